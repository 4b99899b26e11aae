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
//! A [`Layer`] is one epoch's net effect, a [`NetWrites`] (the same structure the
//! client buffers an epoch in): the latest operation per key and the ranges deleted, so
//! applying a layer is ranges first, then entries. Lookups go newest layer first and end
//! at the first layer that decides the key; what no layer decides is RocksDB's committed
//! value (plus the operands of pending merges).
//!
//! When the layers of a node's shards outgrow their share of the memory budget, a
//! layer's in-memory part moves to RocksDB (`spill.rs`): the layer then remembers that
//! part's deleted ranges and reads its entries through a function the shard passes in,
//! between the in-memory part (newer) and older layers.
//!
//! Snapshots store the layers in the `pending` column family (`[epoch u64 BE][seq u64
//! BE]` -> encoded op, ranges of a layer before its entries), so a shard restored from a
//! snapshot has its uncommitted epochs back. This module knows nothing of RocksDB; the
//! shard applies what it says.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
pub use sluice_common::state::net_writes::{End, Entry, Lookup};
use sluice_common::state::net_writes::{NetWrites, Says, fold_newest_first, lookup_newest_first};

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

/// `pending` column family sequence numbers from this one on hold a spilled part's
/// deleted ranges (below it: the in-memory part's operations).
const SPILLED_RANGES_SEQ: u64 = 1 << 63;

/// One epoch's net effect, and how many operations it received (for rollback counts).
#[derive(Debug, Default)]
pub struct Layer {
    /// The part held in memory, newer than the spilled part.
    net: NetWrites,
    /// The deleted ranges of the part spilled to RocksDB (no entries): `Some` once
    /// part of the epoch was spilled.
    spilled: Option<NetWrites>,
    ops: u64,
}

impl std::ops::Deref for Layer {
    type Target = NetWrites;

    fn deref(&self) -> &NetWrites {
        &self.net
    }
}

impl Layer {
    fn apply(&mut self, op: Op) {
        self.ops += 1;
        self.net.apply(op.into());
    }

    /// The deleted ranges of the spilled part, when part of the epoch was spilled.
    pub fn spilled(&self) -> Option<&NetWrites> {
        self.spilled.as_ref()
    }
}

/// The uncommitted layers of a shard, by epoch.
#[derive(Debug, Default)]
pub struct Pending {
    layers: BTreeMap<u64, Layer>,
    /// Bytes held in memory.
    bytes: usize,
    /// Layers with a spilled part.
    spilled: usize,
}

impl Pending {
    /// Applies `op` to `epoch`'s layer. Keys and values are kept as they come, slices of
    /// their request's receive buffer: a layer holds one epoch, every request of which
    /// carries only that epoch's writes, so the buffers go when the layer goes (at the
    /// next commit or rollback), and copying every key and value would cost more.
    pub fn apply(&mut self, epoch: u64, op: Op) {
        let layer = self.layers.entry(epoch).or_default();
        let before = layer.bytes();
        layer.apply(op);
        self.bytes = self.bytes + layer.bytes() - before;
    }

    /// What the layers say of `key` (`Older`: RocksDB's committed value decides), when
    /// none was spilled (`None` when one was: see [`Pending::lookup_with`]).
    pub fn lookup(&self, key: &[u8]) -> Option<Lookup> {
        (self.spilled == 0)
            .then(|| lookup_newest_first(self.layers.values().rev().map(|l| &l.net), key))
    }

    /// What the layers say of `key`, `spilled(epoch, key)` reading a spilled part's
    /// entry (only for layers newer than the first that decides).
    pub fn lookup_with<E>(
        &self,
        key: &[u8],
        mut spilled: impl FnMut(u64, &[u8]) -> Result<Option<Entry>, E>,
    ) -> Result<Lookup, E> {
        let says = self.layers.iter().rev().flat_map(|(&epoch, l)| {
            let memory = std::iter::once((epoch, &l.net, false));
            memory.chain(l.spilled.as_ref().map(|ranges| (epoch, ranges, true)))
        });
        fold_newest_first(says.map(|(epoch, part, on_disk)| {
            if !on_disk {
                return Ok(part.says(key));
            }
            Ok(match spilled(epoch, key)? {
                Some(entry) => Says::Entry(entry),
                None if part.covers(key) => Says::Covered,
                None => Says::Nothing,
            })
        }))
    }

