//! A worker process's side of running part of a job across several processes.
//!
//! [`session`] is the worker's life under the coordinator: it attaches over gRPC
//! (`common/proto/cluster.proto`), registers, heartbeats, and runs deployment attempts;
//! [`worker`] runs one attempt: plans the job, runs the subtasks that the round-robin
//! placement gives this worker, links them to the coordinator's checkpoints, and ends
//! with a [`pb::cluster::Report`]. [`task_metrics`] samples the per-task figures that are
//! printed, reported and published as the worker's metrics; `checkpoint_trace` records
//! the tasks' spans in the coordinator's checkpoint traces.
//!
//! This module must not know how workers are started or found, or how the coordinator
//! decides anything: it does what the control stream says.
//!
//! [`pb::cluster::Report`]: sluice_common::pb::cluster::Report

pub(crate) mod checkpoint_trace;
pub mod session;
pub mod task_metrics;
pub mod worker;
