//! RocksDB options shared by every shard of a node: one LRU block cache, one write buffer
//! manager charged to it, the concatenating merge operator and the TTL compaction filter.
//!
//! It owns how a shard's database is opened (column families `default`, `pending`, `spill`,
//! `meta`, and `undo`, which older versions wrote);
//! it knows nothing of epochs or the object store. The write-ahead log is off for every
//! write: durability is the object store, and a shard is never reopened from its local
//! files after a crash (it is restored from the object store instead).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, MergeOperands, Options,
    WriteBufferManager, WriteOptions,
};

use crate::config::MemorySplit;
use crate::error::Result;
use crate::pending::{CF_DEFAULT, CF_LEGACY_UNDO, CF_META, CF_PENDING};
use crate::ttl_filter::{TtlStates, now_ms};

/// The node-wide RocksDB resources.
pub struct Rocks {
    cache: Cache,
    write_buffers: WriteBufferManager,
    /// The write buffer manager's share.
    write_buffers_total: usize,
    /// The memtable size of the big column families now (see [`Rocks::size_for`]).
    write_buffer_size: AtomicUsize,
}

impl std::fmt::Debug for Rocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rocks")
            .field("write_buffer_size", &self.write_buffer_size())
            .finish_non_exhaustive()
    }
}

/// Memtable size bounds of the big column families.
const MIN_WRITE_BUFFER: usize = 256 << 10;
const MAX_WRITE_BUFFER: usize = 64 << 20;

/// Appends every operand to the existing value.
fn concat(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let len = existing.map_or(0, <[u8]>::len) + operands.iter().map(<[u8]>::len).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    if let Some(e) = existing {
        out.extend_from_slice(e);
    }
    for op in operands {
        out.extend_from_slice(op);
    }
    Some(out)
}

impl Rocks {
    /// Builds the shared cache and write buffer manager for `split`.
    pub fn new(split: MemorySplit) -> Self {
        let cache = Cache::new_lru_cache(split.block_cache);
        // No stall: the manager is shared by every shard's database, and a stalled
        // write waits for memory that only a flush frees, but RocksDB flushes only the
        // database being written to. A write to a shard whose memtables are empty,
        // while idle shards hold the memory, then waited forever (a preload's commit
        // hung for 600 s). Without the stall, each write over the limit flushes its own
        // database's largest memtable.
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            split.write_buffers,
            false,
            cache.clone(),
        );
        let rocks = Self {
            cache,
            write_buffers,
            write_buffers_total: split.write_buffers,
            write_buffer_size: AtomicUsize::new(0),
        };
        rocks.size_for(1);
        rocks
    }

    /// Sizes memtables for `shards` open shards and returns the size: an active and a
    /// flushing memtable of each shard fit the write buffers' share together (of its
    /// two big column families, live state and spilled writes, one at a time takes
    /// most writes), between 256 KiB and 64 MiB. The write buffer manager flushes only
    /// the database being written to, so idle shards' memtables are bounded by their
    /// size alone.
    pub fn size_for(&self, shards: usize) -> usize {
        let size = (self.write_buffers_total / (2 * shards.max(1)))
            .clamp(MIN_WRITE_BUFFER, MAX_WRITE_BUFFER);
        self.write_buffer_size.store(size, Ordering::Relaxed);
        size
    }

    /// The most a write batch of spills and commits should hold: a memtable (which
    /// takes a batch whole, so bigger batches make bigger memtables), 4 MiB at most.
    pub fn batch_bytes(&self) -> usize {
        self.write_buffer_size().min(4 << 20)
    }

    fn write_buffer_size(&self) -> usize {
        self.write_buffer_size.load(Ordering::Relaxed)
    }

    fn table_options(&self) -> BlockBasedOptions {
        let mut t = BlockBasedOptions::default();
        t.set_block_cache(&self.cache);
        t.set_cache_index_and_filter_blocks(true);
        t.set_bloom_filter(10.0, false);
        t
    }

    /// Opens (creating) a shard's database in `dir`.
    pub fn open(&self, dir: &Path, ttl: &TtlStates) -> Result<DB> {
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_write_buffer_manager(&self.write_buffers);
        db_opts.set_max_background_jobs(2);
        db_opts.set_max_open_files(256);
        db_opts.set_compression_type(rocksdb::DBCompressionType::Lz4);

        let mut state = Options::default();
        state.set_block_based_table_factory(&self.table_options());
        state.set_write_buffer_size(self.write_buffer_size());
        state.set_compression_type(rocksdb::DBCompressionType::Lz4);
        state.set_merge_operator_associative("sluice-concat", concat);
        let ttl = ttl.clone();
        state.set_compaction_filter(
            "sluice-ttl",
            move |_level: u32, key: &[u8], value: &[u8]| ttl.decide(key, value, now_ms()),
        );

        // Spilled writes come in volume, are read by key and scanned once at commit.
        let mut spill = Options::default();
        spill.set_block_based_table_factory(&self.table_options());
        spill.set_write_buffer_size(self.write_buffer_size());
        spill.set_compression_type(rocksdb::DBCompressionType::Lz4);

        let mut small = Options::default();
        small.set_block_based_table_factory(&self.table_options());
        small.set_write_buffer_size(MIN_WRITE_BUFFER);

        let cfs = vec![
            ColumnFamilyDescriptor::new(CF_DEFAULT, state),
            ColumnFamilyDescriptor::new(CF_PENDING, small.clone()),
            ColumnFamilyDescriptor::new(crate::spill::CF_SPILL, spill),
            ColumnFamilyDescriptor::new(CF_LEGACY_UNDO, small.clone()),
            ColumnFamilyDescriptor::new(CF_META, small),
        ];
        Ok(DB::open_cf_descriptors(&db_opts, dir, cfs)?)
    }

    /// Whether the memtables of every shard together hold more than `fraction` of
    /// their share.
    pub fn memtables_over(&self, fraction: f64) -> bool {
        self.write_buffers.get_usage() as f64
            > self.write_buffers.get_buffer_size() as f64 * fraction
    }

    /// Bytes the block cache holds now (memtables charged to it included).
    pub fn cache_usage(&self) -> usize {
        self.cache.get_usage()
    }

    /// Bytes of the block cache pinned by readers or memtables now.
    pub fn cache_pinned_usage(&self) -> usize {
        self.cache.get_pinned_usage()
    }
}

/// Write options of every write: no write-ahead log.
pub fn write_options() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.disable_wal(true);
    w
}
