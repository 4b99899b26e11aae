//! What a keyed operator's cache of decoded state counts, reported with its task's
//! metrics (hit ratio, reads, spills, bytes held), and the keys it sees most.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use super::hot_keys::HotKeys;

/// Counters of a keyed operator's cache of decoded state (one per task), which the
/// task's metrics report.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Records whose group was in the cache.
    pub hits: AtomicU64,
    /// Groups created in the cache.
    pub misses: AtomicU64,
    /// Stored values read from the backend.
    pub reads: AtomicU64,
    /// Groups spilled to the backend to stay within the budget.
    pub spills: AtomicU64,
    /// Bytes the cache holds now (summed over subtasks).
    pub bytes: AtomicU64,
    /// The keys the operator sees most, once it encodes keys.
    pub hot_keys: OnceLock<Arc<HotKeys>>,
}
