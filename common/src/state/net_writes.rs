//! The net effect of a run of writes: the latest operation per key and the ranges
//! deleted, what both the remote client's epoch buffer and the state service's
//! uncommitted layers hold.
//!
//! Entries are hashed, in one map per key group: state keys share long prefixes (key
//! group, operator, state name), so ordered lookups would spend their time comparing
//! those, and a range delete, which in practice stays within a key group or a few, only
//! looks at the maps of the groups it spans. Deleted ranges are kept merged and
//! disjoint, so whether one covers a key is one ordered lookup however many were
//! deleted. An entry inside one of the ranges was written after that range was deleted
//! (a range delete drops the entries it covers), so applying a [`NetWrites`] elsewhere
//! is: ranges first, then entries.
//!
//! It knows nothing of the network or of RocksDB.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use bytes::Bytes;

use super::backend::WriteOp;

/// Bytes an entry is charged beyond its key and value.
const ENTRY_OVERHEAD: usize = 48;

/// The latest operation on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The key's value is this.
    Put(Bytes),
    /// The key is absent.
    Delete,
    /// These bytes are appended to whatever value older writes give.
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

/// What a stack of [`NetWrites`] says of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The writes decide the value (`None`: absent).
    Value(Option<Bytes>),
    /// The value is the one older state (below every layer looked at) holds, with these
    /// bytes appended when merges say so (`Some` even when empty: an empty merge onto an
    /// absent key creates it).
    Older(Option<Bytes>),
}

/// A range end: `None` is unbounded.
pub type End = Option<Bytes>;

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

/// The latest operation per key and the deleted ranges of a run of writes.
#[derive(Debug, Default)]
pub struct NetWrites {
    entries: BTreeMap<u16, Group>,
    /// Deleted ranges, disjoint, by start.
    ranges: BTreeMap<Bytes, End>,
    bytes: usize,
}

impl NetWrites {
    /// Applies one write.
    pub fn apply(&mut self, op: WriteOp) {
        match op {
            WriteOp::Put { key, value } => self.set(key, Entry::Put(value)),
            WriteOp::Delete { key } => self.set(key, Entry::Delete),
            WriteOp::Merge { key, operand } => self.merge(key, operand),
            WriteOp::DeleteRange { start, end } => {
                self.delete_range(start, (!end.is_empty()).then_some(end))
            }
        }
    }

    /// Records an append, folding it into what is already there for the key.
    pub fn merge(&mut self, key: Bytes, operand: Bytes) {
        let next = match self.get(&key) {
            Some(Entry::Put(v)) => Entry::Put(concat(v, &operand)),
            Some(Entry::Delete) => Entry::Put(operand),
            Some(Entry::Merge(m)) => Entry::Merge(concat(m, &operand)),
            // The range applies first: the older value is gone by then.
            None if self.covers(&key) => Entry::Put(operand),
            None => Entry::Merge(operand),
        };
        self.set(key, next);
    }

