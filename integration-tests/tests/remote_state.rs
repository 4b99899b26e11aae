//! Remote keyed state across process boundaries: the real `sluice state-service`
//! process, reached over gRPC by the worker's state client (`sluice_compute::state_client`).
//!
//! - The state API's conformance suite (`sluice_common::state::conformance`) passes against
//!   the service, once with the client's epoch buffer and cache in the way and once with
//!   every write shipped at once and no cache; and its epoch cases (seal, commit,
//!   restore, restore at another parallelism) through the job-level `RemoteStore`.
//! - A node killed with SIGKILL while writing loses nothing that was acknowledged durable:
//!   a fresh node on a fresh disk restores every shard from the object store, at the last
//!   committed checkpoint, or at a later one whose writes were all flushed. Run against a
//!   local directory and against the S3 server the test services start (SeaweedFS).
//! - A node restarted on its data directory refuses a writer of a superseded attempt:
//!   fences are durable.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use sluice_common::state::conformance;
use sluice_common::state::{KeyedStateBackend, WriteOp};
use sluice_compute::state_client::{
    RemoteState, RemoteStateBackend, RemoteStateConfig, RemoteStore,
};
use sluice_integration_tests::service::{ServiceProcess, file_store, start_state_node};
use sluice_integration_tests::tempdir;
use sluice_test_support::s3::s3_env;

const MAX_PARALLELISM: u32 = 128;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn connect(
    node: &ServiceProcess,
    job: &str,
    tune: impl FnOnce(&mut RemoteStateConfig),
) -> Arc<RemoteState> {
    let mut config = RemoteStateConfig::new(node.url(), job, MAX_PARALLELISM);
    config.shards = 3;
    tune(&mut config);
    RemoteState::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "connecting to {}: {e}\n--- node stderr\n{}",
            node.url(),
            node.stderr()
        )
    })
}

fn whole_key_space(remote: &Arc<RemoteState>, first_epoch: u64) -> Arc<RemoteStateBackend> {
    Arc::new(remote.backend(0..MAX_PARALLELISM, first_epoch))
}

fn conformance_over_grpc(mode: &str, tune: fn(&mut RemoteStateConfig)) {
    let dir = tempdir();
    let node = start_state_node(dir.path(), "node", &file_store(dir.path()), &[]);
    let rt = rt();
    rt.block_on(async {
        for case in conformance::CASES {
            let remote = connect(&node, &format!("conformance-{mode}-{case}"), tune).await;
            conformance::run_one(case, whole_key_space(&remote, 1)).await;
        }
    });
}

#[test]
fn conformance_suite_passes_over_grpc_with_buffer_and_cache() {
    conformance_over_grpc("buffered", |_| {});
}

/// The epoch lifecycle (seal, commit, restore, restore at another parallelism) through
/// the job-level store the runtime and the coordinator use.
#[test]
fn epoch_cases_pass_over_grpc() {
    let dir = tempdir();
    let node = start_state_node(dir.path(), "node", &file_store(dir.path()), &[]);
    let rt = rt();
    rt.block_on(async {
        for case in conformance::EPOCH_CASES {
            let remote = connect(&node, &format!("epochs-{case}"), |_| {}).await;
            conformance::run_epoch_one(case, Arc::new(RemoteStore(remote))).await;
        }
    });
}

#[test]
fn conformance_suite_passes_over_grpc_writing_through() {
    conformance_over_grpc("write-through", |c| {
        c.write_buffer_bytes = 0;
        c.read_cache_bytes = 0;
    });
}

/// A key in key group `i % 128` (the first two bytes), unique per `i`.
fn key(i: u32) -> Bytes {
    let kg = (i % MAX_PARALLELISM) as u16;
    let mut k = kg.to_be_bytes().to_vec();
    k.extend_from_slice(format!("key-{i:05}").as_bytes());
    Bytes::from(k)
}

fn value(epoch: u64, i: u32) -> Bytes {
    Bytes::from(format!("epoch{epoch}-value{i}"))
}

const KEYS: u32 = 2000;

async fn read_all(backend: &RemoteStateBackend) -> Vec<Option<Bytes>> {
    let keys: Vec<Bytes> = (0..KEYS).map(key).collect();
    backend.get_many(&keys).await.expect("read every key")
}

