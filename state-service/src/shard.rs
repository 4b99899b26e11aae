//! One shard: a key-group range of one job in its own RocksDB instance, with its
//! uncommitted epochs, its delta spool and what of it is durable in the object store.
//!
//! # Live state
//! RocksDB's `default` column family holds committed state only. A write (one `Write`
//! RPC) takes the shard's write lock, appends its records to the spool file and adds
//! them to its epoch's layer of uncommitted writes in memory (`pending.rs`): no read,
//! no RocksDB write. Committing checkpoint C applies the layers of epochs `<= C` to
//! RocksDB as one blind write batch; a rollback drops layers. Readers never take the
//! write lock: a key is looked up in the layers, then in the cache (`cache.rs`), then in
//! RocksDB. The cache holds committed values only, so only a commit invalidates it (the
//! keys it applies that the cache may hold; a commit with range deletes switches the
//! shard to a fresh cache generation). Reads and commits exclude each other through the
//! commit gate, so no read combines a layer with the state that layer was already
//! applied to, and no read fills the cache with a value a commit just replaced.
//!
//! # Durability
//! `flush` cuts the spool into a numbered delta and uploads every cut delta in order (a
//! failed upload stays queued and is retried by the next flush); `commit` writes the
//! manifest (latest complete snapshot + deltas since), applies the committed layers and
//! collects garbage (`gc.rs`). A snapshot stores the layers in the `pending` column
//! family beside the state, so it holds the uncommitted epochs too. Snapshots (`snapshot.rs`) run in the
//! background: a flush that finds one due only starts it. Restore from the object
//! store is in `restore.rs`.
//!
//! Every method here that touches RocksDB blocks: the server calls them through
//! `spawn_blocking`.
//!
//! Snapshots and garbage collection see the shard only through the traits it implements
//! at the end of this file (`ShardObjects`, `Snapshotted`), so they import nothing
//! from here.

use std::collections::HashSet;
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
use crate::pending::{
    self, CF_DEFAULT, CF_LEGACY_UNDO, CF_META, CF_PENDING, Entry, Lookup, Pending,
};
use crate::rocks::{Rocks, write_options};
use crate::shard_id::ShardKey;
use crate::snapshot::Snapshotted;
use crate::spill::{self, PendingBudget};
use crate::store::Durable;
use crate::ttl_filter::TtlStates;
use sluice_common::state::net_writes::{NetWrites, with_appended};

/// A scan page: entries, and the key to resume from when more follow.
pub type ScanPage = (Vec<(Bytes, Bytes)>, Option<Bytes>);

/// The column families that take writes.
const DATA_CFS: [&str; 4] = [CF_DEFAULT, CF_PENDING, spill::CF_SPILL, CF_META];

/// Meta key of the committed checkpoint.
const META_COMMITTED: &[u8] = b"committed";

/// Snapshot once this many deltas were uploaded since the last one.
pub const SNAPSHOT_EVERY_DELTAS: usize = 10;
/// Snapshot once this many delta bytes were uploaded since the last one.
pub const SNAPSHOT_EVERY_BYTES: u64 = 64 << 20;

/// Keys the cache may hold are remembered (as hashes) up to this many; beyond, the shard
/// moves to a fresh cache generation and starts over.
const CACHED_KEYS_MAX: usize = 1 << 20;

/// State behind the shard's write lock.
pub(crate) struct Live {
    pub(crate) spool: Spool,
    pub(crate) next_delta_seq: u64,
}

/// What the shard put in the cache: its generation, and the hashes of the keys it
/// inserted in that generation, so a commit removes only keys the cache may hold (a
/// removal of a key foyer does not hold still costs its disk tier a tombstone).
struct CacheGen {
    generation: u64,
    cached: HashSet<u64>,
}

fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
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
    /// Writes of uncommitted epochs (lock order: `live`, then the gate, then this).
    pending: Mutex<Pending>,
    /// What the layers of every shard of the node may hold in memory.
    budget: Arc<PendingBudget>,
    /// The node's RocksDB resources (how big a write batch may be).
    rocks: Arc<Rocks>,
    /// Held shared by reads, exclusively by a commit applying layers.
    gate: tokio::sync::RwLock<()>,
    cache_gen: Mutex<CacheGen>,
    pub(crate) durability: tokio::sync::Mutex<Durability>,
    /// SST files of this database already uploaded: local name -> (object, size).
    pub(crate) uploaded_sst: Mutex<UploadedSsts>,
    pub(crate) committed: AtomicU64,
    pub(crate) last_durable_epoch: AtomicU64,
    /// The newest epoch a writer flushed to this instance of the shard (or the
    /// checkpoint it was opened at): a checkpoint newer than this one completed
    /// elsewhere (on this node before it restarted, or on another node), so only the
    /// object store has its writes.
    pub(crate) flushed_epoch: AtomicU64,
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

