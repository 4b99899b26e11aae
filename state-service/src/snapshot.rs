//! Snapshots: a RocksDB checkpoint (hard links) taken under the shard's write lock right
//! after a delta is cut, all in a background task (see `start`) so neither flush nor
//! commit latency pays for it: the memtables are flushed before, without the lock, so
//! the checkpoint under the lock only flushes what was written since.
//!
//! SST files are immutable and their names unique within one database, so a file
//! uploaded for an earlier snapshot is not uploaded again (incremental, as Flink's
//! incremental RocksDB checkpoints); uploaded SSTs are named `sst/<instance>-<file>`,
//! where the instance is unique per opening of the shard, so two lives of a shard never
//! collide. The other files (MANIFEST, CURRENT, OPTIONS) go to `snapshots/<seq>/`. A
//! snapshot becomes the base of later manifests only once every file is uploaded.
//!
//! The module works on a `Snapshotted` shard: its objects (`ShardObjects`), its
//! durable state and the two blocking steps only the shard can take (flushing its
//! memtables, cutting its spool together with a RocksDB checkpoint). `shard.rs`
//! implements it and calls `start` and `create_checkpoint`; nothing here imports the
//! shard.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::DB;
use rocksdb::checkpoint::Checkpoint;
use tokio_util::task::AbortOnDropHandle;

use crate::delta::CutSpool;
use crate::durability::{Durability, ShardObjects};
use crate::error::{Error, Result};
use crate::local_dir;
use crate::lock::lock;
use crate::manifest::{SnapshotFile, SnapshotRef};

/// What a snapshot needs of a shard beyond its objects.
pub(crate) trait Snapshotted: ShardObjects {
    /// Unique name of this opening of the shard, part of uploaded SST names.
    fn instance(&self) -> &str;
    /// The shard's durable state, behind its async lock.
    fn durability(&self) -> &tokio::sync::Mutex<Durability>;
    /// Flushes every column family's memtables (blocking, without the write lock).
    fn flush_memtables(&self) -> Result<()>;
    /// Cuts the spool and takes a RocksDB checkpoint of exactly that state (blocking,
    /// under the write lock): `(delta seq, the cut delta if any, checkpoint directory)`,
    /// `None` when no delta was ever cut.
    fn cut_with_checkpoint(&self) -> Result<Option<(u64, Option<CutSpool>, PathBuf)>>;
}

