//! A job's driver: deploy, failover, restart, rescale, savepoint, stop and cancel as one
//! state machine without I/O.
//!
//! [`Driver`] is fed what happens ([`Event`]: worker answers, lost workers, user
//! requests, the outcome of the I/O it asked for, time passing) and answers with
//! [`Action`]s for the job's actor to carry out (send to workers, take or give back
//! slots, open / roll back / commit state, write `_metadata`, answer a request). Time
//! is a number of milliseconds supplied with every event, as for the
//! [`CheckpointProtocol`], which the driver owns and feeds: the driver decides what an
//! attempt is, the protocol what a checkpoint is. Nothing here reads a clock, sleeps or
//! touches the network, so tests drive every interleaving directly (see `tests.rs`).
//!
//! The job's lifecycle ([`JobState`]) moves only through [`JobState::next`]; a
//! transition the lifecycle refuses is a bug: it is logged at error level, recorded
//! ([`Driver::illegal_transitions`], which the tests check after every event) and fails
//! the job. It is never ignored.
//!
//! ## A job's life
//!
//! ```text
//!  start ─▶ Connecting ─▶ Scheduling ─▶ Deploying ─▶ Running ─▶ (every worker's final report) ─▶ Done
//!           (state        (slots on     Prepare      checkpoints,    │ failure, cancel, stop,
//!            service)      N workers)   [open, roll  savepoints,     │ rescale checkpoint done
//!                              ▲        back state]  progress        ▼
//!                              │        Deploy                   Cancelling (workers confirm)
//!                              │                                    │   │         │
//!                              │◀── rescale: redeploy ──────────────┘   │         └─▶ Done (cancelled,
//!                              │                                        ▼              stopped, failed)
//!                              └── FindingRestorePoint ◀── BackingOff ◀─ settle: restart policy
//! ```
//!
//! 1. **Connecting**: with remote state, the state service is reached once per job.
//! 2. **Scheduling**: a slot on `workers` workers. Waiting for capacity is not a
//!    failure: no timeout applies, and the status says what is missing ("workers with
//!    a free slot: 2 of 3").
//! 3. **Deploying** attempt N: `Prepare` (each worker binds a fresh data port); with
//!    remote state the shards are opened and rolled back to the checkpoint the attempt
//!    resumes from, under a fence that refuses writers of older attempts; then `Deploy`.
//!    The prepare and the deploy step each have the deploy timeout; a worker lost, an
//!    error or the timeout fails the attempt.
//! 4. **Running**: checkpoints as the protocol decides; savepoints; progress reports.
//!    Once every task finished its input the final checkpoint is taken (up to three
//!    times), and the workers' final reports end the job.
//! 5. **Cancelling**: the attempt is cancelled on every worker still there, and the
//!    driver waits (bounded) for them to confirm, so no task of it writes state after
//!    the next attempt rolled the shards back. Then, by what caused it: the restart
//!    policy (**BackingOff**, then **FindingRestorePoint**: the newest valid checkpoint
//!    in the store), a redeploy at the new parallelism (rescale), or the end.
//!
//! ## Requests
//!
//! - **Cancel** (and stop without a savepoint) is taken in every state; it is answered
//!   once the workers stopped.
//! - **Savepoint** and **stop with a savepoint** need a running attempt with
//!   checkpoints: while the job is scheduled, deployed or restarting they are refused
//!   with what the job is doing ("try again once it runs"), not queued: a queued
//!   savepoint would outlive the failure that delayed it and be taken at a moment
//!   nobody chose. A savepoint is answered once its named copy is written and the
//!   shards committed. A stop then waits (bounded) for every task to confirm it passed
//!   the savepoint's completion to its sinks, and only then cancels the attempt.
//! - **Rescale** takes an ordinary checkpoint at once (retained like any other; no
//!   savepoint is left behind), and once it is committed cancels the attempt and deploys
//!   at the new parallelism from it. One `RescaleRequest` follows it through. A
//!   rescale to the current parallelism changes nothing and says so.
//!
//! A failed attempt answers the requests waiting on it with the failure.
//!
//! ## Coordinator restarts
//!
//! A new coordinator creates a driver with the newest valid `_metadata` as its
//! `resume` point and the store's newest id: it resumes exactly as a restart would, at
//! the parallelism that checkpoint recorded. A rescale interrupted before its new
//! attempt took a checkpoint is therefore not applied; it was never answered either.
//!
//! ## Where things are
//!
//! This file holds the events, the actions, the driver's states and the lifecycle;
//! `deploy` schedules and deploys an attempt, `running` follows it while it runs,
//! `checkpoints` carries out the protocol's actions and feeds their outcomes back,
//! `requests` takes savepoint, stop, rescale and cancel, `recovery` handles failure,
//! cancellation and restart, and `tests` has a test per interleaving.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use sluice_common::pb;
use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::{coordinator_message as cm, worker_message as wm};

