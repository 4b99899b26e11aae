//! A worker process's side of running part of a job across several processes.
//!
//! Until the coordinator exists, a small driver (`sluice run --workers N`, in the CLI)
//! deploys jobs: it sends each worker a [`pb::cluster::Deployment`] (the job graph, the
//! worker's index, every worker's data address, network settings) over a control
//! connection ([`control`]); the worker plans the job, runs the subtasks that the
//! round-robin placement gives it ([`worker`]) and answers with a
//! [`pb::cluster::Report`]. [`task_metrics`] samples the per-task figures that are
//! printed, reported and exposed through the OpenTelemetry metrics API.
//!
//! This module must not know how workers are started or found: that is the driver's
//! (later the coordinator's) business.
//!
//! [`pb::cluster::Deployment`]: sluice_common::pb::cluster::Deployment
//! [`pb::cluster::Report`]: sluice_common::pb::cluster::Report

pub mod control;
pub mod task_metrics;
pub mod worker;
