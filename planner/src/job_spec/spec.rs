//! A job as the file describes it, checked but not yet a graph.
//!
//! Decoding fills these structs from the YAML tree (the leaves are already protobuf
//! messages); [`super::graph`] turns them into nodes and edges. Keeping the two steps apart
//! means every user mistake is found while positions are at hand, and graph construction
//! cannot fail.

use super::marked_yaml::Pos;
use sluice_common::pb;

pub(super) struct JobSpec {
    pub name: String,
    pub parallelism: u32,
    pub max_parallelism: u32,
    pub state: pb::StateConfig,
    /// Periodic barriers injected by the sources, when set.
    pub checkpoint: Option<pb::CheckpointConfig>,
    /// How data moves between tasks (buffer debloating), when set.
    pub network: Option<pb::NetworkSettings>,
    /// Includes the watermark and batch size.
    pub source: pb::SourceSpec,
    /// Where the `source:` key is.
    pub source_at: Pos,
    pub pipeline: Vec<Stage>,
    pub sink: pb::SinkSpec,
    /// Where the `sink:` key is.
    pub sink_at: Pos,
}

/// One operator of the pipeline and where its key is written.
pub(super) struct Stage {
    pub at: Pos,
    pub op: Operator,
}

pub(super) enum Operator {
    Filter(pb::FilterSpec),
    Select(pb::SelectSpec),
    Window(Box<WindowStage>),
    Dedup(pb::DedupSpec),
    /// An unbounded GROUP BY; not keyed (one subtask) when it has no key columns.
    Aggregate(pb::AggregateSpec),
    /// Top-N per key; not keyed (one subtask) when it has no partition columns.
    TopN(pb::TopNSpec),
    /// An OVER aggregate per key; not keyed (one subtask) when it has no partition
    /// columns.
    Over(pb::OverSpec),
    /// A join of the pipeline so far (left) with another input (right).
    Join(Box<JoinStage>),
    /// A join of the pipeline so far with a bounded table every subtask reads whole.
    LookupJoin(Box<pb::LookupJoinSpec>),
    /// The rows of the pipeline so far and of another input (UNION ALL).
    Union(Box<UnionStage>),
}

/// A `union` item: the other input's own source and pipeline.
pub(super) struct UnionStage {
    /// Includes the other input's watermark.
    pub source: pb::SourceSpec,
    /// Where the other input's `source:` key is.
    pub source_at: Pos,
    pub pipeline: Vec<Stage>,
}

/// A `join` item: the join, and the right input's own source and pipeline.
pub(super) struct JoinStage {
    pub spec: pb::JoinSpec,
    /// Includes the right input's watermark.
    pub source: pb::SourceSpec,
    /// Where the right input's `source:` key is.
    pub source_at: Pos,
    pub pipeline: Vec<Stage>,
}

pub(super) struct WindowStage {
    /// Keyed when `key_columns` is not empty (a `key_by` came right before it).
    pub spec: pb::WindowSpec,
    /// Where late records go when `late: { sink: ... }`, and where that `sink:` key is.
    pub late_sink: Option<(pb::SinkSpec, Pos)>,
}