use super::command::{Answer, ReplyId, Request, RescaleOutcome, StopOutcome};
use super::control::{self, DeploySettings};
use super::graph;
use super::lifecycle::{IllegalTransition, JobEvent, JobState};
use super::restart::{Decision, RestartPolicy};
use super::status::{CheckpointRecord, FailureRecord, JobStatus, TaskStatus};
use crate::checkpoint::RecordsBefore;
use crate::checkpoint::ack::ShardRange;
use crate::checkpoint::metadata::CheckpointMetadata;
use crate::checkpoint::store::{self, CreateOutcome};
use crate::checkpoint::{
    self as ckpt, AbortReason, BarrierMode, CheckpointProtocol, JobInfo, SavepointFailure, TaskId,
};

mod alignment;
mod checkpoints;
mod deploy;
mod recovery;
mod requests;
mod running;

#[cfg(test)]
mod tests;

/// Times the final checkpoint is taken before the attempt counts as failed.
const FINAL_CHECKPOINT_TRIES: u32 = 3;

/// The driver's settings.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The job's id.
    pub job_id: String,
    /// This coordinator incarnation (recorded in `_metadata`).
    pub coordinator_id: String,
    /// Worker processes to run the job on.
    pub workers: usize,
    /// Restarts after failures.
    pub restart: RestartPolicy,
    /// How long workers may take to bind their data ports, and then to deploy.
    pub deploy_timeout: Duration,
    /// How long workers may take to confirm a cancellation.
    pub cancel_timeout: Duration,
    /// How long a stop waits for the tasks to commit its savepoint's output.
    pub stop_commit_timeout: Duration,
    /// Data-plane settings for the workers.
    pub network: pbc::NetworkConfig,
    /// Workers print task metrics this often (0: at the end only).
    pub metrics_interval_ms: u64,
    /// The workers run in the coordinator's process, which holds memory state.
    pub in_process_state: bool,
}

/// Where a driver starts from.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Settings.
    pub config: DriverConfig,
    /// The job.
    pub graph: pb::JobGraph,
    /// The checkpoint the first attempt resumes from (a coordinator restart, a
    /// savepoint).
    pub resume: Option<CheckpointMetadata>,
    /// One past the newest checkpoint id in the store (1 for a new job).
    pub first_checkpoint_id: u64,
    /// When the job was submitted (ms since the Unix epoch).
    pub now: u64,
    /// What earlier coordinators recorded of the job (empty for a new job).
    pub history: JobHistory,
}

/// A job's history from the store: what a coordinator resuming it shows.
#[derive(Debug, Clone, Default)]
pub struct JobHistory {
    /// Its newest completed checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointMetadata>,
    /// Its failed attempts, oldest first.
    pub failures: Vec<FailureRecord>,
}

/// Why an attempt or the job failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What happened.
    pub reason: String,
    /// The job itself is at fault (retrying does not help).
    pub user: bool,
    /// Something the job depends on is out of reach (a state node, an object store):
    /// the job waits for it with back-off and spends no restart of its policy on it.
    pub unavailable: bool,
}

impl Failure {
    /// A failure that is not the job's fault.
    pub fn system(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            user: false,
            unavailable: false,
        }
    }

    /// A dependency out of reach (see [`Failure::unavailable`]).
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self {
            unavailable: true,
            ..Self::system(reason)
        }
    }

    /// The same failure, its reason prefixed with `context`.
    pub fn context(self, context: &str) -> Self {
        Self {
            reason: format!("{context}: {}", self.reason),
            ..self
        }
    }
}

