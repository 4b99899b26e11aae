//! What the benchmarks share.
//!
//! - [`process`]: child processes of this binary (state-service nodes, workers attached
//!   to a coordinator), their logs, and killing them when their owner is dropped.
//! - [`resources`]: a thread that samples a process's resident memory per phase
//!   (reading it is `sluice_common::process`'s).
//! - [`timing`]: nearest-rank percentiles, and waiting for a condition within a bound.
//! - [`tls`]: a CA and certificate made for a measurement over mutual TLS.
//! - [`table`]: result lines: tables (a header, then one row per run) and lines of
//!   `key=value` words, printed and read back.
//!
//! Nothing here knows what a benchmark measures.

pub mod process;
pub mod resources;
pub mod table;
pub mod timing;
pub mod tls;

/// A multi-threaded runtime, one worker thread per core, for a benchmark's async work.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-bench")
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the runtime: {e}"))
}
