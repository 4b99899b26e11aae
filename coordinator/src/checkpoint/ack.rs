//! What a task reports when a barrier passed it: the acknowledgement of a checkpoint.
//!
//! A task is identified by the job-graph node at the head of its chain and its subtask
//! index. The handles are opaque strings minted by others (the state service's
//! `FlushResponse.handle`, a channel-state object path): the coordinator records them and
//! never looks inside.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

/// One task of a running job: the head node of its chain and its subtask index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    /// Job-graph node id of the chain's head.
    pub node: u32,
    /// Subtask index, `0..parallelism`.
    pub subtask: u32,
}

impl TaskId {
    /// Task `subtask` of `node`.
    pub fn new(node: u32, subtask: u32) -> Self {
        Self { node, subtask }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.node, self.subtask)
    }
}

/// A state shard of the job: one key-group range `[start, end)`. A job's shard ranges
/// are fixed for the life of its state, whatever the parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardRange {
    /// First key group.
    pub start: u32,
    /// One past the last key group.
    pub end: u32,
}

/// A shard's answer to `Flush(N)`: proof that the writer's epoch N is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardHandle {
    /// The shard flushed.
    pub shard: ShardRange,
    /// The state service's handle (an object path).
    pub handle: String,
}

/// Where a source split stood when the barrier was emitted (an offset, a file position),
/// encoded by the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourcePosition {
    /// The split's name.
    pub split: String,
    /// The position, opaque to the coordinator.
    pub position: Bytes,
}

/// A task's figures for one checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskFigures {
    /// Synchronous part at the barrier (shipping the epoch buffer).
    pub sync: Duration,
    /// Asynchronous part (waiting for `Flush`).
    pub async_part: Duration,
    /// Time from the first to the last barrier of an aligned checkpoint.
    pub alignment: Duration,
    /// Bytes made durable for this checkpoint.
    pub bytes: u64,
    /// Records the task's source read in its attempt before the barrier.
    pub records: u64,
    /// Bytes of the task's channel state (unaligned checkpoints).
    pub channel_state_bytes: u64,
}

/// A task's acknowledgement of checkpoint `checkpoint_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskAck {
    /// The checkpoint acknowledged.
    pub checkpoint_id: u64,
    /// Who acknowledges.
    pub task: TaskId,
    /// One handle per state shard the task flushed.
    pub shard_handles: Vec<ShardHandle>,
    /// Positions of the task's source splits (sources only).
    pub source_positions: Vec<SourcePosition>,
    /// In-flight buffers persisted by an unaligned checkpoint.
    pub channel_state_handles: Vec<String>,
    /// An unaligned checkpoint's channel state as the task sent it (one object, stored
    /// by the coordinator beside `_metadata`).
    pub channel_state: Option<Bytes>,
    /// Durations and size.
    pub figures: TaskFigures,
}

impl TaskAck {
    /// An acknowledgement with no handles, positions or figures.
    pub fn empty(checkpoint_id: u64, task: TaskId) -> Self {
        Self {
            checkpoint_id,
            task,
            shard_handles: Vec::new(),
            source_positions: Vec::new(),
            channel_state_handles: Vec::new(),
            channel_state: None,
            figures: TaskFigures::default(),
        }
    }
}
