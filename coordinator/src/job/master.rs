//! One job's driver: an actor that deploys the job on workers, runs its checkpoints and
//! restarts it from the last one when something fails.
//!
//! The master owns the job's [`JobState`] and [`CheckpointProtocol`] and is the only
//! one to change them; everything reaches it through its mailbox ([`JobInput`]):
//! worker messages, lost workers, user commands. Its I/O (control messages, the
//! `_metadata` store, the state service) happens here, the decisions in those two
//! state machines.
//!
//! ## An attempt
//!
//! 1. Take a slot on `workers` workers (a [`WorkerLauncher`] may start them first).
//! 2. `Prepare`: each binds a fresh data port for this attempt.
//! 3. With remote state, the shards are rolled back to the checkpoint the attempt
//!    resumes from (nothing written after it survives), and writes start at the next
//!    checkpoint id.
//! 4. `Deploy` with the peers' addresses and where to resume from (checkpoint id and
//!    source positions); each worker answers with its tasks, which become the set that
//!    must acknowledge checkpoints.
//! 5. Running: triggers, acknowledgements, `_metadata`, notifications, shard commits,
//!    as the protocol says; periodic reports; the final reports end the job.
//!
//! A failed task, a lost worker or a deployment that does not come up cancels the
//! attempt on every worker still there, and the restart policy decides whether and
//! when a new attempt resumes from the last completed checkpoint. A job without
//! checkpoints is not restarted (it could only start over, repeating its output).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use prost::Message;
use sluice_common::pb;
use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::{coordinator_message as cm, worker_message as wm};
use tokio::sync::{mpsc, oneshot};

use crate::checkpoint::metadata::CheckpointMetadata;
use crate::checkpoint::store::{self, MetadataStore};
use crate::checkpoint::{BarrierMode, CheckpointConfig, CheckpointProtocol, JobInfo, TaskId};
use crate::cluster::registry::{Registry, WorkerHandle};
use crate::job::lifecycle::{JobEvent, JobState};
use crate::job::restart::{Decision, RestartPolicy};

/// A job's keyed state in the state service, as the coordinator needs it.
#[async_trait]
pub trait JobStateShards: Send + Sync {
    /// Opens every shard; returns the checkpoint they hold.
    async fn open(&self) -> Result<u64, String>;
    /// Brings every shard to `checkpoint`: drops later writes, or restores it from the
    /// object store when a later checkpoint was committed since; and raises the shards'
    /// fence to `fence`, so writers of earlier attempts are refused from then on.
    async fn rollback(&self, checkpoint: u64, fence: u64) -> Result<(), String>;
    /// Commits `checkpoint`, keeping `retained`.
    async fn commit(&self, checkpoint: u64, retained: &[u64]) -> Result<(), String>;
    /// What workers need to reach the shards (without `first_epoch`).
    fn reference(&self) -> pbc::RemoteStateRef;
    /// Bytes the node(s) downloaded to restore shards so far (rescaling must add none).
    async fn restore_bytes(&self) -> Result<u64, String>;
}

/// Connects jobs to the state service.
#[async_trait]
pub trait StateConnector: Send + Sync {
    /// The shards of job `job_id` with graph `graph` (which asked for remote state).
    async fn connect(
        &self,
        job_id: &str,
        graph: &pb::JobGraph,
    ) -> Result<Arc<dyn JobStateShards>, String>;
}

/// Starts worker processes when a job needs more than are attached (embedded clusters).
pub trait WorkerLauncher: Send + Sync {
    /// Makes sure `n` launched workers are alive (starting replacements for dead ones).
    fn ensure(&self, n: usize);
}

/// What reaches a job's master.
#[derive(Debug)]
pub enum JobInput {
    /// A control message from a worker the job uses.
    Worker {
        /// The worker.
        worker: String,
        /// The message.
        msg: wm::Msg,
    },
    /// A worker the job uses is gone.
    Lost {
        /// The worker.
        worker: String,
        /// Why.
        reason: String,
    },
    /// A user's request.
    Command(Command),
}

