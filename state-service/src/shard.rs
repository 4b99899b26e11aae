//! One shard: a key-group range of one job in its own RocksDB instance, with its undo
//! log, its delta spool and what of it is durable in the object store.
//!
//! # Live state
//! A write (one `Write` RPC) takes the shard's write lock, reads the previous values of
//! the keys it touches, appends its records to the spool file, and applies one RocksDB
//! write batch holding the ops and their undo records (`undo.rs`). Readers never take
//! that lock: they go through the cache (`cache.rs`) and RocksDB. Cache consistency: a
//! reader that missed inserts what it read only if no write happened on the shard in the
//! meantime (a per-shard write counter); writes remove the keys they touch from the
//! cache (write-invalidate: only reads fill it); range deletes and rollbacks switch the
//! shard to a fresh cache generation.
//!
//! # Durability
//! `flush` cuts the spool into a numbered delta and uploads every cut delta in order (a
//! failed upload stays queued and is retried by the next flush); `commit` writes the
//! manifest (latest complete snapshot + deltas since), drops the undo records it makes
//! unnecessary and collects garbage (`gc.rs`). Snapshots (`snapshot.rs`) run in the
//! background: a flush that finds one due only starts it. Restore from the object
//! store is in `restore.rs`.
//!
//! Every method here that touches RocksDB blocks: the server calls them through
//! `spawn_blocking`.
//!
//! Snapshots and garbage collection see the shard only through the traits it implements
//! at the end of this file (`ShardObjects`, `Snapshotted`), so they import nothing
//! from here.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use rocksdb::{DB, IteratorMode, ReadOptions, WriteBatch};
use tokio_util::task::AbortOnDropHandle;

use crate::cache::StateCache;
use crate::delta::{CutSpool, Op, Record, Spool};
use crate::durability::{Durability, ShardObjects, UploadedSsts};
use crate::error::{Error, Result};
use crate::lock::lock;
use crate::manifest::{DeltaRef, Manifest, delta_path, manifest_path};
use crate::rocks::write_options;
use crate::shard_id::ShardKey;
use crate::snapshot::Snapshotted;
use crate::store::Durable;
use crate::ttl_filter::TtlStates;
use crate::undo::{self, CF_DEFAULT, CF_META, CF_UNDO};

/// A scan page: entries, and the key to resume from when more follow.
pub type ScanPage = (Vec<(Bytes, Bytes)>, Option<Bytes>);

/// Meta key of the committed checkpoint.
const META_COMMITTED: &[u8] = b"committed";

/// Snapshot once this many deltas were uploaded since the last one.
pub const SNAPSHOT_EVERY_DELTAS: usize = 10;
/// Snapshot once this many delta bytes were uploaded since the last one.
pub const SNAPSHOT_EVERY_BYTES: u64 = 64 << 20;

/// State behind the shard's write lock.
pub(crate) struct Live {
    pub(crate) spool: Spool,
    pub(crate) undo_seq: u64,
    pub(crate) next_delta_seq: u64,
}

/// The shard's cache generation and write counter.
#[derive(Clone, Copy)]
struct CacheGen {
    generation: u64,
    writes: u64,
}

