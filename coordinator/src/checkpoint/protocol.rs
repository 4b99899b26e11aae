//! The checkpoint coordinator's decisions: a state machine without I/O.
//!
//! [`CheckpointProtocol`] is fed what happens (time passing, acknowledgements, declines,
//! the outcome of metadata writes) and answers with [`Action`]s that a driver executes:
//! inject a barrier, write a `_metadata` object with create-if-absent, notify tasks,
//! commit the state shards, abort. Time is a number of milliseconds supplied by the
//! driver (wall clock, so it can also stamp the metadata); nothing here reads a clock,
//! sleeps or touches the network, so tests drive every interleaving directly.
//!
//! ## A checkpoint's life
//!
//! 1. **Trigger** ([`CheckpointProtocol::poll`]): when the interval has passed since the
//!    last trigger, the minimum pause since the last checkpoint ended, and fewer than
//!    `max_concurrent` checkpoints are in flight: [`Action::Trigger`]. Savepoints are
//!    triggered on request ([`CheckpointProtocol::trigger_savepoint`]) regardless of the
//!    interval. Ids only grow and are never reused, not even after an abort.
//! 2. **Collect**: acknowledgements from the known set of tasks. A duplicate ack (the
//!    first one counts), an ack for a checkpoint that is no longer pending (late), or
//!    from a task outside the set is ignored. A decline, an ack naming a shard outside
//!    the job's layout, or the timeout aborts the checkpoint ([`Action::Abort`]).
//! 3. **Commit**: with every ack in, [`Action::WriteMetadata`] at
//!    `jobs/<job>/checkpoints/<id>/_metadata`. The timeout no longer applies: whether the
//!    write happened is for the store to say, not for a timer to guess.
//! 4. **Outcome** ([`CheckpointProtocol::metadata_written`]):
//!    - created: the checkpoint exists. [`Action::NotifyComplete`] (sinks commit),
//!      [`Action::CommitShards`] with the retained ids (the state service may collect
//!      older versions), [`Action::Discard`] for checkpoints retention let go, and for a
//!      savepoint a second [`Action::WriteMetadata`] at `jobs/<job>/savepoints/<name>/`.
//!    - already exists: another coordinator committed this id: this one is
//!      [`Action::Fenced`], aborts what it has in flight and triggers nothing more.
//!    - failed: the checkpoint is aborted (its id is burnt: a write that landed late is
//!      a valid checkpoint nobody was told about, which is safe, see `store`).
//!
//! ## Retention
//!
//! The newest `retained` completed checkpoints are kept (a savepoint among them counts),
//! and every savepoint whose named copy was written or is being written; the others are
//! discarded once a newer checkpoint commits. Only a
//! committed checkpoint can push an older one out, so a run of aborts never leaves the
//! job without a checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;

use super::ack::{ShardRange, TaskAck, TaskId};
use super::metadata::{CheckpointMetadata, ShardState, TaskCheckpoint};
use super::store::{
    CreateOutcome, channel_state_path, checkpoint_path, savepoint_path, validate_name,
};
use crate::error::{Error, Result};

/// How checkpoints are triggered and kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Time between triggers.
    pub interval: Duration,
    /// Time between the end of one checkpoint and the next trigger.
    pub min_pause: Duration,
    /// A checkpoint not fully acknowledged after this long is aborted.
    pub timeout: Duration,
    /// Checkpoints in flight at once (collecting or committing). At least 1.
    pub max_concurrent: usize,
    /// Newest completed checkpoints kept (savepoints are kept in addition). At least 1.
    pub retained: usize,
    /// Barrier alignment.
    pub mode: BarrierMode,
}

impl Default for CheckpointConfig {
    /// Every 10 s, no pause, 10 min timeout, one in flight, keep 3, aligned.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            min_pause: Duration::ZERO,
            timeout: Duration::from_secs(600),
            max_concurrent: 1,
            retained: 3,
            mode: BarrierMode::Aligned,
        }
    }
}

/// Whether barriers wait for alignment (a job setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierMode {
    /// A channel that delivered barrier N is blocked until every channel has.
    Aligned,
    /// Barriers overtake buffered data, which is persisted as channel state.
    Unaligned,
}

/// What the protocol knows about the job it checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// The job's id (a path segment, see `store::validate_name`).
    pub job_id: String,
    /// This coordinator incarnation (unique per process start).
    pub coordinator_id: String,
    /// The encoded `JobGraph`.
    pub job_graph: Bytes,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Parallelism per node.
    pub parallelism: BTreeMap<u32, u32>,
    /// The job's state shards (empty without remote state).
    pub shards: Vec<ShardRange>,
    /// The state node of each shard (`http://host:port`), recorded in every checkpoint
    /// so that a restore finds the shards where they were.
    pub placement: BTreeMap<ShardRange, String>,
    /// Every task that must acknowledge.
    pub tasks: BTreeSet<TaskId>,
}

/// Records the job's sources had read at the checkpoint the attempt restored: a
/// checkpoint's count is this plus what its source tasks read in the attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordsBefore(pub u64);

/// A checkpoint or a named savepoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointKind {
    /// Periodic; subject to retention.
    Checkpoint,
    /// Requested by the user; kept.
    Savepoint {
        /// Its name (a path segment).
        name: String,
    },
}

impl CheckpointKind {
    fn savepoint_name(&self) -> Option<&str> {
        match self {
            CheckpointKind::Checkpoint => None,
            CheckpointKind::Savepoint { name } => Some(name),
        }
    }
}

