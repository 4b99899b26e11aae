//! Running jobs across worker processes on this machine, until the coordinator exists.
//!
//! - [`local_driver`]: `sluice run --workers N`: starts N `sluice worker` processes,
//!   deploys the job to them, collects their reports, fails fast.
//! - [`worker`]: the `sluice worker` command: under a driver (`--control`), or by hand
//!   from a job file and the peers' addresses.
//!
//! The coordinator issue replaces the driver; the worker side stays.

pub mod local_driver;
pub mod worker;
