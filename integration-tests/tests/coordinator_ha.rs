//! Two coordinators elect a leader through a real etcd server (Debian's `etcd-server`,
//! which `scripts/test-services.sh start` installs; each test runs its own etcd on
//! 127.0.0.1 ports of its own, so it can stop it): the leader is killed with SIGKILL
//! mid-run and the standby takes over, resuming the job from its newest checkpoint with
//! the same workers and state node (they were given both coordinators' addresses); with
//! etcd stopped nobody leads, both say why, nothing commits, and the job resumes when
//! etcd is back; an unreachable etcd at start is a clear error.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::cluster::{MiniCluster, free_port};
use sluice_integration_tests::etcd::Etcd;
use sluice_integration_tests::http::http_request;
use sluice_integration_tests::{
    assert_same_rows, read_jsonl_dir, run_sluice, tempdir, write_job, yaml_path,
};

/// A windowed count per auction on remote state into the exactly-once file sink.
fn job(out: &Path, rate: u64) -> String {
    format!(
        "name: ha\nparallelism: 2\ncheckpoint: {{ interval: 300ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 120000, seed: 29, splits: 4, max_events_per_second: {rate} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

fn reference(dir: &Path) -> Vec<sluice_integration_tests::Row> {
    let out = dir.join("reference");
    let path = write_job(dir, "ref.yaml", &job(&out, 0));
    run_sluice(&["run", path.to_str().unwrap()], dir)
        .assert_success()
        .assert_no_panic();
    let rows = read_jsonl_dir(&out);
    assert!(!rows.is_empty());
    rows
}

/// The newest checkpoint committed to the store (its `_metadata` written).
fn newest_checkpoint(dir: &Path, job: &str) -> u64 {
    std::fs::read_dir(dir.join(format!("coordinator-store/jobs/{job}/checkpoints")))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join("_metadata").exists())
                .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Waits until job `id` ended on whichever coordinator now leads (which may answer
/// 503, or not know the job yet, while it takes over) and asserts that it finished.
#[track_caller]
fn finished_on_the_leader(cluster: &MiniCluster, id: &str) {
    let status = cluster.wait_until("the job to finish", Duration::from_secs(120), || {
        let (code, s) = http_request(&cluster.http, "GET", &format!("/v1/jobs/{id}"), None);
        (code == 200 && matches!(s["state"].as_str(), Some("finished" | "failed"))).then_some(s)
    });
    assert_eq!(status["state"], "finished", "{status}\n{}", cluster.logs());
}

/// The leader is killed with SIGKILL mid-run: the standby takes over within the lease
/// time, resumes the job from its newest checkpoint on the same workers and state node
/// (none of them restarted), and the committed output equals the failure-free run's.
#[test]
fn a_killed_leader_is_replaced_by_the_standby_and_the_output_is_exactly_once() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    let etcd = Etcd::start(dir);
    let mut cluster = MiniCluster::start_ha(dir, 2, 1, &etcd.url(), &[]);

    // `sluice cluster` lists both coordinators, one leading, from either address.
    let out = run_sluice(
        &["cluster", "--coordinator", &cluster.urls(), "--json"],
        dir,
    );
    out.assert_success();
    let view: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let coordinators = view["coordinators"].as_array().cloned().unwrap_or_default();
    assert_eq!(coordinators.len(), 2, "{view}");
    assert_eq!(
        coordinators
            .iter()
            .filter(|c| c["role"] == "leader")
            .count(),
        1,
        "{view}"
    );
    // The standby refuses with the leader's address.
    let (code, body) = http_request(cluster.standby_http(), "GET", "/v1/jobs", None);
    assert_eq!(code, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("the leader is coord-1"),
        "{body}"
    );

    let out_dir = dir.join("out");
    let path = write_job(dir, "ha.yaml", &job(&out_dir, 8_000));
    let id = cluster.submit(dir, &path, 2);
    cluster.wait_until("two checkpoints", Duration::from_secs(60), || {
        (cluster.status(&id)["last_checkpoint"].as_u64().unwrap_or(0) > 1).then_some(())
    });
    let worker_pids: Vec<Option<u32>> = cluster.workers.iter().map(|w| w.pid()).collect();
    let state_pid = cluster.state.pid();
    let takeover = cluster.fail_over();
    eprintln!("leader takeover: {} ms", takeover.as_millis());
    finished_on_the_leader(&cluster, &id);
    assert_same_rows(
        "output after a leader takeover",
        &read_jsonl_dir(&out_dir),
        &expected,
    );
    // Nobody restarted: the workers and the state node re-attached to the new leader.
    assert!(
        cluster.workers.iter_mut().all(|w| w.running()),
        "{}",
        cluster.logs()
    );
    assert_eq!(
        cluster.workers.iter().map(|w| w.pid()).collect::<Vec<_>>(),
        worker_pids
    );
    assert_eq!(cluster.state.pid(), state_pid);
    drop(etcd);
}

/// etcd stopped: the leader stops leading within its lease time (and exits saying so),
/// the standby answers that no leader can be confirmed, no checkpoint is committed
/// meanwhile; etcd back, the standby leads and the job finishes with exactly-once
/// output.
#[test]
fn with_etcd_stopped_nobody_leads_nothing_commits_and_both_say_why() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    let mut etcd = Etcd::start(dir);
    let mut cluster = MiniCluster::start_ha(dir, 2, 1, &etcd.url(), &[]);
    let out_dir = dir.join("out");
    let path = write_job(dir, "ha.yaml", &job(&out_dir, 6_000));
    let id = cluster.submit(dir, &path, 2);
    cluster.wait_until("a checkpoint", Duration::from_secs(60), || {
        (cluster.status(&id)["last_checkpoint"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    etcd.stop();
    let said = cluster.wait_leader_exit(Duration::from_secs(20));
    assert!(said.contains("lost the lead"), "{said}");
    let committed = newest_checkpoint(dir, &id);
    let (code, body) = http_request(
        cluster.standby_http(),
        "GET",
        &format!("/v1/jobs/{id}"),
        None,
    );
    assert_eq!(code, 503, "{body}");
    let why = body["error"].as_str().unwrap_or("").to_owned();
    assert!(
        why.contains("no leader can be confirmed") && why.contains("etcd"),
        "{why}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        newest_checkpoint(dir, &id),
        committed,
        "a checkpoint committed without a leader"
    );

    etcd.resume();
    cluster.promote_standby(Duration::from_secs(60));
    finished_on_the_leader(&cluster, &id);
    assert_same_rows(
        "output after an etcd outage",
        &read_jsonl_dir(&out_dir),
        &expected,
    );
}

/// `--ha` with no etcd answering: a clear error naming it, and no coordinator starts.
#[test]
fn an_unreachable_etcd_at_start_is_a_clear_error() {
    let dir = tempdir();
    let dir = dir.path();
    let port = free_port();
    let out = run_sluice(
        &[
            "coordinator",
            "--ha",
            &format!("etcd://127.0.0.1:{port}"),
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--store",
            "store",
        ],
        dir,
    );
    out.assert_code(2).assert_no_panic();
    out.assert_stderr_contains(&format!("etcd at http://127.0.0.1:{port} is unreachable"));
    assert!(
        !out.stderr.contains("coordinator listening"),
        "{}",
        out.stderr
    );
    let out = run_sluice(&["coordinator", "--ha", "http://127.0.0.1:1"], dir);
    out.assert_code(2);
    out.assert_stderr_contains("not an etcd address");
}

/// The whole story on one run: three state nodes, three workers and two
/// coordinators; a state node, then a worker of the job, then the leader are killed with
/// SIGKILL, each after the job recovered from the one before. The committed output
/// equals the failure-free run's.
#[test]
fn a_state_node_a_worker_and_the_leader_killed_in_turn_lose_and_repeat_nothing() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    let etcd = Etcd::start(dir);
    let mut cluster = MiniCluster::start_ha(dir, 3, 3, &etcd.url(), &[]);
    let out_dir = dir.join("out");
    let path = write_job(dir, "ha.yaml", &job(&out_dir, 5_000));
    let id = cluster.submit(dir, &path, 2);
    // Waits until the job has run again since `restarts` and checkpointed past `after`.
    let recovered = |cluster: &MiniCluster, restarts: u64, after: u64, what: &str| -> (u64, u64) {
        cluster.wait_until(what, Duration::from_secs(90), || {
            let (code, s) = http_request(&cluster.http, "GET", &format!("/v1/jobs/{id}"), None);
            if code != 200 {
                return None;
            }
            assert_ne!(s["state"], "failed", "{s}\n{}", cluster.logs());
            assert_ne!(s["state"], "finished", "the job ended before {what}: {s}");
            let r = s["restarts"].as_u64().unwrap_or(0);
            let c = s["last_checkpoint"].as_u64().unwrap_or(0);
            (r >= restarts && c > after && s["state"] == "running").then_some((r, c))
        })
    };
    let (_, c0) = recovered(&cluster, 0, 0, "a first checkpoint");
    cluster.more_state[0].kill();
    let (r1, c1) = recovered(&cluster, 1, c0, "a checkpoint after the state node loss");
    let (code, workers) = http_request(&cluster.http, "GET", "/v1/workers", None);
    assert_eq!(code, 200, "{workers}");
    let busy = workers
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["jobs"].as_array().is_some_and(|j| !j.is_empty()))
        .and_then(|w| w["pid"].as_u64())
        .expect("a worker running the job") as u32;
    let worker = cluster
        .workers
        .iter_mut()
        .find(|w| w.pid() == Some(busy))
        .expect("the busy worker is ours");
    worker.kill();
    let (_, c2) = recovered(&cluster, r1 + 1, c1, "a checkpoint after the worker loss");
    let takeover = cluster.fail_over();
    eprintln!(
        "checkpoints {c0} (node killed), {c1} (worker killed), {c2} (leader killed); takeover {} ms",
        takeover.as_millis()
    );
    finished_on_the_leader(&cluster, &id);
    assert_same_rows(
        "output after a state node, a worker and the leader were killed",
        &read_jsonl_dir(&out_dir),
        &expected,
    );
    drop(etcd);
}
