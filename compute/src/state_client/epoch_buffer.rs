//! The epoch write buffer: mutations a subtask made since it last shipped them.
//!
//! Writes between two barriers stay here, one entry per key holding the key's latest
//! pending mutation, so a key written a thousand times in an epoch costs one operation
//! on the wire. The buffer is shipped to the state service at the barrier (or earlier,
//! when it outgrows its budget; the writes still belong to the open epoch and stay
//! uncommitted until the checkpoint completes). Reads consult it first, so a subtask
//! always reads its own writes. A range delete is buffered too: it drops the entries it
//! covers, and every entry left in its range was written after it, so a ship sends the
//! ranges before the entries.
//!
//! It knows nothing of the network: it turns writes into entries and entries into
//! [`WriteOp`]s.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use sluice_common::pb::state as pb;

/// The pending mutation of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// The key's value is this.
    Put(Bytes),
    /// The key is absent.
    Delete,
    /// These bytes are appended to whatever value the service holds.
    Merge(Bytes),
}

/// What the buffer knows of a key's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The buffer decides the value (`None`: absent).
    Known(Option<Bytes>),
    /// The value is the service's value with these bytes appended.
    Append(Bytes),
    /// The buffer holds nothing for the key.
    Unknown,
}

/// Pending mutations by state key.
///
/// A hash map, not an ordered one: state keys share long prefixes (key group, operator,
/// state name), so ordered lookups spend their time comparing those; nothing needs the
/// order (a ship sends each key once, in any order).
pub type Entries = HashMap<Bytes, Pending, foldhash::fast::RandomState>;

/// What a buffer holds: the latest mutation per key, and the ranges deleted before
/// any of the entries inside them were written.
#[derive(Debug, Default)]
pub struct Writes {
    /// Pending mutations by state key.
    pub entries: Entries,
    /// Deleted `[start, end)` ranges (an empty end: unbounded), in the order deleted.
    pub ranges: Vec<(Bytes, Bytes)>,
}

impl Writes {
    /// What these writes decide about `key`.
    pub fn lookup(&self, key: &[u8]) -> Lookup {
        match self.entries.get(key) {
            Some(Pending::Put(v)) => Lookup::Known(Some(v.clone())),
            Some(Pending::Delete) => Lookup::Known(None),
            Some(Pending::Merge(m)) => Lookup::Append(m.clone()),
            None if self.covers(key) => Lookup::Known(None),
            None => Lookup::Unknown,
        }
    }

    /// Whether a deleted range holds `key`.
    fn covers(&self, key: &[u8]) -> bool {
        self.ranges.iter().any(|(s, e)| in_range(key, s, e))
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.ranges.is_empty()
    }
}

fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    key >= start && (end.is_empty() || key < end)
}

/// Pending mutations by state key.
#[derive(Debug, Default)]
pub struct EpochBuffer {
    writes: Writes,
    bytes: usize,
}

impl EpochBuffer {
    /// Records a put.
    pub fn put(&mut self, key: Bytes, value: Bytes) {
        self.set(key, Pending::Put(value));
    }

    /// Records a delete.
    pub fn delete(&mut self, key: Bytes) {
        self.set(key, Pending::Delete);
    }

    /// Records an append, folding it into what is already pending for the key.
    pub fn merge(&mut self, key: Bytes, operand: Bytes) {
        let next = match self.writes.entries.get(&key) {
            Some(Pending::Put(v)) => Pending::Put(concat(v, &operand)),
            Some(Pending::Delete) => Pending::Put(operand),
            Some(Pending::Merge(m)) => Pending::Merge(concat(m, &operand)),
            // The range is shipped first: the service's value is gone by then.
            None if self.writes.covers(&key) => Pending::Put(operand),
            None => Pending::Merge(operand),
        };
        self.set(key, next);
    }

    fn set(&mut self, key: Bytes, pending: Pending) {
        let add = key.len() + pending_len(&pending);
        if let Some(old) = self.writes.entries.insert(key.clone(), pending) {
            self.bytes -= key.len() + pending_len(&old);
        }
        self.bytes += add;
    }

