//! The distributed data plane across real processes: `sluice run --workers N` starts
//! real `sluice worker` processes that exchange Arrow batches over TCP with credit-based
//! flow control. Each test bounds its own waits; none relies on timing for correctness.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_integration_tests::procs::{Background, children_of};
use sluice_integration_tests::{
    assert_same_rows, read_jsonl_dir, run_sluice, sluice_bin, summary_line, tempdir, write_job,
    yaml_path,
};

/// `examples/NAME.yaml` with a smaller source and its sink writing to `out`.
fn example(name: &str, out: &Path) -> String {
    let path = sluice_integration_tests::workspace_root()
        .join("examples")
        .join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).expect("example");
    let mut adapted = String::new();
    for line in text.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let t = line.trim();
        if t.starts_with("nexmark:") {
            adapted.push_str(&format!(
                "{indent}nexmark: {{ stream: bid, events: 100000, seed: 3, max_out_of_orderness: 2s }}\n"
            ));
        } else if t.starts_with("file:") && t.contains("path:") {
            adapted.push_str(&format!(
                "{indent}file: {{ path: {}, format: jsonl }}\n",
                yaml_path(out)
            ));
        } else {
            adapted.push_str(line);
            adapted.push('\n');
        }
    }
    adapted
}

#[test]
fn examples_give_the_same_output_on_two_workers() {
    for name in [
        "q5-hot-items",
        "q7-highest-bid",
        "q11-user-sessions",
        "q1-currency",
    ] {
        let dir = tempdir();
        let (one, two) = (dir.path().join("one"), dir.path().join("two"));
        let job1 = write_job(dir.path(), "one.yaml", &example(name, &one));
        let job2 = write_job(dir.path(), "two.yaml", &example(name, &two));
        let a = run_sluice(&["run", job1.to_str().unwrap()], dir.path());
        a.assert_success();
        let b = run_sluice(
            &["run", job2.to_str().unwrap(), "--workers", "2"],
            dir.path(),
        );
        b.assert_success().assert_no_panic();
        assert_eq!(a.summary(), b.summary(), "{name}: summaries differ");
        assert_same_rows(name, &read_jsonl_dir(&two), &read_jsonl_dir(&one));
    }
}

