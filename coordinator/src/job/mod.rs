//! # Jobs
//!
//! A job's life on the coordinator, decisions apart from I/O:
//!
//! - [`lifecycle`]: the typed state machine of a job (created, scheduling, running,
//!   failing, restarting, rescaling, finished, cancelled, failed). Every transition is
//!   decided in one place, [`JobState::next`]; anything else is an
//!   [`IllegalTransition`].
//! - [`restart`]: the restart strategy, exponential back-off with a limit.
//! - [`driver`]: deploy, failover, restart, rescale, savepoint, stop and cancel as one
//!   pure state machine, events in and actions out, driving the lifecycle and the
//!   checkpoint protocol. Its module essay tells a job's life.
//! - `actor`: the one mailbox loop per job that carries the driver's actions out
//!   (workers, slots, the `_metadata` store, the state service) and feeds their results
//!   back. The only place a job's I/O happens. `trace`: one trace per deploy, failover
//!   and rescale, from the lifecycle states the actor sees.
//! - [`master`]: how a job's master is configured and started; [`ports`]: the traits
//!   it reaches the state service and worker processes through.
//! - [`command`]: user requests and their answers; [`status`]: what the REST API shows;
//!   [`control`]: the control messages of an attempt; [`graph`]: what the coordinator
//!   reads from a job graph.
//!
//! Dependencies point one way: `master` → `actor` → (`driver`, `ports`), and `driver`
//! → (`lifecycle`, `restart`, `control`, `command`, `status`, `graph`,
//! `crate::checkpoint`). Only `master` (which registers the job) and `actor` know the
//! worker registry (`crate::cluster`), and the registry knows nothing of jobs.

mod actor;
pub mod command;
pub mod control;
pub mod driver;
pub mod graph;
pub mod lifecycle;
pub mod master;
pub mod ports;
pub mod restart;
pub mod status;
mod trace;

pub use command::{Command, RescaleOutcome, StopOutcome};
pub use lifecycle::{IllegalTransition, JobEvent, JobState};
pub use restart::{Decision, RestartPolicy};
pub use status::{CheckpointRecord, JobStatus};