    /// The epochs with a spilled part, oldest first.
    pub fn spilled_epochs(&self) -> Vec<u64> {
        let layers = self.layers.iter();
        layers
            .filter(|(_, l)| l.spilled.is_some())
            .map(|(e, _)| *e)
            .collect()
    }

    /// Moves the in-memory part of every layer to RocksDB: `ranges(epoch, ranges)`
    /// deletes what the part's ranges cover in the spilled part, then
    /// `entries(epoch, chunk, spilled_ranges)` folds its entries in, a chunk at a time.
    /// What a failed call did not move stays in memory, newer than what it did.
    pub fn spill<E>(
        &mut self,
        chunk_bytes: usize,
        mut ranges: impl FnMut(u64, &BTreeMap<Bytes, End>) -> Result<(), E>,
        mut entries: impl FnMut(u64, &[(Bytes, Entry)], &NetWrites) -> Result<(), E>,
    ) -> Result<(), E> {
        for (&epoch, layer) in self.layers.iter_mut() {
            if layer.net.is_empty() {
                continue;
            }
            if layer.spilled.is_none() {
                self.spilled += 1;
            }
            let before = layer.net.bytes();
            let result = (|| {
                let spilled = layer.spilled.get_or_insert_default();
                if !layer.net.range_map().is_empty() {
                    ranges(epoch, layer.net.range_map())?;
                    for (start, end) in layer.net.take_ranges() {
                        spilled.delete_range(start, end);
                    }
                }
                loop {
                    let chunk = layer.net.take_entries(chunk_bytes);
                    if chunk.is_empty() {
                        return Ok(());
                    }
                    if let Err(e) = entries(epoch, &chunk, spilled) {
                        layer.net.put_back(chunk);
                        return Err(e);
                    }
                }
            })();
            self.bytes = self.bytes + layer.net.bytes() - before;
            result?;
        }
        Ok(())
    }

    /// Records that `epoch` has a spilled part (its entries found in RocksDB).
    pub fn mark_spilled(&mut self, epoch: u64) {
        let layer = self.layers.entry(epoch).or_default();
        if layer.spilled.is_none() {
            layer.spilled = Some(NetWrites::default());
            self.spilled += 1;
        }
    }

    /// The first `n` keys of `[start, end)` (`None`: unbounded) any layer has an entry
    /// for, in order.
    pub fn keys_in(&self, start: &[u8], end: Option<&[u8]>, n: usize) -> Vec<Bytes> {
        let mut keys = BTreeSet::new();
        for layer in self.layers.values() {
            keys.extend(layer.keys_in(start, end).cloned());
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
        let taken = std::mem::replace(&mut self.layers, later);
        self.forget(taken.values());
        // Newest first: each taken layer loses what a newer committed one decides (the
        // newer layers' own maps answer that, one lookup per key, nothing copied).
        let newer: Vec<&Layer> = self.layers.range(..=committed).map(|(_, l)| l).collect();
        let mut taken: Vec<(u64, Layer)> = taken.into_iter().collect();
        for i in (0..taken.len()).rev() {
            let (head, tail) = taken.split_at_mut(i + 1);
            let later = || tail.iter().map(|(_, l)| l).chain(newer.iter().copied());
            if later().next().is_some() {
                head[i]
                    .1
                    .net
                    .remove_entries_where(|k| later().any(|l| l.decides(k)));
            }
        }
        taken
    }

    /// Drops the layers of epochs `> checkpoint`; returns the operations they had
    /// received and whether one had a spilled part.
    pub fn drop_after(&mut self, checkpoint: u64) -> (u64, bool) {
        let Some(next) = checkpoint.checked_add(1) else {
            return (0, false);
        };
        let dropped = self.layers.split_off(&next);
        let spilled = self.forget(dropped.values());
        (dropped.values().map(|l| l.ops).sum(), spilled)
    }

    /// Uncounts layers taken out; returns whether one had a spilled part.
    fn forget<'a>(&mut self, gone: impl Iterator<Item = &'a Layer>) -> bool {
        let mut spilled = false;
        for l in gone {
            self.bytes -= l.bytes();
            if l.spilled.is_some() {
                self.spilled -= 1;
                spilled = true;
            }
        }
        spilled
    }

