//! The state service against a local-file-system object store in a temp directory.

mod common;
mod scenarios;

use common::*;
use sluice_common::pb::state::{
    CommitRequest, MultiGetRequest, OpenShardRequest, RollbackRequest, ScanRequest, StatusRequest,
    TtlState, WriteRequest, ttl_state,
};
use sluice_common::state::{key::encode_key, ttl};
use tonic::Code;

fn store_url(dir: &tempfile::TempDir) -> String {
    format!("file://{}", dir.path().display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_rollback_restore() {
    let store = tempfile::tempdir().unwrap();
    scenarios::commit_rollback_restore(&store_url(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_gc() {
    let store = tempfile::tempdir().unwrap();
    scenarios::snapshots_and_gc(&store_url(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_writes_match_a_model() {
    let store = tempfile::tempdir().unwrap();
    scenarios::spilled_writes_match_a_model(&store_url(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_committed_while_its_node_was_down_is_restored() {
    let store = tempfile::tempdir().unwrap();
    scenarios::checkpoint_committed_while_its_node_was_down(&store_url(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_a_superseded_attempt_are_fenced_off() {
    let store = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (node, mut c) = start(config(data.path(), &store_url(&store))).await;
    let s = shard("fenced", 0, 4);
    open(&mut c, &s, 0).await;
    let write_as = |fence: u64, epoch: u64, value: &'static str| WriteRequest {
        shard: Some(s.clone()),
        epoch,
        ops: vec![put(1, "k", value)],
        fence,
    };
    // Attempt 10 writes and checkpoints; attempt 20 takes over from checkpoint 1.
    c.write(write_as(10, 1, "a")).await.unwrap();
    flush(&mut c, &s, 1).await;
    commit(&mut c, &s, 1, vec![1]).await;
    c.write(write_as(10, 2, "lost")).await.unwrap();
    let undone = c
        .rollback(RollbackRequest {
            shard: Some(s.clone()),
            checkpoint_id: 1,
            fence: 20,
        })
        .await
        .unwrap()
        .into_inner()
        .undone;
    assert_eq!(undone, 1);
    // The old attempt, still alive somewhere, can neither write nor flush.
    let e = c.write(write_as(10, 2, "zombie")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("fenced at 20"), "{}", e.message());
    let e = c
        .flush(sluice_common::pb::state::FlushRequest {
            shard: Some(s.clone()),
            epoch: 2,
            fence: 10,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    // The new attempt (and unfenced writers) can.
    c.write(write_as(20, 2, "b")).await.unwrap();
    assert_eq!(get(&mut c, &s, &[(1, "k")]).await, vec![some("b")]);
    c.write(write_as(0, 2, "c")).await.unwrap();
    // Reopening the shard at an older checkpoint keeps the fence.
    c.open_shard(OpenShardRequest {
        shard: Some(s.clone()),
        checkpoint_id: 1,
        ttl_states: vec![],
        fence: 0,
    })
    .await
    .unwrap();
    let e = c.write(write_as(10, 2, "zombie")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    node.shutdown().await.unwrap();

    // The fence is durable: the node restarted on the same data directory (or any node
    // on the object store) still refuses the superseded writer once the shard opens.
    let (node, mut c) = start(config(data.path(), &store_url(&store))).await;
    open(&mut c, &s, 0).await;
    let e = c.write(write_as(10, 2, "zombie")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("fenced at 20"), "{}", e.message());
    c.write(write_as(20, 2, "b")).await.unwrap();
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_pages_through_the_shard() {
    let store = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (node, mut c) = start(config(data.path(), &store_url(&store))).await;
    let s = shard("j", 4, 8);
    open(&mut c, &s, 0).await;
    let ops = (0..25)
        .map(|i| put(4 + (i % 4) as u16, &format!("k{i:02}"), "v"))
        .collect();
    write(&mut c, &s, 1, ops).await;
    let all = scan_all(&mut c, &s, 10).await;
    assert_eq!(all.len(), 25);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
    assert_eq!(scan_all(&mut c, &s, 0).await.len(), 25);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_compaction_drops_expired_values_and_lists() {
    let store = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (node, mut c) = start(config(data.path(), &store_url(&store))).await;
    let s = shard("ttl", 0, 1);
    c.open_shard(OpenShardRequest {
        fence: 0,
        shard: Some(s.clone()),
        checkpoint_id: 0,
        ttl_states: vec![
            TtlState {
                operator_id: 1,
                state_name: "v".into(),
                kind: ttl_state::Kind::Value as i32,
            },
            TtlState {
                operator_id: 1,
                state_name: "l".into(),
                kind: ttl_state::Kind::List as i32,
            },
        ],
    })
    .await
    .unwrap();
    let past = 1_000; // 1970: long expired
    let k = |name: &[u8], user: &str| encode_key(0, 1, name, user.as_bytes(), b"");
    let frame = |at: i64| {
        let mut f = at.to_be_bytes().to_vec();
        f.extend_from_slice(&1u32.to_be_bytes());
        f.push(b'e');
        f
    };
    let mut mixed = frame(past);
    mixed.extend(frame(ttl::NEVER_EXPIRES));
    let ops = [
        (k(b"v", "old"), ttl::wrap(past, b"x")),
        (k(b"v", "live"), ttl::wrap(ttl::NEVER_EXPIRES, b"x")),
        (k(b"l", "old"), [frame(past), frame(past)].concat()),
        (k(b"l", "mixed"), mixed),
        // Not a TTL state: kept although its first bytes look expired.
        (k(b"other", "old"), ttl::wrap(past, b"x")),
    ];
    let write_ops = ops
        .iter()
        .map(|(key, v)| sluice_common::pb::state::WriteOp {
            kind: 0,
            key: key.clone(),
            value: v.clone().into(),
            end: Default::default(),
        })
        .collect();
    write(&mut c, &s, 1, write_ops).await;
    assert_eq!(scan_all(&mut c, &s, 0).await.len(), 5);
    // Compaction filters what RocksDB holds: epoch 1 reaches it at the commit after
    // the one that committed it.
    flush(&mut c, &s, 1).await;
    commit(&mut c, &s, 1, vec![1]).await;
    flush(&mut c, &s, 2).await;
    commit(&mut c, &s, 2, vec![1, 2]).await;
    node.node().compact(&s).await.unwrap();
    let left: Vec<_> = scan_all(&mut c, &s, 0)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    // Key order: the state name is length-prefixed, so "other" sorts after "v".
    assert_eq!(
        left,
        vec![k(b"l", "mixed"), k(b"v", "live"), k(b"other", "old")]
    );
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_server_keeps_serving() {
    let store = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut cfg = config(data.path(), &store_url(&store));
    cfg.max_batch_ops = 10;
    let (node, mut c) = start(cfg).await;
    let s = shard("bad", 4, 8);
    open(&mut c, &s, 0).await;

    let code_of = |r: Result<tonic::Response<_>, tonic::Status>| -> (Code, String) {
        let e = r.map(|_: tonic::Response<()>| ()).unwrap_err();
        (e.code(), e.message().to_string())
    };
    let unit = |r: Result<
        tonic::Response<sluice_common::pb::state::WriteResponse>,
        tonic::Status,
    >| { r.map(|_| tonic::Response::new(())) };

    // Unknown shard.
    let r = c
        .multi_get(MultiGetRequest {
            shard: Some(shard("bad", 0, 4)),
            keys: vec![key(0, "a")],
        })
        .await;
    let e = r.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("bad[0, 4)"), "{}", e.message());

    // A key group outside the shard.
    let r = c
        .write(WriteRequest {
            fence: 0,
            shard: Some(s.clone()),
            epoch: 1,
            ops: vec![put(9, "a", "v")],
        })
        .await;
    let (code, msg) = code_of(unit(r));
    assert_eq!(code, Code::OutOfRange);
    assert!(
        msg.contains("key group 9") && msg.contains("bad[4, 8)"),
        "{msg}"
    );
    let e = c
        .multi_get(MultiGetRequest {
            shard: Some(s.clone()),
            keys: vec![key(3, "a")],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);
    let e = c
        .scan(ScanRequest {
            shard: Some(s.clone()),
            start: key(5, "a"),
            end: key(9, "z"),
            limit: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);

    // A short key that sorts outside the shard (shards are byte ranges: `[4]` sorts
    // before every key of key group 4), a malformed shard id, no shard.
    let mut op = put(4, "a", "v");
    op.key = vec![4u8].into();
    let (code, _) = code_of(unit(
        c.write(WriteRequest {
            fence: 0,
            shard: Some(s.clone()),
            epoch: 1,
            ops: vec![op],
        })
        .await,
    ));
    assert_eq!(code, Code::OutOfRange);
    let e = c
        .open_shard(OpenShardRequest {
            shard: Some(shard("../etc", 0, 4)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.open_shard(OpenShardRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c
        .open_shard(OpenShardRequest {
            shard: Some(shard("j", 8, 4)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // An unknown write kind.
    let mut op = put(4, "a", "v");
    op.kind = 42;
    let (code, _) = code_of(unit(
        c.write(WriteRequest {
            fence: 0,
            shard: Some(s.clone()),
            epoch: 1,
            ops: vec![op],
        })
        .await,
    ));
    assert_eq!(code, Code::InvalidArgument);

    // Oversized batches.
    let ops = (0..11).map(|i| put(4, &format!("k{i}"), "v")).collect();
    let (code, msg) = code_of(unit(
        c.write(WriteRequest {
            fence: 0,
            shard: Some(s.clone()),
            epoch: 1,
            ops,
        })
        .await,
    ));
    assert_eq!(code, Code::ResourceExhausted, "{msg}");
    let e = c
        .multi_get(MultiGetRequest {
            shard: Some(s.clone()),
            keys: (0..11).map(|i| key(4, &i.to_string())).collect(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);

    // Epochs not newer than the committed checkpoint.
    write(&mut c, &s, 1, vec![put(4, "a", "1")]).await;
    flush(&mut c, &s, 1).await;
    commit(&mut c, &s, 1, vec![1]).await;
    for epoch in [0, 1] {
        let (code, msg) = code_of(unit(
            c.write(WriteRequest {
                fence: 0,
                shard: Some(s.clone()),
                epoch,
                ops: vec![put(4, "a", "2")],
            })
            .await,
        ));
        assert_eq!(code, Code::FailedPrecondition);
        assert!(
            msg.contains(&format!(
                "epoch {epoch} is not newer than committed checkpoint 1"
            )),
            "{msg}"
        );
    }
    let e = c
        .rollback(RollbackRequest {
            fence: 0,
            shard: Some(s.clone()),
            checkpoint_id: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let e = c
        .commit(CommitRequest {
            shard: Some(s.clone()),
            checkpoint_id: 0,
            retained: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // A checkpoint the store does not have.
    let e = c
        .open_shard(OpenShardRequest {
            fence: 0,
            shard: Some(shard("bad", 0, 4)),
            checkpoint_id: 7,
            ttl_states: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Still serving.
    assert_eq!(get(&mut c, &s, &[(4, "a")]).await, vec![some("1")]);
    let st = c.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.node_id, "test");
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_manifest_is_an_error_naming_it() {
    let store = tempfile::tempdir().unwrap();
    let url = store_url(&store);
    let s = shard("corrupt", 0, 2);
    {
        let data = tempfile::tempdir().unwrap();
        let (node, mut c) = start(config(data.path(), &url)).await;
        open(&mut c, &s, 0).await;
        write(&mut c, &s, 1, vec![put(0, "a", "1")]).await;
        flush(&mut c, &s, 1).await;
        commit(&mut c, &s, 1, vec![1]).await;
        node.shutdown().await.unwrap();
    }
    let path = store
        .path()
        .join("jobs/corrupt/shards/0-2/manifests/00000000000000000001.manifest");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0xFF;
    std::fs::write(&path, bytes).unwrap();
    let data = tempfile::tempdir().unwrap();
    let (node, mut c) = start(config(data.path(), &url)).await;
    let e = c
        .open_shard(OpenShardRequest {
            shard: Some(s.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DataLoss);
    assert!(
        e.message().contains("00000000000000000001.manifest"),
        "{}",
        e.message()
    );
    node.shutdown().await.unwrap();
}