/// Every `key=value` of the `metrics` lines of task `task` on stderr.
fn metric(stderr: &str, task: &str, key: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter(|l| l.starts_with("metrics ") && l.contains(&format!(" task={task} ")))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

#[test]
fn slow_consumer_back_pressures_the_producer_with_bounded_memory() {
    let dir = tempdir();
    // One source subtask (worker 0) feeding a sink subtask on each worker: the channel
    // to worker 1 crosses the network. The sinks take 5 ms per batch of 1024 rows.
    let job = write_job(
        dir.path(),
        "slow.yaml",
        "name: slow\nparallelism: 1\nsource:\n  nexmark: { stream: bid, events: 400000, seed: 1 }\n  batch_size: 1024\nsink:\n  blackhole: { delay_per_batch: 5ms }\n  parallelism: 2\n",
    );
    let out = run_sluice(
        &[
            "run",
            job.to_str().unwrap(),
            "--workers",
            "2",
            "--metrics-interval-ms",
            "200",
        ],
        dir.path(),
    );
    out.assert_success().assert_no_panic();
    let s = out.summary();
    assert_eq!(s.records_in, 400_000);
    assert_eq!(s.records_out, 400_000, "no record lost or duplicated");
    let bp = metric(&out.stderr, "source[0]", "backpressured_ms_per_s");
    assert!(
        bp.iter().any(|&v| v > 300),
        "the producer must spend most of its time back-pressured: {bp:?}"
    );
    let credits = metric(&out.stderr, "source[0]", "credits");
    assert!(credits.contains(&0), "credits must reach 0: {credits:?}");
    // Bounded by the 16 queued buffers (the default subpartition_buffers) and a partial
    // one, plus the overdraft of the one element a write started with room finishes:
    // 1024 bids, about 113 KB, 4 buffers of 32 KiB.
    let out_buffers = metric(&out.stderr, "source[0]", "buffers_in_use_out");
    assert!(
        out_buffers.iter().all(|&b| b <= 16 + 1 + 4),
        "subpartition buffers are bounded: {out_buffers:?}"
    );
    let rss = metric(&out.stderr, "source[0]", "rss_kb");
    assert!(rss.len() >= 3, "RSS sampled over time: {rss:?}");
    assert!(
        rss.iter().all(|&kb| kb < 400 * 1024),
        "producer RSS must stay bounded: {rss:?}"
    );
}

#[test]
fn skewed_keys_through_the_hash_exchange_match_one_process() {
    let dir = tempdir();
    let job = |out: &Path| {
        format!(
            "name: skew\nparallelism: 2\nsource:\n  nexmark: {{ stream: bid, events: 200000, seed: 5, max_out_of_orderness: 2s }}\nwatermark: {{ column: date_time, max_out_of_orderness: 4s }}\npipeline:\n  - select: [\"auction % 1 AS hot\", \"price\", \"date_time\"]\n  - key_by: [hot]\n  - window: {{ tumbling: 10s }}\n    aggregate: [\"count(*) AS n\", \"sum(price) AS total\"]\nsink:\n  file: {{ path: {}, format: jsonl }}\n",
            yaml_path(out)
        )
    };
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let j1 = write_job(dir.path(), "one.yaml", &job(&one));
    let j2 = write_job(dir.path(), "two.yaml", &job(&two));
    run_sluice(&["run", j1.to_str().unwrap()], dir.path()).assert_success();
    let b = run_sluice(
        &[
            "run",
            j2.to_str().unwrap(),
            "--workers",
            "2",
            "--metrics-interval-ms",
            "500",
        ],
        dir.path(),
    );
    b.assert_success();
    assert_same_rows("hot key", &read_jsonl_dir(&two), &read_jsonl_dir(&one));
    let rss = metric(&b.stderr, "window[0]", "rss_kb");
    assert!(rss.iter().all(|&kb| kb < 400 * 1024), "{rss:?}");
}

#[test]
fn a_job_whose_channels_exceed_the_network_memory_is_refused_at_deployment() {
    let dir = tempdir();
    let job = write_job(
        dir.path(),
        "wide.yaml",
        "name: wide\nparallelism: 4\nsource:\n  nexmark: { stream: bid, events: 20000, seed: 3 }\n\
         watermark: { column: date_time, max_out_of_orderness: 4s }\n\
         pipeline:\n  - key_by: [auction]\n  - window: { tumbling: 10s }\n    \
         aggregate: [\"count(*) AS n\"]\nsink:\n  blackhole: {}\n",
    );
    let out = run_sluice(
        &[
            "run",
            job.to_str().unwrap(),
            "--workers",
            "2",
            "--network-memory",
            "1MiB",
        ],
        dir.path(),
    );
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    out.assert_stderr_contains("network buffers, more than its network memory (1.0 MiB")
        .assert_stderr_contains("remote input channels x 2 exclusive buffers")
        .assert_no_panic();
    // Not restarted over and over: a mistake in the setup, said once.
    assert!(!out.stderr.contains("restart"), "{}", out.stderr);
    run_sluice(
        &[
            "run",
            job.to_str().unwrap(),
            "--workers",
            "2",
            "--network-memory",
            "64MiB",
        ],
        dir.path(),
    )
    .assert_success();
}

#[test]
fn barriers_reach_the_sinks_in_order_in_both_modes() {
    for mode in ["aligned", "unaligned"] {
        let dir = tempdir();
        // Two source subtasks of different speeds (one has half the splits' events
        // behind a slow sink path), a hash exchange, sinks that fail on disorder.
        let job = write_job(
            dir.path(),
            "cp.yaml",
            &format!(
                "name: cp\nparallelism: 2\ncheckpoint: {{ interval: 50ms, mode: {mode} }}\nsource:\n  nexmark: {{ stream: bid, events: 300000, seed: 2, max_out_of_orderness: 2s }}\n  batch_size: 2048\nwatermark: {{ column: date_time, max_out_of_orderness: 4s }}\npipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    aggregate: [\"count(*) AS n\"]\nsink:\n  blackhole: {{ delay_per_batch: 1ms }}\n"
            ),
        );
        let out = run_sluice(
            &["run", job.to_str().unwrap(), "--workers", "2"],
            dir.path(),
        );
        out.assert_success().assert_no_panic();
        let line = summary_line(&out.stderr).unwrap_or_default().to_owned();
        assert!(
            line.contains("barriers at sinks"),
            "{mode}: barriers must reach the sinks: {line}"
        );
    }
}

#[test]
fn a_killed_consumer_fails_the_run_quickly() {
    let dir = tempdir();
    let job = write_job(
        dir.path(),
        "kill.yaml",
        "name: kill\nparallelism: 1\nsource:\n  nexmark: { stream: bid, events: 100000000, seed: 1 }\nsink:\n  blackhole: { delay_per_batch: 10ms }\n  parallelism: 2\n",
    );
    let run = Background::spawn(
        &["run", job.to_str().unwrap(), "--workers", "2"],
        dir.path(),
    );
    let pid = run.id();
    // Find the workers (children of the run) and kill the last one.
    let deadline = Instant::now() + Duration::from_secs(30);
    let workers = loop {
        let kids = children_of(pid);
        if kids.len() >= 2 {
            break kids;
        }
        assert!(Instant::now() < deadline, "workers did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(1500));
    let victim = *workers.iter().max().unwrap();
    let _ = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status();
    let (status, stderr) = run.wait(
        Duration::from_secs(30),
        "sluice run did not fail after a worker died",
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: worker"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for w in workers {
        assert!(
            !Path::new(&format!("/proc/{w}")).exists()
                || std::fs::read_to_string(format!("/proc/{w}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "worker {w} must not outlive the run"
        );
    }
}

/// Starts worker 1 of a two-worker job by hand and returns it with its data address;
/// the test plays worker 0.
fn lone_worker(dir: &Path) -> (std::process::Child, String) {
    let job = write_job(
        dir,
        "pair.yaml",
        "name: pair\nparallelism: 2\nsource:\n  nexmark: { stream: bid, events: 1000, seed: 1 }\nwatermark: { column: date_time, max_out_of_orderness: 4s }\npipeline:\n  - key_by: [auction]\n  - window: { tumbling: 10s }\n    aggregate: [\"count(*) AS n\"]\nsink:\n  blackhole: {}\n",
    );
    let mut child = Command::new(sluice_bin())
        .args([
            "worker",
            "--listen",
            "127.0.0.1:0",
            "--job",
            job.to_str().unwrap(),
            "--index",
            "1",
            "--peers",
            "127.0.0.1:1,self",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start worker");
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .rsplit_once(" on ")
        .map(|(_, a)| a.to_owned())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    // Keep reading stderr in the background so the worker never blocks on it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut reader, &mut rest);
        let _ = tx.send(rest);
    });
    STDERR.with(|s| *s.borrow_mut() = Some(rx));
    (child, addr)
}

thread_local! {
    static STDERR: std::cell::RefCell<Option<std::sync::mpsc::Receiver<String>>> =
        const { std::cell::RefCell::new(None) };
}

/// The data plane's protocol version (`compute/src/network/frame.rs`).
const VERSION: u16 = 2;

fn hello(version: u16, worker: u32) -> Vec<u8> {
    let mut f = vec![0, 0, 0, 11, 1];
    f.extend_from_slice(&0x534c_4345u32.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&worker.to_be_bytes());
    f
}

/// Sends `bytes` (after a valid or invalid hello) and expects the worker to fail with
/// a message containing `problem`, in bounded time, without panicking.
fn garbage_fails_the_worker(bytes: &[u8], version: u16, problem: &str) {
    let dir = tempdir();
    let (child, addr) = lone_worker(dir.path());
    garbage_fails_the_worker_from(child, &addr, bytes, version, problem);
}

/// [`garbage_fails_the_worker`] against a worker already started; returns its stderr.
fn garbage_fails_the_worker_from(
    mut child: std::process::Child,
    addr: &str,
    bytes: &[u8],
    version: u16,
    problem: &str,
) -> String {
    let mut sock = TcpStream::connect(addr).expect("connect to the worker");
    sock.write_all(&hello(version, 0)).unwrap();
    sock.write_all(bytes).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the worker did not fail within 30 s ({problem})");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = STDERR.with(|s| {
        s.borrow_mut()
            .take()
            .and_then(|rx| rx.recv_timeout(Duration::from_secs(5)).ok())
            .unwrap_or_default()
    });
    assert_eq!(status.code(), Some(1), "{problem}: {stderr}");
    assert!(
        stderr.contains(problem),
        "expected {problem:?} in:\n{stderr}"
    );
    assert!(stderr.contains("127.0.0.1"), "the peer is named:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn bad_input_on_the_wire_fails_cleanly() {
    // A frame announcing 1 GiB: refused before allocating.
    garbage_fails_the_worker(&[0x40, 0, 0, 0, 2], VERSION, "exceeds the maximum");
    // An unknown frame type.
    garbage_fails_the_worker(&[0, 0, 0, 1, 77], VERSION, "unknown frame type 77");
    // A credit frame too short.
    garbage_fails_the_worker(&[0, 0, 0, 3, 3, 0, 0], VERSION, "malformed credit frame");
    // Credit for a channel that does not exist.
    let mut credit = vec![0, 0, 0, 17, 3];
    for v in [99u32, 0, 0, 1] {
        credit.extend_from_slice(&v.to_be_bytes());
    }
    garbage_fails_the_worker(&credit, VERSION, "unknown channel 99/0/0");
}

#[test]
fn a_strangers_bad_hello_is_refused_and_the_worker_still_takes_its_peer() {
    let dir = tempdir();
    let (mut child, addr) = lone_worker(dir.path());
    // Random bytes, then a hello of another protocol version: both refused and logged,
    // while the worker keeps waiting for worker 0.
    let mut noise = TcpStream::connect(&addr).expect("connect to the worker");
    noise.write_all(&[0xe8, 0x88, 0x11, 0x93, 7, 7, 7]).unwrap();
    let mut stranger = TcpStream::connect(&addr).expect("connect to the worker");
    stranger.write_all(&hello(9, 0)).unwrap();
    // A quiet connection does not hold the others up either.
    let _silent = TcpStream::connect(&addr).expect("connect to the worker");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "a stranger's bad hello must not fail the worker"
    );
    // Then the real worker 0, which breaks the protocol after its hello: that fails.
    let stderr = garbage_fails_the_worker_from(
        child,
        &addr,
        &[0, 0, 0, 1, 77],
        VERSION,
        "unknown frame type 77",
    );
    for refused in [
        "refused a data connection: bad hello: frame of 3901231507 bytes exceeds the maximum of 64",
        "refused a data connection: protocol version 9",
    ] {
        assert!(
            stderr.contains(refused),
            "expected {refused:?} in:\n{stderr}"
        );
    }
}
