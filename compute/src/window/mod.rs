//! Windows over event time or processing time (DESIGN §9).
//!
//! - [`assigner`]: which windows a timestamp falls into (tumbling, sliding, session).
//! - [`accumulator`]: the fixed-size incremental state of count, sum, min, max and avg.
//! - [`session`]: a key's open sessions and how a new record merges them.
//! - [`timers`]: the queue of window end times still to fire.
//!
//! The operator that drives them is `operator::window`; windows keep their contents in
//! keyed state (`sluice_common::state`) under the window as namespace, so the same code
//! runs on the in-memory backend and on the remote state service.

pub mod accumulator;
pub mod assigner;
pub mod session;
pub mod timers;
