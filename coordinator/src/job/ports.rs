//! The ports through which a job reaches what the coordinator does not own: its keyed
//! state ([`StateConnector`], [`StateStore`], the state API's job-level traits, which
//! the state service's client and the in-process memory store implement) and worker
//! processes ([`WorkerLauncher`]). The job's actor calls them. Traits only: nothing here
//! knows how a job is driven or how any store keeps state.

pub use sluice_common::state::{StateConnector, StateStore};

/// Starts worker processes when a job needs more than are attached (embedded clusters).
pub trait WorkerLauncher: Send + Sync {
    /// Makes sure `n` launched workers are alive (starting replacements for dead ones).
    fn ensure(&self, n: usize);
}
