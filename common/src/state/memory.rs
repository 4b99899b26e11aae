//! The in-memory store (Flink's heap backend): keyed state in this process's memory, one
//! ordered map per key group.
//!
//! # Why per key group
//! A subtask owns a contiguous range of key groups and only ever touches those, so the
//! maps of different subtasks never contend; and a restore at another parallelism only
//! hands the same maps to differently cut ranges. Keys shorter than a key group (the
//! byte-level conformance cases use such keys) are placed as if padded with zeros, which
//! keeps every scan in unsigned byte order across maps.
//!
//! # Epochs and going back
//! A *versioned* store (a job that takes checkpoints) remembers, per key group and epoch,
//! the value each key had before the epoch first changed it (an undo log). Going back to
//! checkpoint `C` replays the undo logs of the epochs after `C`, newest first; a completed
//! checkpoint drops the logs it no longer needs, so the store only ever goes back to its
//! latest completed checkpoint. An unversioned store keeps no logs and cannot go back.
//! Nothing here outlives the process: in a cluster, state that must survive a worker
//! lives in the state service.

use std::collections::{BTreeMap, HashMap};
use std::ops::{Bound, Range};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use async_trait::async_trait;
use bytes::Bytes;

use super::backend::{KeyedStateBackend, WriteOp};
use super::error::{StateError, StateResult};
use super::store::StateStore;

/// Rough bookkeeping cost of one entry beyond its bytes (tree node share, two `Bytes`).
const ENTRY_OVERHEAD: usize = 64;

/// What the keys of one key group were before an epoch changed them. Hashed with
/// foldhash, not SipHash: every write of a checkpointing job looks its key up here, and
/// the keys are the store's own, not an attacker's.
type UndoLog = HashMap<Bytes, Option<Bytes>, foldhash::fast::RandomState>;

/// The state of one key group.
#[derive(Default)]
struct Group {
    map: BTreeMap<Bytes, Bytes>,
    /// Sum of key and value lengths, kept up to date so sizing is O(1).
    bytes: usize,
    /// Undo logs of the epochs not yet superseded by a completed checkpoint, oldest
    /// first (versioned stores only).
    undo: Vec<(u64, UndoLog)>,
}

impl Group {
    /// Remembers `key`'s value before its first change in `epoch`.
    fn remember(&mut self, epoch: Option<u64>, key: &Bytes) {
        let Some(epoch) = epoch else { return };
        if self
            .undo
            .last()
            .is_some_and(|(e, log)| *e == epoch && log.contains_key(key))
        {
            return;
        }
        let before = self.map.get(key).cloned();
        self.undo_log(epoch).insert(key.clone(), before);
    }

    /// One lookup of the ordered map (keys share long prefixes, so each lookup is a run
    /// of comparisons): the replaced value is what the undo log remembers.
    fn put(&mut self, epoch: Option<u64>, key: Bytes, value: Bytes) {
        let undo_key = epoch.map(|_| key.clone());
        let before = self.set(key, value);
        if let (Some(epoch), Some(key)) = (epoch, undo_key) {
            self.undo_log(epoch).entry(key).or_insert(before);
        }
    }

    /// The undo log of `epoch`, the newest (opened if `epoch` has none yet).
    fn undo_log(&mut self, epoch: u64) -> &mut UndoLog {
        if self.undo.last().is_none_or(|(e, _)| *e != epoch) {
            self.undo.push((epoch, UndoLog::default()));
        }
        &mut self.undo.last_mut().expect("pushed above").1
    }

    /// Sets `key` to `value` with one lookup; returns the value it replaced.
    fn set(&mut self, key: Bytes, value: Bytes) -> Option<Bytes> {
        self.bytes += value.len();
        match self.map.entry(key) {
            std::collections::btree_map::Entry::Occupied(mut o) => {
                self.bytes -= o.get().len();
                Some(std::mem::replace(o.get_mut(), value))
            }
            std::collections::btree_map::Entry::Vacant(v) => {
                self.bytes += v.key().len();
                v.insert(value);
                None
            }
        }
    }