/// Why a checkpoint was aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// Not every task acknowledged in time.
    Timeout,
    /// A task declined (it could not take its snapshot).
    Declined {
        /// Who declined.
        task: TaskId,
        /// What it said.
        reason: String,
    },
    /// A task acknowledged with a handle for a shard the job does not have (a bug).
    InvalidAck {
        /// Who sent it.
        task: TaskId,
        /// What is wrong.
        reason: String,
    },
    /// The `_metadata` write failed.
    MetadataWriteFailed(String),
    /// The job is failing over, or this coordinator was fenced.
    JobFailover,
    /// Every task reached the end of its input: the final checkpoint takes its place.
    InputEnded,
    /// The job is being rescaled: its tasks are replaced.
    Rescale,
    /// The job was cancelled.
    Cancelled,
    /// Another coordinator committed a checkpoint with this id.
    Fenced,
}

/// Why a savepoint request was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SavepointFailure {
    /// The checkpoint behind it was aborted.
    Aborted(AbortReason),
    /// Its checkpoint committed, but a savepoint of that name already exists; the
    /// checkpoint is a regular one.
    NameTaken,
    /// Its checkpoint committed, but writing the named copy failed; the checkpoint is a
    /// regular one.
    CopyFailed(String),
}

/// An effect for the driver to carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Tell the sources to record their positions and emit barrier `id`.
    Trigger {
        /// The checkpoint id.
        id: u64,
        /// Checkpoint or savepoint.
        kind: CheckpointKind,
        /// Alignment.
        mode: BarrierMode,
    },
    /// Tell the tasks checkpoint `id` is abandoned (they discard what they prepared).
    Abort {
        /// The checkpoint id.
        id: u64,
        /// Why.
        reason: AbortReason,
    },
    /// `create_if_absent(path, encode(metadata))`, then report the outcome with
    /// [`CheckpointProtocol::metadata_written`] (checkpoint paths) or
    /// [`CheckpointProtocol::savepoint_written`] (savepoint paths).
    WriteMetadata {
        /// Object path below the store's root.
        path: String,
        /// What to write.
        metadata: Box<CheckpointMetadata>,
    },
    /// Checkpoint `id` is committed: tasks may make its side effects visible.
    NotifyComplete {
        /// The checkpoint id.
        id: u64,
    },
    /// Tell every state shard `Commit(id, retained)`.
    CommitShards {
        /// The checkpoint id.
        id: u64,
        /// Checkpoints to keep, `id` included, ascending.
        retained: Vec<u64>,
    },
    /// Checkpoint `id` is no longer retained; its metadata may be deleted.
    Discard {
        /// The checkpoint id.
        id: u64,
    },
    /// The savepoint is written under its name.
    SavepointCompleted {
        /// Its checkpoint id.
        id: u64,
        /// Its name.
        name: String,
        /// Its `_metadata` path.
        path: String,
    },
    /// The savepoint failed.
    SavepointFailed {
        /// Its name.
        name: String,
        /// Why.
        failure: SavepointFailure,
    },
    /// Another coordinator committed checkpoint `id`: step down.
    Fenced {
        /// The checkpoint id it committed.
        id: u64,
    },
}

/// A checkpoint collecting acknowledgements.
#[derive(Debug)]
struct Pending {
    kind: CheckpointKind,
    triggered_at: u64,
    deadline: u64,
    waiting: BTreeSet<TaskId>,
    acks: BTreeMap<TaskId, TaskAck>,
}

/// A completed checkpoint as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Completed {
    id: u64,
    /// A savepoint whose named copy is written or being written.
    kept: bool,
}