/// What happens to the job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Time passed (the actor calls when [`Driver::next_deadline`] is due).
    Tick,
    /// The answer to [`Action::ConnectState`]: the reference workers reach the shards
    /// with.
    StateConnected(Result<pbc::RemoteStateRef, Failure>),
    /// [`Action::AcquireSlots`] cannot be met yet: this many workers have a slot free
    /// for the job.
    Capacity {
        /// Workers with a free slot.
        free: usize,
    },
    /// [`Action::AcquireSlots`] is met: a slot on each of these workers, in placement
    /// order.
    SlotsAcquired(Vec<String>),
    /// A control message from a worker holding one of the job's slots.
    Worker {
        /// The worker.
        worker: String,
        /// The message.
        msg: wm::Msg,
    },
    /// A worker holding one of the job's slots is gone.
    WorkerLost {
        /// The worker.
        worker: String,
        /// Why.
        reason: String,
    },
    /// The answer to [`Action::OpenState`]: the checkpoint the shards hold.
    StateOpened(Result<u64, Failure>),
    /// The answer to [`Action::RollbackState`].
    StateRolledBack(Result<(), Failure>),
    /// The answer to [`Action::CommitState`].
    StateCommitted {
        /// The checkpoint.
        id: u64,
        /// Whether the state service committed it.
        result: Result<(), String>,
    },
    /// The answer to [`Action::ReadRestoreBytes`].
    RestoreBytes(u64),
    /// The answer to [`Action::ReadLatestCheckpoint`].
    LatestCheckpoint(Option<Box<CheckpointMetadata>>),
    /// The answer to [`Action::WriteMetadata`].
    MetadataWritten {
        /// The path written.
        path: String,
        /// Created, already there, or the store's error.
        outcome: Result<CreateOutcome, String>,
    },
    /// A user's request; its answer is [`Action::Reply`] to `reply`.
    Request {
        /// Where the answer goes.
        reply: ReplyId,
        /// What is asked.
        request: Request,
    },
}

/// An effect for the job's actor to carry out; the ones that ask something are answered
/// with the [`Event`] they name.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Reach the state service ([`Event::StateConnected`]).
    ConnectState,
    /// Take a slot on `workers` workers as soon as there are ([`Event::SlotsAcquired`];
    /// meanwhile [`Event::Capacity`] when what is free changes).
    AcquireSlots {
        /// How many.
        workers: usize,
    },
    /// Give every slot back (and stop acquiring).
    ReleaseSlots,
    /// Send `msg` to each of `workers`.
    Send {
        /// The workers.
        workers: Vec<String>,
        /// The message.
        msg: Box<cm::Msg>,
    },
    /// Open the job's shards ([`Event::StateOpened`]).
    OpenState,
    /// Roll the shards back to `checkpoint` under `fence` ([`Event::StateRolledBack`]).
    RollbackState {
        /// The checkpoint.
        checkpoint: u64,
        /// Writers of earlier attempts are refused from now on.
        fence: u64,
    },
    /// Commit `id` on every shard, keeping `retained` ([`Event::StateCommitted`]).
    CommitState {
        /// The checkpoint.
        id: u64,
        /// Checkpoints to keep.
        retained: Vec<u64>,
    },
    /// Read how many bytes the state service restored so far ([`Event::RestoreBytes`]).
    ReadRestoreBytes,
    /// Read the newest valid checkpoint in the store ([`Event::LatestCheckpoint`]).
    ReadLatestCheckpoint,
    /// `create_if_absent(path, encode(metadata))` ([`Event::MetadataWritten`]).
    WriteMetadata {
        /// Object path below the store's root.
        path: String,
        /// What to write.
        metadata: Box<CheckpointMetadata>,
    },
    /// Checkpoint `id` is no longer retained: delete its `_metadata`.
    DeleteCheckpoint {
        /// The checkpoint.
        id: u64,
    },
    /// Answer a request.
    Reply {
        /// Whose.
        to: ReplyId,
        /// The answer, or why it was refused or failed.
        answer: Result<Answer, String>,
    },
}

/// How the job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// Its terminal state.
    pub state: JobState,
    /// Whether to record the end in the store (not when another coordinator took the
    /// job over: the job goes on there).
    pub record: bool,
}

