//! Commit fencing: two coordinators (two independent store clients) race to commit the
//! same checkpoint, round after round, concurrently. Exactly one wins each round, and the
//! object holds the winner's bytes.
//!
//! Runs against a local directory and against the real S3 server (SeaweedFS) that
//! `scripts/test-services.sh start` runs: it exports `SLUICE_TEST_S3_ENDPOINT`,
//! `SLUICE_TEST_S3_BUCKET` and the `AWS_*` credentials. Without them the S3 tests fail
//! (start the services, or set `SLUICE_SKIP_S3=1` to skip them loudly). Each run writes
//! below its own prefix.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_coordinator::checkpoint::metadata::{CheckpointMetadata, encode};
use sluice_coordinator::checkpoint::store::checkpoint_path;
use sluice_coordinator::checkpoint::{
    Action, CheckpointConfig, CheckpointProtocol, CreateOutcome, JobInfo, MemoryMetadataStore,
    MetadataStore, ObjectMetadataStore, TaskAck, TaskId, latest_valid,
};
use sluice_test_support::s3::s3_env;
use tokio::sync::Barrier;

const ROUNDS: u64 = 60;

fn metadata(coordinator: &str, id: u64) -> Bytes {
    encode(&CheckpointMetadata {
        job_id: "race".into(),
        checkpoint_id: id,
        triggered_at_ms: 1,
        completed_at_ms: 2,
        coordinator_id: coordinator.into(),
        savepoint: None,
        kept: false,
        job_graph: Bytes::from_static(b"graph"),
        max_parallelism: 128,
        parallelism: BTreeMap::from([(1, 1)]),
        shards: vec![],
        tasks: vec![],
        records_in: 0,
    })
}

