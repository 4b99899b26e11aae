//! Uncommitted writes that outgrew memory: when the layers of every shard of a node
//! together pass their share of the memory budget ([`PendingBudget`]), the shard being
//! written moves its layers' in-memory part to RocksDB's `spill` column family, where
//! memtables are charged to the write buffer manager and so to the budget.
//!
//! Why not straight into live state: spilled writes are still uncommitted (a rollback
//! drops them), so they are kept apart, keyed `[epoch u64 BE][key]`, one entry per key
//! and epoch (the epoch's net effect, as in memory). An epoch then has two parts: the
//! spilled one (its entries here, its deleted ranges in memory: they are few) and the
//! in-memory one, newer. Spilling again folds the newer part into the spilled one: its
//! ranges delete the spilled entries they cover, its puts and deletes replace, its
//! appends are appended to what is there (read first).
//!
//! This module knows the column family's layout and nothing of epochs' lifecycle; the
//! shard decides when to spill, read, apply and drop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use rocksdb::{DB, IteratorMode, ReadOptions, WriteBatch};
use sluice_common::state::net_writes::{End, Entry, NetWrites, concat};

use crate::error::{Error, Result};
use crate::rocks::write_options;

/// Column family of spilled uncommitted writes.
pub const CF_SPILL: &str = "spill";

/// The share of a node's memory budget its shards' uncommitted layers may hold.
#[derive(Debug)]
pub struct PendingBudget {
    limit: usize,
    used: AtomicUsize,
    spilled: AtomicU64,
}

impl PendingBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            spilled: AtomicU64::new(0),
        }
    }

    /// Records that a shard's layers went from `before` to `after` bytes.
    pub fn adjust(&self, before: usize, after: usize) {
        if after >= before {
            self.used.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.used.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Whether the layers of every shard together hold more than the budget.
    pub fn over(&self) -> bool {
        self.used() > self.limit
    }

    /// Bytes held by every shard's layers.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The budget.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Counts `bytes` of layers moved to RocksDB.
    pub fn spilled(&self, bytes: usize) {
        self.spilled.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Bytes of layers moved to RocksDB since the node started.
    pub fn spilled_bytes(&self) -> u64 {
        self.spilled.load(Ordering::Relaxed)
    }
}

fn cf(db: &DB) -> Result<&rocksdb::ColumnFamily> {
    db.cf_handle(CF_SPILL)
        .ok_or_else(|| Error::Internal(format!("column family {CF_SPILL} missing")))
}

/// The spill key of `key` in `epoch`.
fn spill_key(epoch: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&epoch.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// The first spill key after every key of `epoch`.
fn epoch_end(epoch: u64) -> Vec<u8> {
    match epoch.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xFF; 9],
    }
}

/// `[start, end)` of `epoch` as spill keys (`None`: to the epoch's end).
fn range_keys(epoch: u64, start: &[u8], end: Option<&[u8]>) -> (Vec<u8>, Vec<u8>) {
    let end = match end {
        Some(end) => spill_key(epoch, end),
        None => epoch_end(epoch),
    };
    (spill_key(epoch, start), end)
}

/// `[tag u8][bytes]`: 0 put, 1 delete, 2 append.
fn encode(entry: &Entry) -> Vec<u8> {
    let (tag, v): (u8, &[u8]) = match entry {
        Entry::Put(v) => (0, v),
        Entry::Delete => (1, &[]),
        Entry::Merge(m) => (2, m),
    };
    let mut out = Vec::with_capacity(1 + v.len());
    out.push(tag);
    out.extend_from_slice(v);
    out
}

fn decode(v: &[u8]) -> Result<Entry> {
    let malformed = || Error::Internal(format!("malformed spilled entry {v:02x?}"));
    let (&tag, rest) = v.split_first().ok_or_else(malformed)?;
    Ok(match tag {
        0 => Entry::Put(Bytes::copy_from_slice(rest)),
        1 if rest.is_empty() => Entry::Delete,
        2 => Entry::Merge(Bytes::copy_from_slice(rest)),
        _ => return Err(malformed()),
    })
}

/// Deletes the spilled entries of `epoch` that `ranges` cover (a newer part's ranges).
pub fn write_ranges(db: &DB, epoch: u64, ranges: &BTreeMap<Bytes, End>) -> Result<()> {
    let cf = cf(db)?;
    let mut batch = WriteBatch::default();
    for (start, end) in ranges {
        let (s, e) = range_keys(epoch, start, end.as_deref());
        batch.delete_range_cf(cf, s, e);
    }
    db.write_opt(batch, &write_options())?;
    Ok(())
}

/// Folds newer `entries` of `epoch` into its spilled part, whose deleted ranges are
/// `ranges` (they already include those of the part the entries come from).
pub fn write_entries(
    db: &DB,
    epoch: u64,
    entries: &[(Bytes, Entry)],
    ranges: &NetWrites,
) -> Result<()> {
    let cf = cf(db)?;
    let appends: Vec<Vec<u8>> = entries
        .iter()
        .filter(|(_, e)| matches!(e, Entry::Merge(_)))
        .map(|(k, _)| spill_key(epoch, k))
        .collect();
    let mut older = db
        .batched_multi_get_cf(cf, appends.iter(), false)
        .into_iter();
    let mut batch = WriteBatch::default();
    for (key, entry) in entries {
        let entry = match entry {
            Entry::Merge(m) => {
                let older = older
                    .next()
                    .ok_or_else(|| Error::Internal("spill read came back short".into()))??;
                match older.map(|v| decode(&v)).transpose()? {
                    Some(Entry::Put(v)) => Entry::Put(concat(&v, m)),
                    Some(Entry::Delete) => Entry::Put(m.clone()),
                    Some(Entry::Merge(a)) => Entry::Merge(concat(&a, m)),
                    None if ranges.covers(key) => Entry::Put(m.clone()),
                    None => Entry::Merge(m.clone()),
                }
            }
            e => e.clone(),
        };
        batch.put_cf(cf, spill_key(epoch, key), encode(&entry));
    }
    db.write_opt(batch, &write_options())?;
    Ok(())
}

/// `key`'s spilled entry in `epoch`, if any.
pub fn get(db: &DB, epoch: u64, key: &[u8]) -> Result<Option<Entry>> {
    db.get_pinned_cf(cf(db)?, spill_key(epoch, key))?
        .map(|v| decode(&v))
        .transpose()
}

/// An iterator over the spilled entries of `epoch` in `[start, end)`, in key order.
fn iter<'a>(
    db: &'a DB,
    epoch: u64,
    start: &[u8],
    end: Option<&[u8]>,
) -> Result<impl Iterator<Item = Result<(Bytes, Entry)>> + 'a> {
    let (s, e) = range_keys(epoch, start, end);
    let mut ro = ReadOptions::default();
    ro.set_iterate_upper_bound(e);
    let it = db.iterator_cf_opt(
        cf(db)?,
        ro,
        IteratorMode::From(&s, rocksdb::Direction::Forward),
    );
    Ok(it.map(|item| {
        let (k, v) = item?;
        Ok((Bytes::copy_from_slice(&k[8..]), decode(&v)?))
    }))
}