/// Where the driver is (finer than the lifecycle's [`JobState`]).
#[derive(Debug)]
enum Phase {
    Created,
    Connecting,
    Scheduling,
    Deploying(Deploying),
    Running(Running),
    Cancelling(Cancelling),
    BackingOff { until: u64 },
    FindingRestorePoint,
    Done,
}

/// An attempt being deployed.
#[derive(Debug)]
struct Deploying {
    workers: Vec<String>,
    /// When the current step times out (prepare and deploy steps only).
    deadline: u64,
    step: DeployStep,
    /// Final reports of workers whose tasks ended at once (none to run).
    reports: BTreeMap<String, pbc::Report>,
    /// Tasks that finished their input already (a source without splits).
    finished: BTreeSet<TaskId>,
}

#[derive(Debug)]
enum DeployStep {
    Preparing {
        addresses: BTreeMap<String, String>,
    },
    OpeningState {
        peers: Vec<String>,
    },
    RollingBack {
        peers: Vec<String>,
        reference: pbc::RemoteStateRef,
    },
    Deploying {
        deployed: BTreeSet<String>,
        tasks: BTreeSet<TaskId>,
    },
}

/// A deployed attempt.
#[derive(Debug, Default)]
struct Running {
    workers: Vec<String>,
    tasks: BTreeSet<TaskId>,
    /// Each worker's counts and source watermark from its progress reports.
    progress: BTreeMap<String, (u64, u64, Option<i64>)>,
    /// Final reports, by worker.
    reports: BTreeMap<String, pbc::Report>,
    /// Tasks that finished their input and wait for the final checkpoint.
    finished: BTreeSet<TaskId>,
    /// The newest checkpoint each task passed on to its sinks.
    committed: BTreeMap<TaskId, u64>,
    /// The final checkpoint's id, once triggered, and how often it was.
    final_id: Option<u64>,
    final_triggers: u32,
    /// A stop whose savepoint is committed, waiting for the tasks to commit its output.
    stopping: Option<Stopping>,
    /// Watermark alignment: the source tasks' watermarks per group.
    alignment: alignment::Groups,
}

#[derive(Debug)]
struct Stopping {
    reply: ReplyId,
    id: u64,
    path: String,
    waiting: BTreeSet<TaskId>,
    deadline: u64,
}

/// An attempt being cancelled.
#[derive(Debug)]
struct Cancelling {
    attempt: u64,
    waiting: BTreeSet<String>,
    deadline: u64,
    then: Then,
}

/// What follows a cancellation.
#[derive(Debug)]
enum Then {
    /// The attempt failed: the restart policy decides.
    Settle(Failure),
    /// A rescale: deploy at the new parallelism.
    Redeploy,
    /// The job ends in `state`, and these requests are answered.
    End {
        state: JobState,
        replies: Vec<(ReplyId, Answer)>,
    },
}

/// A savepoint (or a stop's savepoint) waiting for its checkpoint.
#[derive(Debug)]
struct SavepointRequest {
    reply: ReplyId,
    name: String,
    /// A stop: the job stops once the savepoint is taken.
    then_stop: bool,
    /// The named copy's outcome: its path, or why it failed.
    copy: Option<Result<String, String>>,
    /// The shards committed the checkpoint.
    committed: bool,
}

/// A rescale, from the request to the job running at the new parallelism.
#[derive(Debug)]
struct RescaleRequest {
    reply: ReplyId,
    parallelism: u32,
    from_parallelism: u32,
    started_at: u64,
    bytes_before: Option<u64>,
    stage: RescaleStage,
    /// The shards are placed again (`Some(balance)`): a drain or a rebalance.
    place: Option<bool>,
}

#[derive(Debug)]
enum RescaleStage {
    /// Checkpoint `id` is being taken.
    Checkpoint { id: u64 },
    /// The attempt is cancelled and the job deployed again from `from`.
    Redeploy { from: Box<CheckpointMetadata> },
    /// Deployed; the state service's restore figure is being read.
    Measure { checkpoint_id: u64 },
}