    /// The latest operation on `key`, if any.
    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(&group_of(key))?.get(key)
    }

    /// Whether one of the deleted ranges covers `key`.
    pub fn covers(&self, key: &[u8]) -> bool {
        covered(&self.ranges, key)
    }

    /// Whether these writes decide `key` whatever older writes did: they put or delete
    /// it, or a range of theirs covers it (an append builds on older writes; and an
    /// append written after a covering range is recorded as a put).
    pub fn decides(&self, key: &[u8]) -> bool {
        match self.get(key) {
            Some(Entry::Put(_) | Entry::Delete) => true,
            Some(Entry::Merge(_)) => false,
            None => self.covers(key),
        }
    }

    /// What these writes alone say of `key`.
    pub fn lookup(&self, key: &[u8]) -> Lookup {
        lookup_newest_first(std::iter::once(self), key)
    }

    /// What these writes say of `key`.
    pub fn says(&self, key: &[u8]) -> Says {
        match self.get(key) {
            Some(e) => Says::Entry(e.clone()),
            None if self.covers(key) => Says::Covered,
            None => Says::Nothing,
        }
    }

    /// Removes and returns the deleted ranges (the entries stay: they were written
    /// after the ranges, so they mean the same on top of whatever the ranges became).
    pub fn take_ranges(&mut self) -> BTreeMap<Bytes, End> {
        let ranges = std::mem::take(&mut self.ranges);
        for (s, e) in &ranges {
            self.bytes -= s.len() + e.as_ref().map_or(0, Bytes::len) + ENTRY_OVERHEAD;
        }
        ranges
    }

    /// Removes and returns whole key groups of entries, at least one group and at most
    /// about `max_bytes` of them (more when one group alone holds more).
    pub fn take_entries(&mut self, max_bytes: usize) -> Vec<(Bytes, Entry)> {
        let mut out = Vec::new();
        let mut taken = 0;
        while taken < max_bytes {
            let Some((_, group)) = self.entries.pop_first() else {
                break;
            };
            for (k, e) in group {
                let n = k.len() + e.len() + ENTRY_OVERHEAD;
                taken += n;
                self.bytes -= n;
                out.push((k, e));
            }
        }
        out
    }

    /// Puts back entries [`NetWrites::take_entries`] took (nothing newer was written).
    pub fn put_back(&mut self, entries: Vec<(Bytes, Entry)>) {
        for (k, e) in entries {
            self.set(k, e);
        }
    }

    fn set(&mut self, key: Bytes, entry: Entry) {
        let add = key.len() + entry.len() + ENTRY_OVERHEAD;
        let group = self.entries.entry(group_of(&key)).or_default();
        if let Some(old) = group.insert(key.clone(), entry) {
            self.bytes -= key.len() + old.len() + ENTRY_OVERHEAD;
        }
        self.bytes += add;
    }

    /// Removes the entries whose keys are `gone`, only looking in the key groups of
    /// `[start, end)`.
    fn remove_entries_in(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
        gone: impl Fn(&[u8]) -> bool,
    ) {
        let groups: Vec<u16> = self.groups_of_range(start, end).map(|(g, _)| *g).collect();
        self.remove_entries(groups, gone);
    }

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

    /// Removes every entry `gone` says, in any key group.
    pub fn remove_entries_where(&mut self, gone: impl Fn(&[u8]) -> bool) {
        let groups = self.entries.keys().copied().collect();
        self.remove_entries(groups, gone);
    }

    /// The keys of `[start, end)` (`None`: unbounded) with an entry, unordered.
    pub fn keys_in<'a>(
        &'a self,
        start: &'a [u8],
        end: Option<&'a [u8]>,
    ) -> impl Iterator<Item = &'a Bytes> + 'a {
        self.groups_of_range(start, end)
            .flat_map(|(_, group)| group.keys())
            .filter(move |k| k.as_ref() >= start && end.is_none_or(|e| k.as_ref() < e))
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

    /// Deletes every key in `[start, end)` (`None`: unbounded): the entries it covers
    /// go, and the range is merged with those it overlaps or touches.
    pub fn delete_range(&mut self, mut start: Bytes, mut end: End) {
        {
            let (s, e) = (&start, &end);
            self.remove_entries_in(s, e.as_deref(), |k| k >= s.as_ref() && below(k, e));
        }
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

    /// The deleted ranges, disjoint, by start.
    pub fn ranges(&self) -> impl Iterator<Item = (&Bytes, Option<&Bytes>)> {
        self.ranges.iter().map(|(s, e)| (s, e.as_ref()))
    }

    /// The deleted ranges as a map.
    pub fn range_map(&self) -> &BTreeMap<Bytes, End> {
        &self.ranges
    }

    /// The latest operation per key, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (&Bytes, &Entry)> {
        self.entries.values().flatten()
    }

    /// The writes as operations that rebuild them when applied in order to an empty
    /// [`NetWrites`] (ranges first).
    pub fn to_ops(&self) -> impl Iterator<Item = WriteOp> + '_ {
        let ranges = self.ranges.iter().map(|(s, e)| WriteOp::DeleteRange {
            start: s.clone(),
            end: e.clone().unwrap_or_default(),
        });
        let entries = self.entries().map(|(k, e)| match e {
            Entry::Put(v) => WriteOp::Put {
                key: k.clone(),
                value: v.clone(),
            },
            Entry::Delete => WriteOp::Delete { key: k.clone() },
            Entry::Merge(m) => WriteOp::Merge {
                key: k.clone(),
                operand: m.clone(),
            },
        });
        ranges.chain(entries)
    }

    /// Approximate bytes held (keys, values and a fixed overhead per entry and range).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.ranges.is_empty()
    }
}

/// What one layer of writes says of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Says {
    /// Its latest operation on the key.
    Entry(Entry),
    /// No operation on the key, but a range it deleted covers it.
    Covered,
    /// Nothing: older layers decide.
    Nothing,
}

/// What a stack of writes says of `key`, given newest first: the first that puts,
/// deletes or range-deletes it decides, with the appends of newer ones on top.
pub fn lookup_newest_first<'a>(
    layers: impl IntoIterator<Item = &'a NetWrites>,
    key: &[u8],
) -> Lookup {
    let says = layers
        .into_iter()
        .map(|l| Ok::<_, std::convert::Infallible>(l.says(key)));
    match fold_newest_first(says) {
        Ok(found) => found,
        Err(never) => match never {},
    }
}

