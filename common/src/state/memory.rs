//! The in-memory backend (Flink's heap backend): one ordered map per subtask, for unit
//! tests and local runs. Nothing here is durable.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;

use super::backend::{KeyedStateBackend, WriteOp};
use super::error::StateResult;

/// Rough bookkeeping cost of one entry beyond its bytes (tree node share, two `Bytes`).
const ENTRY_OVERHEAD: usize = 64;

#[derive(Default)]
struct Inner {
    map: BTreeMap<Bytes, Bytes>,
    /// Sum of key and value lengths, kept up to date so sizing is O(1).
    bytes: usize,
}

impl Inner {
    fn put(&mut self, key: Bytes, value: Bytes) {
        self.bytes += value.len();
        match self.map.get_mut(&key) {
            Some(old) => {
                self.bytes -= old.len();
                *old = value;
            }
            None => {
                self.bytes += key.len();
                self.map.insert(key, value);
            }
        }
    }

    fn delete(&mut self, key: &[u8]) {
        if let Some((k, v)) = self.map.remove_entry(key) {
            self.bytes -= k.len() + v.len();
        }
    }

    fn merge(&mut self, key: Bytes, operand: Bytes) {
        let Some(old) = self.map.get_mut(&key) else {
            self.put(key, operand);
            return;
        };
        self.bytes += operand.len();
        // Append in place when no reader holds the old value, so that a list growing by
        // one element per record costs amortised O(element), not O(list).
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

    fn delete_range(&mut self, start: &[u8], end: &[u8]) {
        let doomed: Vec<Bytes> = match range(start, end) {
            Some(r) => self
                .map
                .range::<[u8], _>(r)
                .map(|(k, _)| k.clone())
                .collect(),
            None => return,
        };
        for k in doomed {
            self.delete(&k);
        }
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

/// Keyed state in a `BTreeMap` behind a mutex, one per subtask so the lock is uncontended.
#[derive(Default)]
pub struct MemoryStateBackend {
    inner: Mutex<Inner>,
}

impl MemoryStateBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while locked can only come from an allocation failure mid-batch; the map
        // is still a valid map, so carry on rather than poison every later access.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Approximate memory held: key and value bytes plus a per-entry overhead.
    pub fn approx_size_bytes(&self) -> usize {
        let inner = self.lock();
        inner.bytes + inner.map.len() * ENTRY_OVERHEAD
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.lock().map.is_empty()
    }
}

impl std::fmt::Debug for MemoryStateBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemoryStateBackend")
            .field("entries", &inner.map.len())
            .field("bytes", &inner.bytes)
            .finish()
    }
}

#[async_trait]
impl KeyedStateBackend for MemoryStateBackend {
    async fn get_many(&self, keys: &[Bytes]) -> StateResult<Vec<Option<Bytes>>> {
        let inner = self.lock();
        Ok(keys.iter().map(|k| inner.map.get(k).cloned()).collect())
    }

    async fn write(&self, ops: Vec<WriteOp>) -> StateResult<()> {
        // One lock for the whole batch is what makes it atomic to readers.
        let mut inner = self.lock();
        for op in ops {
            match op {
                WriteOp::Put { key, value } => inner.put(key, value),
                WriteOp::Delete { key } => inner.delete(&key),
                WriteOp::Merge { key, operand } => inner.merge(key, operand),
                WriteOp::DeleteRange { start, end } => inner.delete_range(&start, &end),
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
        let inner = self.lock();
        let entries = inner.map.range::<[u8], _>(r);
        let limit = limit.unwrap_or(usize::MAX);
        Ok(entries
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::state::conformance;

    #[tokio::test]
    async fn conformance() {
        conformance::run_all(&|| Arc::new(MemoryStateBackend::new())).await
    }

    #[tokio::test]
    async fn size_tracks_puts_merges_and_deletes() {
        let b = MemoryStateBackend::new();
        assert!(b.is_empty());
        let k = Bytes::from_static(b"key");
        b.write(vec![WriteOp::Put {
            key: k.clone(),
            value: Bytes::from_static(b"12345"),
        }])
        .await
        .unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b.approx_size_bytes(), 3 + 5 + ENTRY_OVERHEAD);
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
        assert_eq!(b.approx_size_bytes(), 3 + 7 + 5 + 2 * ENTRY_OVERHEAD);
        b.write(vec![WriteOp::DeleteRange {
            start: Bytes::new(),
            end: Bytes::new(),
        }])
        .await
        .unwrap();
        assert_eq!((b.len(), b.approx_size_bytes()), (0, 0));
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
}
