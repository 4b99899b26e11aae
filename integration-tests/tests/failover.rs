//! Failover across real processes: worker processes of a `sluice run --workers 2` are
//! killed with SIGKILL at seeded random moments while a job with remote state and the
//! exactly-once file sink runs; the embedded coordinator restarts the job from its last
//! checkpoint each time, and the committed output must equal the output of the same job
//! run without failures: no duplicate, no gap.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_integration_tests::procs::children_of;
use sluice_integration_tests::{
    assert_same_rows, read_jsonl_dir, run_sluice, sluice_bin, tempdir, write_job, yaml_path,
};

/// A windowed count per auction on remote state, throttled so that the run lasts long
/// enough to be killed several times.
fn job(out: &Path, rate: u64) -> String {
    format!(
        "name: failover\nparallelism: 2\ncheckpoint: {{ interval: 300ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 120000, seed: 11, splits: 4, max_events_per_second: {rate} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// A small deterministic generator (xorshift), so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn killed_workers_are_replaced_and_the_output_is_exactly_once() {
    let dir = tempdir();
    let reference = dir.path().join("reference");
    run_sluice(
        &[
            "run",
            write_job(dir.path(), "ref.yaml", &job(&reference, 0))
                .to_str()
                .unwrap(),
        ],
        dir.path(),
    )
    .assert_success()
    .assert_no_panic();
    let expected = read_jsonl_dir(&reference);
    assert!(!expected.is_empty());

    let out = dir.path().join("out");
    let path = write_job(dir.path(), "failover.yaml", &job(&out, 12_000));
    let seed = std::env::var("SLUICE_FAILOVER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f00d_u64);
    eprintln!("seed {seed:#x} (SLUICE_FAILOVER_SEED replays it)");
    let mut rng = Rng(seed);
    let mut child = Command::new(sluice_bin())
        .args(["run", path.to_str().unwrap(), "--workers", "2"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice");
    let pid = child.id();
    let kills = 3;
    let mut killed = Vec::new();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(1200 + rng.below(1500)));
        let workers = children_of(pid);
        if workers.is_empty() || child.try_wait().expect("wait").is_some() {
            break;
        }
        let victim = workers[rng.below(workers.len() as u64) as usize];
        let _ = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status();
        killed.push(victim);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the job did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        killed.len(),
        kills,
        "the job ended before every kill:\n{stderr}"
    );
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("finished "))
        .unwrap_or_else(|| panic!("no summary:\n{stderr}"));
    // A kill while the job is already restarting joins that restart.
    let restarts: usize = summary
        .rsplit_once(", ")
        .and_then(|(_, r)| r.strip_suffix(" restarts"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the job must have restarted: {summary}"));
    assert!((1..=kills).contains(&restarts), "{summary}");
    assert_same_rows(
        "output after worker kills",
        &read_jsonl_dir(&out),
        &expected,
    );
    let hidden: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        hidden.is_empty(),
        "nothing pending or in progress is left: {hidden:?}"
    );
}