impl Drop for Shard {
    fn drop(&mut self) {
        // Its layers leave the node's count with it.
        let held = lock(&self.pending).bytes();
        self.budget.adjust(held, 0);
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
    pub(crate) pending: Arc<PendingBudget>,
    pub(crate) rocks: Arc<Rocks>,
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
                next_delta_seq: parts.next_delta_seq,
            }),
            pending: Mutex::new(Pending::default()),
            budget: parts.pending,
            rocks: parts.rocks,
            gate: tokio::sync::RwLock::new(()),
            cache_gen: Mutex::new(CacheGen {
                generation,
                cached: HashSet::new(),
            }),
            durability: tokio::sync::Mutex::new(parts.durability),
            uploaded_sst: Mutex::new(parts.uploaded_sst),
            committed: AtomicU64::new(0),
            last_durable_epoch: AtomicU64::new(0),
            flushed_epoch: AtomicU64::new(0),
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
        shard.flushed_epoch.store(committed, Ordering::SeqCst);
        shard.check_no_undo_log()?;
        shard.load_pending()?;
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

    /// Refuses a database whose live state holds uncommitted writes, as an older
    /// version's snapshots did (it kept their undo records beside them).
    fn check_no_undo_log(&self) -> Result<()> {
        if let Some(item) = self
            .db
            .iterator_cf(self.cf(CF_LEGACY_UNDO)?, IteratorMode::Start)
            .next()
        {
            item?;
            return Err(Error::FailedPrecondition(format!(
                "{}: its snapshot keeps uncommitted writes with an undo log, as state services \
                 before the pending-layer format wrote them; restore it with that version, or \
                 start the job afresh",
                self.id
            )));
        }
        Ok(())
    }

    /// Runs `f` on the layers and reports their change in size to the node's budget.
    fn with_pending<R>(&self, f: impl FnOnce(&mut Pending) -> R) -> R {
        let mut pending = lock(&self.pending);
        let before = pending.bytes();
        let out = f(&mut pending);
        self.budget.adjust(before, pending.bytes());
        out
    }

    /// Reads back the layers a snapshot stored (the in-memory parts in the `pending`
    /// column family, the spilled ones in `spill`).
    fn load_pending(&self) -> Result<()> {
        self.with_pending(|pending| {
            for item in self
                .db
                .iterator_cf(self.cf(CF_PENDING)?, IteratorMode::Start)
            {
                let (k, v) = item?;
                let malformed =
                    || Error::Internal(format!("malformed pending record {k:02x?} in {}", self.id));
                let (epoch, seq) = pending::parse_key(&k).ok_or_else(malformed)?;
                let op = pending::decode_op(&v).ok_or_else(malformed)?;
                // Layers of committed epochs too: the newest are applied at the next commit.
                pending.load(epoch, seq, op);
            }
            for epoch in spill::epochs(&self.db)? {
                pending.mark_spilled(epoch);
            }
            Ok(())
        })
    }

    /// Moves the layers' in-memory parts to RocksDB (under the pending lock, so no
    /// read sees a part in neither place).
    fn spill(&self, pending: &mut Pending) -> Result<()> {
        let before = pending.bytes();
        let result = pending.spill(
            self.rocks.batch_bytes(),
            |epoch, ranges| spill::write_ranges(&self.db, epoch, ranges),
            |epoch, entries, ranges| spill::write_entries(&self.db, epoch, entries, ranges),
        );
        self.budget.spilled(before - pending.bytes());
        // What was spilled was request buffers the layers held: a burst of frees.
        crate::heap::release_freed();
        result
    }

    /// What the layers say of each of `keys`, reading spilled parts (blocking).
    fn lookup_spilled(&self, keys: &[Bytes]) -> Result<Vec<Lookup>> {
        let pending = lock(&self.pending);
        keys.iter()
            .map(|k| pending.lookup_with(k, |epoch, k| spill::get(&self.db, epoch, k)))
            .collect()
    }

    /// Replaces the `pending` column family's content with the layers held now, so that
    /// a RocksDB checkpoint taken next holds them (blocking; under the write lock).
    fn store_pending(&self, _live: &Live) -> Result<()> {
        let cf = self.cf(CF_PENDING)?;
        let mut batch = WriteBatch::default();
        // Keys are exactly 16 bytes, so this range holds all of them.
        batch.delete_range_cf(cf, &[0u8; 16][..], &[0xFFu8; 17][..]);
        let pending = lock(&self.pending);
        for (key, record) in pending.records() {
            batch.put_cf(cf, key, record);
        }
        self.db.write_opt(batch, &write_options())?;
        Ok(())
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
        self.apply(&mut live, epoch, ops, true)
    }

    /// Applies ops of `epoch`: to the spool when `spool`, then to the epoch's layer.
    pub(crate) fn apply(
        &self,
        live: &mut Live,
        epoch: u64,
        ops: Vec<Op>,
        spool: bool,
    ) -> Result<()> {
        if spool {
            for op in &ops {
                live.spool.append_write(epoch, op)?;
            }
        }
        self.with_pending(|pending| {
            for op in ops {
                let op = match op {
                    Op::DeleteRange(s, e) => {
                        let (start, end) = self.id.clip_range(&s, &e)?;
                        Op::DeleteRange(
                            Bytes::from(start),
                            end.map(Bytes::from).unwrap_or_default(),
                        )
                    }
                    op => op,
                };
                pending.apply(epoch, op);
            }
            Ok::<_, Error>(())
        })?;
        if self.budget.over() {
            self.with_pending(|pending| self.spill(pending))?;
        }
        Ok(())
    }

    /// The values of `keys` (validated): uncommitted layers, then the cache, then RocksDB.
    pub async fn multi_get(self: &Arc<Self>, keys: Vec<Bytes>) -> Result<Vec<Option<Bytes>>> {
        for k in &keys {
            self.id.check_key(k)?;
        }
        let _no_commit = self.gate.read().await;
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        // Keys the layers leave to committed state, with what pending merges append.
        let mut committed: Vec<(usize, Option<Bytes>)> = Vec::new();
        let in_memory: Option<Vec<Lookup>> = {
            let pending = lock(&self.pending);
            keys.iter().map(|k| pending.lookup(k)).collect()
        };
        let lookups = match in_memory {
            Some(lookups) => lookups,
            None => {
                let (shard, keys) = (Arc::clone(self), keys.clone());
                tokio::task::spawn_blocking(move || shard.lookup_spilled(&keys)).await??
            }
        };
        for (i, lookup) in lookups.into_iter().enumerate() {
            match lookup {
                Lookup::Value(v) => out[i] = v,
                Lookup::Older(tail) => committed.push((i, tail)),
            }
        }
        if committed.is_empty() {
            return Ok(out);
        }
        let generation = lock(&self.cache_gen).generation;
        let mut missed: Vec<usize> = Vec::new();
        for (n, (i, _)) in committed.iter().enumerate() {
            match self.cache.get(generation, &keys[*i]).await {
                Some(v) => out[*i] = v,
                None => missed.push(n),
            }
        }
        if !missed.is_empty() {
            let miss_keys: Vec<Bytes> = missed
                .iter()
                .map(|&n| keys[committed[n].0].clone())
                .collect();
            let shard = Arc::clone(self);
            let values = tokio::task::spawn_blocking(move || shard.read_db(&miss_keys)).await??;
            let mut g = lock(&self.cache_gen);
            // Under the gate no commit ran since the generation was read: what RocksDB
            // gave is still the committed value.
            if g.generation == generation && g.cached.len() + missed.len() > CACHED_KEYS_MAX {
                g.generation = self.cache.new_generation();
                g.cached.clear();
            }
            let generation = g.generation;
            for (&n, v) in missed.iter().zip(values) {
                let key = &keys[committed[n].0];
                g.cached.insert(key_hash(key));
                self.cache.insert(generation, key, v.clone());
                out[committed[n].0] = v;
            }
        }
        for (i, tail) in committed {
            out[i] = with_appended(out[i].take(), tail);
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
    /// resume from when more follow (blocking). Committed state and the uncommitted
    /// layers are merged in key order.
    pub fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        max_bytes: usize,
    ) -> Result<ScanPage> {
        let (start, end) = self.id.clip_range(start, end)?;
        let _no_commit = self.gate.blocking_read();
        let pending = lock(&self.pending);
        // The layers' first keys of the range: every one below `boundary` is known, so
        // the page stops there at the latest.
        let n = limit.saturating_add(1);
        let mut overlay = pending.keys_in(&start, end.as_deref(), n);
        let spilled = pending.spilled_epochs();
        if !spilled.is_empty() {
            let mut keys: std::collections::BTreeSet<Bytes> = overlay.into_iter().collect();
            for epoch in spilled {
                keys.extend(spill::keys_in(&self.db, epoch, &start, end.as_deref(), n)?);
            }
            overlay = keys.into_iter().take(n).collect();
        }
        let boundary = (overlay.len() > limit).then(|| overlay.pop()).flatten();
        let mut overlay = overlay.into_iter().peekable();
        let mut ro = ReadOptions::default();
        if let Some(end) = end {
            ro.set_iterate_upper_bound(end);
        }
        let mut it = self.db.iterator_cf_opt(
            self.cf(CF_DEFAULT)?,
            ro,
            IteratorMode::From(start.as_slice(), rocksdb::Direction::Forward),
        );
        let mut committed = it.next().transpose()?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        loop {
            // The next key of either side, and its committed value.
            let (key, base) = match (&committed, overlay.peek()) {
                (None, None) => break,
                (Some((k, _)), Some(p)) if p.as_ref() < k.as_ref() => (overlay.next(), None),
                (Some(_), p) => {
                    let (k, v) = committed.take().expect("matched Some");
                    if p.is_some_and(|p| p.as_ref() == k.as_ref()) {
                        overlay.next();
                    }
                    committed = it.next().transpose()?;
                    (Some(Bytes::from(k.into_vec())), Some(v))
                }
                (None, Some(_)) => (overlay.next(), None),
            };
            let key = key.expect("one side had a key");
            if boundary.as_ref().is_some_and(|b| key >= *b) {
                return Ok((out, boundary));
            }
            let value = match pending.lookup_with(&key, |e, k| spill::get(&self.db, e, k))? {
                Lookup::Value(v) => v,
                Lookup::Older(tail) => with_appended(base.map(|b| Bytes::from(b.into_vec())), tail),
            };
            let Some(value) = value else { continue };
            if out.len() >= limit || (bytes > 0 && bytes + key.len() + value.len() > max_bytes) {
                return Ok((out, Some(key)));
            }
            bytes += key.len() + value.len();
            out.push((key, value));
        }
        Ok((out, boundary))
    }

    /// Drops every write of an epoch `> checkpoint` (blocking); returns how many.
    pub fn rollback(&self, checkpoint: u64) -> Result<u64> {
        let c = self.committed();
        if checkpoint < c {
            return Err(Error::FailedPrecondition(format!(
                "cannot roll {} back to checkpoint {checkpoint}: checkpoint {c} is committed",
                self.id
            )));
        }
        let mut live = lock(&self.live);
        let dropped = self.drop_after(checkpoint)?;
        live.spool.append(&Record::Rollback(checkpoint))?;
        Ok(dropped)
    }

    /// Drops the layers of epochs `> checkpoint`; returns the writes they had received.
    /// Committed state, and so the cache, is untouched.
    pub(crate) fn drop_after(&self, checkpoint: u64) -> Result<u64> {
        self.with_pending(|pending| {
            let (ops, spilled) = pending.drop_after(checkpoint);
            // Under the pending lock: a newer write of those epochs spills after this.
            if let (true, Some(first)) = (spilled, checkpoint.checked_add(1)) {
                spill::drop_epochs(&self.db, first, u64::MAX)?;
            }
            Ok(ops)
        })
    }

    /// Adds the deletion of `part`'s ranges to `batch`; whether it had any.
    fn delete_ranges(&self, batch: &mut WriteBatch, part: &NetWrites) -> Result<bool> {
        let state = self.cf(CF_DEFAULT)?;
        for (start, end) in part.ranges() {
            match end {
                Some(end) => batch.delete_range_cf(state, start, end),
                // The last shard's end is open: delete what is there key by key,
                // after writing what came before, so the iterator sees it.
                None => {
                    let before = std::mem::take(batch);
                    self.db.write_opt(before, &write_options())?;
                    for item in self.db.iterator_cf(
                        state,
                        IteratorMode::From(start, rocksdb::Direction::Forward),
                    ) {
                        batch.delete_cf(state, item?.0);
                        self.write_if_full(batch)?;
                    }
                }
            }
        }
        Ok(part.ranges().next().is_some())
    }

    fn put_entry(batch: &mut WriteBatch, state: &rocksdb::ColumnFamily, key: &[u8], e: &Entry) {
        match e {
            Entry::Put(v) => batch.put_cf(state, key, v),
            Entry::Delete => batch.delete_cf(state, key),
            Entry::Merge(m) => batch.merge_cf(state, key, m),
        }
    }

    /// Writes `batch` once it holds a chunk's worth.
    fn write_if_full(&self, batch: &mut WriteBatch) -> Result<()> {
        if batch.size_in_bytes() >= self.rocks.batch_bytes() {
            self.db.write_opt(std::mem::take(batch), &write_options())?;
        }
        Ok(())
    }

    /// Records `checkpoint` as committed and applies the layers of the checkpoint
    /// committed before it to RocksDB (blocking). The newest committed epochs stay in
    /// memory until the next commit, so that what they replace (a row written in one
    /// epoch and deleted in the next, as windows do) never reaches RocksDB; reads and
    /// snapshots see them like uncommitted layers, and no rollback can drop them.
    pub(crate) fn mark_committed(&self, checkpoint: u64) -> Result<()> {
        let _live = lock(&self.live);
        let _no_reads = self.gate.blocking_write();
        let state = self.cf(CF_DEFAULT)?;
        let applied_through = self.committed().min(checkpoint);
        let layers = self.with_pending(|p| p.take_through(applied_through, checkpoint));
        // Written in batches of a bounded size: the local database is never reopened
        // after a crash, and readers wait at the gate, so nobody sees a half-applied
        // commit; a single batch would hold all of a spilled epoch in memory.
        let mut batch = WriteBatch::default();
        let mut ranged = false;
        let mut spilled = false;
        for (epoch, layer) in &layers {
            if let Some(part) = layer.spilled() {
                spilled = true;
                ranged |= self.delete_ranges(&mut batch, part)?;
                spill::for_each(&self.db, *epoch, |key, entry| {
                    Self::put_entry(&mut batch, state, &key, &entry);
                    self.write_if_full(&mut batch)
                })?;
            }
            ranged |= self.delete_ranges(&mut batch, layer)?;
            for (key, entry) in layer.entries() {
                Self::put_entry(&mut batch, state, key, entry);
                self.write_if_full(&mut batch)?;
            }
        }
        batch.put_cf(self.cf(CF_META)?, META_COMMITTED, checkpoint.to_be_bytes());
        self.db.write_opt(batch, &write_options())?;
        for (epoch, layer) in &layers {
            if layer.spilled().is_some() {
                spill::drop_epochs(&self.db, *epoch, *epoch)?;
            }
        }
        self.committed.fetch_max(checkpoint, Ordering::SeqCst);

        let mut g = lock(&self.cache_gen);
        // Spilled keys are not listed in memory: start the cache over, as for ranges.
        if ranged || spilled {
            g.generation = self.cache.new_generation();
            g.cached.clear();
        } else if !g.cached.is_empty() {
            for (_, layer) in layers {
                for (key, _) in layer.entries() {
                    if g.cached.remove(&key_hash(key)) {
                        self.cache.remove(g.generation, key.clone());
                    }
                }
            }
        }
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
                let taken = self
                    .store_pending(&live)
                    .and_then(|()| crate::snapshot::create_checkpoint(&self.db, &path));
                match taken {
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
                self.store_pending(&live)?;
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
        for name in DATA_CFS {
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

    /// Commits checkpoint `c`: flushes what it needs, writes its manifest, applies the
    /// layers `<= c` and collects objects no retained checkpoint needs.
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
        // The layers of the checkpoint before `c` were applied and dropped: a burst.
        crate::heap::release_freed();
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
        prop("rocksdb.estimate-live-data-size")
            + prop("rocksdb.cur-size-all-mem-tables")
            + self.pending_bytes() as u64
    }

    /// Bytes of uncommitted writes held in memory.
    pub fn pending_bytes(&self) -> usize {
        lock(&self.pending).bytes()
    }

    /// `(memtables, table readers)` bytes of all column families: RocksDB's
    /// `size-all-mem-tables` (active, immutable and pinned) and
    /// `estimate-table-readers-mem` (index and filter blocks outside the block cache).
    pub fn rocksdb_memory(&self) -> (u64, u64) {
        let mut memtables = 0;
        let mut readers = 0;
        for name in DATA_CFS {
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

    /// Sets the memtable size of the big column families (blocking).
    pub fn resize_memtables(&self, bytes: usize) -> Result<()> {
        let size = bytes.to_string();
        for name in [CF_DEFAULT, spill::CF_SPILL] {
            self.db
                .set_options_cf(self.cf(name)?, &[("write_buffer_size", size.as_str())])?;
        }
        Ok(())
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
