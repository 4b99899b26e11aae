//! What the REST API shows of a job: [`JobStatus`] and its [`CheckpointRecord`]s.
//!
//! Plain data, serialized as `docs/api/openapi.yaml` describes it. The job's driver
//! (`super::driver`) keeps it up to date as a side effect of its decisions; the job's
//! actor publishes a copy whenever it changed. Nothing here decides anything.

use crate::checkpoint::metadata::CheckpointMetadata;
use crate::job::lifecycle::JobState;

/// How many completed checkpoints a status lists.
pub const CHECKPOINT_HISTORY: usize = 100;

/// How many failures a status lists.
pub const FAILURE_HISTORY: usize = 20;

/// A failed attempt, as the job's history keeps it (and the store, as JSON at
/// `jobs/<job>/failures/<at_ms>-<attempt>`, so a new coordinator shows it too).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailureRecord {
    /// The attempt that failed.
    pub attempt: u64,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// Why.
    pub reason: String,
    /// A dependency was out of reach (not counted against the restart policy).
    pub unavailable: bool,
}

/// A completed checkpoint, as `sluice checkpoints` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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
    /// Bytes of in-flight data stored with it (unaligned checkpoints).
    pub channel_state_bytes: u64,
}

impl CheckpointRecord {
    /// The record of `m`, committed at `now` (ms since the Unix epoch).
    pub fn of(m: &CheckpointMetadata, now: u64) -> Self {
        let max_micros = |f: fn(&crate::checkpoint::TaskFigures) -> std::time::Duration| {
            m.tasks
                .iter()
                .map(|t| f(&t.figures).as_micros() as u64)
                .max()
                .unwrap_or(0)
        };
        Self {
            id: m.checkpoint_id,
            savepoint: m.savepoint.clone(),
            duration_ms: m.duration().as_millis() as u64,
            commit_ms: now.saturating_sub(m.triggered_at_ms),
            max_sync_micros: max_micros(|f| f.sync),
            max_alignment_micros: max_micros(|f| f.alignment),
            triggered_at_ms: m.triggered_at_ms,
            tasks: m.tasks.len(),
            channel_state_bytes: m.tasks.iter().map(|t| t.figures.channel_state_bytes).sum(),
        }
    }
}

/// What the REST API shows of a job.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobStatus {
    /// Its id.
    pub id: String,
    /// Its name in the job file.
    pub name: String,
    /// Where it is in its life.
    pub state: JobState,
    /// What the job waits for before it can go on ("workers with a free slot: 2 of 3"),
    /// while it is not running.
    pub waiting_for: Option<String>,
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
    /// The smallest source watermark the workers reported (ms since the epoch), once
    /// every source has one.
    pub watermark: Option<i64>,
    /// Late records the windows counted (at the end).
    pub late: u64,
    /// Malformed records skipped (at the end).
    pub skipped: u64,
    /// Checkpoint barriers that reached the sinks (at the end).
    pub barriers: u64,
    /// The newest completed checkpoint.
    pub last_checkpoint: Option<u64>,
    /// Completed checkpoints, oldest first (the last [`CHECKPOINT_HISTORY`]).
    pub checkpoints: Vec<CheckpointRecord>,
    /// Checkpoints aborted so far.
    pub checkpoints_aborted: u64,
    /// Why the job is failing, failed, or restarts (the last attempt's failure);
    /// cleared when the job finishes successfully. History is in `failures`.
    pub failure: Option<String>,
    /// Failed attempts, oldest first (the last [`FAILURE_HISTORY`]).
    pub failures: Vec<FailureRecord>,
    /// The error was in the job itself (not retried).
    pub user_error: bool,
    /// Milliseconds since the Unix epoch when it was submitted.
    pub submitted_at_ms: u64,
    /// Each task's figures from the workers' last progress reports, by task.
    pub tasks: Vec<TaskStatus>,
    /// The job's nodes, upstream first (a task is named after the first node of its
    /// chain: `window[1]`), for tools that follow back pressure downstream.
    pub nodes: Vec<String>,
    /// How long a checkpoint may take before it is aborted (absent without checkpoints).
    pub checkpoint_timeout_ms: Option<u64>,
}