/// The checkpoint coordinator of one job: see the module docs.
#[derive(Debug)]
pub struct CheckpointProtocol {
    config: CheckpointConfig,
    job: JobInfo,
    next_id: u64,
    pending: BTreeMap<u64, Pending>,
    /// Metadata written, outcome not known yet.
    committing: BTreeMap<u64, Box<CheckpointMetadata>>,
    /// Savepoint copies being written, by name.
    copying: BTreeMap<String, u64>,
    completed: Vec<Completed>,
    last_trigger_at: u64,
    last_end_at: Option<u64>,
    periodic: bool,
    fenced: bool,
    records_before: RecordsBefore,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl CheckpointProtocol {
    /// A protocol for `job` started at `now`, whose first checkpoint gets id `first_id`
    /// (one more than the newest id in the store when resuming, 1 for a new job). The
    /// first periodic trigger comes one interval after `now`.
    pub fn new(config: CheckpointConfig, job: JobInfo, first_id: u64, now: u64) -> Result<Self> {
        validate_name("job id", &job.job_id)?;
        Ok(Self {
            config: CheckpointConfig {
                max_concurrent: config.max_concurrent.max(1),
                retained: config.retained.max(1),
                ..config
            },
            job,
            next_id: first_id.max(1),
            pending: BTreeMap::new(),
            committing: BTreeMap::new(),
            copying: BTreeMap::new(),
            completed: Vec::new(),
            last_trigger_at: now,
            last_end_at: None,
            periodic: true,
            fenced: false,
            records_before: RecordsBefore::default(),
        })
    }

    /// Where the job's shards are from now on (an attempt connected to its state).
    pub fn set_placement(&mut self, placement: BTreeMap<ShardRange, String>) {
        self.job.placement = placement;
    }

    /// Records a checkpoint committed before this protocol started (found in the
    /// store), so retention and `CommitShards` account for it.
    pub fn record_existing(&mut self, id: u64, kept: bool) {
        if !self.completed.iter().any(|c| c.id == id) {
            self.completed.push(Completed { id, kept });
            self.completed.sort_by_key(|c| c.id);
        }
        self.next_id = self.next_id.max(id + 1);
    }

    /// The id the next trigger will use.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Whether another coordinator committed one of this one's checkpoint ids.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Ids collecting acknowledgements or being committed, ascending.
    pub fn in_flight(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .pending
            .keys()
            .chain(self.committing.keys())
            .copied()
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Completed checkpoints currently retained, ascending.
    pub fn retained(&self) -> Vec<u64> {
        self.completed.iter().map(|c| c.id).collect()
    }

    /// Tasks of checkpoint `id` that have not acknowledged yet.
    pub fn waiting_for(&self, id: u64) -> Option<Vec<TaskId>> {
        self.pending
            .get(&id)
            .map(|p| p.waiting.iter().copied().collect())
    }

    /// Stops or resumes periodic triggers (a job that is failing or rescaling).
    pub fn set_periodic(&mut self, on: bool) {
        self.periodic = on;
    }

    /// The tasks that must acknowledge future checkpoints (after a redeploy or rescale).
    /// Checkpoints in flight are aborted: their barriers went to the old tasks.
    pub fn set_tasks(&mut self, now: u64, tasks: BTreeSet<TaskId>) -> Vec<Action> {
        self.job.tasks = tasks;
        self.abort_all(now, AbortReason::JobFailover)
    }

    /// The graph future checkpoints record (a rescale changed its parallelism), so a
    /// coordinator that resumes from one of them runs the job as it was then.
    pub fn set_job_graph(&mut self, job_graph: Bytes, parallelism: BTreeMap<u32, u32>) {
        self.job.job_graph = job_graph;
        self.job.parallelism = parallelism;
    }

    /// Aborts every checkpoint still collecting acknowledgements (a task failed).
    /// Checkpoints being committed are left to their write's outcome.
    pub fn abort_all(&mut self, now: u64, reason: AbortReason) -> Vec<Action> {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        let mut actions = Vec::new();
        for id in ids {
            self.abort(now, id, reason.clone(), &mut actions);
        }
        actions
    }

    /// When the driver should call [`poll`](Self::poll) next, if nothing else happens.
    pub fn next_deadline(&self) -> Option<u64> {
        let timeout = self.pending.values().map(|p| p.deadline).min();
        let trigger = self.may_trigger_periodic().then(|| self.periodic_due());
        timeout.into_iter().chain(trigger).min()
    }

    fn may_trigger_periodic(&self) -> bool {
        self.periodic && !self.fenced && self.in_flight_count() < self.config.max_concurrent
    }

    fn in_flight_count(&self) -> usize {
        self.pending.len() + self.committing.len()
    }

    fn periodic_due(&self) -> u64 {
        let by_interval = self
            .last_trigger_at
            .saturating_add(ms(self.config.interval));
        let by_pause = self
            .last_end_at
            .map_or(0, |end| end.saturating_add(ms(self.config.min_pause)));
        by_interval.max(by_pause)
    }

    /// Time passed: aborts timed-out checkpoints and triggers a periodic one when due.
    pub fn poll(&mut self, now: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.abort(now, id, AbortReason::Timeout, &mut actions);
        }
        if self.may_trigger_periodic() && now >= self.periodic_due() {
            self.trigger(now, CheckpointKind::Checkpoint, &mut actions);
        }
        actions
    }

    /// Triggers a checkpoint now, whatever the interval and in-flight limit (the job's
    /// final checkpoint, once every task finished its input).
    pub fn trigger_now(&mut self, now: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        if !self.fenced {
            self.trigger(now, CheckpointKind::Checkpoint, &mut actions);
        }
        actions
    }

    /// Triggers savepoint `name` now, whatever the interval and in-flight limit.
    pub fn trigger_savepoint(&mut self, now: u64, name: &str) -> Result<Vec<Action>> {
        validate_name("savepoint name", name)?;
        if self.fenced {
            return Err(Error::Config(
                "this coordinator was fenced by another one; it takes no savepoints".into(),
            ));
        }
        let busy = self.copying.contains_key(name)
            || self
                .pending
                .values()
                .any(|p| p.kind.savepoint_name() == Some(name))
            || self
                .committing
                .values()
                .any(|m| m.savepoint.as_deref() == Some(name));
        if busy {
            return Err(Error::InvalidName {
                what: "savepoint name",
                value: name.to_string(),
                reason: "a savepoint of that name is already being taken",
            });
        }
        let mut actions = Vec::new();
        self.trigger(
            now,
            CheckpointKind::Savepoint {
                name: name.to_string(),
            },
            &mut actions,
        );
        Ok(actions)
    }

    fn trigger(&mut self, now: u64, kind: CheckpointKind, actions: &mut Vec<Action>) {
        let id = self.next_id;
        self.next_id += 1;
        if kind == CheckpointKind::Checkpoint {
            self.last_trigger_at = now;
        }
        self.pending.insert(
            id,
            Pending {
                kind: kind.clone(),
                triggered_at: now,
                deadline: now.saturating_add(ms(self.config.timeout)),
                waiting: self.job.tasks.clone(),
                acks: BTreeMap::new(),
            },
        );
        tracing::debug!(id, ?kind, "checkpoint triggered");
        // A savepoint is aligned whatever the job's mode, as in Flink: it holds no
        // in-flight data, so it outlives the checkpoints and restores into any job.
        let mode = match kind {
            CheckpointKind::Checkpoint => self.config.mode,
            _ => BarrierMode::Aligned,
        };
        actions.push(Action::Trigger { id, kind, mode });
        // A job without tasks has nothing to wait for.
        self.maybe_complete(now, id, actions);
    }

    /// A task acknowledged a checkpoint.
    pub fn acknowledge(&mut self, now: u64, ack: TaskAck) -> Vec<Action> {
        let mut actions = Vec::new();
        let id = ack.checkpoint_id;
        let Some(pending) = self.pending.get_mut(&id) else {
            tracing::debug!(id, task = %ack.task, "ack for a checkpoint not pending: ignored");
            return actions;
        };
        if !self.job.tasks.contains(&ack.task) {
            tracing::warn!(id, task = %ack.task, "ack from a task the job does not have: ignored");
            return actions;
        }
        if !pending.waiting.remove(&ack.task) {
            tracing::debug!(id, task = %ack.task, "duplicate ack: ignored");
            return actions;
        }
        if let Some(h) = ack
            .shard_handles
            .iter()
            .find(|h| !self.job.shards.contains(&h.shard))
        {
            let reason = AbortReason::InvalidAck {
                task: ack.task,
                reason: format!(
                    "handle for shard [{}, {}), which the job does not have",
                    h.shard.start, h.shard.end
                ),
            };
            self.abort(now, id, reason, &mut actions);
            return actions;
        }
        pending.acks.insert(ack.task, ack);
        self.maybe_complete(now, id, &mut actions);
        actions
    }

    /// A task could not take its part of checkpoint `id`.
    pub fn decline(&mut self, now: u64, id: u64, task: TaskId, reason: &str) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.pending.contains_key(&id) {
            let reason = AbortReason::Declined {
                task,
                reason: reason.to_string(),
            };
            self.abort(now, id, reason, &mut actions);
        }
        actions
    }

