//! Running jobs: the coordinator role, the worker role, the embedded cluster of
//! `sluice run`, and the job commands that talk to a coordinator.
//!
//! - [`coordinator`]: `sluice coordinator`: REST for users, gRPC for workers, jobs
//!   resumed from the metadata store on start.
//! - [`embedded`]: `sluice run`: the same coordinator code in this process, with its
//!   worker in this process, or (`--workers N`) worker child processes it starts and
//!   restarts.
//! - [`local_state`]: where `sluice run` keeps keyed state (an embedded state-service
//!   node, or this process's memory).
//! - [`client`]: `sluice submit | jobs | status | cancel | checkpoints | savepoint | stop
//!   | rescale` over the REST API.
//! - [`worker`]: the `sluice worker` command.
//! - [`doctor`]: `sluice doctor JOB`, the pathologies a running job shows.

pub mod client;
pub mod coordinator;
pub mod doctor;
pub mod embedded;
pub mod local_state;
pub mod worker;
