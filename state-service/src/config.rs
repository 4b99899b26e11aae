//! The state service's settings, as the CLI (or a test) fills them in.
//!
//! It owns the defaults and the split of the one memory budget between RocksDB's block
//! cache, RocksDB's write buffers, foyer's memory tier and disk-tier buffers, and the
//! headroom left for the rest of the process; it knows nothing of how those are built.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Settings of one state-service node.
#[derive(Clone, Debug)]
pub struct StateServiceConfig {
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    /// This node's name, reported by `Status`.
    pub node_id: String,
    /// Local RocksDB directories, the foyer disk cache and delta spool files.
    pub data_dir: PathBuf,
    /// The durable tier: `file:///abs/dir` or `s3://bucket/prefix`.
    pub object_store_url: String,
    /// One budget for the process: RocksDB's block cache and write buffers and foyer's
    /// memory get 65% of it, uncommitted writes and uploads 10% each, the rest is headroom (see [`StateServiceConfig::memory_split`]).
    pub memory_bytes: u64,
    /// Size of foyer's disk tier (0: memory only).
    pub disk_cache_bytes: u64,
    /// gRPC message decode/encode limit.
    pub max_message_bytes: usize,
    /// Most operations or keys in one request.
    pub max_batch_ops: usize,
    /// How long an object-store request may take and how often it is retried before a
    /// `Flush` or `Commit` fails with `Unavailable` (S3 only).
    pub object_store_client: ObjectStoreClientConfig,
}

/// Timeouts and retries of the S3 client. While the store is unreachable, a `Flush` or
/// `Commit` fails (retryably) after about `retry_timeout` plus one `request_timeout` at
/// most, instead of the object_store crate's default of 10 retries within 3 minutes,
/// which would hold every checkpoint of the job that long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectStoreClientConfig {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Time for one whole request, from connecting to the end of the response (uploads
    /// are at most 16 MiB per request, see `store.rs`).
    pub request_timeout: Duration,
    /// Retries of a failed request (0: none).
    pub max_retries: usize,
    /// No retry starts later than this after the first attempt.
    pub retry_timeout: Duration,
}

impl Default for ObjectStoreClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            max_retries: 3,
            retry_timeout: Duration::from_secs(10),
        }
    }
}

impl Default for StateServiceConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            node_id: "state-0".to_string(),
            data_dir: PathBuf::from("sluice-state"),
            object_store_url: String::new(),
            memory_bytes: 1 << 30,
            disk_cache_bytes: 1 << 30,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_batch_ops: DEFAULT_MAX_BATCH_OPS,
            object_store_client: ObjectStoreClientConfig::default(),
        }
    }
}

/// Default gRPC message limit: 64 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Default most operations per request.
pub const DEFAULT_MAX_BATCH_OPS: usize = 100_000;

/// The most a node's resident memory should reach with a budget of `memory_bytes`
/// and `shards` open shards: 1.1 x the budget, plus the process at rest (48 MiB) and
/// what an open shard holds outside the budget (1 MiB). `sluice bench checkpoint`
/// prints it beside the peak it measured.
pub fn rss_bound(memory_bytes: u64, shards: u64) -> u64 {
    memory_bytes / 10 * 11 + (48 << 20) + shards * (1 << 20)
}

/// How the memory budget is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySplit {
    /// RocksDB's shared LRU block cache, write buffers included: the write buffer
    /// manager charges memtable memory to this cache, so blocks and memtables together
    /// stay within it (index and filter blocks are cached in it too).
    pub block_cache: usize,
    /// RocksDB's memtables of all shards together (part of `block_cache`).
    pub write_buffers: usize,
    /// foyer's memory tier.
    pub foyer_memory: usize,
    /// foyer's disk-tier write buffers: [`MemorySplit::foyer_buffer_pool`] twice (the
    /// flusher's buffer and its rotation) and once more the submit queue (entries
    /// waiting for it). Outside foyer's weigher, so charged here; 0 without a disk tier.
    pub foyer_disk_buffers: usize,
    /// foyer's flush buffer pool (and submit queue threshold).
    pub foyer_buffer_pool: usize,
    /// Uncommitted writes held in memory by every shard together; beyond, they are
    /// spilled to RocksDB (whose memtables the block cache share bounds).
    pub pending: usize,
    /// Object-store uploads in progress (parts being filled and in flight).
    pub uploads: usize,
}

/// Size of one block of foyer's disk tier (also the largest entry it takes).
pub const FOYER_BLOCK_BYTES: usize = 4 << 20;

impl StateServiceConfig {
    /// 50% RocksDB block cache with the write buffers (25%) charged to it, 15% foyer
    /// (memory tier plus its disk tier's write buffers), 10% uncommitted writes, 10%
    /// uploads, and 15% left for what the budget does not count: requests in flight
    /// (bounded by the clients' windows and the largest message), download buffers,
    /// RocksDB's compaction and iterator memory, allocator overhead. Each part has a
    /// small floor.
    pub fn memory_split(&self) -> MemorySplit {
        let total = usize::try_from(self.memory_bytes).unwrap_or(usize::MAX);
        let min = 1 << 20;
        let foyer = (total / 100 * 15).max(2 * min);
        // Disk-tier buffers: a pool holds one 4 MiB block at least (the largest entry).
        let pool = (foyer / 12).clamp(FOYER_BLOCK_BYTES, 16 << 20);
        let foyer_disk_buffers = if self.disk_cache_bytes == 0 {
            0
        } else {
            3 * pool
        };
        MemorySplit {
            block_cache: (total / 2).max(2 * min),
            write_buffers: (total / 4).max(min),
            foyer_memory: foyer.saturating_sub(foyer_disk_buffers).max(min),
            foyer_disk_buffers,
            foyer_buffer_pool: pool,
            pending: (total / 10).max(min / 4),
            uploads: total / 10,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_leaves_headroom_and_stays_within_the_budget() {
        for (memory, disk) in [
            (512u64 << 20, 1u64 << 30),
            (128 << 20, 1 << 30),
            (64 << 20, 0),
        ] {
            let config = StateServiceConfig {
                memory_bytes: memory,
                disk_cache_bytes: disk,
                ..StateServiceConfig::default()
            };
            let s = config.memory_split();
            let used = s.block_cache + s.foyer_memory + s.foyer_disk_buffers + s.pending;
            let used = (used + s.uploads) as u64;
            assert!(used <= memory / 100 * 86, "{s:?} of {memory}");
            assert!(s.write_buffers < s.block_cache);
            assert_eq!(s.foyer_disk_buffers == 0, disk == 0);
        }
    }
}
