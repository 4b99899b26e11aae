//! The state client's read cache: recent values of keys, present or absent, so hot keys
//! do not cross the network (DESIGN §7).
//!
//! A bounded foyer in-memory cache weighted by bytes. It holds what the state service
//! holds for a key once this subtask's shipped writes are applied: writes update it when
//! they are acknowledged, and a range delete empties it (foyer has no range removal,
//! and range deletes are rare). A generation number lets a read that raced with a clear
//! drop its now-stale answer instead of caching it.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use foyer::{Cache, CacheBuilder};

/// Bytes of bookkeeping charged per entry on top of key and value.
const ENTRY_OVERHEAD: usize = 48;

/// Cached values of state keys (`None`: known absent).
pub struct ReadCache {
    cache: Option<Cache<Bytes, Option<Bytes>>>,
    generation: AtomicU64,
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCache")
            .field("enabled", &self.cache.is_some())
            .finish()
    }
}

impl ReadCache {
    /// A cache of about `capacity_bytes`; 0 disables caching.
    pub fn new(capacity_bytes: usize) -> Self {
        let cache = (capacity_bytes > 0).then(|| {
            CacheBuilder::new(capacity_bytes)
                .with_shards(4)
                .with_weighter(|k: &Bytes, v: &Option<Bytes>| {
                    k.len() + v.as_ref().map_or(0, Bytes::len) + ENTRY_OVERHEAD
                })
                .build()
        });
        Self {
            cache,
            generation: AtomicU64::new(0),
        }
    }

    /// The cached value of `key`: `None` on a miss, `Some(None)` when known absent.
    pub fn get(&self, key: &Bytes) -> Option<Option<Bytes>> {
        self.cache.as_ref()?.get(key).map(|e| e.value().clone())
    }

    /// The current generation; pass it to [`ReadCache::fill`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Caches a value read from the service, unless the cache was cleared since the
    /// read started (`generation` is from before the read).
    pub fn fill(&self, generation: u64, key: Bytes, value: Option<Bytes>) {
        if let Some(cache) = &self.cache
            && self.generation() == generation
        {
            cache.insert(key, value);
        }
    }

    /// Records a value the service now holds because of this subtask's write.
    pub fn set(&self, key: Bytes, value: Option<Bytes>) {
        if let Some(cache) = &self.cache {
            cache.insert(key, value);
        }
    }

    /// Forgets `key`.
    pub fn remove(&self, key: &Bytes) {
        if let Some(cache) = &self.cache {
            cache.remove(key);
        }
    }

    /// Forgets everything (after a range delete or a rollback).
    pub fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(cache) = &self.cache {
            cache.clear();
        }
    }
}
