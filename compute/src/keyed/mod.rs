//! Keyed state as operators see it: the state a subtask's operator declares, and the
//! timers kept with it.
//!
//! - [`state`]: [`OperatorState`], what the runtime gives a keyed operator: its key
//!   groups and, once it asks for a table, its backend. The runtime keeps the same
//!   handle and seals the backend's epoch at every barrier, so an operator never sees
//!   which store holds its state or when an epoch ends.
//! - [`timers`]: [`KeyedTimers`], event- and processing-time timers per key group,
//!   kept as rows of the operator's `timers` table so that a restore (at any
//!   parallelism) brings back exactly the timers pending at the checkpoint.
//!
//! - [`cache_counters`]: what an operator's cache of decoded state counts.
//! - [`hot_keys`]: the keys a keyed subtask sees most, from sampled batches.
//! - [`memory_stores`]: the memory stores of the jobs a process runs, shared by its
//!   in-process workers and the coordinator beside them.
//!
//! Nothing here knows the network, barriers' alignment, or what an operator computes.

pub mod cache_counters;
pub mod hot_keys;
pub mod memory_stores;
pub mod state;
pub mod timers;

pub use cache_counters::CacheCounters;
pub use memory_stores::{InProcessState, MemoryStores};
pub use state::{Durable, OperatorState};
pub use timers::KeyedTimers;