/// A job's driver: see the module docs.
#[derive(Debug)]
pub struct Driver {
    config: DriverConfig,
    graph: pb::JobGraph,
    lifecycle: JobState,
    phase: Phase,
    protocol: Option<CheckpointProtocol>,
    /// Why the protocol could not be created (the job fails at start).
    protocol_error: Option<String>,
    /// The coordinator opens, restores and commits the job's keyed state: it is in the
    /// state service, or in the memory of this process (in-process workers).
    managed_state: bool,
    /// How workers reach the shards, once connected.
    state_ref: Option<pbc::RemoteStateRef>,
    /// The placement of the last connection, while the shards are placed again.
    last_placement: Option<Vec<pbc::ShardPlacement>>,
    /// The next connection spreads the shards evenly (a rebalance).
    balance: bool,
    not_restorable: Option<String>,
    /// Where the next attempt resumes from.
    restore: Option<CheckpointMetadata>,
    /// Records the sources had read at the checkpoint the running attempt restored
    /// (its counts add to it).
    records_base: u64,
    /// The newest checkpoint this driver committed.
    latest: Option<CheckpointMetadata>,
    attempt: u64,
    /// Restarts the restart policy counts.
    restarts: u32,
    /// Tries to reach an unavailable dependency since the job last ran.
    unavailable_tries: u32,
    /// When the dependency was first found out of reach (ms), until the job runs again.
    unavailable_since: Option<u64>,
    fence: u64,
    fenced: bool,
    /// `_metadata` writes whose outcome is not known yet, by path.
    writes: BTreeMap<String, Box<CheckpointMetadata>>,
    savepoints: BTreeMap<u64, SavepointRequest>,
    rescale: Option<RescaleRequest>,
    status: JobStatus,
    status_version: u64,
    end: Option<End>,
    illegal: Vec<IllegalTransition>,
    /// Illegal transitions already acted on.
    illegal_handled: usize,
}

impl Driver {
    /// A driver for a job that has not started; [`start`](Self::start) starts it.
    pub fn new(setup: Setup) -> Self {
        let Setup {
            config,
            graph,
            resume,
            first_checkpoint_id,
            now,
            history,
        } = setup;
        let mut status = JobStatus::new(
            &config.job_id,
            &graph.name,
            graph::graph_parallelism(&graph),
            now,
        );
        // What earlier coordinators saw: checkpoints, failures, restarts (each recorded
        // failure of a job still running was followed by a restart).
        for m in &history.checkpoints {
            status.record_checkpoint(CheckpointRecord::of(m, m.completed_at_ms));
        }
        let attempts = history
            .failures
            .iter()
            .map(|f| f.attempt)
            .max()
            .unwrap_or(0);
        status.restarts = history.failures.len() as u32;
        for f in history.failures {
            status.record_failure(f);
        }
        status.failure = None;
        status.last_checkpoint = resume.as_ref().map(|m| m.checkpoint_id);
        status.nodes = graph.nodes.iter().map(|n| n.name.clone()).collect();
        let (protocol, protocol_error) = match graph::checkpoint_config(&graph) {
            None => (None, None),
            Some(cfg) => {
                status.checkpoint_timeout_ms = Some(cfg.timeout.as_millis() as u64);
                let info = JobInfo {
                    job_id: config.job_id.clone(),
                    coordinator_id: config.coordinator_id.clone(),
                    job_graph: Bytes::from(graph.encode_to_vec()),
                    max_parallelism: graph::max_parallelism(&graph),
                    parallelism: graph::node_parallelism(&graph),
                    shards: Vec::new(),
                    placement: BTreeMap::new(),
                    tasks: BTreeSet::new(),
                };
                match CheckpointProtocol::new(cfg, info, first_checkpoint_id, now) {
                    Ok(mut p) => {
                        if let Some(m) = &resume {
                            p.record_existing(m.checkpoint_id, m.kept);
                        }
                        (Some(p), None)
                    }
                    Err(e) => (None, Some(format!("checkpoints: {e}"))),
                }
            }
        };
        Self {
            managed_state: graph::uses_remote_state(&graph)
                || (config.in_process_state && graph::keeps_keyed_state(&graph)),
            not_restorable: graph::not_restorable(&graph, config.in_process_state),
            config,
            graph,
            lifecycle: JobState::Created,
            phase: Phase::Created,
            protocol,
            protocol_error,
            state_ref: None,
            last_placement: None,
            balance: false,
            restore: resume,
            records_base: 0,
            latest: None,
            // Attempts continue after the newest one that failed.
            attempt: attempts,
            restarts: 0,
            unavailable_tries: 0,
            unavailable_since: None,
            fence: 0,
            fenced: false,
            writes: BTreeMap::new(),
            savepoints: BTreeMap::new(),
            rescale: None,
            status,
            status_version: 0,
            end: None,
            illegal: Vec::new(),
            illegal_handled: 0,
        }
    }

