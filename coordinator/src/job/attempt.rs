//! A deployed attempt of a job, while it runs: the master's step 5.
//!
//! [`Running`] waits on the job's mailbox and the checkpoint protocol's next deadline,
//! feeds what happens to the protocol (acknowledgements, declines, time) and carries out
//! the actions it returns: barriers and notifications to the workers, `_metadata` writes,
//! shard commits. User commands (savepoint, stop, rescale, cancel) become protocol
//! triggers or end the attempt. It ends with an [`Outcome`]: every worker reported the
//! end of its tasks, a task or worker failed, or a command asked for it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::{coordinator_message as cm, worker_message as wm};
use tokio::sync::oneshot;

use super::master::{
    Command, JobInput, JobMaster, JobStateShards, Outcome, RescaleOutcome, max_parallelism, now_ms,
};
use crate::checkpoint::metadata::{self, CheckpointMetadata};
use crate::checkpoint::store::{self, CreateOutcome};
use crate::checkpoint::{
    AbortReason, Action, BarrierMode, CheckpointProtocol, SourcePosition, TaskAck, TaskFigures,
    TaskId,
};
use crate::cluster::registry::WorkerHandle;

/// Times the final checkpoint is taken before the attempt counts as failed.
const FINAL_CHECKPOINT_TRIES: u32 = 3;

/// How long a stop waits for the tasks to commit its savepoint's output.
const STOP_COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A request waiting for a checkpoint to complete.
enum Waiting {
    Savepoint(String, oneshot::Sender<Result<String, String>>),
    Stop(String, oneshot::Sender<Result<String, String>>),
    Rescale {
        parallelism: u32,
        started: Instant,
        restore_bytes_before: u64,
        reply: oneshot::Sender<Result<RescaleOutcome, String>>,
    },
}

/// A stop waiting for its savepoint's completion to reach every task.
struct Stopping {
    id: u64,
    tasks: BTreeSet<TaskId>,
    deadline: tokio::time::Instant,
    reply: oneshot::Sender<Result<String, String>>,
    path: String,
}

/// What ends the attempt, as an error so handlers can use `?`.
type Step<T = Vec<Action>> = Result<T, Outcome>;

/// A running attempt.
pub(super) struct Running<'a> {
    master: &'a mut JobMaster,
    attempt: u64,
    workers: &'a [WorkerHandle],
    tasks: &'a BTreeSet<TaskId>,
    shards: Option<&'a dyn JobStateShards>,
    protocol: Option<&'a mut CheckpointProtocol>,
    /// Final reports, by worker.
    reports: HashMap<String, pbc::Report>,
    /// User requests waiting for their checkpoint, by id.
    waiting: HashMap<u64, Waiting>,
    /// The newest checkpoint this attempt completed.
    latest: Option<CheckpointMetadata>,
    stopping: Option<Stopping>,
    /// Each worker's counts from its progress reports.
    progress: HashMap<String, (u64, u64)>,
    /// Tasks that finished their input and wait for the final checkpoint.
    finished: BTreeSet<TaskId>,
    /// The final checkpoint's id, once triggered, and how often it was.
    final_id: Option<u64>,
    final_triggers: u32,
}

impl<'a> Running<'a> {
    /// Attempt `attempt` of `master`'s job, deployed on `workers` with `tasks`.
    pub(super) fn new(
        master: &'a mut JobMaster,
        attempt: u64,
        workers: &'a [WorkerHandle],
        tasks: &'a BTreeSet<TaskId>,
        shards: Option<&'a dyn JobStateShards>,
        protocol: Option<&'a mut CheckpointProtocol>,
    ) -> Self {
        Self {
            master,
            attempt,
            workers,
            tasks,
            shards,
            protocol,
            reports: HashMap::new(),
            waiting: HashMap::new(),
            latest: None,
            stopping: None,
            progress: HashMap::new(),
            finished: BTreeSet::new(),
            final_id: None,
            final_triggers: 0,
        }
    }

