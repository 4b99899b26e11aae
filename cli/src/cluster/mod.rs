//! Running jobs across processes: the coordinator role, the worker role, the embedded
//! cluster of `sluice run --workers N`, and the job commands that talk to a coordinator.
//!
//! - [`coordinator`]: `sluice coordinator`: REST for users, gRPC for workers, jobs
//!   resumed from the metadata store on start.
//! - [`embedded`]: `sluice run --workers N`: the same coordinator code in this process,
//!   with worker child processes it starts (and restarts).
//! - [`client`]: `sluice submit | jobs | status | cancel | checkpoints | savepoint | stop
//!   | rescale` over the REST API.
//! - [`worker`]: the `sluice worker` command.
//! - [`state`]: the coordinator's access to a job's shards in the state service.

pub mod client;
pub mod coordinator;
pub mod embedded;
pub mod state;
pub mod worker;
