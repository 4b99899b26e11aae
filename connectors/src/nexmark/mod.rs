//! The deterministic Nexmark generator, modelled on the Nexmark benchmark's (Apache Beam,
//! Flink) event generator.
//!
//! This module owns the content of the three Nexmark streams (persons, auctions, bids)
//! and how a source subtask reads its share of one stream. It must not know about
//! watermarks or the runtime: it only tags batches with their split.
//!
//! # Events
//!
//! Events are numbered 0, 1, 2 ... over all streams; every block of 50 holds 1 person,
//! 3 auctions and 46 bids at fixed positions ([`layout`]). An event's content is a pure
//! function of (seed, event number) ([`sluice_common::rng`], [`generator`]): ids start at 1000; bids go
//! to a hot auction half of the time and come from a hot bidder three times in four,
//! otherwise from a recent auction or person; prices are log-uniform between 1.00 and
//! 1,000,000.00 (in cents). Event time is 2015-07-15T00:00:00Z plus
//! `n * 1000 / events_per_second` ms, minus a random jitter in
//! `[0, max_out_of_orderness_ms]`, so input is out of order by at most that bound.
//!
//! # The generated set
//!
//! A source with `events = N` produces exactly the stream indices `0..N` of its stream,
//! whatever the parallelism and split count ([`reader`]); [`generate_all`] produces the
//! same rows in index order, which is what `sluice nexmark gen` writes.

pub mod config;
pub mod generator;
pub mod layout;
pub mod reader;
pub mod schema;

use arrow::record_batch::RecordBatch;
pub use config::NexmarkConfig;
pub use generator::Generator;
pub use reader::NexmarkReader;
pub use schema::schema;
use sluice_common::pb;

/// Every event of `spec`'s stream in index order, in batches of up to `batch_size` rows
/// (endless when `spec.events` is 0). The rows equal the union of all source subtasks'.
pub fn generate_all(
    spec: &pb::NexmarkSource,
    batch_size: usize,
) -> impl Iterator<Item = RecordBatch> + use<> {
    let cfg = NexmarkConfig::from_spec(spec);
    let generator = Generator::new(cfg);
    let batch_size = batch_size.max(1) as u64;
    let mut next = 0u64;
    std::iter::from_fn(move || {
        let count = match cfg.events {
            Some(events) => events.saturating_sub(next).min(batch_size),
            None => batch_size,
        };
        if count == 0 {
            return None;
        }
        let batch = generator.batch(next, 1, count as usize);
        next += count;
        Some(batch)
    })
}
