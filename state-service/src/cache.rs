//! The read cache in front of RocksDB: a foyer hybrid cache (memory, plus a disk tier
//! under `data_dir/foyer`) of `(generation, key) -> Option<value>`.
//!
//! Absent keys are cached too (`None`), since state reads often miss. A shard reads and
//! writes under a generation number; a range delete or a rollback moves the shard to a
//! fresh generation, so entries cached before are never read again (they age out). Every
//! generation is unique in the process, so a shard closed and reopened never sees the
//! entries of its previous life. The shard decides what to insert and when (reads fill
//! it, writes only remove); this module knows nothing of RocksDB. Memory: the memory
//! tier by weight (key, value and a fixed overhead), plus the disk tier's bounded write
//! buffers (`config.rs`).

use std::hash::Hash;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use foyer::{
    BlockEngineConfig, Code, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
    RecoverMode,
};

use crate::config::FOYER_BLOCK_BYTES;
use crate::error::{Error, Result};

/// A cache key: the shard's generation and the state key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    generation: u64,
    key: Bytes,
}

impl Code for CacheKey {
    fn encode(&self, writer: &mut impl std::io::Write) -> foyer::Result<()> {
        self.generation.encode(writer)?;
        self.key.encode(writer)
    }

    fn decode(reader: &mut impl std::io::Read) -> foyer::Result<Self> {
        Ok(Self {
            generation: u64::decode(reader)?,
            key: Bytes::decode(reader)?,
        })
    }

    fn estimated_size(&self) -> usize {
        8 + self.key.estimated_size()
    }
}

/// A cached value: `None` when the key is absent.
#[derive(Clone, Debug)]
pub struct CacheValue(Option<Bytes>);

impl Code for CacheValue {
    fn encode(&self, writer: &mut impl std::io::Write) -> foyer::Result<()> {
        match &self.0 {
            None => 0u8.encode(writer),
            Some(v) => {
                1u8.encode(writer)?;
                v.encode(writer)
            }
        }
    }

    fn decode(reader: &mut impl std::io::Read) -> foyer::Result<Self> {
        Ok(Self(match u8::decode(reader)? {
            0 => None,
            _ => Some(Bytes::decode(reader)?),
        }))
    }

    fn estimated_size(&self) -> usize {
        1 + self.0.as_ref().map_or(0, |v| v.estimated_size())
    }
}

/// Bytes an entry is charged beyond its key and value.
const ENTRY_OVERHEAD: usize = 64;

/// The process-wide state cache.
pub struct StateCache {
    inner: HybridCache<CacheKey, CacheValue>,
    next_generation: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for StateCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateCache").finish_non_exhaustive()
    }
}

impl StateCache {
    /// A cache of `memory_bytes` in memory and `disk_bytes` on disk under `dir`, the
    /// disk tier writing through a flush buffer pool (and a submit queue) of
    /// `buffer_pool` bytes: entries evicted while those are full are dropped.
    pub async fn build(
        memory_bytes: usize,
        disk_bytes: u64,
        buffer_pool: usize,
        dir: &Path,
    ) -> Result<Self> {
        let builder = HybridCacheBuilder::new()
            .with_name("sluice-state")
            .memory(memory_bytes)
            .with_weighter(|k: &CacheKey, v: &CacheValue| {
                k.key.len() + v.0.as_ref().map_or(0, Bytes::len) + ENTRY_OVERHEAD
            })
            .storage();
        let inner = if disk_bytes == 0 {
            builder.build().await
        } else {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            let device = FsDeviceBuilder::new(dir)
                .with_capacity(usize::try_from(disk_bytes).unwrap_or(usize::MAX))
                .build()
                .map_err(|e| {
                    Error::Config(format!("foyer disk cache in {}: {e}", dir.display()))
                })?;
            builder
                .with_engine_config(
                    BlockEngineConfig::new(device)
                        .with_block_size(FOYER_BLOCK_BYTES)
                        .with_buffer_pool_size(buffer_pool)
                        .with_submit_queue_size_threshold(buffer_pool),
                )
                // Entries of a previous process are of generations never used again.
                .with_recover_mode(RecoverMode::None)
                .build()
                .await
        }
        .map_err(|e| Error::Config(format!("building the foyer cache: {e}")))?;
        Ok(Self {
            inner,
            next_generation: AtomicU64::new(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// A generation no one has used.
    pub fn new_generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    /// The cached value of `key`: `None` on a miss, `Some(None)` for a cached absence.
    pub async fn get(&self, generation: u64, key: &Bytes) -> Option<Option<Bytes>> {
        let k = CacheKey {
            generation,
            key: key.clone(),
        };
        match self.inner.get(&k).await {
            Ok(Some(entry)) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(entry.value().0.clone())
            }
            Ok(None) | Err(_) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Caches `value` (or the absence) of `key`. The key is copied: a key of a request
    /// is a slice of the request's whole receive buffer, which a cached slice would keep
    /// alive unweighed. `value` must own its bytes (values read from RocksDB do).
    pub fn insert(&self, generation: u64, key: &[u8], value: Option<Bytes>) {
        let key = Bytes::copy_from_slice(key);
        self.inner
            .insert(CacheKey { generation, key }, CacheValue(value));
    }

    /// Forgets `key`.
    pub fn remove(&self, generation: u64, key: Bytes) {
        self.inner.remove(&CacheKey { generation, key });
    }

    /// Bytes foyer's memory tier holds now (by the weigher).
    pub fn memory_usage(&self) -> usize {
        self.inner.memory().usage()
    }

    /// `(hits, misses)` since start.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Flushes and stops the disk tier.
    pub async fn close(&self) {
        if let Err(e) = self.inner.close().await {
            tracing::warn!("closing the state cache: {e}");
        }
    }
}
