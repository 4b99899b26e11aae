//! `sluice doctor` on the destruction labs (`examples/labs/`), each run on a cluster of
//! separate processes: the lab's symptom is shown by the job's figures, the doctor names
//! its cause (exit code 1), and with the fix the lab names applied the doctor finds
//! nothing (exit code 0). The hot-key lab checks the diagnosis only (its fixes change the
//! job, not a setting).
//!
//! Tests run one at a time: each starts a cluster on a 2-core machine.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_integration_tests::cluster::{MiniCluster, args_for, free_port};
use sluice_integration_tests::http::http_request;
use sluice_integration_tests::{Outcome, run_sluice, tempdir, workspace_root, write_job};
use sluice_test_support::kafka::{KafkaEnv, kafka_env};

#[path = "common/kafka_topics.rs"]
#[expect(dead_code, reason = "only `bid` is used here")]
mod kafka_topics;

/// How long a lab's symptom may take to show.
const SYMPTOM: Duration = Duration::from_secs(60);

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn lab(name: &str) -> String {
    let path: PathBuf = workspace_root().join("examples/labs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn doctor(cluster: &MiniCluster, dir: &Path, id: &str, json: bool) -> Outcome {
    let url = cluster.url();
    let mut args = vec!["doctor", id, "--coordinator", &url, "--sample-ms", "2000"];
    if json {
        args.push("--json");
    }
    run_sluice(&args, dir)
}

/// The findings of a `--json` run.
fn findings(out: &Outcome) -> Vec<Value> {
    let report: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}):\n{}\n{}",
            out.stdout, out.stderr
        )
    });
    report["findings"].as_array().cloned().unwrap_or_default()
}