    fn delete(&mut self, epoch: Option<u64>, key: &[u8]) {
        if let Some((k, v)) = self.map.remove_entry(key) {
            self.bytes -= k.len() + v.len();
            if let Some(epoch) = epoch {
                // Reinsert-free remember: the old value is the one just removed.
                self.undo_log(epoch).entry(k).or_insert(Some(v));
            }
        }
    }

    fn merge(&mut self, epoch: Option<u64>, key: Bytes, operand: Bytes) {
        self.remember(epoch, &key);
        let Some(old) = self.map.get_mut(&key) else {
            self.set(key, operand);
            return;
        };
        self.bytes += operand.len();
        // Append in place when no reader (and no undo log) holds the old value, so that a
        // list growing by one element per record costs amortised O(element), not O(list).
        let mut grown = match std::mem::take(old).try_into_mut() {
            Ok(unique) => unique,
            Err(shared) => {
                let mut copy = bytes::BytesMut::with_capacity(shared.len() + operand.len());
                copy.extend_from_slice(&shared);
                copy
            }
        };
        grown.extend_from_slice(&operand);
        *old = grown.freeze();
    }

    fn delete_range(&mut self, epoch: Option<u64>, start: &[u8], end: &[u8]) {
        let doomed: Vec<Bytes> = match range(start, end) {
            Some(r) => self
                .map
                .range::<[u8], _>(r)
                .map(|(k, _)| k.clone())
                .collect(),
            None => return,
        };
        for k in doomed {
            self.delete(epoch, &k);
        }
    }

    /// Undoes every epoch after `checkpoint`, newest first.
    fn roll_back(&mut self, checkpoint: u64) {
        while self.undo.last().is_some_and(|(e, _)| *e > checkpoint) {
            let (_, log) = self.undo.pop().expect("checked above");
            for (key, before) in log {
                match before {
                    Some(v) => {
                        self.set(key, v);
                    }
                    None => {
                        if let Some((k, v)) = self.map.remove_entry(&key) {
                            self.bytes -= k.len() + v.len();
                        }
                    }
                }
            }
        }
    }

    /// Forgets the undo logs of epochs up to `checkpoint`.
    fn forget_until(&mut self, checkpoint: u64) {
        self.undo.retain(|(e, _)| *e > checkpoint);
    }
}

/// A key range as `BTreeMap::range` takes it.
type KeyRange<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// `[start, end)` as map bounds (empty `end` unbounded), or `None` when it is empty.
fn range<'a>(start: &'a [u8], end: &'a [u8]) -> Option<KeyRange<'a>> {
    if end.is_empty() {
        return Some((Bound::Included(start), Bound::Unbounded));
    }
    // `BTreeMap::range` panics on inverted bounds; an inverted range is simply empty.
    (start < end).then_some((Bound::Included(start), Bound::Excluded(end)))
}

/// The key group a key is kept under: its first two bytes, zero-padded.
fn group_of(key: &[u8]) -> u16 {
    match key {
        [] => 0,
        [a] => u16::from(*a) << 8,
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
    }
}

/// The groups that keys in `[start, end)` can fall in.
fn groups_of_range(start: &[u8], end: &[u8]) -> Range<u32> {
    let first = u32::from(group_of(start));
    let last = if end.is_empty() {
        u32::from(u16::MAX)
    } else {
        u32::from(group_of(end))
    };
    first..last + 1
}

type SharedGroup = Arc<Mutex<Group>>;

fn lock(group: &SharedGroup) -> MutexGuard<'_, Group> {
    // A panic while locked can only come from an allocation failure mid-batch; the map is
    // still a valid map, so carry on rather than poison every later access.
    group.lock().unwrap_or_else(|e| e.into_inner())
}

