//! Opening a shard on this node: empty when the object store has no manifest for it,
//! otherwise restored from a manifest.
//!
//! Restore of checkpoint C: download the manifest's snapshot files into a fresh local
//! directory (streamed to the files), open RocksDB on them (with the uncommitted epochs
//! the snapshot stored), replay the manifest's deltas in order through the live write
//! path (the rollback markers in them roll back as they did live), then drop every epoch
//! `> C` and commit C, which applies the epochs up to it. The
//! new spool starts with a rollback-to-C marker, so a later manifest that lists the
//! same deltas followed by new ones replays to the same state. Local files of an earlier
//! life of the shard are never reused: the object store is the only source.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cache::StateCache;
use crate::delta::{self, Op, Record};
use crate::durability::Durability;
use crate::error::{Error, Result};
use crate::lock::lock;
use crate::manifest::{DeltaRef, Manifest, delta_path, manifest_path, parse_numbered};
use crate::rocks::Rocks;
use crate::shard::{Shard, ShardParts};
use crate::shard_id::ShardKey;
use crate::store::{Durable, child};
use crate::ttl_filter::TtlStates;

/// What every shard of a node is built with.
#[derive(Clone, Debug)]
pub struct NodeParts {
    /// `data_dir` of the configuration.
    pub data_dir: PathBuf,
    /// The shared RocksDB resources.
    pub rocks: Arc<Rocks>,
    /// The shared read cache.
    pub cache: Arc<StateCache>,
    /// The object store.
    pub durable: Durable,
    /// What the shards' uncommitted layers may hold in memory together.
    pub pending: Arc<crate::spill::PendingBudget>,
}

/// An opened shard and how it came to be.
#[derive(Debug)]
pub struct Opened {
    /// The shard.
    pub shard: Arc<Shard>,
    /// The checkpoint it holds.
    pub checkpoint: u64,
    /// Whether it was read from the object store.
    pub restored: bool,
    /// Bytes downloaded.
    pub bytes: u64,
}

fn instance_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{nanos:x}{:x}{:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The highest numbered object below `prefix` named `<n:020>.<ext>`, and all numbers.
async fn numbered(
    durable: &Durable,
    prefix: &object_store::path::Path,
    ext: &str,
) -> Result<Vec<u64>> {
    let mut out: Vec<u64> = durable
        .list(prefix)
        .await?
        .iter()
        .filter_map(|p| p.filename().and_then(|n| parse_numbered(n, ext)))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Opens `id` at `checkpoint` (0: the latest committed one, or empty).
pub async fn open(
    node: &NodeParts,
    id: ShardKey,
    checkpoint: u64,
    ttl: TtlStates,
) -> Result<Opened> {
    let root = node.durable.shard_root(&id);
    let manifests = numbered(&node.durable, &root.clone().join("manifests"), "manifest").await?;
    let deltas = numbered(&node.durable, &root.clone().join("deltas"), "delta").await?;
    let next_delta_seq = deltas.last().map_or(1, |s| s + 1);

    let dir = node
        .data_dir
        .join("shards")
        .join(&id.job)
        .join(format!("{}-{}", id.start, id.end));
    let dir2 = dir.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        crate::local_dir::remove(&dir2);
        std::fs::create_dir_all(dir2.join("db")).map_err(|e| Error::io(&dir2, e))
    })
    .await??;

    // `base` is the manifest restored from; a checkpoint newer than every manifest is one
    // the coordinator committed after every writer flushed it but before this shard
    // heard of the commit (its node died): the deltas after the newest manifest hold it.
    let (target, base, beyond) = match (manifests.last(), checkpoint) {
        (None, 0) => (None, None, false),
        (Some(&latest), 0) => (Some(latest), Some(latest), false),
        (_, c) if manifests.binary_search(&c).is_ok() => (Some(c), Some(c), false),
        (latest, c) if latest.is_none_or(|&l| l < c) => (Some(c), latest.copied(), true),
        (_, c) => {
            return Err(Error::NotFound(format!(
                "checkpoint {c} of {id} has no manifest in {} (committed: {manifests:?}) and \
                 is older than the newest one",
                node.durable.display()
            )));
        }
    };
    let Some(target) = target else {
        let shard = build(
            node,
            id,
            dir,
            ttl,
            next_delta_seq,
            Durability::default(),
            HashMap::new(),
            0,
        )
        .await?;
        // The first flush then uploads a delta even when nothing was written, so a
        // checkpoint committed before this shard's first manifest is told apart from a
        // shard this object store never had (see `beyond` below).
        let s = Arc::clone(&shard);
        tokio::task::spawn_blocking(move || lock(&s.live).spool.append(&Record::Rollback(0)))
            .await??;
        return Ok(Opened {
            shard,
            checkpoint: 0,
            restored: false,
            bytes: 0,
        });
    };

    let manifest_location = child(&root, &manifest_path(base.unwrap_or(target)));
    let (mut manifest, mut downloaded) = match base {
        Some(_) => {
            let bytes = node.durable.get(&manifest_location).await?;
            let manifest = Manifest::decode(&bytes, manifest_location.as_ref())?;
            (manifest, bytes.len() as u64)
        }
        None => (
            Manifest {
                checkpoint: 0,
                snapshot: None,
                deltas: Vec::new(),
            },
            0,
        ),
    };
    if beyond {
        let covered = manifest
            .deltas
            .iter()
            .map(|d| d.seq)
            .chain(manifest.snapshot.as_ref().map(|s| s.seq))
            .max()
            .unwrap_or(0);
        let later: Vec<u64> = deltas.iter().copied().filter(|&s| s > covered).collect();
        if base.is_none() && later.is_empty() {
            // Every shard's first flush leaves a delta (its spool starts with a marker),
            // so a checkpoint whose writers flushed this shard left something here.
            return Err(Error::NotFound(format!(
                "checkpoint {target} of {id} has nothing in {}: no manifest and no delta",
                node.durable.display()
            )));
        }
        // No later delta is fine: the checkpoint's epochs wrote nothing to this shard,
        // so its state at C is that of the newest manifest.
        tracing::info!(
            "{id}: checkpoint {target} committed without a manifest here (the node died \
             before hearing of it); restoring it from manifest {} and {} later deltas",
            manifest.checkpoint,
            later.len()
        );
        for seq in later {
            manifest.deltas.push(DeltaRef { seq, bytes: 0 });
        }
        manifest.checkpoint = target;
    }
    let mut uploaded_sst = HashMap::new();
    if let Some(snap) = &manifest.snapshot {
        for f in &snap.files {
            if f.local.contains('/') || f.local.starts_with('.') {
                return Err(Error::Corrupt {
                    object: manifest_location.to_string(),
                    reason: format!("snapshot file name {:?}", f.local),
                });
            }
            let location = child(&root, &f.object);
            let path = dir.join("db").join(&f.local);
            let size = node.durable.get_to_file(&location, &path).await?;
            if size != f.size {
                return Err(Error::Corrupt {
                    object: location.to_string(),
                    reason: format!("{size} bytes, the manifest says {}", f.size),
                });
            }
            downloaded += f.size;
            if f.local.ends_with(".sst") {
                uploaded_sst.insert(f.local.clone(), (f.object.clone(), f.size));
            }
        }
    }
    let durability = Durability {
        chain: manifest.deltas.clone(),
        snapshot: manifest.snapshot.clone(),
        last_handle: manifest
            .deltas
            .last()
            .map(|x| child(&root, &delta_path(x.seq)).to_string())
            .unwrap_or_default(),
        manifests: BTreeMap::from([(target, manifest.clone())]),
        ..Durability::default()
    };
    let shard = build(
        node,
        id,
        dir,
        ttl,
        next_delta_seq,
        durability,
        uploaded_sst,
        0,
    )
    .await?;

    // Each delta is downloaded into a file and replayed from it record by record, so a
    // restore holds neither a whole delta nor a whole snapshot file in memory.
    let restore_dir = shard.dir.join("restore");
    tokio::fs::create_dir_all(&restore_dir)
        .await
        .map_err(|e| Error::io(&restore_dir, e))?;
    for x in &manifest.deltas {
        let location = child(&root, &delta_path(x.seq));
        let path = restore_dir.join(format!("{:020}.delta", x.seq));
        downloaded += node.durable.get_to_file(&location, &path).await?;
        let s = Arc::clone(&shard);
        let object = location.to_string();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut reader = delta::FileReader::open(&path, &object)?;
            replay(&s, &mut reader)?;
            drop(reader);
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))
        })
        .await??;
    }
    let s = Arc::clone(&shard);
    tokio::task::spawn_blocking(move || -> Result<()> {
        s.drop_after(target)?;
        s.mark_committed(target)?;
        s.last_durable_epoch.store(target, Ordering::SeqCst);
        s.flushed_epoch.store(target, Ordering::SeqCst);
        lock(&s.live).spool.append(&Record::Rollback(target))
    })
    .await??;
    shard.restore_bytes.store(downloaded, Ordering::SeqCst);
    crate::heap::release_freed();
    Ok(Opened {
        shard,
        checkpoint: target,
        restored: true,
        bytes: downloaded,
    })
}

