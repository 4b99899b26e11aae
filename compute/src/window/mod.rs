//! Windows over event time or processing time (DESIGN §9).
//!
//! - [`assigner`]: which windows a timestamp falls into (tumbling, sliding, session).
//! - [`accumulator`]: the fixed-size incremental state of count, sum, min, max and avg.
//! - [`session`]: a key's open sessions and how a new record merges them.
//!
//! The operator that drives them is `operator::window`; windows keep their contents in
//! keyed state tables (`sluice_common::state`) under the pane as namespace, and their
//! timers in the runtime's timer service (`crate::keyed`), so the same code runs on the
//! in-memory store and on the remote state service.

pub mod accumulator;
pub mod assigner;
pub mod session;