/// `ROUNDS` rounds of two writers racing on checkpoint N; asserts one winner per round.
async fn race(a: Arc<dyn MetadataStore>, b: Arc<dyn MetadataStore>) {
    let barrier = Arc::new(Barrier::new(2));
    let run = |store: Arc<dyn MetadataStore>, me: &'static str| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for id in 1..=ROUNDS {
                barrier.wait().await;
                let path = checkpoint_path("race", id).unwrap();
                let out = store.create_if_absent(&path, metadata(me, id)).await;
                outcomes.push(out.unwrap_or_else(|e| panic!("{me}, round {id}: {e}")));
            }
            outcomes
        })
    };
    let ta = run(a.clone(), "coord-a");
    let tb = run(b.clone(), "coord-b");
    let (oa, ob) = (ta.await.unwrap(), tb.await.unwrap());
    let mut wins = [0, 0];
    for id in 1..=ROUNDS {
        let i = (id - 1) as usize;
        let winner = match (oa[i], ob[i]) {
            (CreateOutcome::Created, CreateOutcome::AlreadyExists) => "coord-a",
            (CreateOutcome::AlreadyExists, CreateOutcome::Created) => "coord-b",
            other => panic!("round {id}: {other:?}, expected exactly one winner"),
        };
        wins[usize::from(winner == "coord-b")] += 1;
        let path = checkpoint_path("race", id).unwrap();
        // Both clients read the winner's bytes.
        for store in [&a, &b] {
            let stored = store.get(&path).await.unwrap().unwrap();
            assert_eq!(stored, metadata(winner, id), "round {id}");
        }
    }
    let latest = latest_valid(a.as_ref(), "race").await.unwrap().unwrap();
    assert_eq!(latest.checkpoint_id, ROUNDS);
    eprintln!("wins: coord-a {}, coord-b {}", wins[0], wins[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_winner_per_round_in_memory() {
    let store = Arc::new(MemoryMetadataStore::new());
    race(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_winner_per_round_on_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    // Two clients, as two coordinator processes would have.
    let a = Arc::new(ObjectMetadataStore::from_url(&url).unwrap());
    let b = Arc::new(ObjectMetadataStore::from_url(&url).unwrap());
    race(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_winner_per_round_on_s3() {
    let Some(s3) = s3_env("fencing", "S3 fencing") else {
        return;
    };
    let url = s3.url_with_endpoint();
    let a = Arc::new(ObjectMetadataStore::from_url(&url).unwrap());
    let b = Arc::new(ObjectMetadataStore::from_url(&url).unwrap());
    race(a, b).await;
    s3.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_honours_create_if_absent() {
    let Some(s3) = s3_env("create-if-absent", "S3 fencing") else {
        return;
    };
    let store = ObjectMetadataStore::from_url(&s3.url_with_endpoint()).unwrap();
    let path = checkpoint_path("probe", 1).unwrap();
    let first = metadata("coord-a", 1);
    assert_eq!(
        store.create_if_absent(&path, first.clone()).await.unwrap(),
        CreateOutcome::Created
    );
    // Same bytes: this writer's own object (a lost answer, retried).
    assert_eq!(
        store.create_if_absent(&path, first.clone()).await.unwrap(),
        CreateOutcome::Created
    );
    assert_eq!(
        store
            .create_if_absent(&path, metadata("coord-b", 1))
            .await
            .unwrap(),
        CreateOutcome::AlreadyExists
    );
    assert_eq!(
        store.get(&path).await.unwrap().unwrap(),
        first,
        "not overwritten"
    );
    s3.remove_all().await;
}

fn job(coordinator: &str) -> JobInfo {
    JobInfo {
        job_id: "race".into(),
        coordinator_id: coordinator.into(),
        job_graph: Bytes::from_static(b"graph"),
        max_parallelism: 128,
        parallelism: BTreeMap::from([(1, 2)]),
        shards: vec![],
        placement: BTreeMap::new(),
        tasks: [TaskId::new(1, 0), TaskId::new(1, 1)].into_iter().collect(),
    }
}

/// Drives a protocol's checkpoint to its metadata write; returns the write's outcome
/// and the actions that follow it.
async fn commit_next(
    p: &mut CheckpointProtocol,
    store: &dyn MetadataStore,
    now: u64,
) -> (u64, Vec<Action>) {
    let acts = p.poll(now);
    let Some(Action::Trigger { id, .. }) = acts.first().cloned() else {
        panic!("no trigger at {now}: {acts:?}");
    };
    let mut write = None;
    for t in [TaskId::new(1, 0), TaskId::new(1, 1)] {
        for a in p.acknowledge(now, TaskAck::empty(id, t)) {
            if let Action::WriteMetadata { path, metadata } = a {
                write = Some((path, metadata));
            }
        }
    }
    let (path, metadata) = write.expect("a metadata write");
    let outcome = store
        .create_if_absent(&path, encode(&metadata))
        .await
        .map_err(|e| e.to_string());
    (id, p.metadata_written(now, id, outcome))
}

/// Two protocols of the same job (a coordinator and its not-quite-dead predecessor) over
/// one store: the one that loses a commit is fenced and stops; the store holds one
/// history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_losing_coordinator_is_fenced_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let sa = ObjectMetadataStore::from_url(&url).unwrap();
    let sb = ObjectMetadataStore::from_url(&url).unwrap();
    let config = CheckpointConfig {
        interval: Duration::from_millis(10),
        ..CheckpointConfig::default()
    };
    let mut a = CheckpointProtocol::new(config.clone(), job("coord-a"), 1, 0).unwrap();
    let (id, acts) = commit_next(&mut a, &sa, 10).await;
    assert_eq!(id, 1);
    assert!(acts.contains(&Action::NotifyComplete { id: 1 }));
    // B starts from what it finds in the store: checkpoint 1, so its first id is 2.
    let found = latest_valid(&sb, "race").await.unwrap().unwrap();
    let mut b =
        CheckpointProtocol::new(config, job("coord-b"), found.checkpoint_id + 1, 0).unwrap();
    b.record_existing(found.checkpoint_id, false);
    let (id_b, acts_b) = commit_next(&mut b, &sb, 20).await;
    assert_eq!(id_b, 2);
    assert!(acts_b.contains(&Action::NotifyComplete { id: 2 }));
    // A, unaware, commits its checkpoint 2 too: fenced, nothing notified.
    let (id_a, acts_a) = commit_next(&mut a, &sa, 20).await;
    assert_eq!(id_a, 2);
    assert!(acts_a.contains(&Action::Fenced { id: 2 }), "{acts_a:?}");
    assert!(
        !acts_a
            .iter()
            .any(|x| matches!(x, Action::NotifyComplete { .. }))
    );
    assert!(a.poll(1_000).is_empty());
    let stored = latest_valid(&sa, "race").await.unwrap().unwrap();
    assert_eq!(
        (stored.checkpoint_id, stored.coordinator_id.as_str()),
        (2, "coord-b")
    );
    let ids: BTreeSet<u64> = sluice_coordinator::checkpoint::store::checkpoint_ids(&sa, "race")
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(ids, BTreeSet::from([1, 2]));
}