/// One task's figures, as its worker last reported them (rates over about a second).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaskStatus {
    /// `node[subtask]`.
    pub task: String,
    /// The worker it runs on.
    pub worker: String,
    /// Milliseconds per second handling elements, not counting back pressure.
    pub busy_ms_per_s: u64,
    /// Milliseconds per second waiting for room downstream.
    pub backpressured_ms_per_s: u64,
    /// Milliseconds per second waiting for input.
    pub idle_ms_per_s: u64,
    /// Records it received so far.
    pub records_in: u64,
    /// Records it emitted so far.
    pub records_out: u64,
    /// Records of its keyed operators that found their state in the operator cache.
    pub cache_hits: u64,
    /// Records whose state was not in the operator cache.
    pub cache_misses: u64,
    /// Entries spilled from the operator cache to the backend.
    pub cache_spills: u64,
    /// Bytes the operator cache holds.
    pub cache_bytes: u64,
    /// A source task's split that holds its watermark (`topic/partition`); absent when
    /// none does.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub watermark_held_by: String,
    /// The newest watermark the task passed on (ms since the Unix epoch), once it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark: Option<i64>,
    /// Milliseconds per second a source task paused, ahead of its alignment group.
    pub alignment_paused_ms_per_s: u64,
    /// Bytes the task's input channels hold, received and not yet processed.
    pub in_flight_bytes: u64,
    /// The task's input throughput: bytes per second of time not spent waiting for input.
    pub input_bytes_per_s: u64,
    /// Buffer debloating: bytes each input channel may hold (0: not debloated).
    pub channel_limit_bytes: u64,
    /// The network buffer size its remote input channels ask for (0: none remote).
    pub buffer_bytes: u64,
    /// The keys a keyed task sees most, hottest first (sampled).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hot_keys: Vec<HotKey>,
}

/// A key a keyed task sees often.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HotKey {
    /// `column=value, ...`.
    pub key: String,
    /// Estimated share of the task's records, in percent (rounded).
    pub share_pct: u32,
}

impl TaskStatus {
    /// The figures `worker` reported for one task.
    pub fn from_report(worker: &str, t: &sluice_common::pb::cluster::TaskMetrics) -> Self {
        Self {
            task: t.task.clone(),
            worker: worker.to_string(),
            busy_ms_per_s: t.busy_ms_per_s,
            backpressured_ms_per_s: t.backpressured_ms_per_s,
            idle_ms_per_s: t.idle_ms_per_s,
            records_in: t.records_in,
            records_out: t.records_out,
            cache_hits: t.cache_hits,
            cache_misses: t.cache_misses,
            cache_spills: t.cache_spills,
            cache_bytes: t.cache_bytes,
            watermark_held_by: t.watermark_held_by.clone(),
            watermark: t.watermark,
            alignment_paused_ms_per_s: t.alignment_paused_ms_per_s,
            in_flight_bytes: t.in_flight_bytes,
            input_bytes_per_s: t.input_bytes_per_s,
            channel_limit_bytes: t.channel_limit_bytes,
            buffer_bytes: t.buffer_bytes,
            hot_keys: t
                .hot_keys
                .iter()
                .map(|h| HotKey {
                    key: h.key.clone(),
                    share_pct: (h.share * 100.0).round().clamp(0.0, 100.0) as u32,
                })
                .collect(),
        }
    }
}

impl JobStatus {
    /// The status of a job that was just created.
    pub fn new(id: &str, name: &str, parallelism: u32, now: u64) -> Self {
        Self {
            id: id.to_string(),
            name: name.to_string(),
            state: JobState::Created,
            waiting_for: None,
            attempt: 0,
            restarts: 0,
            workers: Vec::new(),
            parallelism,
            records_in: 0,
            records_out: 0,
            watermark: None,
            late: 0,
            skipped: 0,
            barriers: 0,
            last_checkpoint: None,
            checkpoints: Vec::new(),
            checkpoints_aborted: 0,
            failure: None,
            failures: Vec::new(),
            user_error: false,
            submitted_at_ms: now,
            tasks: Vec::new(),
            nodes: Vec::new(),
            checkpoint_timeout_ms: None,
        }
    }

    /// Records a failed attempt as the current failure and in the history (keeping
    /// the last [`FAILURE_HISTORY`]).
    pub fn record_failure(&mut self, record: FailureRecord) {
        self.failure = Some(record.reason.clone());
        self.failures.push(record);
        if self.failures.len() > FAILURE_HISTORY {
            self.failures.remove(0);
        }
    }

    /// Adds a completed checkpoint (keeping the last [`CHECKPOINT_HISTORY`]).
    pub fn record_checkpoint(&mut self, record: CheckpointRecord) {
        self.last_checkpoint = Some(record.id);
        self.checkpoints.push(record);
        if self.checkpoints.len() > CHECKPOINT_HISTORY {
            self.checkpoints.remove(0);
        }
    }
}