/// What a stack of layers says of a key, given what each says newest first (read
/// lazily: the layers below the first that decides are not asked).
pub fn fold_newest_first<E>(says: impl IntoIterator<Item = Result<Says, E>>) -> Result<Lookup, E> {
    // Operands of merges met so far, newest first.
    let mut tail: Vec<Bytes> = Vec::new();
    let with_tail = |base: Option<Bytes>, tail: &[Bytes]| -> Option<Bytes> {
        if tail.is_empty() {
            return base;
        }
        let mut v = base.map(|b| b.to_vec()).unwrap_or_default();
        for t in tail.iter().rev() {
            v.extend_from_slice(t);
        }
        Some(Bytes::from(v))
    };
    for said in says {
        match said? {
            Says::Entry(Entry::Put(v)) => return Ok(Lookup::Value(with_tail(Some(v), &tail))),
            Says::Entry(Entry::Delete) | Says::Covered => {
                return Ok(Lookup::Value(with_tail(None, &tail)));
            }
            Says::Entry(Entry::Merge(m)) => tail.push(m),
            Says::Nothing => {}
        }
    }
    Ok(if tail.is_empty() {
        Lookup::Older(None)
    } else {
        Lookup::Older(with_tail(None, &tail))
    })
}

/// A key's value from older state, `base`, with what a [`Lookup::Older`] says newer
/// merges append (`None`: nothing).
pub fn with_appended(base: Option<Bytes>, tail: Option<Bytes>) -> Option<Bytes> {
    match (base, tail) {
        (base, None) => base,
        (None, Some(tail)) => Some(tail),
        (Some(base), Some(tail)) => Some(concat(&base, &tail)),
    }
}

/// Whether one of the disjoint `ranges` (by start) covers `key`.
pub fn covered(ranges: &BTreeMap<Bytes, End>, key: &[u8]) -> bool {
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

/// `a` followed by `b`.
pub fn concat(a: &[u8], b: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(a.len() + b.len());
    v.extend_from_slice(a);
    v.extend_from_slice(b);
    Bytes::from(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn the_latest_write_of_a_key_wins_and_merges_fold() {
        let mut w = NetWrites::default();
        w.merge(b("k"), b("a"));
        w.merge(b("k"), b("b"));
        assert_eq!(w.lookup(b"k"), Lookup::Older(Some(b("ab"))));
        w.apply(WriteOp::Put {
            key: b("k"),
            value: b("x"),
        });
        w.merge(b("k"), b("y"));
        assert_eq!(w.lookup(b"k"), Lookup::Value(Some(b("xy"))));
        w.apply(WriteOp::Delete { key: b("k") });
        assert_eq!(w.lookup(b"k"), Lookup::Value(None));
        w.merge(b("k"), b("z"));
        assert_eq!(w.lookup(b"k"), Lookup::Value(Some(b("z"))));
        assert_eq!(w.lookup(b"other"), Lookup::Older(None));
        assert!(w.bytes() > 0);
        assert_eq!(w.entries().count(), 1);
    }

    #[test]
    fn a_range_delete_drops_what_it_covers_merges_with_its_neighbours_and_later_writes_stand() {
        let mut w = NetWrites::default();
        w.apply(WriteOp::Put {
            key: b("a1"),
            value: b("x"),
        });
        w.apply(WriteOp::Put {
            key: b("b1"),
            value: b("x"),
        });
        w.delete_range(b("a"), Some(b("b")));
        assert_eq!(w.lookup(b"a1"), Lookup::Value(None));
        assert_eq!(w.lookup(b"a2"), Lookup::Value(None));
        assert_eq!(w.lookup(b"b1"), Lookup::Value(Some(b("x"))));
        // Written after the range: stands, and an append over a deleted value is the value.
        w.apply(WriteOp::Put {
            key: b("a1"),
            value: b("y"),
        });
        w.merge(b("a2"), b("z"));
        assert_eq!(w.lookup(b"a1"), Lookup::Value(Some(b("y"))));
        assert_eq!(w.lookup(b"a2"), Lookup::Value(Some(b("z"))));
        // Touching ranges merge; the entry between them that the new range covers goes.
        w.delete_range(b("b"), Some(b("b5")));
        assert_eq!(w.lookup(b"b1"), Lookup::Value(None));
        assert_eq!(w.ranges().count(), 1);
        w.apply(WriteOp::DeleteRange {
            start: b("c"),
            end: Bytes::new(),
        });
        assert_eq!(w.lookup(b"zzz"), Lookup::Value(None));
        assert_eq!(w.lookup(b"b7"), Lookup::Older(None));
        let ops: Vec<WriteOp> = w.to_ops().collect();
        assert!(matches!(ops[0], WriteOp::DeleteRange { .. }));
        assert!(matches!(ops[1], WriteOp::DeleteRange { .. }));
        assert_eq!(ops.len(), 4);
    }

    #[test]
    fn a_stack_reads_newest_first_with_appends_on_top() {
        let mut old = NetWrites::default();
        old.apply(WriteOp::Put {
            key: b("k"),
            value: b("v"),
        });
        let mut new = NetWrites::default();
        new.merge(b("k"), b("+"));
        assert_eq!(
            lookup_newest_first([&new, &old], b"k"),
            Lookup::Value(Some(b("v+")))
        );
        assert_eq!(
            lookup_newest_first([&new], b"k"),
            Lookup::Older(Some(b("+")))
        );
        new.delete_range(b("a"), Some(b("z")));
        assert_eq!(lookup_newest_first([&new, &old], b"k"), Lookup::Value(None));
    }
}
