//! Windows over event time or processing time (DESIGN §9).
//!
//! - [`assigner`]: which windows a timestamp falls into (tumbling, sliding, cumulate, session).
//! - [`accumulator`]: the fixed-size incremental state of count, sum, min, max and avg.
//! - [`fixed`]: tumbling and sliding windows: decoded accumulators per pane in a
//!   memory-bounded write-back cache over keyed state.
//! - [`session`]: a key's open sessions and how a new record merges them.
//!
//! The operator that drives them is `operator::window`. Fixed windows keep their panes
//! decoded in operator memory and write them to keyed state tables
//! (`sluice_common::state`) at checkpoints or when over budget; sessions keep a row per
//! key and their timers in the runtime's timer service (`crate::keyed`). The same code
//! runs on the in-memory store and on the remote state service.

pub mod accumulator;
pub mod assigner;
pub mod fixed;
pub mod session;
