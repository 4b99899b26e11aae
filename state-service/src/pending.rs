//! Uncommitted epochs: the writes of epochs newer than the shard's committed checkpoint,
//! held in memory apart from live state until their checkpoint commits.
//!
//! Why apart: a write that went straight into RocksDB would need the value it replaces
//! (read first) so a rollback could put it back, and would cost two memtable inserts
//! (state and undo record). Here a write costs a hash map insert; a commit applies an
//! epoch's net effect to RocksDB as one blind write batch (a key written many times in
//! an epoch reaches RocksDB once, a key created and deleted within one epoch never), and
//! a rollback drops layers, in O(1) per epoch.
//!
//! A [`Layer`] is one epoch's net effect: the latest operation per key (hashed, in one
//! map per key group, so a range delete, which in practice stays within a key group or
//! a few, only looks at those), and the ranges it deleted (merged, disjoint). An entry inside one of its own ranges was written after
//! that range was deleted (a range delete removes the entries it covers), so applying a
//! layer is: ranges first, then entries. Lookups go newest layer first and end at the
//! first layer that decides the key; what no layer decides is RocksDB's committed value
//! (plus the operands of pending merges).
//!
//! Snapshots store the layers in the `pending` column family (`[epoch u64 BE][seq u64
//! BE]` -> encoded op, ranges of a layer before its entries), so a shard restored from a
//! snapshot has its uncommitted epochs back. This module knows nothing of RocksDB; the
//! shard applies what it says.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;

use bytes::Bytes;

use crate::delta::Op;

/// Column family of live (committed) state.
pub const CF_DEFAULT: &str = "default";
/// Column family of the uncommitted layers, written only when a snapshot is taken.
pub const CF_PENDING: &str = "pending";
/// Column family of shard metadata.
pub const CF_META: &str = "meta";
/// Column family an older version kept undo records in; opened so that such databases
/// open, and required empty (its records would mean live state holds uncommitted writes).
pub const CF_LEGACY_UNDO: &str = "undo";

/// Bytes an entry is charged beyond its key and value.
const ENTRY_OVERHEAD: usize = 48;

/// The latest operation on one key within an epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The key's value is this.
    Put(Bytes),
    /// The key is absent.
    Delete,
    /// These bytes are appended to the value older layers (or RocksDB) give.
    Merge(Bytes),
}

impl Entry {
    fn len(&self) -> usize {
        match self {
            Entry::Put(v) | Entry::Merge(v) => v.len(),
            Entry::Delete => 0,
        }
    }
}

/// What the layers say of a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The layers decide the value (`None`: absent).
    Value(Option<Bytes>),
    /// The value is the committed one, with these bytes appended when pending merges
    /// say so (`Some` even when empty: an empty merge onto an absent key creates it).
    Committed(Option<Vec<u8>>),
}

/// A range end: `None` is unbounded.
type End = Option<Bytes>;

fn below(key: &[u8], end: &End) -> bool {
    end.as_deref().is_none_or(|e| key < e)
}

/// Entries of one key group.
type Group = HashMap<Bytes, Entry, foldhash::fast::RandomState>;

/// The key group a key's first two bytes name, a shorter key padded with zeros (so a
/// key's group is never below that of a key sorting before it).
fn group_of(key: &[u8]) -> u16 {
    let mut g = [0u8; 2];
    for (d, s) in g.iter_mut().zip(key) {
        *d = *s;
    }
    u16::from_be_bytes(g)
}

/// One epoch's net effect.
#[derive(Debug, Default)]
pub struct Layer {
    entries: BTreeMap<u16, Group>,
    /// Deleted ranges, disjoint, by start.
    ranges: BTreeMap<Bytes, End>,
    /// Operations received, for rollback counts.
    ops: u64,
    bytes: usize,
}

impl Layer {
    /// Whether one of this layer's deleted ranges covers `key`.
    fn covers(&self, key: &[u8]) -> bool {
        covered(&self.ranges, key)
    }

    /// Adds the keys this layer puts or deletes to `replaced`, and its ranges to
    /// `ranges`: what an older layer need not apply once this one is.
    fn note_replacements(
        &self,
        replaced: &mut HashSet<Bytes, foldhash::fast::RandomState>,
        ranges: &mut Vec<BTreeMap<Bytes, End>>,
    ) {
        for (k, e) in self.entries() {
            if !matches!(e, Entry::Merge(_)) {
                replaced.insert(k.clone());
            }
        }
        if !self.ranges.is_empty() {
            ranges.push(self.ranges.clone());
        }
    }

