//! Timers of one keyed operator in one subtask, kept with its state.
//!
//! # Where timers live
//! In operator memory while the job runs (ordered by the time they fire at), and in the
//! operator's `timers` table as of every checkpoint: one row per pending timer, under
//! its key group, keyed by its time (sign-flipped big-endian, so rows sort by time) with
//! the operator's payload as namespace. At a barrier the operator calls
//! [`KeyedTimers::persist`], which writes only what changed since the last one (timers
//! registered and still pending; deletions of persisted timers that fired); a timer
//! registered and fired between two barriers never touches state. Without checkpoints
//! nothing is tracked or written.
//!
//! # How they are restored
//! [`KeyedTimers::restore`] reads the `timers` rows of each key group the subtask owns:
//! exactly the timers pending at the checkpoint the state was restored to, whatever the
//! parallelism that wrote them. The operator rebuilds nothing from its other state.
//!
//! A timer is `(time, key group, payload)`; registering one that is pending is a no-op.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use bytes::Bytes;
use sluice_common::state::{StateTable, WriteOp};

use crate::element::Timestamp;
use crate::error::{Error, Result};

/// Rows read per scan call while restoring timers.
const SCAN_PAGE: usize = 4096;

type Hasher = foldhash::fast::RandomState;

/// Whether a pending timer is in state as of the last barrier.
type Persisted = bool;

/// Timers of one operator subtask.
pub struct KeyedTimers {
    table: StateTable,
    /// Pending timers by time.
    by_time: BTreeMap<Timestamp, HashMap<(u16, Bytes), Persisted, Hasher>>,
    len: usize,
    /// Timers registered since the last barrier (only when tracking).
    added: Vec<(Timestamp, u16, Bytes)>,
    /// Persisted timers that fired since the last barrier (only when tracking).
    removed: Vec<(Timestamp, u16, Bytes)>,
    tracking: bool,
}

impl std::fmt::Debug for KeyedTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedTimers")
            .field("table", &self.table)
            .field("len", &self.len)
            .field("tracking", &self.tracking)
            .finish()
    }
}

/// A timestamp as bytes that sort like the numbers (timer rows, window panes).
pub(crate) fn time_key(at: Timestamp) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

/// The timestamp of a [`time_key`]; `None` unless `key` has its 8 bytes.
pub(crate) fn time_from_key(key: &[u8]) -> Option<Timestamp> {
    let bytes: [u8; 8] = key.try_into().ok()?;
    Some((u64::from_be_bytes(bytes) ^ (1 << 63)) as i64)
}

fn time_of(key: &[u8]) -> Result<Timestamp> {
    time_from_key(key)
        .ok_or_else(|| Error::Internal(format!("a timer row has a {}-byte time", key.len())))
}

impl KeyedTimers {
    /// The timers in `table` for the key groups in `key_groups`, as the checkpoint the
    /// state was restored to left them; `tracking` when the job takes checkpoints.
    pub async fn restore(
        table: StateTable,
        key_groups: Range<u32>,
        tracking: bool,
    ) -> Result<Self> {
        let mut timers = Self {
            table,
            by_time: BTreeMap::new(),
            len: 0,
            added: Vec::new(),
            removed: Vec::new(),
            tracking,
        };
        for group in key_groups {
            let group = u16::try_from(group)
                .map_err(|_| Error::Internal(format!("key group {group} out of range")))?;
            for row in timers.table.scan_group(group, SCAN_PAGE).await? {
                let at = time_of(&row.key)?;
                if timers.insert(at, group, row.namespace, true) {
                    timers.len += 1;
                }
            }
        }
        Ok(timers)
    }