/// A user's request to a running job; the answer goes to `reply`.
#[derive(Debug)]
pub enum Command {
    /// Stop the job now.
    Cancel {
        /// Answered once the workers stopped.
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// Take savepoint `name`.
    Savepoint {
        /// Its name.
        name: String,
        /// Its `_metadata` path once written.
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// Take savepoint `name` (if given), then stop.
    Stop {
        /// The savepoint's name.
        savepoint: Option<String>,
        /// The savepoint's path (empty without one).
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// Checkpoint, then run at `parallelism`.
    Rescale {
        /// The new parallelism of every node.
        parallelism: u32,
        /// Answered once the job runs at the new parallelism.
        reply: oneshot::Sender<Result<RescaleOutcome, String>>,
    },
}

/// What a rescale did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RescaleOutcome {
    /// The checkpoint the job resumed from.
    pub checkpoint_id: u64,
    /// Milliseconds from the request to the tasks running at the new parallelism.
    pub millis: u64,
    /// State bytes the state service downloaded meanwhile (0: no state moved).
    pub state_bytes_restored: u64,
}

/// A completed checkpoint, as `sluice checkpoints` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckpointRecord {
    /// Its id.
    pub id: u64,
    /// Its savepoint name, if any.
    pub savepoint: Option<String>,
    /// Trigger to last acknowledgement, ms.
    pub duration_ms: u64,
    /// Trigger to the `_metadata` write, ms.
    pub commit_ms: u64,
    /// Longest synchronous part of a task, µs.
    pub max_sync_micros: u64,
    /// Longest barrier alignment of a task, µs.
    pub max_alignment_micros: u64,
    /// When it was triggered (ms since the Unix epoch).
    pub triggered_at_ms: u64,
    /// Tasks that acknowledged.
    pub tasks: usize,
}

/// What the REST API shows of a job.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobStatus {
    /// Its id.
    pub id: String,
    /// Its name in the job file.
    pub name: String,
    /// Where it is in its life.
    pub state: JobState,
    /// The current deployment attempt (1 for the first).
    pub attempt: u64,
    /// Restarts after failures so far.
    pub restarts: u32,
    /// Worker processes it runs on.
    pub workers: Vec<String>,
    /// Parallelism of its nodes (the largest).
    pub parallelism: u32,
    /// Records read and written, from the workers' last reports.
    pub records_in: u64,
    /// Records written by the sinks.
    pub records_out: u64,
    /// Late records the windows counted (at the end).
    pub late: u64,
    /// Malformed records skipped (at the end).
    pub skipped: u64,
    /// Checkpoint barriers that reached the sinks (at the end).
    pub barriers: u64,
    /// The newest completed checkpoint.
    pub last_checkpoint: Option<u64>,
    /// Completed checkpoints, oldest first (the last 100).
    pub checkpoints: Vec<CheckpointRecord>,
    /// Checkpoints aborted so far.
    pub checkpoints_aborted: u64,
    /// Why the last attempt failed.
    pub failure: Option<String>,
    /// The error was in the job itself (not retried).
    pub user_error: bool,
    /// Milliseconds since the Unix epoch when it was submitted.
    pub submitted_at_ms: u64,
}

/// Settings of a job's master.
#[derive(Clone)]
pub struct MasterConfig {
    /// Worker processes to run the job on.
    pub workers: usize,
    /// Restarts after failures.
    pub restart: RestartPolicy,
    /// How long to wait for workers, ports and deployments.
    pub deploy_timeout: Duration,
    /// Data-plane settings for the workers.
    pub network: pbc::NetworkConfig,
    /// Workers print task metrics this often (0: at the end only).
    pub metrics_interval_ms: u64,
    /// This coordinator incarnation.
    pub coordinator_id: String,
    /// Whose shards in the state service the job uses: its own id (`None`), or the
    /// job it took a savepoint from.
    pub state_id: Option<String>,
}

/// A job's master, ready to run.
pub struct JobMaster {
    pub(super) id: String,
    pub(super) graph: pb::JobGraph,
    config: MasterConfig,
    registry: Arc<Registry>,
    pub(super) store: Arc<dyn MetadataStore>,
    state_connector: Option<Arc<dyn StateConnector>>,
    launcher: Option<Arc<dyn WorkerLauncher>>,
    pub(super) mailbox: mpsc::UnboundedReceiver<JobInput>,
    status: Arc<Mutex<JobStatus>>,
    /// Where the first attempt resumes from (a coordinator restart, a savepoint).
    resume: Option<CheckpointMetadata>,
}

