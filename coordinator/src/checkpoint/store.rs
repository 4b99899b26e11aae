//! Where `_metadata` objects live, behind a store whose one write primitive is
//! "create if absent".
//!
//! ## Layout
//!
//! ```text
//! <root>/jobs/<job>/checkpoints/<id, 20 digits>/_metadata
//! <root>/jobs/<job>/savepoints/<name>/_metadata
//! ```
//!
//! Ids are zero-padded so listing order is id order.
//!
//! ## Fencing
//!
//! Writing checkpoint N's `_metadata` IS committing checkpoint N, and
//! [`MetadataStore::create_if_absent`] answers [`CreateOutcome::AlreadyExists`] to every
//! writer but the first. Two coordinators that both believe they lead therefore can never
//! both commit checkpoint N: the loser learns it was fenced and steps down.
//!
//! The write is `sluice_storage::create_if_absent`: on S3 and Azure Blob a PUT with
//! `If-None-Match: *` (through OpenDAL), which SeaweedFS, AWS S3 and Azurite honour
//! (`412 Precondition Failed` or `409 Conflict` for the loser); on a local directory
//! object_store's write-to-temporary-then-`link(2)`, which fails when the name exists.
//!
//! A write whose answer is lost (timeout, connection reset, a retried request that finds
//! its own earlier attempt) is resolved by reading the object back: the same bytes mean
//! this writer created it (metadata carries the writer's coordinator id and timestamps,
//! so two writers never produce equal bytes), other bytes mean someone else did, no
//! object means the write did not happen *yet*: that is returned as an error, and the
//! caller must treat the checkpoint as aborted and never reuse its id.
//!
//! ## Recovery
//!
//! [`latest_valid`] returns the newest checkpoint whose `_metadata` decodes; a corrupt
//! or truncated newer one is skipped with a warning.
//!
//! This module knows object paths and bytes; it does not know what a checkpoint means
//! beyond [`decode`](super::metadata::decode).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
pub use sluice_storage::CreateOutcome;
use sluice_storage::{Store, StoreOptions};

use super::ack::TaskId;
use super::metadata::{CheckpointMetadata, MetadataError, decode};
use crate::error::{Error, Result};

/// A store of `_metadata` objects, addressed by `/`-separated paths relative to the
/// store's root (see the layout functions below).
#[async_trait]
pub trait MetadataStore: Send + Sync + fmt::Debug {
    /// Writes `bytes` at `path` unless an object is there. The only write.
    async fn create_if_absent(&self, path: &str, bytes: Bytes) -> Result<CreateOutcome>;
    /// The object at `path`, `None` when absent.
    async fn get(&self, path: &str) -> Result<Option<Bytes>>;
    /// Paths of every object below the directory `prefix` (recursively), sorted.
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;
    /// Removes the object at `path` (a checkpoint retention let go); absent is fine.
    async fn delete(&self, path: &str) -> Result<()>;

    /// The store-relative path a user's `path` names: relative paths as they are, and
    /// an absolute one (a local path, `file://`, or a URL of the store) when it is inside
    /// the store; the error says where the store is otherwise.
    fn relative(&self, path: &str) -> std::result::Result<String, String> {
        Ok(path.trim_start_matches('/').to_owned())
    }
}