/// Replays a delta's records (blocking).
fn replay(shard: &Shard, records: &mut delta::FileReader) -> Result<()> {
    let mut live = lock(&shard.live);
    let mut run: Vec<Op> = Vec::new();
    let mut run_epoch = 0;
    while let Some(r) = records.next_record()? {
        match r {
            Record::Write { epoch, op } => {
                if epoch != run_epoch && !run.is_empty() {
                    shard.apply(&mut live, run_epoch, std::mem::take(&mut run), false)?;
                }
                run_epoch = epoch;
                run.push(op);
                if run.len() >= 10_000 {
                    shard.apply(&mut live, run_epoch, std::mem::take(&mut run), false)?;
                }
            }
            Record::Rollback(c) => {
                if !run.is_empty() {
                    shard.apply(&mut live, run_epoch, std::mem::take(&mut run), false)?;
                }
                shard.drop_after(c)?;
            }
        }
    }
    if !run.is_empty() {
        shard.apply(&mut live, run_epoch, std::mem::take(&mut run), false)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn build(
    node: &NodeParts,
    id: ShardKey,
    dir: PathBuf,
    ttl: TtlStates,
    next_delta_seq: u64,
    durability: Durability,
    uploaded_sst: HashMap<String, (String, u64)>,
    restore_bytes: u64,
) -> Result<Arc<Shard>> {
    let rocks = Arc::clone(&node.rocks);
    let db_dir: PathBuf = dir.join("db");
    let ttl2 = ttl.clone();
    let db = tokio::task::spawn_blocking(move || rocks.open(Path::new(&db_dir), &ttl2)).await??;
    let parts = ShardParts {
        id,
        db,
        dir,
        instance: instance_name(),
        ttl,
        cache: Arc::clone(&node.cache),
        durable: node.durable.clone(),
        pending: Arc::clone(&node.pending),
        rocks: Arc::clone(&node.rocks),
        next_delta_seq,
        durability,
        uploaded_sst,
        restore_bytes,
    };
    Ok(Arc::new(
        tokio::task::spawn_blocking(move || Shard::new(parts)).await??,
    ))
}