    /// Removes the entries of `groups` whose keys are `gone`, keeping the byte count.
    fn remove_entries(&mut self, groups: Vec<u16>, gone: impl Fn(&[u8]) -> bool) {
        let mut freed = 0;
        for g in groups {
            let Some(group) = self.entries.get_mut(&g) else {
                continue;
            };
            group.retain(|k, e| {
                let gone = gone(k);
                if gone {
                    freed += k.len() + e.len() + ENTRY_OVERHEAD;
                }
                !gone
            });
            if group.is_empty() {
                self.entries.remove(&g);
            }
        }
        self.bytes -= freed;
    }

    fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(&group_of(key))?.get(key)
    }

    fn set(&mut self, key: Bytes, entry: Entry) {
        let add = key.len() + entry.len() + ENTRY_OVERHEAD;
        let group = self.entries.entry(group_of(&key)).or_default();
        if let Some(old) = group.insert(key.clone(), entry) {
            self.bytes -= key.len() + old.len() + ENTRY_OVERHEAD;
        }
        self.bytes += add;
    }

    /// The groups that may hold keys of `[start, end)`.
    fn groups_of_range<'a>(
        &'a self,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> impl Iterator<Item = (&'a u16, &'a Group)> {
        let last = end.map_or(Bound::Unbounded, |e| Bound::Included(group_of(e)));
        self.entries.range((Bound::Included(group_of(start)), last))
    }

    fn apply(&mut self, op: Op) {
        self.ops += 1;
        match op {
            Op::Put(k, v) => self.set(k, Entry::Put(v)),
            Op::Delete(k) => self.set(k, Entry::Delete),
            Op::Merge(k, operand) => {
                let next = match self.get(&k) {
                    Some(Entry::Put(v)) => Entry::Put(concat(v, &operand)),
                    Some(Entry::Delete) => Entry::Put(operand),
                    Some(Entry::Merge(m)) => Entry::Merge(concat(m, &operand)),
                    None if self.covers(&k) => Entry::Put(operand),
                    None => Entry::Merge(operand),
                };
                self.set(k, next);
            }
            Op::DeleteRange(start, end) => {
                let end: End = (!end.is_empty()).then_some(end);
                self.delete_range(start, end);
            }
        }
    }

    fn delete_range(&mut self, mut start: Bytes, mut end: End) {
        let groups: Vec<u16> = self
            .groups_of_range(&start, end.as_deref())
            .map(|(g, _)| *g)
            .collect();
        self.remove_entries(groups, |k| k >= start.as_ref() && below(k, &end));
        // Merge with the ranges it overlaps or touches, so they stay disjoint.
        if let Some((s, e)) = self
            .ranges
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(start.as_ref())))
            .next_back()
            .map(|(s, e)| (s.clone(), e.clone()))
            && e.as_deref().is_none_or(|e| e >= start.as_ref())
        {
            self.remove_range(&s);
            start = s;
            end = max_end(end, e);
        }
        loop {
            let next = self
                .ranges
                .range::<[u8], _>((Bound::Included(start.as_ref()), Bound::Unbounded))
                .next()
                .map(|(s, e)| (s.clone(), e.clone()));
            match next {
                Some((s, e)) if end.as_deref().is_none_or(|end| s.as_ref() <= end) => {
                    self.remove_range(&s);
                    end = max_end(end, e);
                }
                _ => break,
            }
        }
        self.bytes += start.len() + end.as_ref().map_or(0, Bytes::len) + ENTRY_OVERHEAD;
        self.ranges.insert(start, end);
    }

    fn remove_range(&mut self, start: &Bytes) {
        if let Some(end) = self.ranges.remove(start) {
            self.bytes -= start.len() + end.as_ref().map_or(0, Bytes::len) + ENTRY_OVERHEAD;
        }
    }

    /// The deleted ranges, by start.
    pub fn ranges(&self) -> impl Iterator<Item = (&Bytes, Option<&Bytes>)> {
        self.ranges.iter().map(|(s, e)| (s, e.as_ref()))
    }

    /// The latest operation per key, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (&Bytes, &Entry)> {
        self.entries.values().flatten()
    }

    /// The layer as operations that rebuild it when applied in order to an empty layer.
    pub fn to_ops(&self) -> impl Iterator<Item = Op> + '_ {
        let ranges = self
            .ranges
            .iter()
            .map(|(s, e)| Op::DeleteRange(s.clone(), e.clone().unwrap_or_default()));
        let entries = self.entries().map(|(k, e)| match e {
            Entry::Put(v) => Op::Put(k.clone(), v.clone()),
            Entry::Delete => Op::Delete(k.clone()),
            Entry::Merge(m) => Op::Merge(k.clone(), m.clone()),
        });
        ranges.chain(entries)
    }
}