/// Checks that `value` can be one path segment: ASCII letters, digits, `.`, `_`, `-`,
/// 1 to 200 characters, not `.` or `..`.
pub fn validate_name(what: &'static str, value: &str) -> Result<()> {
    let reason = if value.is_empty() {
        Some("it is empty")
    } else if value.len() > 200 {
        Some("it is longer than 200 characters")
    } else if value == "." || value == ".." {
        Some("'.' and '..' are not names")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("use only ASCII letters, digits, '.', '_' and '-'")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidName {
            what,
            value: value.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// `jobs/<job>/checkpoints`: the directory of a job's checkpoints.
pub fn checkpoints_dir(job: &str) -> Result<String> {
    validate_name("job id", job)?;
    Ok(format!("jobs/{job}/checkpoints"))
}

/// `jobs/<job>/checkpoints/<id:020>/_metadata`.
pub fn checkpoint_path(job: &str, id: u64) -> Result<String> {
    Ok(format!("{}/{id:020}/_metadata", checkpoints_dir(job)?))
}

/// `jobs/<job>/checkpoints/<id:020>/channel-state/<node>-<subtask>`: the channel state
/// `task` recorded for an unaligned checkpoint (the job's id was validated).
pub fn channel_state_path(job: &str, id: u64, task: TaskId) -> String {
    format!(
        "jobs/{job}/checkpoints/{id:020}/channel-state/{}-{}",
        task.node, task.subtask
    )
}

/// `jobs/<job>/savepoints/<name>/_metadata`.
pub fn savepoint_path(job: &str, name: &str) -> Result<String> {
    validate_name("job id", job)?;
    validate_name("savepoint name", name)?;
    Ok(format!("jobs/{job}/savepoints/{name}/_metadata"))
}

/// `jobs/<job>/failures/<at_ms>-<attempt>`: one failed attempt of the job's history
/// (the job's id was validated when it was submitted).
pub fn failure_path(job: &str, at_ms: u64, attempt: u64) -> String {
    format!("{}/{at_ms:020}-{attempt:020}", failures_dir(job))
}

/// `jobs/<job>/failures`.
pub fn failures_dir(job: &str) -> String {
    format!("jobs/{job}/failures")
}

/// The job's recorded failures (see [`failure_path`]), oldest first; unreadable ones are
/// skipped with a warning.
pub async fn failure_history<T: serde::de::DeserializeOwned>(
    store: &dyn MetadataStore,
    job: &str,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    for path in store.list(&failures_dir(job)).await? {
        if let Some(bytes) = store.get(&path).await? {
            match serde_json::from_slice(&bytes) {
                Ok(f) => out.push(f),
                Err(e) => tracing::warn!(%path, "a failure record that does not parse: {e}"),
            }
        }
    }
    Ok(out)
}

/// The checkpoint id of a path made by [`checkpoint_path`] (below `dir`), if it is one.
fn checkpoint_id_of(dir: &str, path: &str) -> Option<u64> {
    let rest = path.strip_prefix(dir)?.strip_prefix('/')?;
    let id = rest.strip_suffix("/_metadata")?;
    (id.len() == 20 && id.bytes().all(|b| b.is_ascii_digit()))
        .then(|| id.parse().ok())
        .flatten()
}

/// Ids of the job's checkpoints that have a `_metadata` object, ascending (whether
/// they decode is not checked).
pub async fn checkpoint_ids(store: &dyn MetadataStore, job: &str) -> Result<Vec<u64>> {
    let dir = checkpoints_dir(job)?;
    let mut ids: Vec<u64> = store
        .list(&dir)
        .await?
        .iter()
        .filter_map(|p| checkpoint_id_of(&dir, p))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Reads and decodes the `_metadata` object at `path`.
pub async fn read_metadata(store: &dyn MetadataStore, path: &str) -> Result<CheckpointMetadata> {
    let bytes = store
        .get(path)
        .await?
        .ok_or_else(|| Error::NotFound(path.to_string()))?;
    decode(&bytes).map_err(|source| Error::Corrupt {
        path: path.to_string(),
        source,
    })
}

/// Reads the `_metadata` object at `path` and the channel-state objects its tasks
/// reference (an unaligned checkpoint), each checked: what a restore needs.
pub async fn read_restorable(store: &dyn MetadataStore, path: &str) -> Result<CheckpointMetadata> {
    let mut meta = read_metadata(store, path).await?;
    for task in &mut meta.tasks {
        let Some(handle) = task.channel_state_handles.first() else {
            continue;
        };
        let corrupt = |reason: String| Error::Corrupt {
            path: path.to_string(),
            source: MetadataError::ChannelState {
                path: handle.clone(),
                reason,
            },
        };
        let object = store
            .get(handle)
            .await?
            .ok_or_else(|| corrupt("is missing".into()))?;
        sluice_common::channel_state::decode(&object).map_err(|e| corrupt(e.to_string()))?;
        task.channel_state = Some(object);
    }
    Ok(meta)
}

/// Deletes checkpoint `id`'s `_metadata` first (so that nothing restores from it), then
/// the channel state objects beside it.
pub async fn delete_checkpoint(store: &dyn MetadataStore, job: &str, id: u64) -> Result<()> {
    store.delete(&checkpoint_path(job, id)?).await?;
    let dir = format!("{}/{id:020}/channel-state/", checkpoints_dir(job)?);
    for path in store.list(&dir).await? {
        store.delete(&path).await?;
    }
    Ok(())
}

/// The newest checkpoint of `job` whose `_metadata` and channel state read back intact;
/// newer ones that do not are skipped with a warning. `None` when the job has no usable
/// checkpoint.
pub async fn latest_valid(
    store: &dyn MetadataStore,
    job: &str,
) -> Result<Option<CheckpointMetadata>> {
    for id in checkpoint_ids(store, job).await?.into_iter().rev() {
        let path = checkpoint_path(job, id)?;
        match read_restorable(store, &path).await {
            Ok(meta) if meta.checkpoint_id == id && meta.job_id == job => return Ok(Some(meta)),
            Ok(meta) => tracing::warn!(
                %path, found_job = %meta.job_id, found_id = meta.checkpoint_id,
                "checkpoint metadata names another job or checkpoint; using an older checkpoint"
            ),
            Err(Error::Corrupt { path, source }) => tracing::warn!(
                %path, error = %source,
                "checkpoint metadata is corrupt or truncated; using an older checkpoint"
            ),
            // Listed a moment ago, gone now (deleted by retention): not a corruption.
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// An in-memory store for unit tests (and embedded single-process runs that need no
/// recovery).
#[derive(Debug, Default, Clone)]
pub struct MemoryMetadataStore {
    objects: Arc<Mutex<BTreeMap<String, Bytes>>>,
}

impl MemoryMetadataStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces an object's bytes, bypassing create-if-absent: for tests that corrupt.
    pub fn overwrite(&self, path: &str, bytes: Bytes) {
        self.lock().insert(path.to_string(), bytes);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl MetadataStore for MemoryMetadataStore {
    async fn create_if_absent(&self, path: &str, bytes: Bytes) -> Result<CreateOutcome> {
        let mut objects = self.lock();
        if objects.contains_key(path) {
            return Ok(CreateOutcome::AlreadyExists);
        }
        objects.insert(path.to_string(), bytes);
        Ok(CreateOutcome::Created)
    }

    async fn get(&self, path: &str) -> Result<Option<Bytes>> {
        Ok(self.lock().get(path).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let dir = format!("{}/", prefix.trim_end_matches('/'));
        Ok(self
            .lock()
            .keys()
            .filter(|k| k.starts_with(&dir))
            .cloned()
            .collect())
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.lock().remove(path);
        Ok(())
    }
}

/// A [`MetadataStore`] over an [`ObjectStore`]: a local directory or S3.
#[derive(Debug, Clone)]
pub struct ObjectMetadataStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    display: String,
}

impl ObjectMetadataStore {
    /// Uses `store`, with every path below `root`.
    pub fn new(store: Arc<dyn ObjectStore>, root: Path) -> Self {
        let display = format!("{store}/{root}");
        Self {
            store,
            root,
            display,
        }
    }

    /// Builds the store a URL names (see `sluice-storage`): a local directory
    /// (`file:///abs/dir` or a plain path, created if missing), `s3://bucket/prefix`
    /// (credentials, region and endpoint from the usual AWS environment variables or
    /// `?endpoint=...&region=...`) or `azblob://container/prefix`.
    pub fn from_url(url: &str) -> Result<Self> {
        let options = StoreOptions {
            create_local_root: true,
            ..StoreOptions::default()
        };
        let store = Store::open(url, &options).map_err(|e| Error::Config(e.to_string()))?;
        let mut s = Self::new(Arc::clone(store.store()), store.root().clone());
        s.display = store.display().to_string();
        Ok(s)
    }

    /// Where the store is, for messages (no credentials).
    pub fn display(&self) -> &str {
        &self.display
    }

    /// See [`MetadataStore::relative`].
    fn relative_to_root(&self, path: &str) -> std::result::Result<String, String> {
        let path = path.strip_prefix("file://").unwrap_or(path);
        if !path.starts_with('/') && !path.contains("://") {
            return Ok(path.to_owned());
        }
        let root = self.display.trim_end_matches('/');
        match path.strip_prefix(root) {
            Some(rest) if rest.starts_with('/') => Ok(rest.trim_start_matches('/').to_owned()),
            _ => Err(format!(
                "`{path}` is not in the coordinator's store ({root}): give a path inside it, \
                 absolute or relative to it (jobs/<job>/...)"
            )),
        }
    }

    fn location(&self, rel: &str) -> Path {
        sluice_storage::child(&self.root, rel)
    }

    /// After an ambiguous or refused create: whose object is at `path`?
    async fn resolve(&self, path: &str, ours: &Bytes) -> Result<Option<CreateOutcome>> {
        Ok(self.get(path).await?.map(|found| {
            if found == ours {
                CreateOutcome::Created
            } else {
                CreateOutcome::AlreadyExists
            }
        }))
    }
}

#[async_trait]
impl MetadataStore for ObjectMetadataStore {
    fn relative(&self, path: &str) -> std::result::Result<String, String> {
        self.relative_to_root(path)
    }

    async fn create_if_absent(&self, path: &str, bytes: Bytes) -> Result<CreateOutcome> {
        let location = self.location(path);
        let put =
            sluice_storage::create_if_absent(self.store.as_ref(), &location, bytes.clone()).await;
        match put {
            Ok(CreateOutcome::Created) => Ok(CreateOutcome::Created),
            // Someone's object is there; it is ours only if our own earlier attempt (a
            // retry inside the client) landed.
            Ok(CreateOutcome::AlreadyExists) => Ok(self
                .resolve(path, &bytes)
                .await?
                .unwrap_or(CreateOutcome::AlreadyExists)),
            Err(
                e @ (object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. }),
            ) => Err(Error::store(
                format!("creating {location}: the store has no conditional put"),
                e,
            )),
            Err(e) => match self.resolve(path, &bytes).await {
                Ok(Some(outcome)) => Ok(outcome),
                _ => Err(Error::store(format!("creating {location}"), e)),
            },
        }
    }

    async fn get(&self, path: &str) -> Result<Option<Bytes>> {
        let location = self.location(path);
        match self.store.get(&location).await {
            Ok(r) => r
                .bytes()
                .await
                .map(Some)
                .map_err(|e| Error::store(format!("reading {location}"), e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store(format!("reading {location}"), e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let location = self.location(prefix);
        let metas: Vec<_> = self
            .store
            .list(Some(&location))
            .try_collect()
            .await
            .map_err(|e| Error::store(format!("listing {location}"), e))?;
        let root: Vec<_> = self.root.parts().collect();
        let mut paths: Vec<String> = metas
            .into_iter()
            .map(|m| {
                m.location
                    .parts()
                    .skip(root.len())
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect();
        paths.sort();
        Ok(paths)
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let location = self.location(path);
        match self.store.delete(&location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store(format!("deleting {location}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::metadata::encode;
    use crate::checkpoint::metadata::tests::sample;

    fn meta(id: u64) -> CheckpointMetadata {
        let mut m = CheckpointMetadata {
            savepoint: None,
            kept: false,
            ..sample(id)
        };
        for t in &mut m.tasks {
            t.channel_state_handles.clear();
        }
        m
    }

    /// The id of the checkpoint recovery would use.
    async fn latest_id(store: &dyn MetadataStore) -> u64 {
        latest_valid(store, "q5")
            .await
            .unwrap()
            .unwrap()
            .checkpoint_id
    }

    /// Checkpoint `id` with a channel-state object for its task, both written to `store`.
    async fn unaligned(store: &dyn MetadataStore, id: u64) -> (String, Bytes) {
        use sluice_common::channel_state::{ChannelKey, ChannelPart, Side, encode as encode_cs};
        let mut m = meta(id);
        let task = m.tasks[0].task;
        let path = channel_state_path("q5", id, task);
        let object = encode_cs(&[ChannelPart {
            key: ChannelKey {
                consumer_node: task.node,
                consumer_subtask: task.subtask,
                consumer_parallelism: 2,
                producer_subtask: 1,
                producer_parallelism: 2,
            },
            side: Side::Input,
            bytes: Bytes::from(vec![id as u8; 100]),
        }]);
        m.tasks[0].channel_state_handles = vec![path.clone()];
        store.create_if_absent(&path, object.clone()).await.unwrap();
        store
            .create_if_absent(&checkpoint_path("q5", id).unwrap(), encode(&m))
            .await
            .unwrap();
        (path, object)
    }

    #[tokio::test]
    async fn a_checkpoint_whose_channel_state_is_corrupt_or_missing_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("meta");
        let store = ObjectMetadataStore::from_url(&root.display().to_string()).unwrap();
        let mut objects = Vec::new();
        for id in 1..=3 {
            objects.push(unaligned(&store, id).await);
        }
        let latest = latest_valid(&store, "q5").await.unwrap().unwrap();
        assert_eq!(latest.checkpoint_id, 3);
        assert_eq!(latest.tasks[0].channel_state.as_ref(), Some(&objects[2].1));
        // A flipped byte in checkpoint 3's channel state: checkpoint 2 is used.
        let file = root.join(&objects[2].0);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[20] ^= 0x01;
        std::fs::write(&file, bytes).unwrap();
        assert_eq!(latest_id(&store).await, 2);
        let err = read_restorable(&store, &checkpoint_path("q5", 3).unwrap())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("channel-state/") && err.contains("checksum mismatch"),
            "{err}"
        );
        // Checkpoint 2's is truncated, then gone: checkpoint 1.
        let file = root.join(&objects[1].0);
        let len = std::fs::metadata(&file).unwrap().len();
        std::fs::write(&file, &std::fs::read(&file).unwrap()[..len as usize - 3]).unwrap();
        assert_eq!(latest_id(&store).await, 1);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(latest_id(&store).await, 1);
        // Deleting a checkpoint takes its channel state with it.
        delete_checkpoint(&store, "q5", 1).await.unwrap();
        assert!(store.get(&objects[0].0).await.unwrap().is_none());
        assert_eq!(checkpoint_ids(&store, "q5").await.unwrap(), vec![2, 3]);
    }

    #[test]
    fn layout_and_names() {
        assert_eq!(
            checkpoint_path("q5", 42).unwrap(),
            "jobs/q5/checkpoints/00000000000000000042/_metadata"
        );
        assert_eq!(
            savepoint_path("q5", "v1.2_pre-upgrade").unwrap(),
            "jobs/q5/savepoints/v1.2_pre-upgrade/_metadata"
        );
        for bad in ["", ".", "..", "a/b", "a b", "é"] {
            let err = savepoint_path("q5", bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidName {
                        what: "savepoint name",
                        ..
                    }
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            checkpoint_path("../x", 1),
            Err(Error::InvalidName { .. })
        ));
        assert_eq!(
            checkpoint_id_of("jobs/q5/checkpoints", &checkpoint_path("q5", 9).unwrap()),
            Some(9)
        );
        assert_eq!(
            checkpoint_id_of("jobs/q5/checkpoints", "jobs/q5/checkpoints/9/_metadata"),
            None
        );
        assert_eq!(
            checkpoint_id_of(
                "jobs/q5/checkpoints",
                "jobs/q5/checkpoints/00000000000000000009/other"
            ),
            None
        );
    }

    async fn exercise(store: &dyn MetadataStore) {
        assert_eq!(latest_valid(store, "q5").await.unwrap(), None);
        for id in [1, 2, 10] {
            let path = checkpoint_path("q5", id).unwrap();
            let out = store
                .create_if_absent(&path, encode(&meta(id)))
                .await
                .unwrap();
            assert_eq!(out, CreateOutcome::Created);
        }
        // Same bytes again: our own object (an answer lost and retried).
        let p10 = checkpoint_path("q5", 10).unwrap();
        let again = store
            .create_if_absent(&p10, encode(&meta(10)))
            .await
            .unwrap();
        assert!(matches!(
            again,
            CreateOutcome::Created | CreateOutcome::AlreadyExists
        ));
        let other = CheckpointMetadata {
            coordinator_id: "coord-b".into(),
            ..meta(10)
        };
        assert_eq!(
            store.create_if_absent(&p10, encode(&other)).await.unwrap(),
            CreateOutcome::AlreadyExists
        );
        assert_eq!(read_metadata(store, &p10).await.unwrap(), meta(10));
        // A job whose id is a prefix of another's is not listed with it.
        let p_other_job = checkpoint_path("q55", 99).unwrap();
        store
            .create_if_absent(&p_other_job, encode(&meta(99)))
            .await
            .unwrap();
        assert_eq!(checkpoint_ids(store, "q5").await.unwrap(), vec![1, 2, 10]);
        assert_eq!(
            latest_valid(store, "q5")
                .await
                .unwrap()
                .unwrap()
                .checkpoint_id,
            10
        );
        assert!(matches!(
            read_metadata(store, &checkpoint_path("q5", 3).unwrap()).await,
            Err(Error::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn memory_store_creates_once_and_lists() {
        exercise(&MemoryMetadataStore::new()).await;
    }

    #[tokio::test]
    async fn local_store_creates_once_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("meta").display());
        let store = ObjectMetadataStore::from_url(&url).unwrap();
        exercise(&store).await;
        // Exactly the objects written, no staging leftovers.
        let all = store.list("jobs").await.unwrap();
        assert_eq!(all.len(), 4, "{all:?}");
    }

    #[test]
    fn an_absolute_path_inside_the_store_names_the_same_object_as_a_relative_one() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("meta");
        let store = ObjectMetadataStore::from_url(&root.display().to_string()).unwrap();
        let rel = "jobs/q5/checkpoints/00000000000000000007/_metadata";
        let abs = format!("{}/{rel}", root.display());
        assert_eq!(store.relative(rel).unwrap(), rel);
        assert_eq!(store.relative(&abs).unwrap(), rel);
        assert_eq!(store.relative(&format!("file://{abs}")).unwrap(), rel);
        let err = store.relative("/elsewhere/jobs/q5/_metadata").unwrap_err();
        assert!(
            err.contains("not in the coordinator's store")
                && err.contains(&*root.to_string_lossy()),
            "{err}"
        );
        let err = store.relative("s3://bucket/jobs/q5/_metadata").unwrap_err();
        assert!(err.contains("not in the coordinator's store"), "{err}");
    }

    #[tokio::test]
    async fn a_corrupt_or_truncated_newest_checkpoint_is_skipped() {
        let store = MemoryMetadataStore::new();
        for id in 1..=3 {
            let path = checkpoint_path("q5", id).unwrap();
            store
                .create_if_absent(&path, encode(&meta(id)))
                .await
                .unwrap();
        }
        let p3 = checkpoint_path("q5", 3).unwrap();
        let good3 = encode(&meta(3));
        store.overwrite(&p3, good3.slice(..good3.len() - 5));
        assert_eq!(latest_id(&store).await, 2);
        let p2 = checkpoint_path("q5", 2).unwrap();
        let mut flipped = encode(&meta(2)).to_vec();
        flipped[30] ^= 0x10;
        store.overwrite(&p2, Bytes::from(flipped));
        assert_eq!(latest_id(&store).await, 1);
        assert!(matches!(
            read_metadata(&store, &p2).await,
            Err(Error::Corrupt { .. })
        ));
        // Metadata of another checkpoint copied into place is not trusted either.
        let p1 = checkpoint_path("q5", 1).unwrap();
        store.overwrite(&p1, encode(&meta(7)));
        assert_eq!(latest_valid(&store, "q5").await.unwrap(), None);
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for url in ["hdfs://nn/x", "file://relative", "s3:///nobucket", ""] {
            assert!(
                matches!(ObjectMetadataStore::from_url(url), Err(Error::Config(_))),
                "{url}"
            );
        }
        assert!(matches!(
            ObjectMetadataStore::from_url("s3://b/p?colour=blue"),
            Err(Error::Config(m)) if m.contains("colour")
        ));
    }
}