    /// The job's lifecycle state.
    pub fn state(&self) -> JobState {
        self.lifecycle
    }

    /// What the REST API shows.
    pub fn status(&self) -> &JobStatus {
        &self.status
    }

    /// Grows whenever the status may have changed.
    pub fn status_version(&self) -> u64 {
        self.status_version
    }

    /// How the job ended, once it did.
    pub fn end(&self) -> Option<End> {
        self.end
    }

    /// Transitions the lifecycle refused (each one failed the job): a bug.
    pub fn illegal_transitions(&self) -> &[IllegalTransition] {
        &self.illegal
    }

    /// The graph as the job runs it now.
    pub fn graph(&self) -> &pb::JobGraph {
        &self.graph
    }

    /// When [`Event::Tick`] is due if nothing else happens (ms).
    pub fn next_deadline(&self) -> Option<u64> {
        match &self.phase {
            Phase::Deploying(d) => match d.step {
                DeployStep::Preparing { .. } | DeployStep::Deploying { .. } => Some(d.deadline),
                _ => None,
            },
            Phase::Running(r) => {
                let protocol = self.protocol.as_ref().and_then(|p| p.next_deadline());
                let stop = r.stopping.as_ref().map(|s| s.deadline);
                protocol.into_iter().chain(stop).min()
            }
            Phase::Cancelling(c) => Some(c.deadline),
            Phase::BackingOff { until } => Some(*until),
            _ => None,
        }
    }

    /// Starts the job: the first actions.
    pub fn start(&mut self, now: u64) -> Vec<Action> {
        let mut acts = Vec::new();
        if !matches!(self.phase, Phase::Created) {
            return acts;
        }
        self.transition(JobEvent::Schedule);
        if let Some(e) = self.protocol_error.take() {
            self.fail_unattempted(
                now,
                Failure {
                    reason: e,
                    user: true,
                    unavailable: false,
                },
            );
        } else if self.managed_state {
            self.phase = Phase::Connecting;
            self.waiting_for("the state service");
            acts.push(Action::ConnectState);
        } else {
            self.schedule(&mut acts);
        }
        self.after(now, &mut acts);
        acts
    }

    /// Handles `event` at `now`; returns what to do.
    pub fn on_event(&mut self, now: u64, event: Event) -> Vec<Action> {
        let mut acts = Vec::new();
        if matches!(self.phase, Phase::Done) {
            if let Event::Request { reply, .. } = event {
                acts.push(refuse(reply, "the job has ended".into()));
            }
            return acts;
        }
        match event {
            Event::Tick => self.on_tick(now, &mut acts),
            Event::StateConnected(r) => self.on_state_connected(now, r, &mut acts),
            Event::Capacity { free } => {
                if matches!(self.phase, Phase::Scheduling) {
                    let n = self.workers_needed();
                    self.waiting_for(&format!("workers with a free slot: {free} of {n}"));
                }
            }
            Event::SlotsAcquired(workers) => self.on_slots(now, workers, &mut acts),
            Event::Worker { worker, msg } => self.on_worker(now, worker, msg, &mut acts),
            Event::WorkerLost { worker, reason } => self.on_lost(now, worker, reason, &mut acts),
            Event::StateOpened(r) => self.on_state_opened(now, r, &mut acts),
            Event::StateRolledBack(r) => self.on_rolled_back(now, r, &mut acts),
            Event::StateCommitted { id, result } => {
                if let Err(e) = result {
                    // The checkpoint exists (its metadata is written): a restore finds
                    // it from the flushed deltas even without a manifest.
                    tracing::warn!(job = %self.config.job_id, id, "state commit failed: {e}");
                }
                self.checkpoint_done(now, id, &mut acts);
            }
            Event::RestoreBytes(bytes) => self.on_restore_bytes(now, bytes, &mut acts),
            Event::LatestCheckpoint(m) => self.on_latest(m, &mut acts),
            Event::MetadataWritten { path, outcome } => {
                self.on_metadata_written(now, path, outcome, &mut acts)
            }
            Event::Request { reply, request } => self.on_request(now, reply, request, &mut acts),
        }
        self.after(now, &mut acts);
        acts
    }