struct Inner {
    groups: RwLock<BTreeMap<u16, SharedGroup>>,
    versioned: bool,
    /// The newest completed checkpoint (0: none).
    committed: AtomicU64,
    /// The newest epoch a subtask sealed (0: none).
    sealed: AtomicU64,
}

impl Inner {
    /// The group `g`, created when absent.
    fn group(&self, g: u16) -> SharedGroup {
        if let Some(found) = self
            .groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&g)
        {
            return found.clone();
        }
        self.groups
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(g)
            .or_default()
            .clone()
    }

    /// The existing groups in `range`, in order.
    fn groups_in(&self, range: Range<u32>) -> Vec<SharedGroup> {
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        let hi = range.end.min(u32::from(u16::MAX) + 1);
        if range.start >= hi {
            return Vec::new();
        }
        let (lo, hi) = (range.start as u16, Bound::Included((hi - 1) as u16));
        groups
            .range((Bound::Included(lo), hi))
            .map(|(_, g)| g.clone())
            .collect()
    }

    fn all_groups(&self) -> Vec<SharedGroup> {
        self.groups_in(0..u32::from(u16::MAX) + 1)
    }
}

/// A job's keyed state in this process's memory.
#[derive(Clone)]
pub struct MemoryStateStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStateStore")
            .field("versioned", &self.inner.versioned)
            .field("entries", &self.len())
            .finish()
    }
}

impl MemoryStateStore {
    /// An empty store; a `versioned` one keeps what it needs to go back to its latest
    /// completed checkpoint.
    pub fn new(versioned: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                groups: RwLock::new(BTreeMap::new()),
                versioned,
                committed: AtomicU64::new(0),
                sealed: AtomicU64::new(0),
            }),
        }
    }

    /// Approximate memory held: key and value bytes plus a per-entry overhead.
    pub fn approx_size_bytes(&self) -> usize {
        self.inner
            .all_groups()
            .iter()
            .map(|g| {
                let g = lock(g);
                g.bytes + g.map.len() * ENTRY_OVERHEAD
            })
            .sum()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.inner
            .all_groups()
            .iter()
            .map(|g| lock(g).map.len())
            .sum()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl StateStore for MemoryStateStore {
    async fn open(&self) -> StateResult<u64> {
        Ok(self.inner.committed.load(Ordering::Acquire))
    }

    fn subtask(&self, key_groups: Range<u32>, first_epoch: u64) -> Arc<dyn KeyedStateBackend> {
        Arc::new(MemoryStateBackend::over(
            self.clone(),
            key_groups,
            first_epoch,
        ))
    }

    async fn restore(&self, checkpoint: u64, _fence: u64) -> StateResult<u64> {
        let committed = self.inner.committed.load(Ordering::Acquire);
        if !self.inner.versioned {
            if self.is_empty() {
                return Ok(0);
            }
            return Err(StateError::Rejected(format!(
                "state kept in memory without checkpoints cannot go back to checkpoint {checkpoint}"
            )));
        }
        if checkpoint < committed {
            return Err(StateError::Rejected(format!(
                "state kept in memory can only go back to its latest completed checkpoint \
                 ({committed}), not to {checkpoint}; keep state in the state service \
                 (`state: {{ backend: remote }}`) to restore older checkpoints"
            )));
        }
        for g in self.inner.all_groups() {
            lock(&g).roll_back(checkpoint);
        }
        Ok(0)
    }

    fn last_sealed(&self) -> u64 {
        self.inner.sealed.load(Ordering::Acquire)
    }

    async fn commit(&self, checkpoint: u64, _retained: &[u64]) -> StateResult<()> {
        self.inner.committed.fetch_max(checkpoint, Ordering::AcqRel);
        for g in self.inner.all_groups() {
            lock(&g).forget_until(checkpoint);
        }
        Ok(())
    }
}

/// One subtask's keyed state in a [`MemoryStateStore`].
pub struct MemoryStateBackend {
    store: MemoryStateStore,
    /// The groups this subtask owns, by `group - owned.start`.
    owned: Range<u32>,
    local: Vec<SharedGroup>,
    epoch: AtomicU64,
}

impl std::fmt::Debug for MemoryStateBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStateBackend")
            .field("owned", &self.owned)
            .field("epoch", &self.epoch)
            .finish()
    }
}

