//! The node's metrics (`GET /metrics` with `--metrics-http`, OTLP): its shards and their
//! sizes, what it served, its cache and its memory budget. Names and units are listed in
//! `docs/metrics.md`; it reads the same figures as the `Status` RPC plus the node's data
//! path counters, and must not keep bookkeeping of its own.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_telemetry::{Collect, Metric, Snapshot};

use crate::server::{IoCounters, Node};

const SHARDS: Metric = Metric::gauge(
    "sluice.state.shards",
    "{shard}",
    "Shards open on this node.",
);
const SHARD_SIZE: Metric = Metric::gauge(
    "sluice.state.shard.size",
    "By",
    "Approximate bytes of a shard's data (RocksDB's estimate).",
);
const SHARD_COMMITTED: Metric = Metric::gauge(
    "sluice.state.shard.committed_checkpoint",
    "{checkpoint}",
    "The newest checkpoint a shard committed.",
);
const CACHE_HITS: Metric = Metric::counter(
    "sluice.state.cache.hits",
    "{lookup}",
    "Reads the node's foyer cache answered.",
);
const CACHE_MISSES: Metric = Metric::counter(
    "sluice.state.cache.misses",
    "{lookup}",
    "Reads the node's foyer cache did not answer.",
);
const RESTORED: Metric = Metric::counter(
    "sluice.state.restored",
    "By",
    "Bytes read from the object store to open shards.",
);
const MEMORY_LIMIT: Metric = Metric::gauge(
    "sluice.state.memory.limit",
    "By",
    "The node's memory budget (--memory).",
);

const UNCOMMITTED: Metric = Metric::gauge(
    "sluice.state.uncommitted",
    "By",
    "Uncommitted writes the node's shards hold in memory (at most 10% of --memory).",
);
const SPILLED: Metric = Metric::counter(
    "sluice.state.uncommitted.spilled",
    "By",
    "Uncommitted writes moved to RocksDB because memory held its share of them.",
);

/// A counter of the data path and how to read it.
type IoFigure = (Metric, fn(&IoCounters) -> u64);

const IO_FIGURES: [IoFigure; 7] = [
    (
        Metric::counter("sluice.state.keys_read", "{key}", "Keys read (multi-get)."),
        |c| c.keys_read.load(Ordering::Relaxed),
    ),
    (
        Metric::counter("sluice.state.read", "By", "Bytes of values read."),
        |c| c.bytes_read.load(Ordering::Relaxed),
    ),
    (
        Metric::counter(
            "sluice.state.ops_written",
            "{op}",
            "Write operations (put, delete, merge, range delete).",
        ),
        |c| c.ops_written.load(Ordering::Relaxed),
    ),
    (
        Metric::counter(
            "sluice.state.written",
            "By",
            "Bytes of keys and values written.",
        ),
        |c| c.bytes_written.load(Ordering::Relaxed),
    ),
    (
        Metric::counter(
            "sluice.state.flushes",
            "{flush}",
            "Checkpoint flushes of a shard.",
        ),
        |c| c.flushes.load(Ordering::Relaxed),
    ),
    (
        Metric::counter(
            "sluice.state.flushed",
            "By",
            "Bytes checkpoint flushes made durable in the object store.",
        ),
        |c| c.flushed_bytes.load(Ordering::Relaxed),
    ),
    (
        Metric::counter(
            "sluice.state.commits",
            "{commit}",
            "Checkpoint commits of a shard.",
        ),
        |c| c.commits.load(Ordering::Relaxed),
    ),
];

/// A node's metrics as a role's collector.
pub struct NodeMetrics(pub Arc<Node>);

/// Every metric of a state node, in the order `/metrics` lists them.
pub fn metrics() -> Vec<Metric> {
    let mut all = vec![
        SHARDS,
        SHARD_SIZE,
        SHARD_COMMITTED,
        CACHE_HITS,
        CACHE_MISSES,
        RESTORED,
        MEMORY_LIMIT,
        UNCOMMITTED,
        SPILLED,
    ];
    all.extend(IO_FIGURES.iter().map(|(m, _)| *m));
    all
}

impl Collect for NodeMetrics {
    fn metrics(&self) -> Vec<Metric> {
        metrics()
    }

    fn collect(&self, out: &mut Snapshot) {
        let status = self.0.status();
        let none: [(&str, String); 0] = [];
        out.add(&SHARDS, none.clone(), status.shards.len() as f64);
        for s in &status.shards {
            let Some(id) = &s.shard else { continue };
            let labels = || {
                [
                    ("job_id", id.job_id.clone()),
                    (
                        "key_groups",
                        format!("{}-{}", id.key_group_start, id.key_group_end),
                    ),
                ]
            };
            out.add(&SHARD_SIZE, labels(), s.approximate_bytes as f64);
            out.add(&SHARD_COMMITTED, labels(), s.committed_checkpoint as f64);
        }
        out.add(&CACHE_HITS, none.clone(), status.cache_hits as f64);
        out.add(&CACHE_MISSES, none.clone(), status.cache_misses as f64);
        out.add(&RESTORED, none.clone(), status.restore_bytes_total as f64);
        out.add(
            &MEMORY_LIMIT,
            none.clone(),
            status.memory_limit_bytes as f64,
        );
        out.add(&UNCOMMITTED, none.clone(), status.pending_bytes as f64);
        out.add(&SPILLED, none.clone(), status.spilled_bytes_total as f64);
        for (m, value) in &IO_FIGURES {
            out.add(m, none.clone(), value(&self.0.io) as f64);
        }
    }
}