    fn abort(&mut self, now: u64, id: u64, reason: AbortReason, actions: &mut Vec<Action>) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        self.last_end_at = Some(now);
        actions.push(Action::Abort {
            id,
            reason: reason.clone(),
        });
        if let CheckpointKind::Savepoint { name } = p.kind {
            actions.push(Action::SavepointFailed {
                name,
                failure: SavepointFailure::Aborted(reason),
            });
        }
    }

    fn maybe_complete(&mut self, now: u64, id: u64, actions: &mut Vec<Action>) {
        if !self.pending.get(&id).is_some_and(|p| p.waiting.is_empty()) {
            return;
        }
        let p = self.pending.remove(&id).expect("checked above");
        tracing::debug!(
            id,
            after_ms = now.saturating_sub(p.triggered_at),
            "every task acknowledged: writing the metadata"
        );
        let metadata = Box::new(self.metadata(id, now, p));
        let path = checkpoint_path(&self.job.job_id, id).expect("job id validated in new");
        self.committing.insert(id, metadata.clone());
        actions.push(Action::WriteMetadata { path, metadata });
    }

    fn metadata(&self, id: u64, now: u64, p: Pending) -> CheckpointMetadata {
        let mut shards: BTreeMap<ShardRange, Vec<String>> = self
            .job
            .shards
            .iter()
            .chain(self.job.placement.keys())
            .map(|&r| (r, Vec::new()))
            .collect();
        let mut tasks = Vec::with_capacity(p.acks.len());
        for (task, ack) in p.acks {
            for h in ack.shard_handles {
                shards.entry(h.shard).or_default().push(h.handle);
            }
            let mut handles = ack.channel_state_handles;
            let mut figures = ack.figures;
            if let Some(object) = &ack.channel_state {
                handles.push(channel_state_path(&self.job.job_id, id, task));
                figures.bytes += object.len() as u64;
                figures.channel_state_bytes = object.len() as u64;
            }
            tasks.push(TaskCheckpoint {
                task,
                source_positions: ack.source_positions,
                channel_state_handles: handles,
                channel_state: ack.channel_state,
                figures,
            });
        }
        let savepoint = p.kind.savepoint_name().map(str::to_string);
        let records_in =
            self.records_before.0 + tasks.iter().map(|t| t.figures.records).sum::<u64>();
        CheckpointMetadata {
            job_id: self.job.job_id.clone(),
            checkpoint_id: id,
            triggered_at_ms: p.triggered_at,
            completed_at_ms: now,
            coordinator_id: self.job.coordinator_id.clone(),
            kept: savepoint.is_some(),
            savepoint,
            job_graph: self.job.job_graph.clone(),
            max_parallelism: self.job.max_parallelism,
            parallelism: self.job.parallelism.clone(),
            shards: shards
                .into_iter()
                .map(|(range, handles)| ShardState {
                    node: self.job.placement.get(&range).cloned().unwrap_or_default(),
                    range,
                    handles,
                })
                .collect(),
            tasks,
            records_in,
        }
    }

    /// The count of records the attempt's checkpoints start from (that of the
    /// checkpoint it restored).
    pub fn set_records_before(&mut self, before: RecordsBefore) {
        self.records_before = before;
    }

    /// The outcome of writing checkpoint `id`'s `_metadata` (`Err` carries the store's
    /// error message).
    pub fn metadata_written(
        &mut self,
        now: u64,
        id: u64,
        outcome: Result<CreateOutcome, String>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(metadata) = self.committing.remove(&id) else {
            tracing::warn!(
                id,
                "outcome of a metadata write that was not asked for: ignored"
            );
            return actions;
        };
        match outcome {
            Ok(CreateOutcome::Created) => {
                tracing::debug!(
                    id,
                    after_ms = now.saturating_sub(metadata.triggered_at_ms),
                    "checkpoint complete"
                );
                self.last_end_at = Some(now);
                let kept = metadata.savepoint.is_some();
                self.completed.push(Completed { id, kept });
                self.completed.sort_by_key(|c| c.id);
                actions.push(Action::NotifyComplete { id });
                if let Some(name) = metadata.savepoint.clone() {
                    let path = savepoint_path(&self.job.job_id, &name).expect("validated");
                    self.copying.insert(name, id);
                    actions.push(Action::WriteMetadata { path, metadata });
                }
                self.apply_retention(&mut actions);
                actions.push(Action::CommitShards {
                    id,
                    retained: self.retained(),
                });
            }
            Ok(CreateOutcome::AlreadyExists) => {
                tracing::warn!(id, "another coordinator committed this checkpoint: fenced");
                self.fenced = true;
                self.last_end_at = Some(now);
                actions.push(Action::Abort {
                    id,
                    reason: AbortReason::Fenced,
                });
                if let Some(name) = metadata.savepoint {
                    actions.push(Action::SavepointFailed {
                        name,
                        failure: SavepointFailure::Aborted(AbortReason::Fenced),
                    });
                }
                actions.extend(self.abort_all(now, AbortReason::Fenced));
                actions.push(Action::Fenced { id });
            }
            Err(e) => {
                self.last_end_at = Some(now);
                let reason = AbortReason::MetadataWriteFailed(e);
                actions.push(Action::Abort {
                    id,
                    reason: reason.clone(),
                });
                if let Some(name) = metadata.savepoint {
                    actions.push(Action::SavepointFailed {
                        name,
                        failure: SavepointFailure::Aborted(reason),
                    });
                }
            }
        }
        actions
    }

    /// The outcome of writing savepoint `name`'s named copy.
    pub fn savepoint_written(
        &mut self,
        name: &str,
        outcome: Result<CreateOutcome, String>,
    ) -> Vec<Action> {
        let Some(id) = self.copying.remove(name) else {
            return Vec::new();
        };
        let failure = match outcome {
            Ok(CreateOutcome::Created) => {
                let path = savepoint_path(&self.job.job_id, name).expect("validated");
                return vec![Action::SavepointCompleted {
                    id,
                    name: name.to_string(),
                    path,
                }];
            }
            Ok(CreateOutcome::AlreadyExists) => SavepointFailure::NameTaken,
            Err(e) => SavepointFailure::CopyFailed(e),
        };
        // Not a savepoint after all: retention treats it as a regular checkpoint from the
        // next commit on.
        if let Some(c) = self.completed.iter_mut().find(|c| c.id == id) {
            c.kept = false;
        }
        vec![Action::SavepointFailed {
            name: name.to_string(),
            failure,
        }]
    }

    fn apply_retention(&mut self, actions: &mut Vec<Action>) {
        let regular: Vec<u64> = self
            .completed
            .iter()
            .filter(|c| !c.kept)
            .map(|c| c.id)
            .collect();
        // The newest `retained` completed checkpoints are kept, savepoints included in
        // "newest" so the latest state is always retained.
        let newest: BTreeSet<u64> = self
            .completed
            .iter()
            .rev()
            .take(self.config.retained)
            .map(|c| c.id)
            .collect();
        let drop: BTreeSet<u64> = regular
            .into_iter()
            .filter(|id| !newest.contains(id))
            .collect();
        self.completed.retain(|c| !drop.contains(&c.id));
        actions.extend(drop.into_iter().map(|id| Action::Discard { id }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::ack::{ShardHandle, SourcePosition};

    const T0: u64 = 1_000_000;

    fn config() -> CheckpointConfig {
        CheckpointConfig {
            interval: Duration::from_millis(100),
            min_pause: Duration::from_millis(30),
            timeout: Duration::from_millis(500),
            max_concurrent: 1,
            retained: 2,
            mode: BarrierMode::Aligned,
        }
    }

    fn tasks() -> Vec<TaskId> {
        vec![TaskId::new(1, 0), TaskId::new(1, 1), TaskId::new(2, 0)]
    }

    fn job() -> JobInfo {
        JobInfo {
            job_id: "q5".into(),
            coordinator_id: "coord-a".into(),
            job_graph: Bytes::from_static(b"graph"),
            max_parallelism: 128,
            parallelism: BTreeMap::from([(1, 2), (2, 1)]),
            shards: vec![
                ShardRange { start: 0, end: 64 },
                ShardRange {
                    start: 64,
                    end: 128,
                },
            ],
            placement: BTreeMap::from([(
                ShardRange { start: 0, end: 64 },
                "http://127.0.0.1:7071".to_owned(),
            )]),
            tasks: tasks().into_iter().collect(),
        }
    }

    fn protocol(config: CheckpointConfig) -> CheckpointProtocol {
        CheckpointProtocol::new(config, job(), 1, T0).unwrap()
    }

    fn ack(id: u64, task: TaskId) -> TaskAck {
        TaskAck {
            shard_handles: vec![ShardHandle {
                shard: ShardRange { start: 0, end: 64 },
                handle: format!("h-{id}-{task}"),
            }],
            source_positions: vec![SourcePosition {
                split: format!("split-{task}"),
                position: Bytes::from(id.to_be_bytes().to_vec()),
            }],
            ..TaskAck::empty(id, task)
        }
    }

    /// Acks `id` from every task; returns the actions of the last ack.
    fn ack_all(p: &mut CheckpointProtocol, now: u64, id: u64) -> Vec<Action> {
        let mut last = Vec::new();
        for t in tasks() {
            last = p.acknowledge(now, ack(id, t));
        }
        last
    }

    fn triggered(actions: &[Action]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Trigger { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    }

    fn write_of(actions: &[Action]) -> (String, CheckpointMetadata) {
        actions
            .iter()
            .find_map(|a| match a {
                Action::WriteMetadata { path, metadata } => {
                    Some((path.clone(), (**metadata).clone()))
                }
                _ => None,
            })
            .expect("a metadata write")
    }

    /// Triggers the next periodic checkpoint (polling at its due time) and returns (id, now).
    fn next_checkpoint(p: &mut CheckpointProtocol) -> (u64, u64) {
        let now = p.next_deadline().expect("a deadline");
        let ids = triggered(&p.poll(now));
        assert_eq!(ids.len(), 1, "one trigger at {now}");
        (ids[0], now)
    }

    /// Runs a whole checkpoint: trigger, every ack, created.
    fn complete_one(p: &mut CheckpointProtocol) -> (u64, Vec<Action>) {
        let (id, now) = next_checkpoint(p);
        let acts = ack_all(p, now + 10, id);
        write_of(&acts);
        (
            id,
            p.metadata_written(now + 20, id, Ok(CreateOutcome::Created)),
        )
    }

    #[test]
    fn trigger_ack_commit_notify_in_order() {
        let mut p = protocol(config());
        assert!(p.poll(T0 + 99).is_empty(), "not before one interval");
        let acts = p.poll(T0 + 100);
        assert_eq!(
            acts,
            vec![Action::Trigger {
                id: 1,
                kind: CheckpointKind::Checkpoint,
                mode: BarrierMode::Aligned
            }]
        );
        assert!(
            p.acknowledge(T0 + 110, ack(1, TaskId::new(1, 0)))
                .is_empty()
        );
        assert!(
            p.acknowledge(T0 + 120, ack(1, TaskId::new(2, 0)))
                .is_empty()
        );
        assert_eq!(p.waiting_for(1), Some(vec![TaskId::new(1, 1)]));
        // No notification, no commit before the metadata is written.
        let acts = p.acknowledge(T0 + 150, ack(1, TaskId::new(1, 1)));
        assert_eq!(acts.len(), 1);
        let (path, meta) = write_of(&acts);
        assert_eq!(path, "jobs/q5/checkpoints/00000000000000000001/_metadata");
        assert_eq!(meta.checkpoint_id, 1);
        assert_eq!(meta.triggered_at_ms, T0 + 100);
        assert_eq!(meta.completed_at_ms, T0 + 150);
        assert_eq!(meta.duration(), Duration::from_millis(50));
        assert_eq!(meta.tasks.len(), 3);
        assert_eq!(meta.shards.len(), 2);
        assert_eq!(meta.shards[0].handles.len(), 3);
        assert!(meta.shards[1].handles.is_empty());
        assert_eq!(
            meta.shards[0].node, "http://127.0.0.1:7071",
            "the placement"
        );
        assert_eq!(meta.shards[1].node, "", "a shard placed nowhere says so");
        assert_eq!(meta.job_graph, Bytes::from_static(b"graph"));
        assert_eq!(p.in_flight(), vec![1]);
        // Still committing: nothing else is triggered (one in flight).
        assert!(p.poll(T0 + 400).is_empty());
        let acts = p.metadata_written(T0 + 160, 1, Ok(CreateOutcome::Created));
        assert_eq!(
            acts,
            vec![
                Action::NotifyComplete { id: 1 },
                Action::CommitShards {
                    id: 1,
                    retained: vec![1]
                }
            ]
        );
        assert!(p.in_flight().is_empty());
        assert_eq!(p.retained(), vec![1]);
    }

    #[test]
    fn interval_and_minimum_pause_both_hold() {
        let mut p = protocol(config());
        let (id, now) = next_checkpoint(&mut p);
        ack_all(&mut p, now, id);
        // Ended 95 ms after the trigger: the interval allows T0+200, the pause T0+225.
        p.metadata_written(now + 95, id, Ok(CreateOutcome::Created));
        assert_eq!(p.next_deadline(), Some(now + 125));
        assert!(p.poll(now + 124).is_empty());
        assert_eq!(triggered(&p.poll(now + 125)), vec![2]);
    }

    #[test]
    fn timeout_aborts_and_the_next_id_is_fresh() {
        let mut p = protocol(config());
        let (id, now) = next_checkpoint(&mut p);
        p.acknowledge(now, ack(id, TaskId::new(1, 0)));
        assert_eq!(p.next_deadline(), Some(now + 500));
        assert!(p.poll(now + 499).is_empty());
        let acts = p.poll(now + 500);
        // The interval is long past, but the abort ended a checkpoint: 30 ms pause.
        assert_eq!(
            acts,
            vec![Action::Abort {
                id,
                reason: AbortReason::Timeout
            }]
        );
        assert!(p.poll(now + 529).is_empty());
        assert_eq!(triggered(&p.poll(now + 530)), vec![id + 1]);
        // Acks of the aborted checkpoint are late: ignored.
        for t in tasks() {
            assert!(p.acknowledge(now + 531, ack(id, t)).is_empty());
        }
        assert_eq!(p.waiting_for(id + 1).unwrap().len(), 3);
    }

    #[test]
    fn duplicate_unknown_and_future_acks_are_ignored() {
        let mut p = protocol(config());
        let (id, now) = next_checkpoint(&mut p);
        assert!(p.acknowledge(now, ack(id, TaskId::new(1, 0))).is_empty());
        assert!(p.acknowledge(now, ack(id, TaskId::new(1, 0))).is_empty());
        assert!(p.acknowledge(now, ack(id, TaskId::new(9, 0))).is_empty());
        assert!(
            p.acknowledge(now, ack(id + 5, TaskId::new(1, 1)))
                .is_empty()
        );
        assert_eq!(p.waiting_for(id).unwrap().len(), 2);
        p.acknowledge(now, ack(id, TaskId::new(1, 1)));
        let acts = p.acknowledge(now, ack(id, TaskId::new(2, 0)));
        let (_, meta) = write_of(&acts);
        // The first of the duplicate acks counted, once.
        assert_eq!(meta.tasks.len(), 3);
        // Acks after completion (while committing) are ignored too.
        assert!(p.acknowledge(now, ack(id, TaskId::new(2, 0))).is_empty());
        assert!(
            p.metadata_written(now, id + 7, Ok(CreateOutcome::Created))
                .is_empty()
        );
    }

    #[test]
    fn decline_and_invalid_shard_abort() {
        let mut p = protocol(config());
        let (id, now) = next_checkpoint(&mut p);
        let acts = p.decline(now + 1, id, TaskId::new(2, 0), "disk full");
        assert_eq!(
            acts,
            vec![Action::Abort {
                id,
                reason: AbortReason::Declined {
                    task: TaskId::new(2, 0),
                    reason: "disk full".into()
                }
            }]
        );
        assert!(
            p.decline(now + 2, id, TaskId::new(2, 0), "again")
                .is_empty()
        );
        let (id2, now) = next_checkpoint(&mut p);
        let mut bad = ack(id2, TaskId::new(1, 0));
        bad.shard_handles[0].shard = ShardRange { start: 0, end: 32 };
        let acts = p.acknowledge(now, bad);
        assert!(matches!(
            acts.as_slice(),
            [Action::Abort { id, reason: AbortReason::InvalidAck { .. } }] if *id == id2
        ));
        assert!(p.in_flight().is_empty());
    }

    #[test]
    fn at_most_two_in_flight() {
        let mut p = protocol(CheckpointConfig {
            max_concurrent: 2,
            min_pause: Duration::ZERO,
            ..config()
        });
        assert_eq!(triggered(&p.poll(T0 + 100)), vec![1]);
        assert_eq!(triggered(&p.poll(T0 + 200)), vec![2]);
        assert!(p.poll(T0 + 300).is_empty(), "two in flight");
        assert!(p.poll(T0 + 450).is_empty());
        assert_eq!(
            p.next_deadline(),
            Some(T0 + 600),
            "only the timeout of 1 is due"
        );
        // Checkpoint 2 completes before 1: it is committed first (ids need not commit in
        // order); 1 is still in flight.
        let acts = ack_all(&mut p, T0 + 460, 2);
        write_of(&acts);
        assert!(p.poll(T0 + 470).is_empty(), "2 still committing");
        p.metadata_written(T0 + 480, 2, Ok(CreateOutcome::Created));
        assert_eq!(triggered(&p.poll(T0 + 480)), vec![3]);
        assert_eq!(p.in_flight(), vec![1, 3]);
        // 1 times out; 3 continues.
        let acts = p.poll(T0 + 600);
        assert_eq!(
            acts[0],
            Action::Abort {
                id: 1,
                reason: AbortReason::Timeout
            }
        );
        assert_eq!(triggered(&acts), vec![4]);
        assert_eq!(p.in_flight(), vec![3, 4]);
    }

    #[test]
    fn retention_keeps_the_newest_and_savepoints() {
        let mut p = protocol(config());
        let (c1, _) = complete_one(&mut p);
        let (c2, acts) = complete_one(&mut p);
        assert!(!acts.iter().any(|a| matches!(a, Action::Discard { .. })));
        assert_eq!(p.retained(), vec![c1, c2]);
        // A savepoint, outside the schedule.
        let now = T0 + 10_000;
        let acts = p.trigger_savepoint(now, "pre-upgrade").unwrap();
        let sp = triggered(&acts)[0];
        let acts = ack_all(&mut p, now + 5, sp);
        let (_, meta) = write_of(&acts);
        assert_eq!(meta.savepoint.as_deref(), Some("pre-upgrade"));
        assert!(meta.kept);
        let acts = p.metadata_written(now + 6, sp, Ok(CreateOutcome::Created));
        assert_eq!(acts[0], Action::NotifyComplete { id: sp });
        let (path, _) = write_of(&acts);
        assert_eq!(path, "jobs/q5/savepoints/pre-upgrade/_metadata");
        assert!(acts.contains(&Action::Discard { id: c1 }));
        assert!(acts.contains(&Action::CommitShards {
            id: sp,
            retained: vec![c2, sp]
        }));
        assert_eq!(
            p.savepoint_written("pre-upgrade", Ok(CreateOutcome::Created)),
            vec![Action::SavepointCompleted {
                id: sp,
                name: "pre-upgrade".into(),
                path: path.clone()
            }]
        );
        // Two more checkpoints: c2 goes, the savepoint stays.
        let (c4, acts) = complete_one(&mut p);
        assert!(acts.contains(&Action::Discard { id: c2 }));
        let (c5, acts) = complete_one(&mut p);
        assert!(acts.contains(&Action::CommitShards {
            id: c5,
            retained: vec![sp, c4, c5]
        }));
        let (c6, acts) = complete_one(&mut p);
        assert!(acts.contains(&Action::Discard { id: c4 }));
        assert_eq!(p.retained(), vec![sp, c5, c6]);
    }

    #[test]
    fn a_taken_savepoint_name_leaves_a_regular_checkpoint() {
        let mut p = protocol(config());
        let acts = p.trigger_savepoint(T0, "sp").unwrap();
        let sp = triggered(&acts)[0];
        assert!(
            p.trigger_savepoint(T0, "sp").is_err(),
            "same name twice at once"
        );
        assert!(p.trigger_savepoint(T0, "a/b").is_err());
        ack_all(&mut p, T0 + 1, sp);
        p.metadata_written(T0 + 2, sp, Ok(CreateOutcome::Created));
        let acts = p.savepoint_written("sp", Ok(CreateOutcome::AlreadyExists));
        assert_eq!(
            acts,
            vec![Action::SavepointFailed {
                name: "sp".into(),
                failure: SavepointFailure::NameTaken
            }]
        );
        complete_one(&mut p);
        let (_, acts) = complete_one(&mut p);
        assert!(acts.contains(&Action::Discard { id: sp }), "{acts:?}");
    }

    #[test]
    fn a_declined_savepoint_fails_with_its_reason() {
        let mut p = protocol(config());
        let sp = triggered(&p.trigger_savepoint(T0, "sp").unwrap())[0];
        let acts = p.decline(T0 + 1, sp, TaskId::new(1, 0), "nope");
        assert!(matches!(
            &acts[1],
            Action::SavepointFailed { name, failure: SavepointFailure::Aborted(AbortReason::Declined { .. }) }
                if name == "sp"
        ));
    }

    #[test]
    fn losing_the_commit_race_fences_the_coordinator() {
        let mut p = protocol(CheckpointConfig {
            max_concurrent: 2,
            ..config()
        });
        let (id, now) = next_checkpoint(&mut p);
        ack_all(&mut p, now, id);
        let (id2, now2) = next_checkpoint(&mut p);
        assert_eq!(p.in_flight(), vec![id, id2]);
        let acts = p.metadata_written(now2, id, Ok(CreateOutcome::AlreadyExists));
        assert_eq!(
            acts,
            vec![
                Action::Abort {
                    id,
                    reason: AbortReason::Fenced
                },
                Action::Abort {
                    id: id2,
                    reason: AbortReason::Fenced
                },
                Action::Fenced { id },
            ]
        );
        assert!(p.is_fenced());
        assert!(
            !acts
                .iter()
                .any(|a| matches!(a, Action::NotifyComplete { .. }))
        );
        assert_eq!(p.next_deadline(), None);
        assert!(p.poll(now2 + 1_000_000).is_empty());
        assert!(p.trigger_savepoint(now2, "x").is_err());
        assert!(p.retained().is_empty());
    }

    #[test]
    fn a_failed_write_aborts_and_burns_the_id() {
        let mut p = protocol(config());
        let (id, now) = next_checkpoint(&mut p);
        ack_all(&mut p, now, id);
        let acts = p.metadata_written(now + 1, id, Err("connection reset".into()));
        assert_eq!(
            acts,
            vec![Action::Abort {
                id,
                reason: AbortReason::MetadataWriteFailed("connection reset".into())
            }]
        );
        let (next, _) = next_checkpoint(&mut p);
        assert_eq!(next, id + 1);
        assert!(p.retained().is_empty());
    }

    #[test]
    fn resuming_continues_after_the_stored_ids() {
        let mut p = CheckpointProtocol::new(config(), job(), 1, T0).unwrap();
        p.record_existing(41, false);
        p.record_existing(40, true);
        assert_eq!(p.next_id(), 42);
        let (id, acts) = complete_one(&mut p);
        assert_eq!(id, 42);
        assert!(acts.contains(&Action::CommitShards {
            id: 42,
            retained: vec![40, 41, 42]
        }));
        let (_, acts) = complete_one(&mut p);
        assert!(acts.contains(&Action::Discard { id: 41 }));
    }

    #[test]
    fn failover_aborts_pending_and_new_tasks_are_awaited() {
        let mut p = protocol(config());
        let (id, now) = next_checkpoint(&mut p);
        p.set_periodic(false);
        let acts = p.abort_all(now + 1, AbortReason::JobFailover);
        assert_eq!(
            acts,
            vec![Action::Abort {
                id,
                reason: AbortReason::JobFailover
            }]
        );
        assert!(p.poll(now + 10_000).is_empty(), "periodic triggers are off");
        let rescaled: BTreeSet<TaskId> = (0..4).map(|s| TaskId::new(1, s)).collect();
        assert!(p.set_tasks(now + 10_000, rescaled).is_empty());
        p.set_periodic(true);
        let (id2, now2) = next_checkpoint(&mut p);
        assert_eq!(p.waiting_for(id2).unwrap().len(), 4);
        assert!(
            p.acknowledge(now2, ack(id2, TaskId::new(2, 0))).is_empty(),
            "old task"
        );
    }

    #[test]
    fn checkpoints_after_a_rescale_record_the_new_graph() {
        let mut p = protocol(config());
        let (_, acts) = complete_one(&mut p);
        assert!(!acts.is_empty());
        p.set_job_graph(
            Bytes::from_static(b"graph at 4"),
            BTreeMap::from([(1, 4), (2, 4)]),
        );
        let (id, now) = next_checkpoint(&mut p);
        let (_, meta) = write_of(&ack_all(&mut p, now, id));
        assert_eq!(meta.job_graph, Bytes::from_static(b"graph at 4"));
        assert_eq!(meta.parallelism, BTreeMap::from([(1, 4), (2, 4)]));
    }

    #[test]
    fn a_job_without_tasks_commits_at_once() {
        let mut p = CheckpointProtocol::new(
            config(),
            JobInfo {
                tasks: BTreeSet::new(),
                ..job()
            },
            1,
            T0,
        )
        .unwrap();
        let acts = p.poll(T0 + 100);
        assert_eq!(triggered(&acts), vec![1]);
        write_of(&acts);
    }
}