/// The job's number of key groups (0 in a graph means the default).
pub fn max_parallelism(graph: &pb::JobGraph) -> u32 {
    match graph.max_parallelism {
        0 => sluice_common::DEFAULT_MAX_PARALLELISM,
        n => n,
    }
}

/// How an attempt ended.
pub(super) enum Outcome {
    Finished(Vec<pbc::Report>),
    Failed {
        reason: String,
        user: bool,
    },
    Cancelled(Option<oneshot::Sender<Result<(), String>>>),
    Stopped(oneshot::Sender<Result<String, String>>, String),
    Rescale {
        parallelism: u32,
        from: Box<CheckpointMetadata>,
        started: Instant,
        restore_bytes_before: u64,
        reply: oneshot::Sender<Result<RescaleOutcome, String>>,
    },
    Fenced(u64),
}

/// A rescale whose new attempt is being deployed.
struct PendingRescale {
    checkpoint_id: u64,
    started: Instant,
    restore_bytes_before: u64,
    reply: oneshot::Sender<Result<RescaleOutcome, String>>,
}

/// Moves `state` by `event` (when the lifecycle allows it) and shows it in `status`.
fn go(state: &mut JobState, event: JobEvent, status: &Arc<Mutex<JobStatus>>) {
    match state.next(event) {
        Ok(n) => {
            *state = n;
            status.lock().unwrap_or_else(|p| p.into_inner()).state = n;
        }
        Err(e) => tracing::debug!("{e}"),
    }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The largest parallelism of the graph's nodes.
pub fn graph_parallelism(graph: &pb::JobGraph) -> u32 {
    graph
        .nodes
        .iter()
        .map(|n| n.parallelism)
        .max()
        .unwrap_or(1)
        .max(1)
}

/// Runs every node of `graph` (and a sink that names its own) at parallelism `p`.
pub fn set_parallelism(graph: &mut pb::JobGraph, p: u32) {
    for n in &mut graph.nodes {
        if n.parallelism > 0 {
            n.parallelism = p;
        }
        if let Some(pb::node::Kind::Sink(s)) = &mut n.kind
            && s.parallelism > 0
        {
            s.parallelism = p;
        }
    }
}

impl JobMaster {
    /// A master for job `id`; its status is shared through the returned cell.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        graph: pb::JobGraph,
        config: MasterConfig,
        registry: Arc<Registry>,
        store: Arc<dyn MetadataStore>,
        state_connector: Option<Arc<dyn StateConnector>>,
        launcher: Option<Arc<dyn WorkerLauncher>>,
        resume: Option<CheckpointMetadata>,
    ) -> (Self, mpsc::UnboundedSender<JobInput>, Arc<Mutex<JobStatus>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        registry.add_job(&id, tx.clone());
        let status = Arc::new(Mutex::new(JobStatus {
            id: id.clone(),
            name: graph.name.clone(),
            state: JobState::Created,
            attempt: 0,
            restarts: 0,
            workers: Vec::new(),
            parallelism: graph_parallelism(&graph),
            records_in: 0,
            records_out: 0,
            late: 0,
            skipped: 0,
            barriers: 0,
            last_checkpoint: resume.as_ref().map(|m| m.checkpoint_id),
            checkpoints: Vec::new(),
            checkpoints_aborted: 0,
            failure: None,
            user_error: false,
            submitted_at_ms: now_ms(),
        }));
        let master = Self {
            id,
            graph,
            config,
            registry,
            store,
            state_connector,
            launcher,
            mailbox: rx,
            status: status.clone(),
            resume,
        };
        (master, tx, status)
    }

    pub(super) fn status(&self) -> std::sync::MutexGuard<'_, JobStatus> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the job to a terminal state; returns it.
    pub async fn run(mut self) -> JobState {
        let end = self.drive().await;
        self.registry.remove_job(&self.id);
        {
            let mut st = self.status();
            st.state = end;
            st.workers.clear();
        }
        let marker = format!("jobs/{}/end", self.id);
        let _ = self
            .store
            .create_if_absent(&marker, Bytes::from(end.to_string()))
            .await;
        end
    }

    fn checkpoint_config(&self) -> Option<CheckpointConfig> {
        let c = self
            .graph
            .checkpoint
            .as_ref()
            .filter(|c| c.interval_ms > 0)?;
        Some(CheckpointConfig {
            interval: Duration::from_millis(c.interval_ms),
            mode: match c.mode() {
                pb::CheckpointMode::Aligned => BarrierMode::Aligned,
                pb::CheckpointMode::Unaligned => {
                    // The in-flight data an unaligned barrier overtakes is not stored
                    // yet, so a restore from such a checkpoint would lose it.
                    tracing::warn!(
                        job = %self.id,
                        "unaligned checkpoints do not store in-flight data yet; this job's checkpoints are aligned"
                    );
                    BarrierMode::Aligned
                }
            },
            timeout: Duration::from_secs(120),
            ..CheckpointConfig::default()
        })
    }

    fn job_info(&self) -> JobInfo {
        JobInfo {
            job_id: self.id.clone(),
            coordinator_id: self.config.coordinator_id.clone(),
            job_graph: Bytes::from(self.graph.encode_to_vec()),
            max_parallelism: max_parallelism(&self.graph),
            parallelism: self
                .graph
                .nodes
                .iter()
                .map(|n| (n.id, n.parallelism))
                .collect(),
            shards: Vec::new(),
            tasks: BTreeSet::new(),
        }
    }

    async fn drive(&mut self) -> JobState {
        let mut state = JobState::Created;
        go(&mut state, JobEvent::Schedule, &self.status);
        let shards = match (&self.state_connector, self.wants_remote_state()) {
            (Some(c), true) => match c
                .connect(
                    self.config.state_id.as_deref().unwrap_or(&self.id),
                    &self.graph,
                )
                .await
            {
                Ok(s) => Some(s),
                Err(e) => return self.fail(format!("state service: {e}"), false),
            },
            (None, true) => {
                return self.fail(
                    "the job keeps its state in a state service, and this coordinator knows none (--state-service)".into(),
                    true,
                );
            }
            _ => None,
        };
        let mut protocol = match self.checkpoint_config() {
            Some(cfg) => {
                let existing = store::checkpoint_ids(self.store.as_ref(), &self.id)
                    .await
                    .unwrap_or_default();
                let first = existing.last().map_or(1, |l| l + 1);
                match CheckpointProtocol::new(cfg, self.job_info(), first, now_ms()) {
                    Ok(mut p) => {
                        if let Some(m) = &self.resume {
                            p.record_existing(m.checkpoint_id, m.kept);
                        }
                        Some(p)
                    }
                    Err(e) => return self.fail(format!("checkpoints: {e}"), true),
                }
            }
            None => None,
        };
        let mut restore: Option<CheckpointMetadata> = self.resume.take();
        let mut restarts = 0u32;
        let mut attempt = 0u64;
        // A rescale waiting for its attempt to come up: (started, bytes before, reply).
        let mut rescaling: Option<PendingRescale> = None;
        loop {
            attempt += 1;
            self.status().attempt = attempt;
            let deployed = self
                .deploy(
                    attempt,
                    restore.as_ref(),
                    shards.as_deref(),
                    protocol.as_mut(),
                )
                .await;
            let outcome = match deployed {
                Ok((workers, tasks)) => {
                    if let Some(r) = rescaling.take() {
                        let bytes = match &shards {
                            Some(s) => s.restore_bytes().await.unwrap_or(0),
                            None => 0,
                        };
                        let _ = r.reply.send(Ok(RescaleOutcome {
                            checkpoint_id: r.checkpoint_id,
                            millis: r.started.elapsed().as_millis() as u64,
                            state_bytes_restored: bytes.saturating_sub(r.restore_bytes_before),
                        }));
                        go(&mut state, JobEvent::Rescaled, &self.status);
                    } else {
                        go(&mut state, JobEvent::Deployed, &self.status);
                    }
                    let o = self
                        .run_attempt(
                            attempt,
                            &workers,
                            &tasks,
                            shards.as_deref(),
                            protocol.as_mut(),
                        )
                        .await;
                    self.cancel_attempt(attempt, &workers).await;
                    o
                }
                Err(o) => {
                    if let Some(r) = rescaling.take() {
                        let _ = r.reply.send(Err(
                            "the job did not come up at the new parallelism; it restarts from the rescale checkpoint".into(),
                        ));
                    }
                    o
                }
            };
            self.registry.release(&self.id);
            self.status().workers.clear();
            match outcome {
                Outcome::Finished(reports) => {
                    let last = reports
                        .iter()
                        .map(|r| r.last_flushed_epoch)
                        .max()
                        .unwrap_or(0);
                    // With checkpoints, the final checkpoint committed the shards already.
                    if let (Some(s), true, None) = (&shards, last > 0, &protocol) {
                        // Every task flushed its last epoch at the end of its input.
                        if let Err(e) = s.commit(last, &[last]).await {
                            tracing::warn!(job = %self.id, "final state commit failed: {e}");
                        }
                    }
                    go(&mut state, JobEvent::AllFinished, &self.status);
                    return state;
                }
                Outcome::Cancelled(reply) => {
                    if let Some(r) = reply {
                        let _ = r.send(Ok(()));
                    }
                    return JobState::Cancelled;
                }
                Outcome::Stopped(reply, path) => {
                    let _ = reply.send(Ok(path));
                    return JobState::Cancelled;
                }
                Outcome::Fenced(id) => {
                    let msg = format!(
                        "another coordinator committed checkpoint {id} of this job; this one stepped down"
                    );
                    return self.fail(msg, false);
                }
                Outcome::Rescale {
                    parallelism,
                    from,
                    started,
                    restore_bytes_before,
                    reply,
                } => {
                    set_parallelism(&mut self.graph, parallelism);
                    self.status().parallelism = parallelism;
                    go(&mut state, JobEvent::RescaleRequested, &self.status);
                    rescaling = Some(PendingRescale {
                        checkpoint_id: from.checkpoint_id,
                        started,
                        restore_bytes_before,
                        reply,
                    });
                    restore = Some(*from);
                }
                Outcome::Failed { reason, user } => {
                    go(&mut state, JobEvent::TaskFailed, &self.status);
                    match self
                        .settle(
                            reason,
                            user,
                            &mut restore,
                            &mut restarts,
                            protocol.is_some(),
                        )
                        .await
                    {
                        Some(end) => {
                            if end == JobState::Failed {
                                go(&mut state, JobEvent::GiveUp, &self.status);
                            }
                            return end;
                        }
                        None => {
                            go(&mut state, JobEvent::Restart, &self.status);
                            go(&mut state, JobEvent::Restarted, &self.status);
                        }
                    }
                }
            }
        }
    }

    /// After a failed attempt: the terminal state, or `None` to deploy again from
    /// `restore` once the back-off passed.
    async fn settle(
        &mut self,
        reason: String,
        user: bool,
        restore: &mut Option<CheckpointMetadata>,
        restarts: &mut u32,
        checkpoints: bool,
    ) -> Option<JobState> {
        tracing::warn!(job = %self.id, "attempt failed: {reason}");
        {
            let mut st = self.status();
            st.failure = Some(reason.clone());
            st.user_error = user;
        }
        if user || !checkpoints {
            return Some(JobState::Failed);
        }
        if let Some(why) = self.not_restorable() {
            let mut st = self.status();
            st.failure = Some(format!("{reason}; not restarted: {why}"));
            return Some(JobState::Failed);
        }
        let wait = match self.config.restart.decide(*restarts) {
            Decision::GiveUp => return Some(JobState::Failed),
            Decision::Restart(wait) => wait,
        };
        *restarts += 1;
        self.status().restarts = *restarts;
        self.status().state = JobState::Restarting;
        // The back-off, still answering commands.
        let until = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                input = self.mailbox.recv() => match input {
                    Some(JobInput::Command(Command::Cancel { reply })) => {
                        let _ = reply.send(Ok(()));
                        return Some(JobState::Cancelled);
                    }
                    Some(JobInput::Command(c)) => refuse(c, "the job is restarting"),
                    Some(_) => {}
                    None => return Some(JobState::Failed),
                }
            }
        }
        if let Some(m) = self.latest_completed().await {
            *restore = Some(m);
        } else if restore.is_none() {
            // Nothing completed: start over, with sinks discarding what is pending.
            *restore = Some(CheckpointMetadata {
                job_id: self.id.clone(),
                max_parallelism: self.graph.max_parallelism,
                ..CheckpointMetadata::default()
            });
        }
        None
    }

    fn fail(&self, reason: String, user: bool) -> JobState {
        tracing::error!(job = %self.id, "job failed: {reason}");
        let mut st = self.status();
        st.failure = Some(reason);
        st.user_error = user;
        JobState::Failed
    }

    /// Why a checkpoint of this job cannot be restored, if it cannot: window state kept
    /// in worker memory is not part of a checkpoint.
    fn not_restorable(&self) -> Option<String> {
        let windows = self
            .graph
            .nodes
            .iter()
            .any(|n| matches!(n.kind, Some(pb::node::Kind::Window(_))));
        (windows && !self.wants_remote_state()).then(|| {
            "the job's windows keep their state in worker memory, which checkpoints do not \
             capture; with `state: { backend: remote }` it restarts from its last checkpoint"
                .to_string()
        })
    }

    fn wants_remote_state(&self) -> bool {
        self.graph
            .state
            .as_ref()
            .is_some_and(|s| s.backend() == pb::StateBackend::Remote)
    }

    /// The newest checkpoint in the store whose `_metadata` is valid.
    async fn latest_completed(&self) -> Option<CheckpointMetadata> {
        match store::latest_valid(self.store.as_ref(), &self.id).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(job = %self.id, "cannot read checkpoints: {e}");
                None
            }
        }
    }

    /// Waits for the next mailbox input until `deadline`; `None` on timeout.
    async fn next_input(&mut self, deadline: tokio::time::Instant) -> Option<JobInput> {
        tokio::time::timeout_at(deadline, self.mailbox.recv())
            .await
            .ok()
            .flatten()
    }

    /// The next worker message while `workers` deploy an attempt. The attempt fails when
    /// `deadline` passes (saying `late`) or one of them is lost; a cancel ends it; other
    /// commands are refused for now.
    async fn deploying_message(
        &mut self,
        deadline: tokio::time::Instant,
        workers: &[WorkerHandle],
        late: &str,
    ) -> Result<(String, wm::Msg), Outcome> {
        loop {
            match self.next_input(deadline).await {
                None => {
                    return Err(Outcome::Failed {
                        reason: late.to_string(),
                        user: false,
                    });
                }
                Some(JobInput::Worker { worker, msg }) => return Ok((worker, msg)),
                Some(JobInput::Lost { worker, reason })
                    if workers.iter().any(|w| w.id == worker) =>
                {
                    return Err(Outcome::Failed {
                        reason: format!("worker {worker} lost while deploying: {reason}"),
                        user: false,
                    });
                }
                Some(JobInput::Command(Command::Cancel { reply })) => {
                    return Err(Outcome::Cancelled(Some(reply)));
                }
                Some(JobInput::Command(c)) => refuse(c, "the job is being deployed"),
                Some(JobInput::Lost { .. }) => {}
            }
        }
    }

    /// Steps 1-4 of an attempt; the workers running it, or how it ended.
    async fn deploy(
        &mut self,
        attempt: u64,
        restore: Option<&CheckpointMetadata>,
        shards: Option<&dyn JobStateShards>,
        protocol: Option<&mut CheckpointProtocol>,
    ) -> Result<(Vec<WorkerHandle>, BTreeSet<TaskId>), Outcome> {
        let n = self.config.workers.max(1);
        let deadline = tokio::time::Instant::now() + self.config.deploy_timeout;
        let failed = |reason: String| Outcome::Failed {
            reason,
            user: false,
        };
        // 1. Slots.
        let workers = loop {
            if let Some(l) = &self.launcher {
                l.ensure(n);
            }
            if let Some(w) = self.registry.acquire(&self.id, n) {
                break w;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(failed(format!(
                    "{n} workers with a free slot were needed; {} attached within {:?}",
                    self.registry.free_workers(),
                    self.config.deploy_timeout
                )));
            }
            tokio::select! {
                _ = self.registry.wait_for_change(Duration::from_millis(200)) => {}
                input = self.mailbox.recv() => match input {
                    Some(JobInput::Command(Command::Cancel { reply })) => return Err(Outcome::Cancelled(Some(reply))),
                    Some(JobInput::Command(c)) => refuse(c, "the job is being scheduled"),
                    _ => {}
                }
            }
        };
        self.status().workers = workers.iter().map(|w| w.id.clone()).collect();
        // 2. Data ports.
        for w in &workers {
            w.send(cm::Msg::Prepare(pbc::Prepare {
                job_id: self.id.clone(),
                attempt,
            }));
        }
        let mut addresses: HashMap<String, String> = HashMap::new();
        while addresses.len() < workers.len() {
            let late = "workers did not bind their data ports in time";
            let (worker, msg) = self.deploying_message(deadline, &workers, late).await?;
            if let wm::Msg::Prepared(p) = msg
                && p.attempt == attempt
            {
                if !p.error.is_empty() {
                    return Err(failed(format!("worker {worker}: {}", p.error)));
                }
                addresses.insert(worker, p.data_address);
            }
        }
        let peers: Vec<String> = workers.iter().map(|w| addresses[&w.id].clone()).collect();
        // 3. State.
        let restore_id = restore.map(|m| m.checkpoint_id);
        let mut protocol = protocol;
        let remote_state = match shards {
            Some(s) => {
                let held = s
                    .open()
                    .await
                    .map_err(|e| failed(format!("state service: {e}")))?;
                if let Some(p) = protocol.as_deref_mut()
                    && held >= p.next_id()
                {
                    // The shards hold a checkpoint the store does not know (the job's
                    // state was prepared elsewhere): ids continue after it.
                    p.record_existing(held, false);
                }
                let first_epoch = protocol.as_ref().map_or(1, |p| p.next_id());
                // Wall-clock milliseconds only grow across attempts and coordinators: a
                // writer of any earlier attempt (a worker that missed its heartbeats but
                // still runs) is refused once the shards are rolled back for this one.
                let fence = now_ms();
                if let Some(c) = restore_id {
                    s.rollback(c, fence)
                        .await
                        .map_err(|e| failed(format!("state rollback to checkpoint {c}: {e}")))?;
                }
                let mut r = s.reference();
                // Writes of the attempt belong to the next checkpoint; a fresh job
                // without a coordinator checkpoint continues after what the shards hold.
                r.first_epoch = first_epoch.max(held + 1);
                r.fence = fence;
                Some(r)
            }
            None => None,
        };
        // 4. Deploy.
        let restore_msg = restore.map(|m| pbc::Restore {
            checkpoint_id: m.checkpoint_id,
            source_positions: m
                .tasks
                .iter()
                .flat_map(|t| t.source_positions.iter())
                .map(|p| pbc::SourcePosition {
                    split: p.split.clone(),
                    position: p.position.clone(),
                })
                .collect(),
        });
        let coordinated = protocol.is_some();
        for (i, w) in workers.iter().enumerate() {
            w.send(cm::Msg::Deploy(pbc::Deploy {
                attempt,
                deployment: Some(pbc::Deployment {
                    job: Some(self.graph.clone()),
                    worker_index: i as u32,
                    peers: peers.clone(),
                    network: Some(self.config.network),
                    metrics_interval_ms: self.config.metrics_interval_ms,
                    remote_state: remote_state.clone(),
                    restore: restore_msg.clone(),
                    coordinated_checkpoints: coordinated,
                    job_id: self.id.clone(),
                }),
            }));
        }
        let mut tasks = BTreeSet::new();
        let mut deployed = HashSet::new();
        while deployed.len() < workers.len() {
            let late = "workers did not deploy their tasks in time";
            let (worker, msg) = self.deploying_message(deadline, &workers, late).await?;
            match msg {
                wm::Msg::Deployed(d) if d.attempt == attempt => {
                    if !d.error.is_empty() {
                        return Err(Outcome::Failed {
                            reason: format!("worker {worker}: {}", d.error),
                            user: d.user_error,
                        });
                    }
                    tasks.extend(d.tasks.iter().map(|t| TaskId::new(t.node, t.subtask)));
                    deployed.insert(worker);
                }
                wm::Msg::Report(r) if r.attempt == attempt && !r.error.is_empty() => {
                    return Err(Outcome::Failed {
                        reason: format!("worker {worker}: {}", r.error),
                        user: r.user_error,
                    });
                }
                _ => {}
            }
        }
        if let Some(p) = protocol {
            p.set_tasks(now_ms(), tasks.clone());
            p.set_periodic(true);
        }
        tracing::info!(job = %self.id, attempt, workers = workers.len(), restore = ?restore_id, "deployed");
        Ok((workers, tasks))
    }

    /// Step 5: runs until the attempt ends (see [`super::attempt`]).
    async fn run_attempt(
        &mut self,
        attempt: u64,
        workers: &[WorkerHandle],
        tasks: &BTreeSet<TaskId>,
        shards: Option<&dyn JobStateShards>,
        protocol: Option<&mut CheckpointProtocol>,
    ) -> Outcome {
        {
            let mut st = self.status();
            st.records_in = 0;
            st.records_out = 0;
        }
        super::attempt::Running::new(self, attempt, workers, tasks, shards, protocol)
            .run()
            .await
    }

    pub(super) fn record_checkpoint(&self, m: &CheckpointMetadata) {
        let mut st = self.status();
        st.last_checkpoint = Some(m.checkpoint_id);
        st.checkpoints.push(CheckpointRecord {
            id: m.checkpoint_id,
            savepoint: m.savepoint.clone(),
            duration_ms: m.duration().as_millis() as u64,
            commit_ms: now_ms().saturating_sub(m.triggered_at_ms),
            max_sync_micros: m
                .tasks
                .iter()
                .map(|t| t.figures.sync.as_micros() as u64)
                .max()
                .unwrap_or(0),
            max_alignment_micros: m
                .tasks
                .iter()
                .map(|t| t.figures.alignment.as_micros() as u64)
                .max()
                .unwrap_or(0),
            triggered_at_ms: m.triggered_at_ms,
            tasks: m.tasks.len(),
        });
        if st.checkpoints.len() > 100 {
            st.checkpoints.remove(0);
        }
    }

    /// Cancels `attempt` on every worker and waits (bounded) for them to confirm, so no
    /// task of it writes state after the next attempt rolled the shards back.
    async fn cancel_attempt(&mut self, attempt: u64, workers: &[WorkerHandle]) {
        let mut pending: HashSet<String> = HashSet::new();
        for w in workers {
            if self.registry.is_attached(&w.id) && w.send(cm::Msg::Cancel(pbc::Cancel { attempt }))
            {
                pending.insert(w.id.clone());
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !pending.is_empty() {
            match self.next_input(deadline).await {
                None => {
                    tracing::warn!(job = %self.id, ?pending, "workers did not confirm the cancellation in time");
                    break;
                }
                Some(JobInput::Worker {
                    worker,
                    msg: wm::Msg::Report(r),
                }) if r.attempt == attempt && r.r#final => {
                    pending.remove(&worker);
                }
                Some(JobInput::Lost { worker, .. }) => {
                    pending.remove(&worker);
                }
                Some(JobInput::Command(c)) => refuse(c, "the job is stopping its tasks"),
                Some(_) => {}
            }
        }
    }
}

/// Answers a command that does not fit the job's state.
fn refuse(c: Command, why: &str) {
    let msg = format!("{why}; try again shortly");
    match c {
        Command::Cancel { reply } => {
            let _ = reply.send(Err(msg));
        }
        Command::Savepoint { reply, .. } | Command::Stop { reply, .. } => {
            let _ = reply.send(Err(msg));
        }
        Command::Rescale { reply, .. } => {
            let _ = reply.send(Err(msg));
        }
    }
}
