//! Snapshots: a RocksDB checkpoint (hard links) taken under the shard's write lock right
//! after a delta is cut, uploaded in the background so flush latency does not pay for
//! it.
//!
//! SST files are immutable and their names unique within one database, so a file
//! uploaded for an earlier snapshot is not uploaded again (incremental, as Flink's
//! incremental RocksDB checkpoints); uploaded SSTs are named `sst/<instance>-<file>`,
//! where the instance is unique per opening of the shard, so two lives of a shard never
//! collide. The other files (MANIFEST, CURRENT, OPTIONS) go to `snapshots/<seq>/`. A
//! snapshot becomes the base of later manifests only once every file is uploaded.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::DB;
use rocksdb::checkpoint::Checkpoint;

use crate::error::{Error, Result};
use crate::manifest::{SnapshotFile, SnapshotRef};
use crate::shard::{Durability, Shard, lock};

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

/// Starts uploading the checkpoint in `dir`, cut at delta `seq`, in the background.
pub(crate) fn start_upload(
    shard: &Arc<Shard>,
    d: &mut Durability,
    seq: u64,
    dir: PathBuf,
) -> Result<()> {
    let mut files = Vec::new();
    let mut to_upload = Vec::new();
    {
        let uploaded = lock(&shard.uploaded_sst);
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
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
                        format!("sst/{}-{local}", shard.instance)
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
    }
    files.sort_by(|a, b| a.local.cmp(&b.local));
    d.snapshot_in_progress = Some(
        files
            .iter()
            .map(|f| f.object.clone())
            .collect::<HashSet<_>>(),
    );
    let shard2 = Arc::clone(shard);
    let task = tokio::spawn(async move {
        let shard = shard2;
        let mut failed = None;
        for (local, object, size) in &to_upload {
            match shard
                .durable
                .put_file(&shard.object(object), &dir.join(local))
                .await
            {
                Ok(_) => {
                    if local.ends_with(".sst") {
                        lock(&shard.uploaded_sst).insert(local.clone(), (object.clone(), *size));
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        {
            let mut d = shard.durability.lock().await;
            d.snapshot_in_progress = None;
            match failed {
                None => {
                    d.chain.retain(|x| x.seq > seq);
                    d.snapshot = Some(SnapshotRef { seq, files });
                    tracing::debug!("snapshot {seq} of {} uploaded", shard.id);
                }
                Some(e) => tracing::warn!("snapshot {seq} of {} not uploaded: {e}", shard.id),
            }
        }
        let _ = tokio::task::spawn_blocking(move || Shard::remove_local(&dir)).await;
    });
    if let Some(old) = lock(&shard.snapshot_task).replace(task) {
        old.abort();
    }
    Ok(())
}