/// The first `n` keys of `[start, end)` with a spilled entry in `epoch`.
pub fn keys_in(
    db: &DB,
    epoch: u64,
    start: &[u8],
    end: Option<&[u8]>,
    n: usize,
) -> Result<Vec<Bytes>> {
    iter(db, epoch, start, end)?
        .take(n)
        .map(|item| item.map(|(k, _)| k))
        .collect()
}

/// Calls `f` with every spilled entry of `epoch`, in key order.
pub fn for_each(db: &DB, epoch: u64, mut f: impl FnMut(Bytes, Entry) -> Result<()>) -> Result<()> {
    for item in iter(db, epoch, &[], None)? {
        let (k, e) = item?;
        f(k, e)?;
    }
    Ok(())
}

/// Deletes the spilled entries of the epochs in `[first, last]`.
pub fn drop_epochs(db: &DB, first: u64, last: u64) -> Result<()> {
    let mut batch = WriteBatch::default();
    batch.delete_range_cf(cf(db)?, &first.to_be_bytes()[..], &epoch_end(last)[..]);
    db.write_opt(batch, &write_options())?;
    Ok(())
}

/// The epochs with spilled entries, in order.
pub fn epochs(db: &DB) -> Result<Vec<u64>> {
    let cf = cf(db)?;
    let mut out = Vec::new();
    let mut from = Vec::new();
    loop {
        let mut it = db.iterator_cf(cf, IteratorMode::From(&from, rocksdb::Direction::Forward));
        let Some(item) = it.next() else { break };
        let (k, _) = item?;
        let epoch = k
            .get(..8)
            .and_then(|e| e.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| Error::Internal(format!("malformed spill key {k:02x?}")))?;
        out.push(epoch);
        match epoch.checked_add(1) {
            Some(next) => from = next.to_be_bytes().to_vec(),
            None => break,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_garbage_is_refused() {
        for e in [
            Entry::Put(Bytes::from_static(b"v")),
            Entry::Delete,
            Entry::Merge(Bytes::new()),
        ] {
            assert_eq!(decode(&encode(&e)).unwrap(), e);
        }
        assert!(decode(&[]).is_err());
        assert!(decode(&[1, 0]).is_err());
        assert!(decode(&[7]).is_err());
    }

    #[test]
    fn the_budget_counts_what_shards_report() {
        let b = PendingBudget::new(10);
        b.adjust(0, 8);
        assert!(!b.over());
        b.adjust(0, 5);
        assert!(b.over());
        b.adjust(8, 0);
        assert_eq!(b.used(), 5);
        assert!(!b.over());
    }
}
