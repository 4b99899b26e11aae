//! # Jobs
//!
//! What the coordinator knows about a job's life, as data and plain functions:
//!
//! - [`lifecycle`]: the typed state machine of a job (created, scheduling, running,
//!   failing, restarting, rescaling, finished, cancelled, failed). Every transition is
//!   decided in one place, [`JobState::next`]; anything else is an
//!   [`IllegalTransition`].
//! - [`restart`]: the restart strategy, exponential back-off with a limit.
//!
//! This module performs no I/O and knows nothing of workers, slots or the network: a
//! driver (the coordinator's job actor, not built yet) feeds it events and acts on its
//! answers.

mod attempt;
pub mod lifecycle;
pub mod master;
pub mod restart;

pub use lifecycle::{IllegalTransition, JobEvent, JobState};
pub use restart::{Decision, RestartPolicy};