/// Writes two epochs (the first committed, the second only flushed), then keeps writing
/// a third while the node is killed; fresh nodes restore both checkpoints exactly.
fn kill_during_writes_loses_nothing_acknowledged(store: &str, env: &[(&str, &str)]) {
    let dir = tempdir();
    let rt = rt();
    let mut node = start_state_node(dir.path(), "node-a", store, env);
    let job = "kill-test";
    rt.block_on(async {
        let remote = connect(&node, job, |c| c.write_buffer_bytes = 16 << 10).await;
        let backend = whole_key_space(&remote, 1);
        let ops = (0..KEYS)
            .map(|i| WriteOp::Put {
                key: key(i),
                value: value(1, i),
            })
            .collect();
        backend.write(ops).await.expect("epoch 1 writes");
        backend.flush_epoch(1).await.expect("epoch 1 durable");
        remote
            .commit(1, &[1])
            .await
            .expect("checkpoint 1 committed");

        // Epoch 2: half the keys change, one list-like append; flushed, not committed.
        let mut ops: Vec<WriteOp> = (0..KEYS)
            .filter(|i| i % 2 == 0)
            .map(|i| WriteOp::Put {
                key: key(i),
                value: value(2, i),
            })
            .collect();
        ops.push(WriteOp::Merge {
            key: key(1),
            operand: Bytes::from_static(b"+appended"),
        });
        ops.push(WriteOp::Delete { key: key(3) });
        backend.write(ops).await.expect("epoch 2 writes");
        backend.flush_epoch(2).await.expect("epoch 2 durable");

        // Epoch 3: writes keep shipping (16 KiB buffer) until the node dies under them.
        let writer = Arc::clone(&backend);
        let writes = tokio::spawn(async move {
            for round in 0..200u32 {
                let ops = (0..KEYS)
                    .map(|i| WriteOp::Put {
                        key: key(i),
                        value: value(3 + u64::from(round), i),
                    })
                    .collect();
                if writer.write(ops).await.is_err() {
                    return round;
                }
            }
            200
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        node.kill();
        let rounds = tokio::time::timeout(std::time::Duration::from_secs(30), writes)
            .await
            .expect("the writer notices the dead node within 30 s")
            .expect("writer task");
        assert!(
            rounds < 200,
            "the node was killed while writes were still going on"
        );
    });

    // A fresh node, fresh disk: the latest committed checkpoint is 1.
    let node_b = start_state_node(dir.path(), "node-b", store, env);
    rt.block_on(async {
        let remote = connect(&node_b, job, |_| {}).await;
        assert_eq!(
            remote
                .open_all()
                .await
                .expect("open shards from the object store"),
            1
        );
        let got = read_all(&whole_key_space(&remote, 2)).await;
        for i in 0..KEYS {
            assert_eq!(
                got[i as usize],
                Some(value(1, i)),
                "key {i} at checkpoint 1"
            );
        }
        let status = remote.status().await.expect("status").remove(0);
        assert!(
            status.restore_bytes_total > 0,
            "node b read the shards from the object store"
        );
    });
    drop(node_b);

    // Epoch 2 was acknowledged durable: a coordinator that saw every flush may commit
    // it after the node died, and another fresh node restores it.
    let node_c = start_state_node(dir.path(), "node-c", store, env);
    rt.block_on(async {
        let remote = connect(&node_c, job, |c| c.restore_checkpoint = 2).await;
        assert_eq!(remote.open_all().await.expect("open at checkpoint 2"), 2);
        let got = read_all(&whole_key_space(&remote, 3)).await;
        let mut wrong = BTreeMap::new();
        for i in 0..KEYS {
            let want = match i {
                1 => Some(Bytes::from_static(b"epoch1-value1+appended")),
                3 => None,
                i if i % 2 == 0 => Some(value(2, i)),
                i => Some(value(1, i)),
            };
            if got[i as usize] != want {
                wrong.insert(i, (got[i as usize].clone(), want));
            }
        }
        assert!(
            wrong.is_empty(),
            "{} keys differ at checkpoint 2, e.g. {:?}",
            wrong.len(),
            wrong.iter().next()
        );
    });
}

#[test]
fn killed_node_loses_nothing_acknowledged_local_store() {
    let dir = tempdir();
    kill_during_writes_loses_nothing_acknowledged(&file_store(dir.path()), &[]);
}

#[test]
fn killed_node_loses_nothing_acknowledged_s3() {
    let Some(s3) = s3_env("state-kill", "Remote state on S3") else {
        return;
    };
    let (endpoint, store) = (s3.endpoint.clone(), s3.url());
    kill_during_writes_loses_nothing_acknowledged(
        &store,
        &[
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
        ],
    );
}

/// `sluice state-service --coordinator URL` registers the node: `sluice cluster` lists it
/// with its endpoint and budget, then a job's shards on it with their sizes; a node
/// killed leaves the list.
#[test]
fn a_state_node_registers_with_the_coordinator_and_reports_its_shards() {
    use sluice_integration_tests::cluster::MiniCluster;
    use sluice_integration_tests::{run_sluice, write_job};
    use std::time::Duration;

    let dir = tempdir();
    let dir = dir.path();
    let mut cluster = MiniCluster::start(dir, 1, |_| Vec::new(), &[]);
    let url = cluster.url();
    let listed = |cluster: &MiniCluster| -> serde_json::Value {
        let out = run_sluice(&["cluster", "--coordinator", &url, "--json"], dir);
        out.assert_success();
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", out.stdout, cluster.logs()))
    };
    let node = cluster.wait_until("the state node registered", Duration::from_secs(30), || {
        listed(&cluster)["state_nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node_id"] == "node-a")
            .cloned()
    });
    assert_eq!(
        node["endpoint"].as_str(),
        Some(cluster.state.url().as_str())
    );
    assert_eq!(node["memory_bytes"].as_u64(), Some(256 << 20));

    let job = write_job(
        dir,
        "counts.yaml",
        "name: counts\nparallelism: 2\ncheckpoint: { interval: 200ms }\n\
         state: { backend: remote, shards: 4 }\n\
         source:\n  nexmark: { stream: bid, events: 100000000, seed: 3, max_events_per_second: 20000 }\n\
         watermark: { column: date_time, max_out_of_orderness: 4s }\n\
         pipeline:\n  - key_by: [auction]\n  - window: { tumbling: 10s }\n    aggregate: [\"count(*) AS bids\"]\n\
         sink:\n  blackhole: {}\n",
    );
    let id = cluster.submit(dir, &job, 1);
    let shards = cluster.wait_until(
        "the job's four shards on the node, with a commit",
        Duration::from_secs(60),
        || {
            let nodes = listed(&cluster)["state_nodes"].as_array()?.clone();
            let shards: Vec<serde_json::Value> = nodes[0]["shards"]
                .as_array()?
                .iter()
                .filter(|s| s["job_id"] == id.as_str())
                .cloned()
                .collect();
            (shards.len() == 4
                && shards
                    .iter()
                    .all(|s| s["committed_checkpoint"].as_u64() > Some(0)))
            .then_some(shards)
        },
    );
    assert!(
        shards.iter().any(|s| s["key_groups"] == "0-32"),
        "{shards:?}"
    );
    // People get a table.
    let out = run_sluice(&["cluster", "--coordinator", &url], dir);
    out.assert_success();
    assert!(
        out.stdout.contains("state nodes:") && out.stdout.contains("node-a"),
        "{}",
        out.stdout
    );
    cluster.cancel(dir, &id);

    // A node on another object store is refused, and says why.
    let other = dir.join("other-objects");
    std::fs::create_dir_all(&other).expect("dir");
    let stranger = ServiceProcess::start(
        &[
            "state-service",
            "--listen",
            "127.0.0.1:0",
            "--node-id",
            "node-z",
            "--data-dir",
            dir.join("state-z").to_str().expect("UTF-8"),
            "--object-store",
            &format!("file://{}", other.display()),
            "--coordinator",
            &cluster.grpc_url(),
        ],
        dir,
        &[],
    );
    cluster.wait_until("node-z refused", Duration::from_secs(30), || {
        stranger
            .stderr()
            .contains("every state node of a cluster must use one object store")
            .then_some(())
    });
    assert!(
        !listed(&cluster).to_string().contains("node-z"),
        "a refused node is not listed"
    );
    drop(stranger);

    cluster.state.kill();
    cluster.wait_until(
        "the killed node gone from the list",
        Duration::from_secs(30),
        || {
            listed(&cluster)["state_nodes"]
                .as_array()?
                .is_empty()
                .then_some(())
        },
    );
}

/// A state node killed with SIGKILL and started again on the same data directory still
/// refuses a writer of a superseded attempt (its fence is in the object store), while
/// the attempt that superseded it writes on.
#[test]
fn a_restarted_node_refuses_a_superseded_writer() {
    let dir = tempdir();
    let store = file_store(dir.path());
    let rt = rt();
    let job = "fence-test";
    let mut node = start_state_node(dir.path(), "node", &store, &[]);
    rt.block_on(async {
        // Attempt 100 writes and checkpoints; attempt 200 restores checkpoint 1.
        let old = connect(&node, job, |c| c.fence = 100).await;
        let backend = whole_key_space(&old, 1);
        let put = |epoch: u64| {
            (0..KEYS)
                .map(|i| WriteOp::Put {
                    key: key(i),
                    value: value(epoch, i),
                })
                .collect::<Vec<_>>()
        };
        backend.write(put(1)).await.expect("epoch 1");
        backend.flush_epoch(1).await.expect("epoch 1 durable");
        let coordinator = connect(&node, job, |_| {}).await;
        coordinator.commit(1, &[1]).await.expect("checkpoint 1");
        coordinator
            .restore_to(1, 200)
            .await
            .expect("attempt 200 restores");
    });
    node.kill();
    let node = start_state_node(dir.path(), "node", &store, &[]);
    rt.block_on(async {
        let zombie = connect(&node, job, |c| c.fence = 100).await;
        let backend = whole_key_space(&zombie, 2);
        let ops = (0..KEYS)
            .map(|i| WriteOp::Put {
                key: key(i),
                value: value(2, i),
            })
            .collect();
        let refused = match backend.write(ops).await {
            Err(e) => e.to_string(),
            Ok(()) => backend
                .flush_epoch(2)
                .await
                .expect_err("the superseded writer's epoch is refused")
                .to_string(),
        };
        assert!(refused.contains("fenced at 200"), "{refused}");
        let current = connect(&node, job, |c| c.fence = 200).await;
        let backend = whole_key_space(&current, 2);
        backend
            .write(vec![WriteOp::Put {
                key: key(0),
                value: value(2, 0),
            }])
            .await
            .expect("the current attempt writes");
        backend.flush_epoch(2).await.expect("and flushes");
    });
}

/// An append (`Merge`) read while the buffer holding it ships: the read must not add it
/// to a service value that already holds it. Each round appends to keys nothing has
/// read (so no cached value answers), cuts the epoch, and reads the keys over and over
/// while another task ships it.
#[test]
fn an_append_read_while_its_epoch_ships_is_read_once() {
    let dir = tempdir();
    let node = start_state_node(dir.path(), "node", &file_store(dir.path()), &[]);
    let rt = rt();
    rt.block_on(async {
        let remote = connect(&node, "append-race", |_| {}).await;
        let backend = whole_key_space(&remote, 1);
        for round in 0..40u32 {
            let keys: Vec<Bytes> = (0..300).map(|i| key(round * 1000 + i)).collect();
            let epoch = u64::from(round) + 1;
            let appends = keys.iter().map(|k| WriteOp::Merge {
                key: k.clone(),
                operand: Bytes::from_static(b"+a"),
            });
            backend.write(appends.collect()).await.expect("appends");
            backend.cut_epoch(epoch).await.expect("cut");
            let shipping = backend.clone();
            let ship = tokio::spawn(async move { shipping.await_durable(epoch).await });
            for _ in 0..10 {
                let values = backend.get_many(&keys).await.expect("read");
                for v in values {
                    assert_eq!(v.as_deref(), Some(&b"+a"[..]), "round {round}");
                }
            }
            ship.await.expect("ship task").expect("appends durable");
        }
    });
}