    /// After every step: an illegal transition fails the job.
    fn after(&mut self, now: u64, acts: &mut Vec<Action>) {
        if self.illegal.len() > self.illegal_handled {
            self.illegal_handled = self.illegal.len();
            let e = self.illegal[self.illegal.len() - 1];
            self.abandon(now, e, acts);
        }
        self.status_version += 1;
    }

    // -----------------------------------------------------------------------------------
    // The lifecycle

    /// Moves the lifecycle by `event`; false (and recorded) when it refuses.
    fn transition(&mut self, event: JobEvent) -> bool {
        match self.lifecycle.next(event) {
            Ok(next) => {
                self.lifecycle = next;
                self.status.state = next;
                true
            }
            Err(e) => {
                tracing::error!(job = %self.config.job_id, "bug in the job driver: {e}");
                self.illegal.push(e);
                false
            }
        }
    }

    /// An illegal transition happened: the job fails (cancelled where failing is not a
    /// state the lifecycle can reach), its workers are told to stop, and every request
    /// is answered.
    fn abandon(&mut self, _now: u64, e: IllegalTransition, acts: &mut Vec<Action>) {
        if self.lifecycle.is_terminal() && self.end.is_some() {
            return;
        }
        self.status.failure = Some(format!("internal error in the job driver: {e}"));
        self.status.user_error = false;
        if let Some((attempt, workers)) = self.attempt_workers() {
            acts.push(Action::Send {
                workers,
                msg: Box::new(control::cancel(attempt)),
            });
        }
        self.answer_all("the job failed (internal error)", acts);
        acts.push(Action::ReleaseSlots);
        let failed = self
            .lifecycle
            .next(JobEvent::TaskFailed)
            .and_then(|s| s.next(JobEvent::GiveUp))
            .or_else(|_| self.lifecycle.next(JobEvent::Cancel));
        if let Ok(s) = failed {
            self.lifecycle = s;
            self.status.state = s;
        }
        self.phase = Phase::Done;
        self.status.waiting_for = None;
        self.end = Some(End {
            state: self.lifecycle,
            record: true,
        });
    }

    /// The job ends in `state` (a transition to it must be legal).
    fn finish(&mut self, event: JobEvent) {
        if event == JobEvent::AllFinished {
            // A failure the job recovered from is history (`failures`), not its state.
            self.status.failure = None;
        }
        self.transition(event);
        self.phase = Phase::Done;
        self.status.waiting_for = None;
        self.status.workers.clear();
        self.end = Some(End {
            state: self.lifecycle,
            record: !self.fenced,
        });
    }

    /// `f` failed the current attempt at `now`.
    fn record_failure(&mut self, now: u64, f: &Failure) {
        self.status.record_failure(FailureRecord {
            attempt: self.attempt,
            at_ms: now,
            reason: f.reason.clone(),
            unavailable: f.unavailable,
        });
    }

    fn waiting_for(&mut self, what: &str) {
        self.status.waiting_for = Some(what.to_string());
    }

    fn workers_needed(&self) -> usize {
        self.config.workers.max(1)
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The id of the checkpoint `actions` trigger, if they do.
fn triggered(actions: &[ckpt::Action]) -> Option<u64> {
    actions.iter().find_map(|a| match a {
        ckpt::Action::Trigger { id, .. } => Some(*id),
        _ => None,
    })
}

/// `workers` for which `done` is false, for messages.
fn missing(workers: &[String], done: impl Fn(&String) -> bool) -> String {
    let late: Vec<&str> = workers
        .iter()
        .filter(|w| !done(w))
        .map(String::as_str)
        .collect();
    late.join(", ")
}

fn reply_to(to: ReplyId, answer: Answer) -> Action {
    Action::Reply {
        to,
        answer: Ok(answer),
    }
}

fn refuse(to: ReplyId, why: String) -> Action {
    Action::Reply {
        to,
        answer: Err(why),
    }
}
