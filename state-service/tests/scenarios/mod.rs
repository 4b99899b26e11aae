//! Scenarios run against every object store (local file system and S3): the same
//! commit, rollback, restore and garbage-collection checks.

#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;

use object_store::path::Path as ObjectPath;
use sluice_state_service::shard_id::ShardKey;
use sluice_state_service::store::Durable;

use crate::common::*;

/// Objects below the shard's root, relative to it, sorted.
pub async fn objects(url: &str, job: &str, start: u32, end: u32) -> Vec<String> {
    let durable = Durable::from_url(url).expect("store");
    let key = ShardKey::from_pb(Some(&shard(job, start, end))).expect("shard key");
    let root: ObjectPath = durable.shard_root(&key);
    let mut out: Vec<String> = durable
        .list(&root)
        .await
        .expect("list")
        .iter()
        .filter_map(|p| {
            p.prefix_match(&root).map(|parts| {
                parts
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
        })
        .collect();
    out.sort();
    out
}

/// Write, flush, commit, roll back, rewrite an epoch, restore on a fresh node.
pub async fn commit_rollback_restore(url: &str) {
    let s = shard("job-a", 0, 8);
    let d1 = tempfile::tempdir().unwrap();
    let (node1, mut c) = start(config(d1.path(), url)).await;
    assert_eq!(open(&mut c, &s, 0).await, (0, false, 0));

    write(
        &mut c,
        &s,
        1,
        vec![put(0, "a", "1"), put(3, "b", "1"), merge(5, "l", "x")],
    )
    .await;
    let h1 = flush(&mut c, &s, 1).await;
    assert!(h1.ends_with("00000000000000000001.delta"), "{h1}");
    // Nothing new: the same handle.
    assert_eq!(flush(&mut c, &s, 1).await, h1);
    let m1 = commit(&mut c, &s, 1, vec![1]).await;
    assert!(
        m1.ends_with("manifests/00000000000000000001.manifest"),
        "{m1}"
    );
    // Idempotent.
    assert_eq!(commit(&mut c, &s, 1, vec![1]).await, m1);

    write(
        &mut c,
        &s,
        2,
        vec![
            put(0, "a", "2"),
            del(3, "b"),
            merge(5, "l", "y"),
            merge(5, "l", "z"),
        ],
    )
    .await;
    assert_eq!(
        get(&mut c, &s, &[(0, "a"), (3, "b"), (5, "l")]).await,
        vec![some("2"), None, some("xyz")]
    );
    write(&mut c, &s, 2, vec![del_groups(5, 6), put(7, "new", "n")]).await;
    flush(&mut c, &s, 2).await;
    assert_eq!(get(&mut c, &s, &[(5, "l")]).await, vec![None]);

    let undone = rollback(&mut c, &s, 1).await;
    assert!(undone >= 6, "undone {undone}");
    assert_eq!(
        get(&mut c, &s, &[(0, "a"), (3, "b"), (5, "l"), (7, "new")]).await,
        vec![some("1"), some("1"), some("x"), None]
    );

    // Epoch 2 again, after the rollback: only the new writes count.
    write(&mut c, &s, 2, vec![put(0, "a", "22")]).await;
    flush(&mut c, &s, 2).await;
    commit(&mut c, &s, 2, vec![1, 2]).await;
    // Acknowledged durable but never committed: a restore must not show it.
    write(&mut c, &s, 3, vec![put(0, "a", "3"), put(1, "c", "3")]).await;
    flush(&mut c, &s, 3).await;
    node1.shutdown().await.unwrap();

    let d2 = tempfile::tempdir().unwrap();
    let (node2, mut c) = start(config(d2.path(), url)).await;
    let (cp, restored, bytes) = open(&mut c, &s, 0).await;
    assert_eq!((cp, restored), (2, true));
    assert!(bytes > 0);
    assert_eq!(
        get(
            &mut c,
            &s,
            &[(0, "a"), (3, "b"), (5, "l"), (7, "new"), (1, "c")]
        )
        .await,
        vec![some("22"), some("1"), some("x"), None, None]
    );
    let status = c
        .status(sluice_common::pb::state::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.restore_bytes_total, bytes);
    assert_eq!(status.shards.len(), 1);
    assert_eq!(status.shards[0].committed_checkpoint, 2);

    // Writes continue on the new node, and survive another restore.
    write(&mut c, &s, 3, vec![put(1, "c", "33")]).await;
    flush(&mut c, &s, 3).await;
    commit(&mut c, &s, 3, vec![2, 3]).await;

    // Back to checkpoint 2, which is older than what is committed here: from the store.
    let (cp, restored, _) = open(&mut c, &s, 2).await;
    assert_eq!((cp, restored), (2, true));
    assert_eq!(
        get(&mut c, &s, &[(0, "a"), (1, "c")]).await,
        vec![some("22"), None]
    );
    node2.shutdown().await.unwrap();

    let d3 = tempfile::tempdir().unwrap();
    let (node3, mut c) = start(config(d3.path(), url)).await;
    assert_eq!(open(&mut c, &s, 3).await.0, 3);
    assert_eq!(
        get(&mut c, &s, &[(0, "a"), (1, "c"), (3, "b")]).await,
        vec![some("22"), some("33"), some("1")]
    );
    node3.shutdown().await.unwrap();
}

/// A checkpoint completes (every writer flushed it) but its node dies before the
/// commit reaches it; the node comes back on its data directory, something opens the
/// shard at "the latest" first (its newest manifest), and the coordinator then restores
/// the completed checkpoint: the shard must hold that checkpoint's writes, which only
/// the deltas flushed after the newest manifest have. Also for a shard whose first
/// checkpoint was never committed here, and for one whose checkpoint wrote nothing.
pub async fn checkpoint_committed_while_its_node_was_down(url: &str) {
    let later = shard("job-down", 0, 4);
    let first = shard("job-down", 4, 8);
    let quiet = shard("job-down", 8, 12);
    let data = tempfile::tempdir().unwrap();
    let (node, mut c) = start(config(data.path(), url)).await;
    for s in [&later, &first, &quiet] {
        open(&mut c, s, 0).await;
    }
    write(&mut c, &later, 1, vec![put(0, "a", "1")]).await;
    flush(&mut c, &later, 1).await;
    commit(&mut c, &later, 1, vec![1]).await;
    write(&mut c, &later, 2, vec![put(0, "a", "2"), put(1, "b", "2")]).await;
    write(&mut c, &first, 1, vec![put(4, "x", "1")]).await;
    for s in [&later, &first, &quiet] {
        flush(&mut c, s, 2).await;
    }
    // Checkpoint 2 completed; the node dies before any shard hears of it.
    node.shutdown().await.unwrap();

    let (node, mut c) = start(config(data.path(), url)).await;
    assert_eq!(open(&mut c, &later, 0).await.0, 1, "the newest manifest");
    assert_eq!(
        get(&mut c, &later, &[(0, "a"), (1, "b")]).await,
        vec![some("1"), None]
    );
    assert_eq!(open(&mut c, &first, 0).await.0, 0, "no manifest yet");
    open(&mut c, &quiet, 0).await;
    for s in [&later, &first, &quiet] {
        let (cp, restored, _) = open(&mut c, s, 2).await;
        assert_eq!((cp, restored), (2, true), "{s:?}");
    }
    assert_eq!(
        get(&mut c, &later, &[(0, "a"), (1, "b")]).await,
        vec![some("2"), some("2")]
    );
    assert_eq!(get(&mut c, &first, &[(4, "x")]).await, vec![some("1")]);
    assert_eq!(get(&mut c, &quiet, &[(8, "x")]).await, vec![None]);
    // The commit arrives now, and the next epoch builds on it.
    for s in [&later, &first, &quiet] {
        commit(&mut c, s, 2, vec![2]).await;
    }
    write(&mut c, &later, 3, vec![put(1, "b", "3")]).await;
    flush(&mut c, &later, 3).await;
    commit(&mut c, &later, 3, vec![2, 3]).await;
    node.shutdown().await.unwrap();

    let other = tempfile::tempdir().unwrap();
    let (node, mut c) = start(config(other.path(), url)).await;
    assert_eq!(open(&mut c, &later, 3).await.0, 3);
    assert_eq!(
        get(&mut c, &later, &[(0, "a"), (1, "b")]).await,
        vec![some("2"), some("3")]
    );
    node.shutdown().await.unwrap();
}

/// Many checkpoints: snapshots get taken and uploaded, GC keeps only what the retained
/// checkpoints need, and a restore from snapshot + deltas is exact.
pub async fn snapshots_and_gc(url: &str) {
    let job = "job-gc";
    let s = shard(job, 0, 8);
    let d1 = tempfile::tempdir().unwrap();
    let (node1, mut c) = start(config(d1.path(), url)).await;
    open(&mut c, &s, 0).await;
    let epochs = 30u64;
    // As in a running job, epoch e is written and flushed before e - 1 commits, so
    // snapshots are taken while epochs are uncommitted and must keep them. Key group 7
    // holds "tmp", written every epoch and range-deleted in every third.
    for e in 1..=epochs {
        let kg = (e % 7) as u16;
        let k = format!("k{e}");
        let mut ops = vec![
            put(kg, &k, &format!("v{e}")),
            put(0, "hot", &e.to_string()),
            merge(1, "list", "+"),
            put(7, "tmp", &e.to_string()),
        ];
        if e % 3 == 0 {
            ops.push(del_groups(7, 8));
        }
        write(&mut c, &s, e, ops).await;
        flush(&mut c, &s, e).await;
        if e > 1 {
            let retained = if e > 2 {
                vec![e - 2, e - 1]
            } else {
                vec![e - 1]
            };
            commit(&mut c, &s, e - 1, retained).await;
        }
        if e % 5 == 0 {
            // Let a background snapshot upload finish.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    commit(&mut c, &s, epochs, vec![epochs - 1, epochs]).await;
    let objs = objects(url, job, 0, 8).await;
    let manifests: Vec<_> = objs
        .iter()
        .filter(|o| o.starts_with("manifests/"))
        .collect();
    let deltas = objs.iter().filter(|o| o.starts_with("deltas/")).count();
    let ssts = objs.iter().filter(|o| o.starts_with("sst/")).count();
    assert_eq!(manifests.len(), 2, "{objs:#?}");
    assert!(deltas < 15, "{deltas} deltas kept: {objs:#?}");
    assert!(ssts > 0, "no snapshot uploaded: {objs:#?}");
    node1.shutdown().await.unwrap();

    for cp in [epochs, epochs - 1] {
        let d = tempfile::tempdir().unwrap();
        let (node, mut c) = start(config(d.path(), url)).await;
        assert_eq!(open(&mut c, &s, cp).await.0, cp);
        let all = scan_all(&mut c, &s, 7).await;
        let tmp = cp % 3 != 0;
        assert_eq!(
            all.len() as u64,
            cp + 2 + u64::from(tmp),
            "keys k1..k{cp}, hot, list and (unless deleted) tmp"
        );
        let got = get(
            &mut c,
            &s,
            &[
                (0, "hot"),
                (1, "list"),
                ((cp % 7) as u16, &format!("k{cp}")),
                (7, "tmp"),
            ],
        )
        .await;
        assert_eq!(
            got,
            vec![
                some(&cp.to_string()),
                some(&"+".repeat(cp as usize)),
                some(&format!("v{cp}")),
                if tmp { some(&cp.to_string()) } else { None },
            ]
        );
        node.shutdown().await.unwrap();
    }
}

/// The shard's content as a test computes it: committed state and the operations of
/// each uncommitted epoch, in order.
#[derive(Default)]
struct Model {
    committed: std::collections::BTreeMap<Bytes, Bytes>,
    epochs: std::collections::BTreeMap<u64, Vec<sluice_common::pb::state::WriteOp>>,
}

impl Model {
    fn apply(
        map: &mut std::collections::BTreeMap<Bytes, Bytes>,
        op: &sluice_common::pb::state::WriteOp,
    ) {
        use sluice_common::pb::state::write_op::Kind;
        match Kind::try_from(op.kind).expect("kind") {
            Kind::Put => {
                map.insert(op.key.clone(), op.value.clone());
            }
            Kind::Delete => {
                map.remove(&op.key);
            }
            Kind::Merge => {
                let mut v = map.get(&op.key).map(|v| v.to_vec()).unwrap_or_default();
                v.extend_from_slice(&op.value);
                map.insert(op.key.clone(), Bytes::from(v));
            }
            Kind::DeleteRange => map.retain(|k, _| !(*k >= op.key && *k < op.end)),
        }
    }

    /// Committed state with the epochs up to `through` applied.
    fn view(&self, through: u64) -> std::collections::BTreeMap<Bytes, Bytes> {
        let mut map = self.committed.clone();
        for ops in self.epochs.range(..=through).map(|(_, ops)| ops) {
            ops.iter().for_each(|op| Self::apply(&mut map, op));
        }
        map
    }

    fn commit(&mut self, c: u64) {
        self.committed = self.view(c);
        self.epochs = self.epochs.split_off(&(c + 1));
    }
}

/// A random write over few keys (so they are written again, appended to and deleted
/// within and across epochs), now and then a key group's range deleted.
fn random_op(rng: &mut sluice_common::rng::Rng) -> sluice_common::pb::state::WriteOp {
    let (kg, k) = (rng.below(8) as u16, format!("k{}", rng.below(200)));
    match rng.below(100) {
        0..50 => put(kg, &k, &"v".repeat(500 + rng.below(2500) as usize)),
        50..65 => del(kg, &k),
        65..99 => merge(kg, &k, &format!("+{}", rng.below(1000))),
        _ => del_groups(kg, kg + 1),
    }
}

async fn values(
    c: &mut Client,
    s: &sluice_common::pb::state::ShardId,
    keys: &[Bytes],
) -> Vec<Option<Bytes>> {
    let r = c
        .multi_get(sluice_common::pb::state::MultiGetRequest {
            shard: Some(s.clone()),
            keys: keys.to_vec(),
        })
        .await
        .expect("multi_get")
        .into_inner();
    r.values
        .into_iter()
        .zip(r.found)
        .map(|(v, f)| f.then_some(v))
        .collect()
}

fn same(got: Vec<(Bytes, Bytes)>, want: &std::collections::BTreeMap<Bytes, Bytes>, what: &str) {
    let want: Vec<(Bytes, Bytes)> = want.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!(
            g == w,
            "{what}: {:02x?} = {} where the model has {:02x?} = {}",
            g.0,
            short(Some(&g.1)),
            w.0,
            short(Some(&w.1))
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: entry count");
}

/// A value as its length and first bytes.
fn short(v: Option<&Bytes>) -> String {
    v.map_or_else(
        || "absent".into(),
        |v| {
            format!(
                "{} bytes {:?}",
                v.len(),
                String::from_utf8_lossy(&v[..v.len().min(12)])
            )
        },
    )
}

/// A node whose uncommitted layers may hold 256 KiB takes epochs of about 4 MiB of
/// puts, deletes, appends and range deletes, so layers spill to RocksDB over and over:
/// reads, scans, commits (lagging one epoch, as the job driver does), rollbacks and a
/// restore on a fresh node (from snapshots that hold spilled layers) all agree with a
/// model of the writes.
pub async fn spilled_writes_match_a_model(url: &str) {
    let s = shard("spill", 0, 8);
    let d1 = tempfile::tempdir().unwrap();
    let mut cfg = config(d1.path(), url);
    cfg.memory_bytes = 2 << 20;
    let (node1, mut c) = start(cfg).await;
    open(&mut c, &s, 0).await;
    let mut rng = sluice_common::rng::Rng::new(7);
    let mut model = Model::default();
    let mut committed = 0;
    for epoch in 1..=14u64 {
        for _ in 0..24 {
            let ops: Vec<_> = (0..100).map(|_| random_op(&mut rng)).collect();
            model
                .epochs
                .entry(epoch)
                .or_default()
                .extend(ops.iter().cloned());
            write(&mut c, &s, epoch, ops).await;
            let keys: Vec<Bytes> = (0..40)
                .map(|_| key(rng.below(8) as u16, &format!("k{}", rng.below(200))))
                .collect();
            let view = model.view(u64::MAX);
            let got = values(&mut c, &s, &keys).await;
            for (i, k) in keys.iter().enumerate() {
                let want = view.get(k);
                assert!(
                    got[i].as_ref() == want,
                    "read of {k:02x?} in epoch {epoch}: {} where the model has {}",
                    short(got[i].as_ref()),
                    short(want)
                );
            }
        }
        flush(&mut c, &s, epoch).await;
        if epoch % 5 == 0 {
            // A failed attempt: everything after the committed checkpoint goes.
            rollback(&mut c, &s, committed).await;
            model.epochs.retain(|e, _| *e <= committed);
        } else if epoch > 1 && epoch - 1 > committed {
            commit(&mut c, &s, epoch - 1, vec![epoch - 1]).await;
            model.commit(epoch - 1);
            committed = epoch - 1;
        }
        same(
            scan_all(&mut c, &s, 97).await,
            &model.view(u64::MAX),
            &format!("scan after epoch {epoch}"),
        );
    }
    let st = c
        .status(sluice_common::pb::state::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        st.spilled_bytes_total > 4 << 20,
        "spilled {}",
        st.spilled_bytes_total
    );
    assert!(st.pending_bytes <= 1 << 20, "held {}", st.pending_bytes);
    node1.shutdown().await.unwrap();

    // A fresh node, as small, restores the committed checkpoint (replaying the later
    // epochs' deltas spills again before they are dropped).
    let d2 = tempfile::tempdir().unwrap();
    let mut cfg = config(d2.path(), url);
    cfg.memory_bytes = 2 << 20;
    let (node2, mut c) = start(cfg).await;
    assert_eq!(open(&mut c, &s, committed).await.0, committed);
    same(
        scan_all(&mut c, &s, 0).await,
        &model.view(committed),
        "restored",
    );
    node2.shutdown().await.unwrap();
}