/// Largest key-group range whose maps a subtask looks up without the store's lock.
const MAX_LOCAL_GROUPS: u32 = 1 << 12;

impl MemoryStateBackend {
    /// A backend of its own store (unversioned), for every key group: unit tests and
    /// operators run outside a job.
    pub fn new() -> Self {
        Self::over(MemoryStateStore::new(false), 0..0, 1)
    }

    fn over(store: MemoryStateStore, owned: Range<u32>, first_epoch: u64) -> Self {
        let owned = if owned.end - owned.start.min(owned.end) > MAX_LOCAL_GROUPS {
            0..0
        } else {
            owned
        };
        let local = owned
            .clone()
            .filter(|&g| g <= u32::from(u16::MAX))
            .map(|g| store.inner.group(g as u16))
            .collect();
        Self {
            store,
            owned,
            local,
            epoch: AtomicU64::new(first_epoch.max(1)),
        }
    }

    /// The store this backend belongs to.
    pub fn store(&self) -> &MemoryStateStore {
        &self.store
    }

    fn group(&self, g: u16) -> SharedGroup {
        match self
            .local
            .get(u32::from(g).wrapping_sub(self.owned.start) as usize)
        {
            Some(found) => found.clone(),
            None => self.store.inner.group(g),
        }
    }

    /// The epoch writes are recorded under, when the store keeps undo logs.
    fn undo_epoch(&self) -> Option<u64> {
        self.store
            .inner
            .versioned
            .then(|| self.epoch.load(Ordering::Acquire))
    }
}

impl Default for MemoryStateBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl KeyedStateBackend for MemoryStateBackend {
    async fn get_many(&self, keys: &[Bytes]) -> StateResult<Vec<Option<Bytes>>> {
        let mut out = Vec::with_capacity(keys.len());
        let mut held: Option<(u16, SharedGroup)> = None;
        for key in keys {
            let g = group_of(key);
            if held.as_ref().is_none_or(|(h, _)| *h != g) {
                held = Some((g, self.group(g)));
            }
            let group = &held.as_ref().expect("set above").1;
            out.push(lock(group).map.get(key).cloned());
        }
        Ok(out)
    }

    async fn write(&self, ops: Vec<WriteOp>) -> StateResult<()> {
        let epoch = self.undo_epoch();
        let mut held: Option<(u16, SharedGroup)> = None;
        for op in ops {
            if let WriteOp::DeleteRange { start, end } = &op {
                for g in self.store.inner.groups_in(groups_of_range(start, end)) {
                    lock(&g).delete_range(epoch, start, end);
                }
                continue;
            }
            let key = match &op {
                WriteOp::Put { key, .. } | WriteOp::Delete { key } | WriteOp::Merge { key, .. } => {
                    key
                }
                WriteOp::DeleteRange { .. } => unreachable!("handled above"),
            };
            let g = group_of(key);
            if held.as_ref().is_none_or(|(h, _)| *h != g) {
                held = Some((g, self.group(g)));
            }
            let mut group = lock(&held.as_ref().expect("set above").1);
            match op {
                WriteOp::Put { key, value } => group.put(epoch, key, value),
                WriteOp::Delete { key } => group.delete(epoch, &key),
                WriteOp::Merge { key, operand } => group.merge(epoch, key, operand),
                WriteOp::DeleteRange { .. } => unreachable!("handled above"),
            }
        }
        Ok(())
    }

