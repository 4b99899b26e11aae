//! Create-if-absent on every backend this crate claims, against the real thing: a local
//! directory, the S3 server of the test services (SeaweedFS) and their Azure Blob
//! emulator (Azurite). Two independent clients race on the same names; exactly one wins
//! each, and the object holds the winner's bytes, whole.
//!
//! The S3 and Azure tests need `scripts/test-services.sh start` (or `SLUICE_SKIP_S3=1` /
//! `SLUICE_SKIP_AZURE=1` to skip them loudly).

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use sluice_storage::{CreateOutcome, Store, StoreOptions, create_if_absent};
use sluice_test_support::azure::azure_env;
use sluice_test_support::s3::s3_env;
use tokio::sync::Barrier;

const ROUNDS: usize = 25;

/// Bytes writer `who` puts in round `round`: big enough that a torn write would show.
fn payload(who: &str, round: usize) -> Bytes {
    Bytes::from(format!("{who}:{round}:").repeat(4096))
}

/// Two clients of the same URL race `ROUNDS` times; each round has one winner.
/// The bytes of the object at `location`.
async fn read(store: &Store, location: &object_store::path::Path) -> Bytes {
    store
        .store()
        .get(location)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
}

async fn race(url: &str) {
    let a = Arc::new(Store::open(url, &StoreOptions::default()).unwrap());
    let b = Arc::new(Store::open(url, &StoreOptions::default()).unwrap());
    let barrier = Arc::new(Barrier::new(2));
    let run = |store: Arc<Store>, who: &'static str| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let mut out = Vec::new();
            for round in 0..ROUNDS {
                barrier.wait().await;
                let location = store.child(&format!("race/{round:04}/_metadata"));
                let got = create_if_absent(store.store().as_ref(), &location, payload(who, round))
                    .await
                    .unwrap_or_else(|e| panic!("{who}, round {round}: {e}"));
                out.push(got);
            }
            out
        })
    };
    let (oa, ob) = (run(a.clone(), "a"), run(b.clone(), "b"));
    let (oa, ob) = (oa.await.unwrap(), ob.await.unwrap());
    for round in 0..ROUNDS {
        let winner = match (oa[round], ob[round]) {
            (CreateOutcome::Created, CreateOutcome::AlreadyExists) => "a",
            (CreateOutcome::AlreadyExists, CreateOutcome::Created) => "b",
            other => panic!("round {round} on {url}: {other:?}, expected one winner"),
        };
        let location = a.child(&format!("race/{round:04}/_metadata"));
        for store in [&a, &b] {
            let got = read(store, &location).await;
            assert_eq!(got, payload(winner, round), "round {round} on {url}");
        }
    }
    // A later writer of an existing name never overwrites it.
    let location = a.child("race/0000/_metadata");
    let before = read(&a, &location).await;
    assert_eq!(
        create_if_absent(a.store().as_ref(), &location, Bytes::from_static(b"late"))
            .await
            .unwrap(),
        CreateOutcome::AlreadyExists
    );
    let after = read(&a, &location).await;
    assert_eq!(before, after);
    // Exactly the objects written: no temporary files left behind.
    let listed: Vec<_> = a.store().list(Some(a.root())).try_collect().await.unwrap();
    assert_eq!(listed.len(), ROUNDS, "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_winner_per_name_on_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    race(&format!("file://{}", dir.path().join("store").display())).await;
    // A plain path is the same store.
    let plain = Store::open(
        dir.path().join("store").to_str().unwrap(),
        &StoreOptions::default(),
    )
    .unwrap();
    let got = plain
        .store()
        .get(&plain.child("race/0001/_metadata"))
        .await
        .unwrap();
    assert!(got.bytes().await.unwrap().len() > 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_winner_per_name_on_s3() {
    let Some(s3) = s3_env("storage-create", "create-if-absent on S3") else {
        return;
    };
    race(&s3.url_with_endpoint()).await;
    s3.remove_all().await;
}

#[tokio::test]
async fn s3_errors_name_the_url_and_never_the_secret() {
    let options = StoreOptions {
        secret_access_key: Some("SECRETVALUE".into()),
        access_key_id: Some("k".into()),
        ..StoreOptions::default()
    };
    let store = Store::open("s3://bucket/p?endpoint=http://127.0.0.1:1", &options).unwrap();
    assert_eq!(store.display(), "s3://bucket/p");
    let shown = format!("{store:?} {}", store.store());
    assert!(!shown.contains("SECRETVALUE"), "{shown}");
    let err = Store::open("s3://b/p?colour=blue", &options).unwrap_err();
    assert!(err.to_string().contains("s3://b/p?colour=blue"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_winner_per_name_on_azure_blob() {
    let Some(azure) = azure_env("storage-create", "create-if-absent on Azure Blob") else {
        return;
    };
    race(&azure.url()).await;
    let store = Store::open(&azure.url(), &StoreOptions::default()).unwrap();
    let objects: Vec<_> = store
        .store()
        .list(Some(store.root()))
        .try_collect()
        .await
        .unwrap();
    for o in objects {
        store.store().delete(&o.location).await.unwrap();
    }
}

#[test]
fn gs_urls_are_refused_naming_what_is_supported() {
    let err = Store::open("gs://bucket/prefix", &StoreOptions::default()).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains("gs://bucket/prefix") && shown.contains("azblob://"),
        "{shown}"
    );
}
