//! Keyed state over several state nodes, across real processes: three `sluice
//! state-service` nodes register with a coordinator, which places a job's shards over
//! them (`sluice cluster` shows where); one node is killed with SIGKILL mid-run, its
//! shards reopen on the survivors from the object store at the last checkpoint, and the
//! job's committed output (the exactly-once file sink) equals the output of the same job
//! run without failures. An outage of the only state node, longer than the restart
//! policy allows restarts, is waited for and survived. And `sluice cluster drain` /
//! `rebalance` move shards off a node and onto a new one while the job runs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::cluster::{MiniCluster, args_for, node_name};
use sluice_integration_tests::{
    assert_same_rows, read_jsonl_dir, run_sluice, tempdir, write_job, yaml_path,
};

const SHARDS: usize = 6;

/// A windowed count per auction on remote state into the exactly-once file sink, at
/// `rate` events per second (0: unthrottled).
fn job(out: &Path, rate: u64) -> String {
    format!(
        "name: placed\nparallelism: 2\ncheckpoint: {{ interval: 300ms }}\n\
         state: {{ backend: remote, shards: {SHARDS} }}\n\
         source:\n  nexmark: {{ stream: bid, events: 150000, seed: 23, splits: 4, max_events_per_second: {rate} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// `sluice cluster --json`.
fn cluster_view(cluster: &MiniCluster, dir: &Path) -> Value {
    let out = run_sluice(&["cluster", "--coordinator", &cluster.url(), "--json"], dir);
    out.assert_success();
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", out.stdout, cluster.logs()))
}

/// The job's open shards per state node, by node name.
fn shards_by_node(view: &Value, job: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for n in view["state_nodes"].as_array().into_iter().flatten() {
        let shards: Vec<String> = n["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["job_id"] == job)
            .filter_map(|s| s["key_groups"].as_str().map(str::to_owned))
            .collect();
        if !shards.is_empty() {
            out.insert(n["node_id"].as_str().unwrap_or("?").to_owned(), shards);
        }
    }
    out
}

#[test]
fn a_killed_state_nodes_shards_reopen_on_the_survivors_and_the_output_is_exactly_once() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    let mut cluster = MiniCluster::start_nodes(dir, 2, 3, |_| Vec::new(), &[]);
    let out = dir.join("out");
    let path = write_job(dir, "placed.yaml", &job(&out, 9_000));
    let id = cluster.submit(dir, &path, 2);

    // The coordinator spreads the six shards over the three nodes, two each.
    let before = cluster.wait_until(
        "the job's shards open on every node, with a checkpoint",
        Duration::from_secs(60),
        || {
            let placed = shards_by_node(&cluster_view(&cluster, dir), &id);
            let committed = cluster.status(&id)["last_checkpoint"].as_u64().unwrap_or(0) > 0;
            (committed && placed.len() == 3 && placed.values().all(|s| s.len() == 2))
                .then_some(placed)
        },
    );
    eprintln!("placement before: {before:?}");
    let victim = node_name(1);
    let moved = before[&victim].clone();
    let restarts = cluster.status(&id)["restarts"].as_u64().unwrap_or(0);
    cluster.more_state[0].kill();

    // The job restarts from its last checkpoint with node-b's shards on node-a and
    // node-c, opened there from the object store.
    let after = cluster.wait_until(
        "every shard open on the two surviving nodes",
        Duration::from_secs(60),
        || {
            let status = cluster.status(&id);
            if status["state"] == "finished" {
                return Some(BTreeMap::new());
            }
            let placed = shards_by_node(&cluster_view(&cluster, dir), &id);
            let restarted = status["restarts"].as_u64().unwrap_or(0) > restarts;
            let all: usize = placed.values().map(Vec::len).sum();
            (restarted && !placed.contains_key(&victim) && all == SHARDS).then_some(placed)
        },
    );
    eprintln!("placement after {victim} was killed: {after:?}");
    if !after.is_empty() {
        for shard in &moved {
            let holders: Vec<&String> = after
                .iter()
                .filter(|(_, s)| s.contains(shard))
                .map(|(n, _)| n)
                .collect();
            assert_eq!(holders.len(), 1, "shard {shard} on one node: {after:?}");
        }
        let a = after.get("node-a").map_or(0, Vec::len);
        let c = after.get("node-c").map_or(0, Vec::len);
        assert_eq!((a, c), (3, 3), "the lost shards spread: {after:?}");
    }

    let status = cluster.wait_finished(&id);
    assert!(
        status["restarts"].as_u64().unwrap_or(0) > restarts,
        "the node's loss restarted the job: {status}"
    );
    assert_same_rows(
        "output after a state node was killed",
        &read_jsonl_dir(&out),
        &expected,
    );
}

/// The job run without failures, into `dir/reference`.
fn reference(dir: &Path) -> Vec<sluice_integration_tests::Row> {
    let reference = dir.join("reference");
    let ref_job = write_job(dir, "ref.yaml", &job(&reference, 0));
    run_sluice(&["run", ref_job.to_str().unwrap()], dir)
        .assert_success()
        .assert_no_panic();
    let rows = read_jsonl_dir(&reference);
    assert!(!rows.is_empty());
    rows
}

/// The only state node is down for longer than the restart policy's budget
/// (`--max-restarts 1`): the job waits for it, saying so, spends no restart, and
/// resumes by itself when the node is back, with exactly-once output.
#[test]
fn a_state_service_outage_is_waited_for_without_spending_restarts() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    let mut cluster = MiniCluster::start(
        dir,
        2,
        args_for("coordinator", &["--max-restarts", "1"]),
        &[],
    );
    let out = dir.join("out");
    let path = write_job(dir, "outage.yaml", &job(&out, 9_000));
    let id = cluster.submit(dir, &path, 2);
    cluster.wait_until("a checkpoint", Duration::from_secs(60), || {
        (cluster.status(&id)["last_checkpoint"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    cluster.state.kill();
    let waiting = cluster.wait_until(
        "the job to say it waits for the state service",
        Duration::from_secs(30),
        || {
            let s = cluster.status(&id);
            assert_ne!(s["state"], "failed", "{s}\n{}", cluster.logs());
            let w = s["waiting_for"].as_str().unwrap_or("").to_owned();
            w.contains("out of reach").then_some(w)
        },
    );
    assert!(waiting.contains("state"), "{waiting}");
    // Several tries pass, more than the policy's one restart.
    let tries = cluster.wait_until(
        "three tries to reach the state service",
        Duration::from_secs(30),
        || {
            let s = cluster.status(&id);
            assert_ne!(s["state"], "failed", "{s}\n{}", cluster.logs());
            let restarts = s["restarts"].as_u64().unwrap_or(0);
            (restarts >= 3).then_some(restarts)
        },
    );
    eprintln!("{tries} tries while the node was down: {waiting}");
    cluster.restart_state_node(dir, 0);
    let status = cluster.wait_finished(&id);
    assert_eq!(
        status["failure"],
        Value::Null,
        "recovered: history, not state"
    );
    // The failures are in the job's history, in the status and in the store (where a
    // coordinator resuming the job reads them).
    let failures = status["failures"].as_array().cloned().unwrap_or_default();
    assert!(failures.len() >= 3, "{status}");
    assert!(
        failures.iter().all(|f| f["unavailable"] == true),
        "{status}"
    );
    let recorded = std::fs::read_dir(dir.join(format!("coordinator-store/jobs/{id}/failures")))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(
        recorded,
        failures.len(),
        "each failure recorded in the store"
    );
    assert_same_rows(
        "output after a state service outage",
        &read_jsonl_dir(&out),
        &expected,
    );
}

/// `sluice cluster drain`: every shard leaves the drained node at a checkpoint; a node
/// added afterwards takes its share at `sluice cluster rebalance`; the job runs on and
/// its output equals the failure-free run's.
#[test]
fn a_drained_node_gives_up_its_shards_and_a_new_node_takes_its_share_at_a_rebalance() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    // Only the command rebalances here (a join alone does in the next test).
    let mut cluster = MiniCluster::start_nodes(
        dir,
        2,
        3,
        args_for("coordinator", &["--rebalance-after-join-ms", "0"]),
        &[],
    );
    let out = dir.join("out");
    let path = write_job(dir, "moved.yaml", &job(&out, 7_000));
    let id = cluster.submit(dir, &path, 2);
    let url = cluster.url();
    let before = cluster.wait_until(
        "the job's shards on the three nodes, with a checkpoint",
        Duration::from_secs(60),
        || {
            let placed = shards_by_node(&cluster_view(&cluster, dir), &id);
            let committed = cluster.status(&id)["last_checkpoint"].as_u64().unwrap_or(0) > 0;
            (committed && placed.len() == 3).then_some(placed)
        },
    );
    eprintln!("placement before: {before:?}");

    let drained = run_sluice(
        &[
            "cluster",
            "drain",
            "node-b",
            "--coordinator",
            &url,
            "--json",
        ],
        dir,
    );
    drained.assert_success();
    let moves: Value = serde_json::from_str(&drained.stdout).expect("JSON");
    let outcome = &moves[0]["outcome"];
    assert_eq!(moves[0]["job"], id.as_str(), "{moves}");
    assert_eq!(outcome["unchanged"], false, "{moves}\n{}", cluster.logs());
    assert!(
        outcome["state_bytes_restored"].as_u64().unwrap_or(0) > 0,
        "node-b's shards were read back from the object store: {moves}"
    );
    eprintln!(
        "drain of node-b: the job paused {} ms, {} bytes read back",
        outcome["millis"], outcome["state_bytes_restored"]
    );
    let view = cluster_view(&cluster, dir);
    let b = view["state_nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["node_id"] == "node-b"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(b["draining"], true, "{view}");
    let after_drain = cluster.wait_until(
        "node-b's shards open on node-a and node-c, and closed on node-b",
        Duration::from_secs(30),
        || {
            let placed = shards_by_node(&cluster_view(&cluster, dir), &id);
            let on_others: usize = ["node-a", "node-c"]
                .iter()
                .map(|n| placed.get(*n).map_or(0, Vec::len))
                .sum();
            (on_others == SHARDS && !placed.contains_key("node-b")).then_some(placed)
        },
    );
    eprintln!("placement after draining node-b: {after_drain:?}");
    // Draining again moves nothing, and says so; an unknown node is a clear error.
    let again = run_sluice(&["cluster", "drain", "node-b", "--coordinator", &url], dir);
    again.assert_success();
    assert!(
        again.stdout.contains("nothing was moved"),
        "{}",
        again.stdout
    );
    let unknown = run_sluice(&["cluster", "drain", "node-x", "--coordinator", &url], dir);
    unknown.assert_code(2);
    assert!(
        unknown.stderr.contains("no state node `node-x`"),
        "{}",
        unknown.stderr
    );

    // A fourth node joins; a rebalance gives it its share of the job's shards.
    let d = cluster.add_state_node(dir);
    let name = node_name(d);
    cluster.wait_until("the new node registered", Duration::from_secs(30), || {
        let view = cluster_view(&cluster, dir);
        view["state_nodes"]
            .as_array()?
            .iter()
            .any(|n| n["node_id"] == name.as_str())
            .then_some(())
    });
    let rebalanced = run_sluice(
        &["cluster", "rebalance", "--coordinator", &url, "--json"],
        dir,
    );
    rebalanced.assert_success();
    let moves: Value = serde_json::from_str(&rebalanced.stdout).expect("JSON");
    let outcome = &moves[0]["outcome"];
    assert_eq!(outcome["unchanged"], false, "{moves}");
    eprintln!(
        "rebalance onto the new node: the job paused {} ms, {} bytes read back",
        outcome["millis"], outcome["state_bytes_restored"]
    );
    let after_join = cluster.wait_until(
        "the new node holding its share",
        Duration::from_secs(30),
        || {
            let placed = shards_by_node(&cluster_view(&cluster, dir), &id);
            let open: usize = placed.values().map(Vec::len).sum();
            // Each shard open on one node: the moved ones' old copies were closed.
            (placed.get(&name).map_or(0, Vec::len) == 2 && open == SHARDS).then_some(placed)
        },
    );
    eprintln!("placement after {name} joined: {after_join:?}");

    let status = cluster.wait_finished(&id);
    assert_eq!(status["restarts"], 0, "moves are not failures: {status}");
    assert_same_rows(
        "output after a drain and a rebalance",
        &read_jsonl_dir(&out),
        &expected,
    );
}

/// A state node that joins while a job runs gets its share of the job's shards by
/// itself, once the join settled (`--rebalance-after-join-ms`): no command, no restart,
/// the same output.
#[test]
fn a_node_that_joins_gets_its_share_of_the_shards_without_a_command() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    let mut cluster = MiniCluster::start_nodes(
        dir,
        2,
        2,
        args_for("coordinator", &["--rebalance-after-join-ms", "1000"]),
        &[],
    );
    let out = dir.join("out");
    let path = write_job(dir, "joined.yaml", &job(&out, 7_000));
    let id = cluster.submit(dir, &path, 2);
    let before = cluster.wait_until(
        "the job's shards on both nodes, with a checkpoint",
        Duration::from_secs(60),
        || {
            let placed = shards_by_node(&cluster_view(&cluster, dir), &id);
            let committed = cluster.status(&id)["last_checkpoint"].as_u64().unwrap_or(0) > 0;
            (committed && placed.len() == 2).then_some(placed)
        },
    );
    eprintln!("placement before: {before:?}");
    let c = cluster.add_state_node(dir);
    let name = node_name(c);
    let after = cluster.wait_until(
        "the new node holding its share",
        Duration::from_secs(60),
        || {
            let s = cluster.status(&id);
            if matches!(s["state"].as_str(), Some("finished" | "failed")) {
                panic!(
                    "the job ended before the node got its share: {s}\n{}",
                    cluster.logs()
                );
            }
            let placed = shards_by_node(&cluster_view(&cluster, dir), &id);
            let open: usize = placed.values().map(Vec::len).sum();
            (placed.get(&name).map_or(0, Vec::len) == SHARDS / 3 && open == SHARDS)
                .then_some(placed)
        },
    );
    eprintln!("placement after {name} joined: {after:?}");
    let status = cluster.wait_finished(&id);
    assert_eq!(status["restarts"], 0, "moves are not failures: {status}");
    assert_same_rows(
        "output after a node joined",
        &read_jsonl_dir(&out),
        &expected,
    );
}

/// A zombie: a worker of the job is paused (SIGSTOP) past its heartbeat timeout, the job
/// recovers on the other workers, then the paused one resumes (SIGCONT) and runs on for
/// a moment as if nothing happened. Nothing it writes reaches the state (the shards'
/// fences refuse its attempt) or the sink (its parts are tagged with its attempt, and
/// the recovery's fence mark voids what it leaves after it): the committed output
/// equals the failure-free run's.
#[test]
fn a_paused_worker_that_resumes_after_the_job_recovered_writes_nothing_that_counts() {
    let dir = tempdir();
    let dir = dir.path();
    let expected = reference(dir);
    let cluster = MiniCluster::start(
        dir,
        3,
        |role| match role {
            "coordinator" => [
                "--heartbeat-timeout-ms",
                "1500",
                "--heartbeat-interval-ms",
                "300",
            ]
            .map(String::from)
            .to_vec(),
            _ => Vec::new(),
        },
        &[],
    );
    let out = dir.join("out");
    let path = write_job(dir, "zombie.yaml", &job(&out, 9_000));
    let id = cluster.submit(dir, &path, 2);
    cluster.wait_until("a checkpoint", Duration::from_secs(60), || {
        (cluster.status(&id)["last_checkpoint"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    let workers = cluster_view(&cluster, dir)["workers"].clone();
    let busy: Vec<u64> = workers
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["jobs"].as_array().is_some_and(|j| !j.is_empty()))
        .filter_map(|w| w["pid"].as_u64())
        .collect();
    assert_eq!(busy.len(), 2, "{workers}");
    let zombie = busy[0].to_string();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &zombie])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {sig} {zombie}");
    };
    signal("-STOP");
    let restarts = cluster.status(&id)["restarts"].as_u64().unwrap_or(0);
    // The job recovers without it and completes a checkpoint of the new attempt.
    let recovered_at = cluster.wait_until("the job to recover", Duration::from_secs(60), || {
        let s = cluster.status(&id);
        (s["restarts"].as_u64().unwrap_or(0) > restarts && s["state"] == "running")
            .then(|| s["last_checkpoint"].as_u64().unwrap_or(0))
    });
    cluster.wait_until(
        "a checkpoint after the recovery",
        Duration::from_secs(60),
        || {
            let s = cluster.status(&id);
            (s["last_checkpoint"].as_u64().unwrap_or(0) > recovered_at
                || matches!(s["state"].as_str(), Some("finished" | "failed")))
            .then_some(())
        },
    );
    signal("-CONT");
    cluster.wait_finished(&id);
    // The recovery left its fence mark beside the parts.
    let marks = std::fs::read_dir(&out)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(".fence-"))
                .count()
        })
        .unwrap_or(0);
    assert!(marks > 0, "no fence mark in {}", out.display());
    assert_same_rows(
        "output after a zombie worker resumed",
        &read_jsonl_dir(&out),
        &expected,
    );
}