    /// Records the delete of every key in `[start, end)` (an empty end: unbounded):
    /// the entries it covers are dropped, as the service would drop their values.
    pub fn delete_range(&mut self, start: Bytes, end: Bytes) {
        let mut freed = 0;
        self.writes.entries.retain(|k, p| {
            let gone = in_range(k, &start, &end);
            if gone {
                freed += k.len() + pending_len(p);
            }
            !gone
        });
        self.bytes = self.bytes - freed + start.len() + end.len() + 16;
        self.writes.ranges.push((start, end));
    }

    /// What the buffer knows of `key`.
    pub fn lookup(&self, key: &[u8]) -> Lookup {
        self.writes.lookup(key)
    }

    /// Approximate bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Empties the buffer, returning its writes.
    pub fn take(&mut self) -> Writes {
        self.bytes = 0;
        std::mem::take(&mut self.writes)
    }
}

/// The wire form of one pending mutation.
pub fn to_wire(key: Bytes, pending: Pending) -> pb::WriteOp {
    let (kind, value) = match pending {
        Pending::Put(v) => (pb::write_op::Kind::Put, v),
        Pending::Delete => (pb::write_op::Kind::Delete, Bytes::new()),
        Pending::Merge(m) => (pb::write_op::Kind::Merge, m),
    };
    pb::WriteOp {
        kind: kind as i32,
        key,
        value,
        end: Bytes::new(),
    }
}

/// The wire form of the delete of `[start, end)` (an empty end: unbounded).
pub fn range_to_wire(start: Bytes, end: Bytes) -> pb::WriteOp {
    pb::WriteOp {
        kind: pb::write_op::Kind::DeleteRange as i32,
        key: start,
        value: Bytes::new(),
        end,
    }
}

/// `base` followed by `tail`.
pub fn concat(base: &[u8], tail: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(base.len() + tail.len());
    out.extend_from_slice(base);
    out.extend_from_slice(tail);
    out.freeze()
}

fn pending_len(p: &Pending) -> usize {
    match p {
        Pending::Put(v) | Pending::Merge(v) => v.len() + 16,
        Pending::Delete => 16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn the_latest_mutation_of_a_key_wins_and_merges_fold() {
        let mut buf = EpochBuffer::default();
        buf.merge(b("k"), b("a"));
        buf.merge(b("k"), b("b"));
        assert_eq!(buf.lookup(b"k"), Lookup::Append(b("ab")));
        buf.put(b("k"), b("x"));
        buf.merge(b("k"), b("y"));
        assert_eq!(buf.lookup(b"k"), Lookup::Known(Some(b("xy"))));
        buf.delete(b("k"));
        assert_eq!(buf.lookup(b"k"), Lookup::Known(None));
        buf.merge(b("k"), b("z"));
        assert_eq!(buf.lookup(b"k"), Lookup::Known(Some(b("z"))));
        assert_eq!(buf.lookup(b"other"), Lookup::Unknown);
        let bytes = buf.bytes();
        assert!(bytes > 0);
        let taken = buf.take();
        assert_eq!(taken.entries.len(), 1);
        assert_eq!(buf.bytes(), 0);
        assert!(buf.is_empty());
    }

    #[test]
    fn a_range_delete_drops_what_it_covers_and_later_writes_stand() {
        let mut buf = EpochBuffer::default();
        buf.put(b("a1"), b("x"));
        buf.put(b("b1"), b("x"));
        buf.delete_range(b("a"), b("b"));
        assert_eq!(buf.lookup(b"a1"), Lookup::Known(None));
        assert_eq!(buf.lookup(b"a2"), Lookup::Known(None));
        assert_eq!(buf.lookup(b"b1"), Lookup::Known(Some(b("x"))));
        // Written after the range: stands, and an append over a deleted value is the value.
        buf.put(b("a1"), b("y"));
        buf.merge(b("a2"), b("z"));
        assert_eq!(buf.lookup(b"a1"), Lookup::Known(Some(b("y"))));
        assert_eq!(buf.lookup(b"a2"), Lookup::Known(Some(b("z"))));
        buf.delete_range(b("c"), Bytes::new());
        assert_eq!(buf.lookup(b"zzz"), Lookup::Known(None));
        assert_eq!(buf.lookup(b"b2"), Lookup::Unknown);
        let taken = buf.take();
        assert_eq!(taken.ranges.len(), 2);
        assert_eq!(taken.entries.len(), 3);
        assert!(buf.is_empty());
    }
}