/// Creates a RocksDB checkpoint of `db` at `path` (which must not exist yet; blocking).
pub fn create_checkpoint(db: &DB, path: &Path) -> Result<()> {
    if path.exists() {
        std::fs::remove_dir_all(path).map_err(|e| Error::io(path, e))?;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    Checkpoint::new(db)?.create_checkpoint(path)?;
    Ok(())
}

/// Starts a snapshot in the background; dropping the returned handle aborts it (the
/// shard keeps it, so a new snapshot or the shard's closing aborts an earlier one).
///
/// Steps: flush the memtables without any lock (the slow part, while writes go on);
/// then, under the durability lock, cut the spool into a delta and take the checkpoint
/// under the write lock (cheap: only what was written since the flush is flushed again),
/// queue that delta for the next flush to upload, and upload the checkpoint's files.
/// Neither a flush nor a commit waits for it, except for the short cut.
pub(crate) fn start<S: Snapshotted>(shard: &Arc<S>) -> AbortOnDropHandle<()> {
    let s = Arc::clone(shard);
    AbortOnDropHandle::new(tokio::spawn(async move {
        if let Err(e) = run(&s).await {
            tracing::warn!("snapshot of {} not taken: {e}", s.id());
        }
    }))
}

async fn run<S: Snapshotted>(shard: &Arc<S>) -> Result<()> {
    let started = std::time::Instant::now();
    let s = Arc::clone(shard);
    tokio::task::spawn_blocking(move || s.flush_memtables()).await??;
    let flushed = started.elapsed();
    let (seq, dir, files, to_upload) = {
        let mut d = shard.durability().lock().await;
        if d.snapshot_in_progress.is_some() {
            return Ok(());
        }
        let s = Arc::clone(shard);
        let Some((seq, cut, dir)) =
            tokio::task::spawn_blocking(move || s.cut_with_checkpoint()).await??
        else {
            return Ok(());
        };
        // The delta ends exactly where the checkpoint is; the next flush uploads it.
        if let Some(cut) = cut {
            d.pending.push_back((seq, cut));
        }
        if d.snapshot.as_ref().is_some_and(|s| s.seq >= seq) {
            // Nothing was written since the last snapshot.
            let _ = tokio::task::spawn_blocking(move || local_dir::remove(&dir)).await;
            return Ok(());
        }
        let (files, to_upload) = list_files(shard.as_ref(), seq, &dir)?;
        d.snapshot_in_progress = Some(
            files
                .iter()
                .map(|f| f.object.clone())
                .collect::<HashSet<_>>(),
        );
        tracing::debug!(
            "snapshot {seq} of {}: memtables flushed in {} ms, cut and checkpoint after {} ms",
            shard.id(),
            flushed.as_millis(),
            started.elapsed().as_millis()
        );
        (seq, dir, files, to_upload)
    };
    upload(shard.as_ref(), seq, dir, files, to_upload).await;
    Ok(())
}

/// Files to upload: (local name, object, size).
type ToUpload = Vec<(String, String, u64)>;

/// The checkpoint's files with their objects, and those not uploaded yet.
fn list_files(
    shard: &impl Snapshotted,
    seq: u64,
    dir: &Path,
) -> Result<(Vec<SnapshotFile>, ToUpload)> {
    let mut files = Vec::new();
    let mut to_upload = Vec::new();
    let uploaded = lock(shard.uploaded_sst());
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let local = entry.file_name().to_string_lossy().into_owned();
        let size = entry
            .metadata()
            .map_err(|e| Error::io(entry.path(), e))?
            .len();
        let known = local
            .ends_with(".sst")
            .then(|| uploaded.get(&local).cloned())
            .flatten();
        let object = match known {
            Some((object, _)) => object,
            None => {
                let object = if local.ends_with(".sst") {
                    format!("sst/{}-{local}", shard.instance())
                } else {
                    format!("snapshots/{seq:020}/{local}")
                };
                to_upload.push((local.clone(), object.clone(), size));
                object
            }
        };
        files.push(SnapshotFile {
            local,
            object,
            size,
        });
    }
    files.sort_by(|a, b| a.local.cmp(&b.local));
    Ok((files, to_upload))
}

/// Uploads the files of the checkpoint in `dir` one at a time (each streamed), then
/// makes it the shard's snapshot, or drops it when an upload failed.
async fn upload(
    shard: &impl Snapshotted,
    seq: u64,
    dir: PathBuf,
    files: Vec<SnapshotFile>,
    to_upload: ToUpload,
) {
    let mut failed = None;
    for (local, object, size) in &to_upload {
        match shard
            .durable()
            .put_file(&shard.object(object), &dir.join(local))
            .await
        {
            Ok(_) => {
                if local.ends_with(".sst") {
                    lock(shard.uploaded_sst()).insert(local.clone(), (object.clone(), *size));
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    {
        let mut d = shard.durability().lock().await;
        d.snapshot_in_progress = None;
        match failed {
            None => {
                d.chain.retain(|x| x.seq > seq);
                d.snapshot = Some(SnapshotRef { seq, files });
                tracing::debug!("snapshot {seq} of {} uploaded", shard.id());
            }
            Some(e) => tracing::warn!("snapshot {seq} of {} not uploaded: {e}", shard.id()),
        }
    }
    let _ = tokio::task::spawn_blocking(move || local_dir::remove(&dir)).await;
}