    /// Inserts a timer; false when it was pending already.
    fn insert(&mut self, at: Timestamp, key_group: u16, payload: Bytes, persisted: bool) -> bool {
        let slot = self.by_time.entry(at).or_default();
        match slot.entry((key_group, payload)) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(persisted);
                true
            }
        }
    }

    /// Registers a timer firing once time reaches `at`.
    pub fn register(&mut self, at: Timestamp, key_group: u16, payload: Bytes) {
        if !self.insert(at, key_group, payload.clone(), false) {
            return;
        }
        self.len += 1;
        if self.tracking {
            self.added.push((at, key_group, payload));
        }
    }

    /// Removes and returns every timer due at `now` (time `<= now`), in time order
    /// (timers of one time in no particular order).
    pub fn pop_due(&mut self, now: Timestamp) -> Vec<(Timestamp, u16, Bytes)> {
        let later = match now.checked_add(1) {
            Some(next) => self.by_time.split_off(&next),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.by_time, later);
        let mut out = Vec::new();
        for (at, timers) in due {
            for ((key_group, payload), persisted) in timers {
                if persisted && self.tracking {
                    self.removed.push((at, key_group, payload.clone()));
                }
                out.push((at, key_group, payload));
            }
        }
        self.len -= out.len();
        out
    }

    /// The state writes that bring the `timers` table up to date: registered timers
    /// still pending, persisted ones that fired.
    fn changes(&mut self) -> Vec<WriteOp> {
        let mut ops = Vec::with_capacity(self.added.len() + self.removed.len());
        for (at, key_group, payload) in std::mem::take(&mut self.removed) {
            let key = self.table.key(key_group, &time_key(at), &payload);
            ops.push(WriteOp::Delete { key });
        }
        for (at, key_group, payload) in std::mem::take(&mut self.added) {
            let Some(persisted) = self
                .by_time
                .get_mut(&at)
                .and_then(|t| t.get_mut(&(key_group, payload.clone())))
            else {
                continue; // fired before the barrier: never stored
            };
            if *persisted {
                continue;
            }
            *persisted = true;
            let key = self.table.key(key_group, &time_key(at), &payload);
            ops.push(WriteOp::Put {
                key,
                value: Bytes::new(),
            });
        }
        ops
    }

    /// Writes what changed since the last barrier into the `timers` table; the operator
    /// calls it when a barrier reaches it, before the runtime seals the epoch.
    pub async fn persist(&mut self) -> Result<()> {
        let ops = self.changes();
        self.table.write(ops).await?;
        Ok(())
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_common::state::{MemoryStateStore, StateStore};

    use super::*;

    fn payload(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn sorted(mut v: Vec<(Timestamp, u16, Bytes)>) -> Vec<(Timestamp, u16, Bytes)> {
        v.sort();
        v
    }

    #[test]
    fn time_keys_sort_like_times() {
        let times = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for w in times.windows(2) {
            assert!(time_key(w[0]) < time_key(w[1]), "{w:?}");
        }
        for t in times {
            assert_eq!(time_of(&time_key(t)).unwrap(), t);
        }
    }

    #[tokio::test]
    async fn pops_only_due_timers_in_time_order_once() {
        let store = Arc::new(MemoryStateStore::new(false));
        let table = StateTable::new(store.subtask(0..4, 1), 1, "timers");
        let mut t = KeyedTimers::restore(table, 0..4, false).await.unwrap();
        t.register(30, 1, payload("c"));
        t.register(10, 0, payload("a"));
        t.register(20, 2, payload("b"));
        t.register(10, 3, payload("a2"));
        t.register(10, 0, payload("a"));
        assert_eq!(t.len(), 4, "a pending timer registered twice is one timer");
        let due = t.pop_due(20);
        assert_eq!(due[2], (20, 2, payload("b")));
        assert_eq!(
            sorted(due[..2].to_vec()),
            vec![(10, 0, payload("a")), (10, 3, payload("a2"))]
        );
        assert_eq!(t.len(), 1);
        assert_eq!(t.pop_due(i64::MAX), vec![(30, 1, payload("c"))]);
        assert!(t.is_empty());
    }

    #[tokio::test]
    async fn a_restore_brings_back_the_timers_pending_at_the_checkpoint() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(true));
        let backend = store.subtask(0..8, 1);
        let table = StateTable::new(backend.clone(), 7, "timers");
        let mut t = KeyedTimers::restore(table, 0..8, true).await.unwrap();
        t.register(10, 1, payload("fired before the barrier"));
        t.register(20, 2, payload("pending"));
        t.register(30, 6, payload("fires after the barrier"));
        t.pop_due(10);
        t.persist().await.unwrap();
        backend.seal_epoch(1).await.unwrap();
        store.commit(1, &[1]).await.unwrap();
        // After the checkpoint: one fires, one is added; neither may survive a restore.
        t.pop_due(30);
        t.register(40, 3, payload("registered after the barrier"));
        t.persist().await.unwrap();
        backend.seal_epoch(2).await.unwrap();
        drop((t, backend));
        store.restore(1, 2).await.unwrap();
        // Two subtasks of the next attempt each find the timers of their key groups.
        let mut found = Vec::new();
        for groups in [0..4, 4..8] {
            let table = StateTable::new(store.subtask(groups.clone(), 2), 7, "timers");
            let mut t = KeyedTimers::restore(table, groups, true).await.unwrap();
            found.extend(t.pop_due(i64::MAX));
        }
        assert_eq!(
            sorted(found),
            vec![
                (20, 2, payload("pending")),
                (30, 6, payload("fires after the barrier"))
            ]
        );
    }

    #[tokio::test]
    async fn without_checkpoints_nothing_is_written() {
        let store = Arc::new(MemoryStateStore::new(false));
        let table = StateTable::new(store.subtask(0..4, 1), 1, "timers");
        let mut t = KeyedTimers::restore(table, 0..4, false).await.unwrap();
        t.register(5, 0, payload("x"));
        t.persist().await.unwrap();
        assert!(store.is_empty());
    }
}