fn task_figure(status: &Value, prefix: &str, key: &str) -> Option<u64> {
    status["tasks"]
        .as_array()?
        .iter()
        .filter(|t| t["task"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .filter_map(|t| t[key].as_u64())
        .max()
}

#[test]
fn doctor_names_a_slow_sink_as_the_bottleneck_and_nothing_once_it_keeps_up() {
    let _serial = serial();
    let dir = tempdir();
    let dir = dir.path();
    let cluster = MiniCluster::start(dir, 2, |_| Vec::new(), &[]);

    let job = write_job(dir, "slow.yaml", &lab("slow-sink.yaml"));
    let id = cluster.submit(dir, &job, 2);
    // The symptom, from the job's own figures: the sources wait, the sink works.
    // (The sink's busy share as Flink counts it: neither idle nor back-pressured.)
    cluster.wait_until("the sources back-pressured by the sink", SYMPTOM, || {
        let s = cluster.status(&id);
        (task_figure(&s, "source", "backpressured_ms_per_s")? >= 500
            && task_figure(&s, "sink", "idle_ms_per_s")? <= 400)
            .then_some(())
    });
    let out = doctor(&cluster, dir, &id, true);
    assert_eq!(
        out.code,
        Some(1),
        "doctor found nothing; the job's tasks now: {}\n{}",
        cluster.status(&id)["tasks"],
        out.stdout
    );
    let found = findings(&out);
    let cascade = found
        .iter()
        .find(|f| f["pathology"] == "back-pressure cascade")
        .unwrap_or_else(|| panic!("no cascade in {found:?}\n{}", cluster.logs()));
    assert_eq!(cascade["subject"], "sink[0]", "{cascade}");
    assert!(
        cascade["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("back-pressured")),
        "{cascade}"
    );
    // For people: a table with the same finding.
    let human = doctor(&cluster, dir, &id, false);
    human.assert_code(1);
    assert!(
        human.stdout.contains("back-pressure cascade") && human.stdout.contains("sink[0]"),
        "{}",
        human.stdout
    );
    cluster.cancel(dir, &id);

    // The fix the doctor names, a sink that keeps up: nothing to report.
    let job = write_job(dir, "fixed.yaml", &lab("slow-sink-fixed.yaml"));
    let id = cluster.submit(dir, &job, 2);
    cluster.wait_until("the fixed job's tasks reporting", SYMPTOM, || {
        let s = cluster.status(&id);
        (task_figure(&s, "sink", "records_in")? > 10_000).then_some(())
    });
    let out = doctor(&cluster, dir, &id, false);
    assert_eq!(
        out.code,
        Some(0),
        "the fixed lab still shows:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(out.stdout.contains("no pathology found"), "{}", out.stdout);
    cluster.cancel(dir, &id);

    // A job that is not running, and one that does not exist, are named.
    let ended = doctor(&cluster, dir, &id, false);
    ended.assert_code(2).assert_stderr_contains("not running");
    let missing = doctor(&cluster, dir, "no-such-job", false);
    missing.assert_code(2).assert_no_panic();
}

#[test]
fn doctor_names_a_checkpoint_alignment_stall_and_nothing_once_the_sink_keeps_up() {
    let _serial = serial();
    let dir = tempdir();
    let dir = dir.path();
    let cluster = MiniCluster::start(dir, 2, |_| Vec::new(), &[]);

    let job = write_job(dir, "stall.yaml", &lab("alignment-stall.yaml"));
    let id = cluster.submit(dir, &job, 2);
    // The symptom, from the job's checkpoints: they take half the 4 s timeout and more.
    let stalled = cluster.wait_until("checkpoints near their timeout", SYMPTOM, || {
        let s = cluster.status(&id);
        let last = s["checkpoints"].as_array()?.last()?["duration_ms"].as_u64()?;
        (last >= 2_000).then_some(last)
    });
    eprintln!("alignment stall: the last checkpoint took {stalled} ms");
    let out = doctor(&cluster, dir, &id, true);
    assert_eq!(out.code, Some(1), "doctor found nothing:\n{}", out.stdout);
    let found = findings(&out);
    let stall = found
        .iter()
        .find(|f| f["pathology"] == "checkpoint alignment timeout")
        .unwrap_or_else(|| panic!("no alignment finding in {found:?}"));
    assert!(
        stall["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("of a 4000 ms timeout")),
        "{stall}"
    );
    cluster.cancel(dir, &id);

    // The fix the doctor names, no back pressure: checkpoints align at once, nothing found.
    let job = write_job(dir, "fixed.yaml", &lab("alignment-stall-fixed.yaml"));
    let id = cluster.submit(dir, &job, 2);
    cluster.wait_until("three checkpoints of the fixed job", SYMPTOM, || {
        let s = cluster.status(&id);
        (s["checkpoints"].as_array()?.len() >= 3).then_some(())
    });
    let out = doctor(&cluster, dir, &id, false);
    assert_eq!(
        out.code,
        Some(0),
        "the fixed lab still shows:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    cluster.cancel(dir, &id);
}

/// The state-memory lab on a node whose budget is `memory`: the doctor's findings, with
/// the node's `/metrics`, once the job checkpointed its state there a few times.
fn state_memory_findings(memory: &str) -> Vec<Value> {
    let dir = tempdir();
    let dir = dir.path();
    let metrics = format!("127.0.0.1:{}", free_port());
    let node_args = ["--memory", memory, "--metrics-http", metrics.as_str()];
    let cluster = MiniCluster::start(dir, 2, args_for("state-service", &node_args), &[]);
    let job = write_job(dir, "memory.yaml", &lab("state-memory.yaml"));
    let id = cluster.submit(dir, &job, 2);
    cluster.wait_until("three checkpoints of state", SYMPTOM, || {
        let s = cluster.status(&id);
        (s["checkpoints"].as_array()?.len() >= 3).then_some(())
    });
    let url = cluster.url();
    let metrics_url = format!("http://{metrics}/metrics");
    let out = run_sluice(
        &[
            "doctor",
            &id,
            "--coordinator",
            &url,
            "--sample-ms",
            "1000",
            "--state-metrics",
            &metrics_url,
            "--json",
        ],
        dir,
    );
    out.assert_no_panic();
    cluster.cancel(dir, &id);
    findings(&out)
        .into_iter()
        .filter(|f| f["pathology"] == "state memory growth")
        .collect()
}

#[test]
fn doctor_names_a_state_node_short_of_memory_and_nothing_with_a_budget_that_fits() {
    let _serial = serial();
    let short = state_memory_findings("40MiB");
    assert_eq!(short.len(), 1, "{short:?}");
    eprintln!("state memory lab at 40 MiB: {}", short[0]["evidence"]);
    assert!(
        short[0]["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("of its 40 MiB budget")),
        "{short:?}"
    );
    assert!(
        short[0]["fix"]
            .as_str()
            .is_some_and(|f| f.contains("--memory")),
        "{short:?}"
    );
    // The fix the doctor names: a budget that fits.
    let fits = state_memory_findings("512MiB");
    assert!(fits.is_empty(), "{fits:?}");
}

#[test]
fn doctor_names_a_killed_worker_as_the_cause_of_a_failover() {
    let _serial = serial();
    let dir = tempdir();
    let dir = dir.path();
    let mut cluster = MiniCluster::start(dir, 3, |_| Vec::new(), &[]);
    let job = write_job(dir, "killed.yaml", &lab("killed-worker.yaml"));
    let id = cluster.submit(dir, &job, 2);
    let checkpointed = |cluster: &MiniCluster, restarts: u64, after: u64| {
        cluster.wait_until("a checkpoint of a running attempt", SYMPTOM, || {
            let s = cluster.status(&id);
            let c = s["last_checkpoint"].as_u64()?;
            (s["state"] == "running" && s["restarts"].as_u64()? >= restarts && c > after)
                .then_some(c)
        })
    };
    let first = checkpointed(&cluster, 0, 0);
    // Nothing wrong yet.
    let out = doctor(&cluster, dir, &id, true);
    let found = findings(&out);
    assert!(
        found.iter().all(|f| f["pathology"] != "failover"),
        "{found:?}"
    );
    // Kill -9 a worker that runs the job.
    let (code, workers) = http_request(&cluster.http, "GET", "/v1/workers", None);
    assert_eq!(code, 200, "{workers}");
    let (victim, pid) = workers
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["jobs"].as_array().is_some_and(|j| !j.is_empty()))
        .and_then(|w| Some((w["id"].as_str()?.to_owned(), w["pid"].as_u64()? as u32)))
        .expect("a worker running the job");
    cluster
        .workers
        .iter_mut()
        .find(|w| w.pid() == Some(pid))
        .expect("the worker is ours")
        .kill();
    // The symptom: a restart, and the job running and checkpointing again.
    checkpointed(&cluster, 1, first);
    let out = doctor(&cluster, dir, &id, true);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    let found = findings(&out);
    let failover = found
        .iter()
        .find(|f| f["pathology"] == "failover")
        .unwrap_or_else(|| panic!("no failover in {found:?}"));
    let evidence = failover["evidence"].as_str().unwrap_or_default();
    eprintln!("killed worker lab: {evidence}");
    assert!(
        evidence.contains(&victim),
        "the lost worker {victim} is named: {failover}"
    );
    assert!(evidence.contains("1 restarts so far"), "{failover}");
    cluster.cancel(dir, &id);
}

#[test]
fn doctor_names_the_subtask_a_hot_key_lands_on_and_the_key() {
    let _serial = serial();
    let dir = tempdir();
    let dir = dir.path();
    let cluster = MiniCluster::start(dir, 1, |_| Vec::new(), &[]);
    let job = write_job(dir, "hot.yaml", &lab("hot-key.yaml"));
    let id = cluster.submit(dir, &job, 1);
    // The symptom: one window subtask takes most records.
    cluster.wait_until("one window subtask taking most records", SYMPTOM, || {
        let s = cluster.status(&id);
        let windows: Vec<u64> = s["tasks"]
            .as_array()?
            .iter()
            .filter(|t| t["task"].as_str().is_some_and(|n| n.starts_with("window")))
            .filter_map(|t| t["records_in"].as_u64())
            .collect();
        let max = *windows.iter().max()?;
        (windows.len() == 2 && max > 100_000 && max > 3 * windows.iter().min()?).then_some(())
    });
    let out = doctor(&cluster, dir, &id, true);
    let found = findings(&out);
    let skew = found
        .iter()
        .find(|f| f["pathology"] == "data skew on key_by")
        .unwrap_or_else(|| {
            panic!(
                "no skew in {found:?}; tasks: {}\n{}",
                cluster.status(&id)["tasks"],
                cluster.logs()
            )
        });
    assert!(
        skew["subject"]
            .as_str()
            .is_some_and(|s| s.starts_with("window[")),
        "{skew}"
    );
    assert!(
        skew["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("its hottest keys: auction=0 (")),
        "{skew}"
    );
    cluster.cancel(dir, &id);
}

/// Writes bids to partitions 0..3 of `topic` every 100 ms, event time advancing a
/// second per round, until stopped (at most `limit`).
fn feed(
    env: KafkaEnv,
    topic: String,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut second = 0i64;
        while !stop.load(Ordering::Relaxed) && started.elapsed() < limit {
            for p in 0..3 {
                let records: Vec<String> = (0..5)
                    .map(|i| kafka_topics::bid(i, 1_436_918_400_000 + second * 1000))
                    .collect();
                let records: Vec<(Option<&str>, &str)> =
                    records.iter().map(|r| (None, r.as_str())).collect();
                env.produce(&topic, p, &records);
            }
            second += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

#[test]
fn doctor_names_the_silent_partition_that_starves_the_watermark_and_nothing_with_idleness() {
    let _serial = serial();
    let Some(env) = kafka_env("doctor-idle", "sluice doctor on watermark starvation") else {
        return;
    };
    let dir = tempdir();
    let dir = dir.path();
    let topic = env.topic("lab-bids");
    env.create_topic_blocking(&topic, 4);
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed(
        env.clone(),
        topic.clone(),
        stop.clone(),
        Duration::from_secs(180),
    );
    let cluster = MiniCluster::start(dir, 1, |_| Vec::new(), &[]);
    let text = lab("idle-partition.yaml")
        .replace("127.0.0.1:9092", &env.brokers)
        .replace("topic: lab-bids", &format!("topic: {topic}"));

    let job = write_job(dir, "starved.yaml", &text);
    let id = cluster.submit(dir, &job, 1);
    let holder = format!("{topic}/3");
    cluster.wait_until(
        "the silent partition named as the watermark's holder",
        SYMPTOM,
        || {
            let s = cluster.status(&id);
            let held = s["tasks"]
                .as_array()?
                .iter()
                .any(|t| t["watermark_held_by"] == holder.as_str());
            (held && s["records_in"].as_u64()? > 0).then_some(())
        },
    );
    let out = doctor(&cluster, dir, &id, true);
    out.assert_code(1).assert_no_panic();
    let found = findings(&out);
    let starved = found
        .iter()
        .find(|f| f["pathology"] == "watermark starvation")
        .unwrap_or_else(|| panic!("no starvation in {found:?}\n{}", cluster.logs()));
    assert!(
        starved["subject"]
            .as_str()
            .is_some_and(|s| s.contains(&holder)),
        "{starved}"
    );
    assert!(
        starved["fix"]
            .as_str()
            .is_some_and(|f| f.contains("idleness")),
        "{starved}"
    );
    cluster.cancel(dir, &id);

    // The fix: idleness. The watermark moves with the three live partitions.
    let job = write_job(
        dir,
        "idle.yaml",
        &text.replace("# idleness: 2s", "idleness: 2s"),
    );
    let id = cluster.submit(dir, &job, 1);
    cluster.wait_until("a watermark with idleness", SYMPTOM, || {
        cluster.status(&id)["watermark"].as_i64().map(|_| ())
    });
    let out = doctor(&cluster, dir, &id, true);
    let found = findings(&out);
    assert!(
        found
            .iter()
            .all(|f| f["pathology"] != "watermark starvation"),
        "starvation despite idleness: {found:?}"
    );
    cluster.cancel(dir, &id);
    stop.store(true, Ordering::Relaxed);
    let _ = feeder.join();
}