    /// Runs until the attempt ends.
    pub(super) async fn run(mut self) -> Outcome {
        loop {
            let step = match self.next_step().await {
                Ok(actions) => self.execute(actions).await,
                Err(end) => Err(end),
            };
            if let Err(end) = step {
                return end;
            }
        }
    }

    /// When the protocol or a stop next needs attention without any input.
    fn deadline(&self) -> tokio::time::Instant {
        let protocol = self
            .protocol
            .as_ref()
            .and_then(|p| p.next_deadline())
            .map(|at| {
                let wait = at.saturating_sub(now_ms());
                tokio::time::Instant::now() + Duration::from_millis(wait)
            })
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        match &self.stopping {
            Some(s) => protocol.min(s.deadline),
            None => protocol,
        }
    }

    /// Waits for the next input or deadline and handles it.
    async fn next_step(&mut self) -> Step {
        let deadline = self.deadline();
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => self.on_deadline(),
            input = self.master.mailbox.recv() => match input {
                None => Err(Outcome::Failed {
                    reason: "the job's mailbox closed".into(),
                    user: false,
                }),
                Some(JobInput::Lost { worker, reason }) => {
                    if self.workers.iter().any(|w| w.id == worker) {
                        return Err(Outcome::Failed {
                            reason: format!("worker {worker} lost: {reason}"),
                            user: false,
                        });
                    }
                    Ok(Vec::new())
                }
                Some(JobInput::Worker { worker, msg }) => self.on_worker(worker, msg),
                Some(JobInput::Command(c)) => self.on_command(c).await,
            },
        }
    }

    fn on_deadline(&mut self) -> Step {
        if let Some(s) = self
            .stopping
            .take_if(|s| tokio::time::Instant::now() >= s.deadline)
        {
            tracing::warn!(job = %self.master.id, waiting = ?s.tasks,
                "tasks did not confirm the savepoint's commit in time; stopping");
            return Err(Outcome::Stopped(s.reply, s.path));
        }
        Ok(self
            .protocol
            .as_deref_mut()
            .map(|p| p.poll(now_ms()))
            .unwrap_or_default())
    }

    fn on_worker(&mut self, worker: String, msg: wm::Msg) -> Step {
        let attempt = self.attempt;
        match msg {
            wm::Msg::Report(r) if r.attempt == attempt => self.on_report(worker, r),
            wm::Msg::Ack(a) if a.attempt == attempt && a.finished => Ok(self.on_finished(a.task)),
            wm::Msg::Ack(a) if a.attempt == attempt && a.committed => {
                self.on_committed(a.checkpoint_id, a.task)?;
                Ok(Vec::new())
            }
            wm::Msg::Ack(a) if a.attempt == attempt => {
                let (Some(p), Some(t)) = (self.protocol.as_deref_mut(), a.task) else {
                    return Ok(Vec::new());
                };
                let positions = a.source_positions.into_iter().map(|s| SourcePosition {
                    split: s.split,
                    position: s.position,
                });
                Ok(p.acknowledge(
                    now_ms(),
                    TaskAck {
                        checkpoint_id: a.checkpoint_id,
                        task: TaskId::new(t.node, t.subtask),
                        shard_handles: Vec::new(),
                        source_positions: positions.collect(),
                        channel_state_handles: Vec::new(),
                        figures: TaskFigures {
                            sync: Duration::from_micros(a.sync_micros),
                            alignment: Duration::from_micros(a.alignment_micros),
                            ..TaskFigures::default()
                        },
                    },
                ))
            }
            wm::Msg::Decline(d) if d.attempt == attempt => {
                let (Some(p), Some(t)) = (self.protocol.as_deref_mut(), d.task) else {
                    return Ok(Vec::new());
                };
                let task = TaskId::new(t.node, t.subtask);
                Ok(p.decline(now_ms(), d.checkpoint_id, task, &d.reason))
            }
            // Messages of earlier attempts, heartbeats, late answers to deployment.
            _ => Ok(Vec::new()),
        }
    }

    /// A worker's report: progress, a failure, or the end of its tasks.
    fn on_report(&mut self, worker: String, r: pbc::Report) -> Step {
        if !r.error.is_empty() {
            return Err(Outcome::Failed {
                reason: format!("worker {worker}: {}", r.error),
                user: r.user_error,
            });
        }
        if r.cancelled {
            return Err(Outcome::Failed {
                reason: format!("worker {worker} cancelled the attempt"),
                user: false,
            });
        }
        if !r.r#final {
            self.progress.insert(worker, (r.records_in, r.records_out));
            let mut st = self.master.status();
            st.records_in = self.progress.values().map(|p| p.0).sum();
            st.records_out = self.progress.values().map(|p| p.1).sum();
            return Ok(Vec::new());
        }
        // A worker ends its attempt once its tasks are done: after the final checkpoint,
        // or at once when it has no tasks.
        self.reports.insert(worker, r);
        if self.reports.len() < self.workers.len() {
            return Ok(Vec::new());
        }
        {
            let reports = &self.reports;
            let mut st = self.master.status();
            st.records_in = reports.values().map(|r| r.records_in).sum();
            st.records_out = reports.values().map(|r| r.records_out).sum();
            st.late = reports.values().map(|r| r.late).sum();
            st.skipped = reports.values().map(|r| r.skipped).sum();
            st.barriers = reports.values().map(|r| r.barriers).sum();
        }
        Err(Outcome::Finished(
            std::mem::take(&mut self.reports).into_values().collect(),
        ))
    }

    /// A task finished its input; once every task has, the final checkpoint commits the
    /// last output.
    fn on_finished(&mut self, task: Option<pbc::TaskRef>) -> Vec<Action> {
        if let Some(t) = task {
            self.finished.insert(TaskId::new(t.node, t.subtask));
        }
        let Some(p) = self.protocol.as_deref_mut() else {
            return Vec::new();
        };
        if self.final_id.is_some() || self.finished.len() < self.tasks.len() {
            return Vec::new();
        }
        p.set_periodic(false);
        let mut actions = p.abort_all(now_ms(), AbortReason::JobFailover);
        actions.extend(self.trigger_final());
        actions
    }

    /// Triggers the final checkpoint (again).
    fn trigger_final(&mut self) -> Vec<Action> {
        let Some(p) = self.protocol.as_deref_mut() else {
            return Vec::new();
        };
        let triggered = p.trigger_now(now_ms());
        self.final_id = triggered.iter().find_map(|a| match a {
            Action::Trigger { id, .. } => Some(*id),
            _ => None,
        });
        self.final_triggers += 1;
        triggered
    }

    /// A task passed checkpoint `id`'s completion to its sinks; a stop waits for all.
    fn on_committed(&mut self, id: u64, task: Option<pbc::TaskRef>) -> Step<()> {
        let (Some(s), Some(t)) = (self.stopping.as_mut(), task) else {
            return Ok(());
        };
        if id < s.id {
            return Ok(());
        }
        s.tasks.remove(&TaskId::new(t.node, t.subtask));
        if s.tasks.is_empty()
            && let Some(s) = self.stopping.take()
        {
            return Err(Outcome::Stopped(s.reply, s.path));
        }
        Ok(())
    }

    async fn on_command(&mut self, c: Command) -> Step {
        const NO_CHECKPOINTS: &str =
            "the job takes no checkpoints (set `checkpoint: { interval: ... }`)";
        let Some(p) = self.protocol.as_deref_mut() else {
            match c {
                Command::Cancel { reply } => return Err(Outcome::Cancelled(Some(reply))),
                Command::Stop {
                    savepoint: None,
                    reply,
                } => return Err(Outcome::Stopped(reply, String::new())),
                Command::Savepoint { reply, .. } | Command::Stop { reply, .. } => {
                    let _ = reply.send(Err(NO_CHECKPOINTS.into()));
                }
                Command::Rescale { reply, .. } => {
                    let _ = reply.send(Err(format!(
                        "rescaling resumes from a checkpoint; {NO_CHECKPOINTS}"
                    )));
                }
            }
            return Ok(Vec::new());
        };
        let (name, waiting) = match c {
            Command::Cancel { reply } => return Err(Outcome::Cancelled(Some(reply))),
            Command::Stop {
                savepoint: None,
                reply,
            } => return Err(Outcome::Stopped(reply, String::new())),
            Command::Savepoint { name, reply } => (name.clone(), Waiting::Savepoint(name, reply)),
            Command::Stop {
                savepoint: Some(name),
                reply,
            } => (name.clone(), Waiting::Stop(name, reply)),
            Command::Rescale { parallelism, reply } => {
                let max = max_parallelism(&self.master.graph);
                if parallelism == 0 || parallelism > max {
                    let _ = reply.send(Err(format!(
                        "parallelism must be between 1 and the job's max_parallelism ({max})"
                    )));
                    return Ok(Vec::new());
                }
                let restore_bytes_before = match self.shards {
                    Some(s) => s.restore_bytes().await.unwrap_or(0),
                    None => 0,
                };
                let name = format!("rescale-{}-{}", p.next_id(), now_ms());
                let waiting = Waiting::Rescale {
                    parallelism,
                    started: Instant::now(),
                    restore_bytes_before,
                    reply,
                };
                (name, waiting)
            }
        };
        match p.trigger_savepoint(now_ms(), &name) {
            Ok(actions) => {
                if !matches!(waiting, Waiting::Savepoint(..)) {
                    // The job ends or redeploys after this one.
                    p.set_periodic(false);
                }
                self.waiting.insert(p.next_id() - 1, waiting);
                Ok(actions)
            }
            Err(e) => {
                answer_err(waiting, e.to_string());
                Ok(Vec::new())
            }
        }
    }

    /// Sends `msg` to every worker of the attempt.
    fn broadcast(&self, msg: impl Fn() -> cm::Msg) {
        for w in self.workers {
            w.send(msg());
        }
    }

    /// Carries out the protocol's actions, and those their outcomes produce.
    async fn execute(&mut self, actions: Vec<Action>) -> Step<()> {
        let attempt = self.attempt;
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Trigger { id, mode, .. } => {
                    let final_checkpoint = self.final_id == Some(id);
                    self.broadcast(|| {
                        cm::Msg::Trigger(pbc::TriggerCheckpoint {
                            attempt,
                            checkpoint_id: id,
                            unaligned: mode == BarrierMode::Unaligned,
                            final_checkpoint,
                        })
                    });
                }
                Action::Abort { id, reason } if self.final_id == Some(id) => {
                    self.master.status().checkpoints_aborted += 1;
                    if self.final_triggers >= FINAL_CHECKPOINT_TRIES {
                        return Err(Outcome::Failed {
                            reason: format!(
                                "the final checkpoint failed {} times; the last: {reason:?}",
                                self.final_triggers
                            ),
                            user: false,
                        });
                    }
                    tracing::warn!(job = %self.master.id, id, ?reason, "final checkpoint aborted; taking another");
                    queue.extend(self.trigger_final());
                }
                Action::Abort { id, reason } => {
                    tracing::info!(job = %self.master.id, id, ?reason, "checkpoint aborted");
                    self.master.status().checkpoints_aborted += 1;
                    self.broadcast(|| {
                        cm::Msg::Abort(pbc::AbortCheckpoint {
                            attempt,
                            checkpoint_id: id,
                        })
                    });
                    if let Some(wait) = self.waiting.remove(&id) {
                        answer_err(wait, format!("checkpoint {id} was aborted: {reason:?}"));
                        if let Some(p) = self.protocol.as_deref_mut() {
                            p.set_periodic(true);
                        }
                    }
                }
                Action::WriteMetadata { path, metadata } => {
                    queue.extend(self.write_metadata(&path, &metadata).await);
                }
                Action::NotifyComplete { id } => {
                    self.broadcast(|| {
                        cm::Msg::Complete(pbc::CheckpointComplete {
                            attempt,
                            checkpoint_id: id,
                        })
                    });
                }
                Action::CommitShards { id, retained } => {
                    if let Some(s) = self.shards
                        && let Err(e) = s.commit(id, &retained).await
                    {
                        // The checkpoint exists (its metadata is written): a restore
                        // finds it from the flushed deltas even without a manifest.
                        tracing::warn!(job = %self.master.id, id, "state commit failed: {e}");
                    }
                    self.checkpoint_done(id)?;
                }
                Action::Discard { id } => {
                    // Its state versions go with the shards' next commit.
                    let deleted = match store::checkpoint_path(&self.master.id, id) {
                        Ok(path) => self
                            .master
                            .store
                            .delete(&path)
                            .await
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(e) = deleted {
                        tracing::warn!(job = %self.master.id, id, "cannot delete a checkpoint retention let go: {e}");
                    }
                }
                Action::SavepointCompleted { name, path, .. } => {
                    tracing::info!(job = %self.master.id, %name, %path, "savepoint written");
                }
                Action::SavepointFailed { name, failure } => {
                    tracing::warn!(job = %self.master.id, %name, ?failure, "savepoint failed");
                }
                Action::Fenced { id } => return Err(Outcome::Fenced(id)),
            }
        }
        Ok(())
    }

    /// Writes a checkpoint's or a savepoint's `_metadata` (create if absent) and reports
    /// the outcome to the protocol.
    async fn write_metadata(&mut self, path: &str, metadata: &CheckpointMetadata) -> Vec<Action> {
        let bytes = metadata::encode(metadata);
        let outcome = self
            .master
            .store
            .create_if_absent(path, bytes)
            .await
            .map_err(|e| e.to_string());
        let Some(p) = self.protocol.as_deref_mut() else {
            return Vec::new();
        };
        if path.contains("/savepoints/") {
            let name = metadata.savepoint.clone().unwrap_or_default();
            return p.savepoint_written(&name, outcome);
        }
        if matches!(outcome, Ok(CreateOutcome::Created)) {
            self.master.record_checkpoint(metadata);
            self.latest = Some(metadata.clone());
        }
        p.metadata_written(now_ms(), metadata.checkpoint_id, outcome)
    }

    /// Checkpoint `id` is committed everywhere: answers the request waiting for it.
    fn checkpoint_done(&mut self, id: u64) -> Step<()> {
        let Some(wait) = self.waiting.remove(&id) else {
            return Ok(());
        };
        match wait {
            Waiting::Savepoint(name, r) => {
                let path = store::savepoint_path(&self.master.id, &name);
                let _ = r.send(Ok(path.unwrap_or_default()));
                Ok(())
            }
            Waiting::Stop(name, reply) => {
                // Stop once every sink has committed the savepoint's output (the
                // notification went out before the shards' commit).
                let path = store::savepoint_path(&self.master.id, &name);
                self.stopping = Some(Stopping {
                    id,
                    tasks: self.tasks.clone(),
                    deadline: tokio::time::Instant::now() + STOP_COMMIT_TIMEOUT,
                    reply,
                    path: path.unwrap_or_default(),
                });
                Ok(())
            }
            Waiting::Rescale {
                parallelism,
                started,
                restore_bytes_before,
                reply,
            } => match self.latest.clone() {
                Some(from) => Err(Outcome::Rescale {
                    parallelism,
                    from: Box::new(from),
                    started,
                    restore_bytes_before,
                    reply,
                }),
                None => {
                    let _ = reply.send(Err(format!("checkpoint {id} left no metadata")));
                    Ok(())
                }
            },
        }
    }
}

/// Answers a waiting request with an error.
fn answer_err(wait: Waiting, message: String) {
    match wait {
        Waiting::Savepoint(_, r) | Waiting::Stop(_, r) => {
            let _ = r.send(Err(message));
        }
        Waiting::Rescale { reply, .. } => {
            let _ = reply.send(Err(message));
        }
    }
}