    /// Every layer, oldest first.
    pub fn layers(&self) -> impl Iterator<Item = (u64, &Layer)> {
        self.layers.iter().map(|(e, l)| (*e, l))
    }

    /// Bytes held in memory (keys, values and a fixed overhead per entry).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Applies a spilled part's deleted range read back from a snapshot.
    fn apply_spilled_range(&mut self, epoch: u64, op: Op) {
        self.mark_spilled(epoch);
        let spilled = self.layers.get_mut(&epoch).and_then(|l| l.spilled.as_mut());
        if let (Some(spilled), Op::DeleteRange(s, e)) = (spilled, op) {
            spilled.delete_range(s, (!e.is_empty()).then_some(e));
        }
    }

    /// Applies a `pending` column family record (`seq` from its key) read back.
    pub fn load(&mut self, epoch: u64, seq: u64, op: Op) {
        if seq >= SPILLED_RANGES_SEQ {
            self.apply_spilled_range(epoch, op)
        } else {
            self.apply(epoch, op)
        }
    }

    /// The `pending` column family records of every layer: the in-memory parts'
    /// operations and the spilled parts' ranges.
    pub fn records(&self) -> impl Iterator<Item = ([u8; 16], Vec<u8>)> + '_ {
        self.layers.iter().flat_map(|(&epoch, layer)| {
            let memory = layer
                .to_ops()
                .enumerate()
                .map(move |(seq, op)| (seq as u64, op));
            let spilled = layer.spilled.iter().flat_map(NetWrites::to_ops);
            let spilled = spilled
                .enumerate()
                .map(|(i, op)| (SPILLED_RANGES_SEQ + i as u64, op));
            memory
                .chain(spilled)
                .map(move |(seq, op)| (key(epoch, seq), encode_op(&op.into())))
        })
    }
}

/// The `pending` column family key of operation `seq` of `epoch`'s layer.
pub fn key(epoch: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&epoch.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The epoch and sequence number of a `pending` column family key.
pub fn parse_key(k: &[u8]) -> Option<(u64, u64)> {
    let k: &[u8; 16] = k.try_into().ok()?;
    let (epoch, seq) = k.split_at(8);
    Some((
        u64::from_be_bytes(epoch.try_into().ok()?),
        u64::from_be_bytes(seq.try_into().ok()?),
    ))
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
        p.lookup(k.as_bytes()).expect("nothing spilled")
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
        assert_eq!(value(&p, "c"), Lookup::Older(Some(b("z"))));
        assert_eq!(value(&p, "d"), Lookup::Older(None));
        p.apply(3, Op::Merge(b("e"), Bytes::new()));
        assert_eq!(value(&p, "e"), Lookup::Older(Some(Bytes::new())));
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
        assert_eq!(value(&p, "z"), Lookup::Older(None));
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
        assert_eq!(p.drop_after(3), (2, false));
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
            let op = decode_op(&encode_op(&op.into())).unwrap();
            again.apply(op);
        }
        fn sorted(l: &Layer) -> BTreeMap<&Bytes, &Entry> {
            l.entries().collect()
        }
        assert_eq!(sorted(&again), sorted(&l));
        assert_eq!(again.bytes(), l.bytes());
        assert_eq!(again.range_map(), l.range_map());
        assert_eq!(decode_op(&[9, 0, 0, 0, 0]), None);
        assert_eq!(decode_op(&[1, 0, 0, 0, 1, b'k', b'v']), None);
    }
}