/// An open shard.
pub struct Shard {
    pub(crate) id: ShardKey,
    pub(crate) db: DB,
    /// The shard's local directory (database, spool, cut deltas, checkpoints).
    pub(crate) dir: PathBuf,
    /// Unique name of this opening, part of uploaded SST names.
    pub(crate) instance: String,
    pub(crate) ttl: TtlStates,
    pub(crate) cache: Arc<StateCache>,
    pub(crate) durable: Durable,
    /// The shard's root in the object store.
    pub(crate) root: ObjectPath,
    pub(crate) live: Mutex<Live>,
    cache_gen: Mutex<CacheGen>,
    pub(crate) durability: tokio::sync::Mutex<Durability>,
    /// SST files of this database already uploaded: local name -> (object, size).
    pub(crate) uploaded_sst: Mutex<UploadedSsts>,
    pub(crate) committed: AtomicU64,
    pub(crate) last_durable_epoch: AtomicU64,
    pub(crate) restore_bytes: AtomicU64,
    /// The background snapshot upload, aborted when the shard goes.
    pub(crate) snapshot_task: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The parts a shard is built from.
pub(crate) struct ShardParts {
    pub(crate) id: ShardKey,
    pub(crate) db: DB,
    pub(crate) dir: PathBuf,
    pub(crate) instance: String,
    pub(crate) ttl: TtlStates,
    pub(crate) cache: Arc<StateCache>,
    pub(crate) durable: Durable,
    pub(crate) next_delta_seq: u64,
    pub(crate) durability: Durability,
    pub(crate) uploaded_sst: UploadedSsts,
    pub(crate) restore_bytes: u64,
}

impl Shard {
    /// Assembles a shard over an opened database, starting a fresh spool.
    pub(crate) fn new(parts: ShardParts) -> Result<Self> {
        let spool = Spool::create(&parts.dir.join("spool"))?;
        let root = parts.durable.shard_root(&parts.id);
        let generation = parts.cache.new_generation();
        let shard = Self {
            root,
            live: Mutex::new(Live {
                spool,
                undo_seq: 0,
                next_delta_seq: parts.next_delta_seq,
            }),
            cache_gen: Mutex::new(CacheGen {
                generation,
                writes: 0,
            }),
            durability: tokio::sync::Mutex::new(parts.durability),
            uploaded_sst: Mutex::new(parts.uploaded_sst),
            committed: AtomicU64::new(0),
            last_durable_epoch: AtomicU64::new(0),
            restore_bytes: AtomicU64::new(parts.restore_bytes),
            snapshot_task: Mutex::new(None),
            id: parts.id,
            db: parts.db,
            dir: parts.dir,
            instance: parts.instance,
            ttl: parts.ttl,
            cache: parts.cache,
            durable: parts.durable,
        };
        let committed = shard.read_committed()?;
        shard.committed.store(committed, Ordering::SeqCst);
        shard.last_durable_epoch.store(committed, Ordering::SeqCst);
        let next_undo = shard.last_undo_seq()?.map_or(0, |s| s + 1);
        lock(&shard.live).undo_seq = next_undo;
        Ok(shard)
    }

    fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| Error::Internal(format!("column family {name} missing in {}", self.id)))
    }

    fn read_committed(&self) -> Result<u64> {
        let v = self.db.get_cf(self.cf(CF_META)?, META_COMMITTED)?;
        Ok(
            v.and_then(|v| v.as_slice().try_into().ok().map(u64::from_be_bytes))
                .unwrap_or(0),
        )
    }

    fn last_undo_seq(&self) -> Result<Option<u64>> {
        let mut it = self.db.iterator_cf(self.cf(CF_UNDO)?, IteratorMode::End);
        match it.next() {
            Some(item) => {
                let (k, _) = item?;
                Ok(undo::decode_key(&k).map(|(_, s)| s))
            }
            None => Ok(None),
        }
    }

    /// The committed checkpoint.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::SeqCst)
    }

    /// Checks a write's epoch against the committed checkpoint.
    pub fn check_epoch(&self, epoch: u64) -> Result<()> {
        let c = self.committed();
        if epoch <= c {
            return Err(Error::FailedPrecondition(format!(
                "epoch {epoch} is not newer than committed checkpoint {c} of {}",
                self.id
            )));
        }
        Ok(())
    }

    /// Validates and applies one `Write` RPC's ops of `epoch` (blocking).
    pub fn write(&self, epoch: u64, ops: Vec<Op>) -> Result<()> {
        self.check_epoch(epoch)?;
        for op in &ops {
            match op {
                Op::Put(k, _) | Op::Delete(k) | Op::Merge(k, _) => self.id.check_key(k)?,
                Op::DeleteRange(s, e) => {
                    self.id.clip_range(s, e)?;
                }
            }
        }
        let mut live = lock(&self.live);
        // Checked again under the lock: a commit may have happened meanwhile.
        self.check_epoch(epoch)?;
        self.apply(&mut live, epoch, &ops, true)
    }

    /// Applies ops: previous values to the undo log, records to the spool when
    /// `spool`, one RocksDB batch, then the cache.
    pub(crate) fn apply(&self, live: &mut Live, epoch: u64, ops: &[Op], spool: bool) -> Result<()> {
        let state = self.cf(CF_DEFAULT)?;
        let undo_cf = self.cf(CF_UNDO)?;
        // Values as of "before this op", updated as the batch goes.
        let mut overlay: HashMap<Bytes, Option<Bytes>> = HashMap::new();
        let mut point: Vec<&Bytes> = Vec::new();
        for op in ops {
            if let Op::Put(k, _) | Op::Delete(k) | Op::Merge(k, _) = op
                && !overlay.contains_key(k)
            {
                overlay.insert(k.clone(), None);
                point.push(k);
            }
        }
        let got = self
            .db
            .batched_multi_get_cf(state, point.iter().map(|k| k.as_ref()), false);
        for (k, v) in point.iter().zip(got) {
            overlay.insert((*k).clone(), v?.map(|v| Bytes::copy_from_slice(&v)));
        }

        let mut batch = WriteBatch::default();
        let mut range_deleted = false;
        let mut undo_seq = live.undo_seq;
        let mut push_undo = |batch: &mut WriteBatch, key: &[u8], prev: Option<&Bytes>| {
            batch.put_cf(
                undo_cf,
                undo::key(epoch, undo_seq),
                undo::value(key, prev.map(|p| p.as_ref())),
            );
            undo_seq += 1;
        };
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    push_undo(&mut batch, k, overlay.get(k).and_then(Option::as_ref));
                    batch.put_cf(state, k, v);
                    overlay.insert(k.clone(), Some(v.clone()));
                }
                Op::Delete(k) => {
                    push_undo(&mut batch, k, overlay.get(k).and_then(Option::as_ref));
                    batch.delete_cf(state, k);
                    overlay.insert(k.clone(), None);
                }
                Op::Merge(k, v) => {
                    let prev = overlay.get(k).cloned().flatten();
                    push_undo(&mut batch, k, prev.as_ref());
                    batch.merge_cf(state, k, v);
                    let mut next = prev.map(|p| p.to_vec()).unwrap_or_default();
                    next.extend_from_slice(v);
                    overlay.insert(k.clone(), Some(Bytes::from(next)));
                }
                Op::DeleteRange(s, e) => {
                    range_deleted = true;
                    let (start, end) = self.id.clip_range(s, e)?;
                    let mut present: BTreeMap<Bytes, Bytes> = BTreeMap::new();
                    let mut ro = ReadOptions::default();
                    ro.fill_cache(false);
                    if let Some(end) = &end {
                        ro.set_iterate_upper_bound(end.clone());
                    }
                    let it = self.db.iterator_cf_opt(
                        state,
                        ro,
                        IteratorMode::From(start.as_slice(), rocksdb::Direction::Forward),
                    );
                    for item in it {
                        let (k, v) = item?;
                        present.insert(Bytes::from(k.into_vec()), Bytes::from(v.into_vec()));
                    }
                    let in_range =
                        |k: &[u8]| k >= start.as_slice() && end.as_deref().is_none_or(|e| k < e);
                    // Earlier ops of this batch win over what RocksDB holds.
                    for (k, v) in &overlay {
                        if in_range(k.as_ref()) {
                            match v {
                                Some(v) => present.insert(k.clone(), v.clone()),
                                None => present.remove(k),
                            };
                        }
                    }
                    for (k, v) in present {
                        push_undo(&mut batch, &k, Some(&v));
                        batch.delete_cf(state, &k);
                        overlay.insert(k, None);
                    }
                }
            }
        }
        if spool {
            for op in ops {
                live.spool.append(&Record::Write {
                    epoch,
                    op: op.clone(),
                })?;
            }
        }
        self.db.write_opt(batch, &write_options())?;
        live.undo_seq = undo_seq;

        let mut g = lock(&self.cache_gen);
        g.writes += 1;
        if range_deleted {
            g.generation = self.cache.new_generation();
        } else {
            // Write-invalidate: the next read fills the cache. Inserting here would fill
            // foyer (and its disk tier) with every value written, and pin the requests'
            // receive buffers the values are slices of.
            for k in overlay.into_keys() {
                self.cache.remove(g.generation, k);
            }
        }
        Ok(())
    }

    /// The values of `keys` (validated), through the cache.
    pub async fn multi_get(self: &Arc<Self>, keys: Vec<Bytes>) -> Result<Vec<Option<Bytes>>> {
        for k in &keys {
            self.id.check_key(k)?;
        }
        let seen = *lock(&self.cache_gen);
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        let mut missed: Vec<usize> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            match self.cache.get(seen.generation, k).await {
                Some(v) => out[i] = v,
                None => missed.push(i),
            }
        }
        if missed.is_empty() {
            return Ok(out);
        }
        let miss_keys: Vec<Bytes> = missed.iter().map(|&i| keys[i].clone()).collect();
        let shard = Arc::clone(self);
        let values = tokio::task::spawn_blocking(move || shard.read_db(&miss_keys)).await??;
        let g = lock(&self.cache_gen);
        let unchanged = g.generation == seen.generation && g.writes == seen.writes;
        for (&i, v) in missed.iter().zip(values) {
            if unchanged {
                self.cache.insert(seen.generation, &keys[i], v.clone());
            }
            out[i] = v;
        }
        Ok(out)
    }

    fn read_db(&self, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>> {
        let state = self.cf(CF_DEFAULT)?;
        self.db
            .batched_multi_get_cf(state, keys.iter().map(|k| k.as_ref()), false)
            .into_iter()
            .map(|v| Ok(v?.map(|v| Bytes::copy_from_slice(&v))))
            .collect()
    }

    /// Up to `limit` entries of `[start, end)` and at most about `max_bytes`; the key to
    /// resume from when more follow (blocking).
    pub fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
    ) -> Result<ScanPage> {
        let (start, end) = self.id.clip_range(start, end)?;
        let mut ro = ReadOptions::default();
        if let Some(end) = end {
            ro.set_iterate_upper_bound(end);
        }
        let it = self.db.iterator_cf_opt(
            self.cf(CF_DEFAULT)?,
            ro,
            IteratorMode::From(start.as_slice(), rocksdb::Direction::Forward),
        );
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for item in it {
            let (k, v) = item?;
            if out.len() >= limit || (bytes > 0 && bytes + k.len() + v.len() > max_bytes) {
                return Ok((out, Some(Bytes::from(k.into_vec()))));
            }
            bytes += k.len() + v.len();
            out.push((Bytes::from(k.into_vec()), Bytes::from(v.into_vec())));
        }
        Ok((out, None))
    }

    /// Undoes every write of an epoch `> checkpoint` (blocking); returns how many.
    pub fn rollback(&self, checkpoint: u64) -> Result<u64> {
        let c = self.committed();
        if checkpoint < c {
            return Err(Error::FailedPrecondition(format!(
                "cannot roll {} back to checkpoint {checkpoint}: checkpoint {c} is committed",
                self.id
            )));
        }
        let mut live = lock(&self.live);
        let undone = self.undo_after(checkpoint)?;
        live.spool.append(&Record::Rollback(checkpoint))?;
        Ok(undone)
    }

    /// Applies the undo records of epochs `> checkpoint`, newest first, and drops them.
    pub(crate) fn undo_after(&self, checkpoint: u64) -> Result<u64> {
        let state = self.cf(CF_DEFAULT)?;
        let undo_cf = self.cf(CF_UNDO)?;
        let Some(first) = checkpoint.checked_add(1) else {
            return Ok(0);
        };
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(undo::epoch_start(first).to_vec());
        ro.fill_cache(false);
        let mut batch = WriteBatch::default();
        let mut undone = 0u64;
        for item in self.db.iterator_cf_opt(undo_cf, ro, IteratorMode::End) {
            let (k, v) = item?;
            let (key, prev) = undo::decode_value(&v).ok_or_else(|| {
                Error::Internal(format!("malformed undo record {k:02x?} in {}", self.id))
            })?;
            match prev {
                Some(p) => batch.put_cf(state, key, p),
                None => batch.delete_cf(state, key),
            }
            batch.delete_cf(undo_cf, &k);
            undone += 1;
        }
        self.db.write_opt(batch, &write_options())?;
        let mut g = lock(&self.cache_gen);
        g.writes += 1;
        g.generation = self.cache.new_generation();
        Ok(undone)
    }

    /// Records `checkpoint` as committed and drops the undo records it makes unnecessary
    /// (blocking).
    pub(crate) fn mark_committed(&self, checkpoint: u64) -> Result<()> {
        let _live = lock(&self.live);
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_META)?, META_COMMITTED, checkpoint.to_be_bytes());
        if let Some(end) = checkpoint.checked_add(1) {
            batch.delete_range_cf(
                self.cf(CF_UNDO)?,
                undo::epoch_start(0),
                undo::epoch_start(end),
            );
        }
        self.db.write_opt(batch, &write_options())?;
        self.committed.fetch_max(checkpoint, Ordering::SeqCst);
        Ok(())
    }

    /// Cuts the spool into delta `seq` if it holds anything, taking a RocksDB checkpoint
    /// into `checkpoint_dir` right after when asked (blocking, under the write lock).
    fn cut(
        &self,
        snapshot_to: Option<&dyn Fn(u64) -> PathBuf>,
    ) -> Result<Option<(u64, CutSpool, Option<PathBuf>)>> {
        let mut live = lock(&self.live);
        if live.spool.is_empty() {
            return Ok(None);
        }
        let seq = live.next_delta_seq;
        let pending = self.dir.join("pending");
        std::fs::create_dir_all(&pending).map_err(|e| Error::io(&pending, e))?;
        let cut = live.spool.cut(&pending.join(format!("{seq:020}.delta")))?;
        live.next_delta_seq += 1;
        // The cut delta must reach the upload queue whatever happens to the checkpoint.
        let checkpoint = match snapshot_to {
            Some(path_of) => {
                let path = path_of(seq);
                match crate::snapshot::create_checkpoint(&self.db, &path) {
                    Ok(()) => Some(path),
                    Err(e) => {
                        tracing::warn!("checkpoint of {} at delta {seq} failed: {e}", self.id);
                        None
                    }
                }
            }
            None => None,
        };
        Ok(Some((seq, cut, checkpoint)))
    }

    /// Makes every write received so far durable; returns the last delta's handle and
    /// the bytes uploaded so far.
    pub async fn flush(self: &Arc<Self>) -> Result<(String, u64)> {
        let mut d = self.durability.lock().await;
        self.flush_locked(&mut d).await?;
        Ok((d.last_handle.clone(), d.durable_bytes))
    }

    /// [`Shard::flush`] with the durability lock held.
    pub(crate) async fn flush_locked(self: &Arc<Self>, d: &mut Durability) -> Result<()> {
        let since_bytes: u64 = d.chain.iter().map(|x| x.bytes).sum::<u64>()
            + d.pending.iter().map(|(_, c)| c.bytes).sum::<u64>();
        let since_count = d.chain.len() + d.pending.len() + 1;
        let want_snapshot = d.snapshot_in_progress.is_none()
            && lock(&self.snapshot_task)
                .as_ref()
                .is_none_or(|t| t.is_finished())
            && (since_count >= SNAPSHOT_EVERY_DELTAS || since_bytes >= SNAPSHOT_EVERY_BYTES);
        let shard = Arc::clone(self);
        let cut = tokio::task::spawn_blocking(move || shard.cut(None)).await??;
        if let Some((seq, cut, _)) = cut {
            d.pending.push_back((seq, cut));
        }
        self.upload_pending(d).await?;
        if want_snapshot {
            // In the background: this flush does not wait for the snapshot, and later
            // ones only for the short cut that ends it (`snapshot.rs`).
            *lock(&self.snapshot_task) = Some(crate::snapshot::start(self));
        }
        Ok(())
    }

    /// Cuts the spool into delta `seq` and takes a RocksDB checkpoint of exactly that
    /// state into `checkpoints/<seq>` (blocking, under the write lock). With an empty
    /// spool the state is that after the last cut delta: the checkpoint is taken at its
    /// number, and no delta is cut. `None` when no delta was ever cut. Cheap when the
    /// memtables were flushed just before.
    pub(crate) fn cut_with_checkpoint(&self) -> Result<Option<(u64, Option<CutSpool>, PathBuf)>> {
        let dir = self.dir.join("checkpoints");
        let path_of = move |seq: u64| dir.join(format!("{seq:020}"));
        {
            let live = lock(&self.live);
            if live.spool.is_empty() {
                let Some(seq) = live.next_delta_seq.checked_sub(1).filter(|&s| s > 0) else {
                    return Ok(None);
                };
                let path = path_of(seq);
                crate::snapshot::create_checkpoint(&self.db, &path)?;
                return Ok(Some((seq, None, path)));
            }
        }
        let path_of: &dyn Fn(u64) -> PathBuf = &path_of;
        Ok(self
            .cut(Some(path_of))?
            .and_then(|(seq, cut, path)| path.map(|p| (seq, Some(cut), p))))
    }

    /// Flushes every column family's memtables to SST files (blocking, without the write
    /// lock: writes go on meanwhile).
    pub(crate) fn flush_memtables(&self) -> Result<()> {
        for name in [CF_DEFAULT, CF_UNDO, CF_META] {
            self.db.flush_cf(self.cf(name)?)?;
        }
        Ok(())
    }

    /// Uploads every cut delta waiting, oldest first; one that fails stays queued.
    pub(crate) async fn upload_pending(&self, d: &mut Durability) -> Result<()> {
        while let Some((seq, cut)) = d.pending.front() {
            let (seq, cut) = (*seq, cut.clone());
            let location = self.object(&delta_path(seq));
            let bytes = self.durable.put_file(&location, &cut.path).await?;
            if let Err(e) = std::fs::remove_file(&cut.path) {
                tracing::warn!("removing uploaded spool {}: {e}", cut.path.display());
            }
            d.pending.pop_front();
            if d.snapshot.as_ref().is_none_or(|s| seq > s.seq) {
                d.chain.push(DeltaRef { seq, bytes });
            }
            d.last_handle = location.to_string();
            d.durable_bytes += bytes;
            self.last_durable_epoch
                .fetch_max(cut.max_epoch, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Commits checkpoint `c`: flushes what it needs, writes its manifest, drops undo
    /// records `<= c` and collects objects no retained checkpoint needs.
    pub async fn commit(self: &Arc<Self>, c: u64, retained: &[u64]) -> Result<String> {
        let started = std::time::Instant::now();
        let mut d = self.durability.lock().await;
        let locked = started.elapsed();
        let path = self.object(&manifest_path(c));
        let committed = self.committed();
        if c <= committed && committed > 0 {
            if d.manifests.contains_key(&c) || c == committed {
                return Ok(path.to_string());
            }
            return Err(Error::FailedPrecondition(format!(
                "checkpoint {c} is older than committed checkpoint {committed} of {} and has \
                 no manifest here",
                self.id
            )));
        }
        // Everything received goes first: the writes of epochs <= c, and rollback markers
        // (without them, a restore would replay undone writes as if they had stayed).
        let needs_flush = !lock(&self.live).spool.is_empty() || !d.pending.is_empty();
        if needs_flush {
            self.flush_locked(&mut d).await?;
        }
        let flushed = started.elapsed();
        let manifest = Manifest {
            checkpoint: c,
            snapshot: d.snapshot.clone(),
            deltas: d
                .chain
                .iter()
                .copied()
                .filter(|x| d.snapshot.as_ref().is_none_or(|s| x.seq > s.seq))
                .collect(),
        };
        self.durable
            .put(&path, Bytes::from(manifest.encode()))
            .await?;
        d.manifests.insert(c, manifest);
        let shard = Arc::clone(self);
        tokio::task::spawn_blocking(move || shard.mark_committed(c)).await??;
        let marked = started.elapsed();
        let mut keep: Vec<u64> = retained.to_vec();
        keep.push(c);
        if let Err(e) = crate::gc::collect(self.as_ref(), &mut d, &keep).await {
            tracing::warn!(
                "garbage collection of {} failed (retried at the next commit): {e}",
                self.id
            );
        }
        let ms = |t: std::time::Duration| t.as_millis();
        tracing::debug!(
            "commit {c} of {}: {} ms (durability lock after {}, flushed after {}, marked \
             after {}; flush needed: {needs_flush})",
            self.id,
            ms(started.elapsed()),
            ms(locked),
            ms(flushed),
            ms(marked),
        );
        Ok(path.to_string())
    }

    /// Approximate bytes of live state.
    pub fn approximate_bytes(&self) -> u64 {
        let Ok(cf) = self.cf(CF_DEFAULT) else {
            return 0;
        };
        let prop = |name: &str| {
            self.db
                .property_int_value_cf(cf, name)
                .ok()
                .flatten()
                .unwrap_or(0)
        };
        prop("rocksdb.estimate-live-data-size") + prop("rocksdb.cur-size-all-mem-tables")
    }

    /// `(memtables, table readers)` bytes of all column families: RocksDB's
    /// `size-all-mem-tables` (active, immutable and pinned) and
    /// `estimate-table-readers-mem` (index and filter blocks outside the block cache).
    pub fn rocksdb_memory(&self) -> (u64, u64) {
        let mut memtables = 0;
        let mut readers = 0;
        for name in [CF_DEFAULT, CF_UNDO, CF_META] {
            let Ok(cf) = self.cf(name) else { continue };
            let prop = |p: &str| {
                self.db
                    .property_int_value_cf(cf, p)
                    .ok()
                    .flatten()
                    .unwrap_or(0)
            };
            memtables += prop("rocksdb.size-all-mem-tables");
            readers += prop("rocksdb.estimate-table-readers-mem");
        }
        (memtables, readers)
    }

    /// Forces a full compaction of live state (runs the TTL filter; blocking).
    pub fn compact(&self) -> Result<()> {
        let cf = self.cf(CF_DEFAULT)?;
        self.db.flush_cf(cf)?;
        self.db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }
}

impl ShardObjects for Shard {
    fn id(&self) -> &ShardKey {
        &self.id
    }

    fn durable(&self) -> &Durable {
        &self.durable
    }

    fn root(&self) -> &ObjectPath {
        &self.root
    }

    fn uploaded_sst(&self) -> &Mutex<UploadedSsts> {
        &self.uploaded_sst
    }
}

impl Snapshotted for Shard {
    fn instance(&self) -> &str {
        &self.instance
    }

    fn durability(&self) -> &tokio::sync::Mutex<Durability> {
        &self.durability
    }

    fn flush_memtables(&self) -> Result<()> {
        Shard::flush_memtables(self)
    }

    fn cut_with_checkpoint(&self) -> Result<Option<(u64, Option<CutSpool>, PathBuf)>> {
        Shard::cut_with_checkpoint(self)
    }
}