    async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: Option<usize>,
    ) -> StateResult<Vec<(Bytes, Bytes)>> {
        let Some(r) = range(start, end) else {
            return Ok(Vec::new());
        };
        let limit = limit.unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for g in self.store.inner.groups_in(groups_of_range(start, end)) {
            if out.len() >= limit {
                break;
            }
            let group = lock(&g);
            out.extend(
                group
                    .map
                    .range::<[u8], _>(r)
                    .take(limit - out.len())
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
        Ok(out)
    }

    async fn seal_epoch(&self, epoch: u64) -> StateResult<()> {
        // Memory is as durable as this process: sealing only moves later writes on.
        self.epoch.fetch_max(epoch + 1, Ordering::AcqRel);
        self.store.inner.sealed.fetch_max(epoch, Ordering::AcqRel);
        Ok(())
    }

    fn open_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    async fn notify_committed(&self, epoch: u64) -> StateResult<()> {
        if self.store.inner.versioned {
            for g in &self.local {
                lock(g).forget_until(epoch);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::conformance;

    #[tokio::test]
    async fn conformance() {
        conformance::run_all(&|| Arc::new(MemoryStateBackend::new())).await
    }

    #[tokio::test]
    async fn epoch_lifecycle() {
        conformance::run_epochs(&|| Arc::new(MemoryStateStore::new(true))).await
    }

    #[tokio::test]
    async fn size_tracks_puts_merges_and_deletes() {
        let b = MemoryStateBackend::new();
        assert!(b.store().is_empty());
        let k = Bytes::from_static(b"key");
        b.write(vec![WriteOp::Put {
            key: k.clone(),
            value: Bytes::from_static(b"12345"),
        }])
        .await
        .unwrap();
        assert_eq!(b.store().len(), 1);
        assert_eq!(b.store().approx_size_bytes(), 3 + 5 + ENTRY_OVERHEAD);
        b.write(vec![
            WriteOp::Merge {
                key: k.clone(),
                operand: Bytes::from_static(b"67"),
            },
            WriteOp::Put {
                key: Bytes::from_static(b"other"),
                value: Bytes::new(),
            },
        ])
        .await
        .unwrap();
        assert_eq!(
            b.store().approx_size_bytes(),
            3 + 7 + 5 + 2 * ENTRY_OVERHEAD
        );
        b.write(vec![WriteOp::DeleteRange {
            start: Bytes::new(),
            end: Bytes::new(),
        }])
        .await
        .unwrap();
        assert_eq!((b.store().len(), b.store().approx_size_bytes()), (0, 0));
    }

    #[tokio::test]
    async fn merge_does_not_disturb_a_held_value() {
        let b = MemoryStateBackend::new();
        let k = Bytes::from_static(b"k");
        let merge = |operand: &'static [u8]| {
            vec![WriteOp::Merge {
                key: k.clone(),
                operand: Bytes::from_static(operand),
            }]
        };
        b.write(merge(b"ab")).await.unwrap();
        let held = b.get(k.clone()).await.unwrap().unwrap();
        b.write(merge(b"cd")).await.unwrap();
        assert_eq!(&held[..], b"ab");
        assert_eq!(&b.get(k.clone()).await.unwrap().unwrap()[..], b"abcd");
    }

    #[tokio::test]
    async fn an_unversioned_store_refuses_to_go_back() {
        let store = MemoryStateStore::new(false);
        assert_eq!(
            store.restore(0, 0).await.unwrap(),
            0,
            "empty: nothing to undo"
        );
        let b = store.subtask(0..128, 1);
        b.write(vec![WriteOp::Put {
            key: Bytes::from_static(b"\0\x01k"),
            value: Bytes::from_static(b"v"),
        }])
        .await
        .unwrap();
        let err = store.restore(0, 0).await.unwrap_err().to_string();
        assert!(err.contains("without checkpoints"), "{err}");
    }
}