/// Whether one of the disjoint `ranges` (by start) covers `key`.
fn covered(ranges: &BTreeMap<Bytes, End>, key: &[u8]) -> bool {
    ranges
        .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
        .next_back()
        .is_some_and(|(_, end)| below(key, end))
}

fn max_end(a: End, b: End) -> End {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

fn concat(a: &[u8], b: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(a.len() + b.len());
    v.extend_from_slice(a);
    v.extend_from_slice(b);
    Bytes::from(v)
}

/// The uncommitted layers of a shard, by epoch.
#[derive(Debug, Default)]
pub struct Pending {
    layers: BTreeMap<u64, Layer>,
    bytes: usize,
}

impl Pending {
    /// Applies `op` to `epoch`'s layer. Keys and values are kept as they come, slices of
    /// their request's receive buffer: a layer holds one epoch, every request of which
    /// carries only that epoch's writes, so the buffers go when the layer goes (at the
    /// next commit or rollback), and copying every key and value would cost more.
    pub fn apply(&mut self, epoch: u64, op: Op) {
        let layer = self.layers.entry(epoch).or_default();
        let before = layer.bytes;
        layer.apply(op);
        self.bytes = self.bytes + layer.bytes - before;
    }

    /// What the layers say of `key`.
    pub fn lookup(&self, key: &[u8]) -> Lookup {
        // Operands of merges met so far, newest first.
        let mut tail: Vec<&Bytes> = Vec::new();
        let with_tail = |base: Option<&[u8]>, tail: &[&Bytes]| -> Option<Bytes> {
            if tail.is_empty() {
                return base.map(Bytes::copy_from_slice);
            }
            let mut v = base.map(<[u8]>::to_vec).unwrap_or_default();
            for t in tail.iter().rev() {
                v.extend_from_slice(t);
            }
            Some(Bytes::from(v))
        };
        for layer in self.layers.values().rev() {
            match layer.get(key) {
                Some(Entry::Put(v)) => return Lookup::Value(with_tail(Some(v), &tail)),
                Some(Entry::Delete) => return Lookup::Value(with_tail(None, &tail)),
                Some(Entry::Merge(m)) => tail.push(m),
                None if layer.covers(key) => return Lookup::Value(with_tail(None, &tail)),
                None => {}
            }
        }
        if tail.is_empty() {
            return Lookup::Committed(None);
        }
        let mut appended = Vec::new();
        for t in tail.iter().rev() {
            appended.extend_from_slice(t);
        }
        Lookup::Committed(Some(appended))
    }

    /// The first `n` keys of `[start, end)` (`None`: unbounded) any layer has an entry
    /// for, in order.
    pub fn keys_in(&self, start: &[u8], end: Option<&[u8]>, n: usize) -> Vec<Bytes> {
        let in_range = |k: &[u8]| k >= start && end.is_none_or(|e| k < e);
        let mut keys = BTreeSet::new();
        for layer in self.layers.values() {
            for (_, group) in layer.groups_of_range(start, end) {
                keys.extend(group.keys().filter(|k| in_range(k)).cloned());
            }
        }
        keys.into_iter().take(n).collect()
    }

    /// Removes and returns the layers of epochs `<= through`, oldest first, each without
    /// the entries that a later layer of an epoch `<= committed` replaces (a put or
    /// delete of the same key, or a range covering it): that layer will be applied too
    /// (it is committed, so no rollback drops it), and what it replaces would only cost
    /// RocksDB a write undone by the next one. Later layers stay.
    pub fn take_through(&mut self, through: u64, committed: u64) -> Vec<(u64, Layer)> {
        let later = match through.checked_add(1) {
            Some(next) => self.layers.split_off(&next),
            None => BTreeMap::new(),
        };
        let mut taken = std::mem::replace(&mut self.layers, later);
        self.bytes -= taken.values().map(|l| l.bytes).sum::<usize>();
        // Keys a newer committed layer puts or deletes, and the ranges newer ones delete.
        let mut replaced: HashSet<Bytes, foldhash::fast::RandomState> = HashSet::default();
        let mut ranges: Vec<BTreeMap<Bytes, End>> = Vec::new();
        for (_, layer) in self.layers.range(..=committed).rev() {
            layer.note_replacements(&mut replaced, &mut ranges);
        }
        for (_, layer) in taken.iter_mut().rev() {
            if !replaced.is_empty() || !ranges.is_empty() {
                let groups = layer.entries.keys().copied().collect();
                layer.remove_entries(groups, |k| {
                    replaced.contains(k) || ranges.iter().any(|r| covered(r, k))
                });
            }
            layer.note_replacements(&mut replaced, &mut ranges);
        }
        taken.into_iter().collect()
    }

    /// Drops the layers of epochs `> checkpoint`; returns the operations they had received.
    pub fn drop_after(&mut self, checkpoint: u64) -> u64 {
        let Some(next) = checkpoint.checked_add(1) else {
            return 0;
        };
        let dropped = self.layers.split_off(&next);
        self.bytes -= dropped.values().map(|l| l.bytes).sum::<usize>();
        dropped.values().map(|l| l.ops).sum()
    }

    /// Every layer, oldest first.
    pub fn layers(&self) -> impl Iterator<Item = (u64, &Layer)> {
        self.layers.iter().map(|(e, l)| (*e, l))
    }

    /// Bytes held (keys, values and a fixed overhead per entry).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The `pending` column family key of operation `seq` of `epoch`'s layer.
pub fn key(epoch: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&epoch.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The epoch of a `pending` column family key.
pub fn epoch_of(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.get(..8)?.try_into().ok()?))
}

/// Encodes an operation: `[tag u8][a_len u32 BE][a][b]` (tags as in deltas).
pub fn encode_op(op: &Op) -> Vec<u8> {
    let (tag, a, b): (u8, &[u8], &[u8]) = match op {
        Op::Put(k, v) => (0, k, v),
        Op::Delete(k) => (1, k, &[]),
        Op::Merge(k, v) => (2, k, v),
        Op::DeleteRange(s, e) => (3, s, e),
    };
    let mut out = Vec::with_capacity(5 + a.len() + b.len());
    out.push(tag);
    out.extend_from_slice(&(a.len() as u32).to_be_bytes());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out
}

/// Decodes what [`encode_op`] wrote.
pub fn decode_op(v: &[u8]) -> Option<Op> {
    let (&tag, rest) = v.split_first()?;
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let a = Bytes::copy_from_slice(rest.get(4..4usize.checked_add(len)?)?);
    let b = Bytes::copy_from_slice(rest.get(4 + len..)?);
    match tag {
        0 => Some(Op::Put(a, b)),
        1 if b.is_empty() => Some(Op::Delete(a)),
        2 => Some(Op::Merge(a, b)),
        3 => Some(Op::DeleteRange(a, b)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn value(p: &Pending, k: &str) -> Lookup {
        p.lookup(k.as_bytes())
    }

    fn some(s: &str) -> Lookup {
        Lookup::Value(Some(b(s)))
    }

    #[test]
    fn newest_layer_decides_and_merges_stack() {
        let mut p = Pending::default();
        p.apply(1, Op::Put(b("a"), b("1")));
        p.apply(2, Op::Merge(b("a"), b("x")));
        p.apply(3, Op::Merge(b("a"), b("y")));
        p.apply(3, Op::Merge(b("c"), b("z")));
        assert_eq!(value(&p, "a"), some("1xy"));
        assert_eq!(value(&p, "c"), Lookup::Committed(Some(b"z".to_vec())));
        assert_eq!(value(&p, "d"), Lookup::Committed(None));
        p.apply(3, Op::Merge(b("e"), Bytes::new()));
        assert_eq!(value(&p, "e"), Lookup::Committed(Some(Vec::new())));
        p.apply(3, Op::Delete(b("a")));
        assert_eq!(value(&p, "a"), Lookup::Value(None));
    }

    #[test]
    fn range_deletes_hide_older_layers_and_earlier_entries_only() {
        let mut p = Pending::default();
        p.apply(1, Op::Put(b("k1"), b("old")));
        p.apply(2, Op::Put(b("k2"), b("gone")));
        p.apply(2, Op::DeleteRange(b("k"), b("l")));
        p.apply(2, Op::Put(b("k3"), b("after")));
        p.apply(2, Op::Merge(b("k4"), b("m")));
        assert_eq!(value(&p, "k1"), Lookup::Value(None));
        assert_eq!(value(&p, "k2"), Lookup::Value(None));
        assert_eq!(value(&p, "k3"), some("after"));
        // A merge onto a deleted range starts from nothing.
        assert_eq!(value(&p, "k4"), some("m"));
        assert_eq!(value(&p, "z"), Lookup::Committed(None));
        // Unbounded ends.
        p.apply(3, Op::DeleteRange(b("m"), Bytes::new()));
        assert_eq!(value(&p, "zzz"), Lookup::Value(None));
        assert_eq!(value(&p, "k3"), some("after"));
    }

    #[test]
    fn ranges_stay_disjoint() {
        let mut l = Layer::default();
        l.apply(Op::DeleteRange(b("b"), b("d")));
        l.apply(Op::DeleteRange(b("f"), b("h")));
        l.apply(Op::DeleteRange(b("c"), b("g")));
        l.apply(Op::DeleteRange(b("x"), Bytes::new()));
        l.apply(Op::DeleteRange(b("h"), b("i")));
        let r: Vec<_> = l.ranges().map(|(s, e)| (s.clone(), e.cloned())).collect();
        assert_eq!(r, vec![(b("b"), Some(b("i"))), (b("x"), None)]);
        assert!(l.covers(b"c") && l.covers(b"hz") && l.covers(b"zz"));
        assert!(!l.covers(b"a") && !l.covers(b"i") && !l.covers(b"w"));
    }

    #[test]
    fn commit_takes_old_layers_and_rollback_counts_dropped_ops() {
        let mut p = Pending::default();
        for e in 1..=4 {
            p.apply(e, Op::Put(b("k"), b(&e.to_string())));
        }
        p.apply(4, Op::Put(b("j"), b("4")));
        let taken = p.take_through(2, 2);
        assert_eq!(taken.iter().map(|(e, _)| *e).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(p.drop_after(3), 2);
        assert_eq!(value(&p, "k"), some("3"));
        assert_eq!(p.take_through(3, 3).len(), 1);
        assert_eq!(p.bytes(), 0);
    }

    #[test]
    fn what_a_newer_committed_layer_replaces_is_not_applied() {
        let mut p = Pending::default();
        p.apply(1, Op::Put(b("gone"), b("1")));
        p.apply(1, Op::Put(b("kept"), b("1")));
        p.apply(1, Op::Put(b("merged"), b("1")));
        p.apply(1, Op::Put(b("r1"), b("1")));
        p.apply(1, Op::Put(b("uncommitted"), b("1")));
        p.apply(2, Op::Delete(b("gone")));
        p.apply(2, Op::Merge(b("merged"), b("x")));
        p.apply(2, Op::DeleteRange(b("r"), b("s")));
        p.apply(3, Op::Put(b("uncommitted"), b("3")));
        // Epoch 1 applied now, 2 committed (applied later), 3 not committed.
        let taken = p.take_through(1, 2);
        let keys: BTreeSet<&Bytes> = taken[0].1.entries().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            BTreeSet::from([&b("kept"), &b("merged"), &b("uncommitted")])
        );
        assert_eq!(value(&p, "gone"), Lookup::Value(None));
        assert_eq!(value(&p, "uncommitted"), some("3"));
    }

    #[test]
    fn a_layer_rebuilds_from_its_ops() {
        let mut l = Layer::default();
        l.apply(Op::Put(b("a"), b("1")));
        l.apply(Op::DeleteRange(b("a"), b("c")));
        l.apply(Op::Merge(b("b"), b("x")));
        l.apply(Op::Merge(b("z"), b("y")));
        l.apply(Op::Delete(b("q")));
        let mut again = Layer::default();
        for op in l.to_ops() {
            let op = decode_op(&encode_op(&op)).unwrap();
            again.apply(op);
        }
        assert_eq!(again.entries, l.entries);
        assert_eq!(again.bytes, l.bytes);
        assert_eq!(again.ranges, l.ranges);
        assert_eq!(decode_op(&[9, 0, 0, 0, 0]), None);
        assert_eq!(decode_op(&[1, 0, 0, 0, 1, b'k', b'v']), None);
    }
}
