//! From a checked [`JobSpec`] to a [`pb::JobGraph`]: node ids, names, parallelism and
//! edge partitioning. Nothing here can fail; every user mistake was caught while decoding.
//!
//! # Shape
//!
//! Nodes are numbered in order: the source (0), one node per filter, select and window, the
//! sink, then one `late-sink` per window that sends late records to a sink. Consecutive
//! nodes are connected; a late sink hangs off its window by a `late` side-output edge.
//!
//! # Parallelism and partitioning
//!
//! The source runs at the job parallelism and each node inherits its upstream node's,
//! except windows, aggregates and Top-Ns (the same rule for all): a keyed window runs at the job parallelism behind a hash edge on its key
//! columns; a non-keyed window runs as one subtask behind a hash edge with no key columns
//! (every record in the same key group). Other edges are forward when both ends have the
//! same parallelism and rebalance otherwise.

use std::collections::HashMap;

use super::marked_yaml::Pos;
use super::spec::{JobSpec, JoinStage, Operator, Stage, UnionStage, WindowStage};
use sluice_common::pb;

pub(super) fn job_graph(file: &str, spec: JobSpec) -> pb::JobGraph {
    let mut graph = GraphBuilder::default();
    let job_parallelism = spec.parallelism;
    let source = graph.add_node(
        "source",
        job_parallelism,
        spec.source_at,
        pb::node::Kind::Source(spec.source),
    );
    let mut late_sinks = Vec::new();
    let upstream = add_stages(
        &mut graph,
        source,
        spec.pipeline,
        job_parallelism,
        &mut late_sinks,
    );
    let sink_parallelism = match spec.sink.parallelism {
        0 => upstream.parallelism,
        p => p,
    };
    let sink = graph.add_node(
        "sink",
        sink_parallelism,
        spec.sink_at,
        pb::node::Kind::Sink(spec.sink),
    );
    graph.connect(
        upstream,
        sink,
        pointwise(upstream.parallelism, sink.parallelism),
        Vec::new(),
        "",
    );
    for (window, sink, at) in late_sinks {
        let late = graph.add_node(
            "late-sink",
            window.parallelism,
            at,
            pb::node::Kind::Sink(sink),
        );
        graph.connect(window, late, pb::Partitioning::Forward, Vec::new(), "late");
    }
    pb::JobGraph {
        name: spec.name,
        max_parallelism: spec.max_parallelism,
        nodes: graph.nodes,
        edges: graph.edges,
        origin_file: file.to_owned(),
        state: Some(spec.state),
        checkpoint: spec.checkpoint,
        network: spec.network,
    }
}

/// Adds the nodes of `stages` after `upstream`, connected in order; returns the last.
fn add_stages(
    graph: &mut GraphBuilder,
    mut upstream: Added,
    stages: Vec<Stage>,
    job_parallelism: u32,
    late_sinks: &mut Vec<(Added, pb::SinkSpec, Pos)>,
) -> Added {
    for stage in stages {
        let (node, edge_partitioning, key_columns) = match stage.op {
            Operator::Filter(filter) => {
                let p = upstream.parallelism;
                let node = graph.add_node("filter", p, stage.at, pb::node::Kind::Filter(filter));
                (node, pointwise(upstream.parallelism, p), Vec::new())
            }
            Operator::Select(select) => {
                let p = upstream.parallelism;
                let node = graph.add_node("select", p, stage.at, pb::node::Kind::Select(select));
                (node, pointwise(upstream.parallelism, p), Vec::new())
            }
            Operator::Window(window) => {
                let WindowStage { spec, late_sink } = *window;
                let p = if spec.key_columns.is_empty() {
                    1
                } else {
                    job_parallelism
                };
                let key_columns = spec.key_columns.clone();
                let node = graph.add_node("window", p, stage.at, pb::node::Kind::Window(spec));
                if let Some((sink, at)) = late_sink {
                    late_sinks.push((node, sink, at));
                }
                (node, pb::Partitioning::Hash, key_columns)
            }
            Operator::Dedup(dedup) => {
                let key_columns = dedup.key_columns.clone();
                let node = graph.add_node(
                    "dedup",
                    job_parallelism,
                    stage.at,
                    pb::node::Kind::Dedup(dedup),
                );
                (node, pb::Partitioning::Hash, key_columns)
            }
            Operator::Aggregate(aggregate) => {
                let p = if aggregate.key_columns.is_empty() {
                    1
                } else {
                    job_parallelism
                };
                let key_columns = aggregate.key_columns.clone();
                let node = graph.add_node(
                    "aggregate",
                    p,
                    stage.at,
                    pb::node::Kind::Aggregate(aggregate),
                );
                (node, pb::Partitioning::Hash, key_columns)
            }
            Operator::Join(join) => {
                let JoinStage {
                    spec,
                    source,
                    source_at,
                    pipeline,
                } = *join;
                let right_source = graph.source(job_parallelism, source_at, source);
                let right = add_stages(graph, right_source, pipeline, job_parallelism, late_sinks);
                let (left_keys, right_keys) = (spec.left_keys.clone(), spec.right_keys.clone());
                let node = graph.add_node(
                    "join",
                    job_parallelism,
                    stage.at,
                    pb::node::Kind::Join(spec),
                );
                graph.connect_input(right, node, pb::Partitioning::Hash, right_keys, 1);
                (node, pb::Partitioning::Hash, left_keys)
            }
            Operator::Union(union) => {
                let UnionStage {
                    source,
                    source_at,
                    pipeline,
                } = *union;
                let other_source = graph.source(job_parallelism, source_at, source);
                let other = add_stages(graph, other_source, pipeline, job_parallelism, late_sinks);
                // Both inputs' parallelism when they have one: forward edges keep an
                // updating input's changes of a key in order.
                let p = match upstream.parallelism == other.parallelism {
                    true => other.parallelism,
                    false => job_parallelism,
                };
                let node = graph.add_node(
                    "union",
                    p,
                    stage.at,
                    pb::node::Kind::Union(pb::UnionSpec {}),
                );
                graph.connect_input(other, node, pointwise(other.parallelism, p), Vec::new(), 1);
                (node, pointwise(upstream.parallelism, p), Vec::new())
            }
            Operator::LookupJoin(spec) => {
                let p = upstream.parallelism;
                let node = graph.add_node(
                    "lookup_join",
                    p,
                    stage.at,
                    pb::node::Kind::LookupJoin(*spec),
                );
                (node, pointwise(upstream.parallelism, p), Vec::new())
            }
            Operator::Over(over) => {
                let p = if over.partition_columns.is_empty() {
                    1
                } else {
                    job_parallelism
                };
                let key_columns = over.partition_columns.clone();
                let node = graph.add_node("over", p, stage.at, pb::node::Kind::Over(over));
                (node, pb::Partitioning::Hash, key_columns)
            }
            Operator::TopN(top) => {
                let p = if top.partition_columns.is_empty() {
                    1
                } else {
                    job_parallelism
                };
                let key_columns = top.partition_columns.clone();
                let node = graph.add_node("top_n", p, stage.at, pb::node::Kind::TopN(top));
                (node, pb::Partitioning::Hash, key_columns)
            }
        };
        graph.connect(upstream, node, edge_partitioning, key_columns, "");
        upstream = node;
    }
    upstream
}

/// Forward between equal parallelisms, rebalance otherwise.
fn pointwise(upstream: u32, downstream: u32) -> pb::Partitioning {
    if upstream == downstream {
        pb::Partitioning::Forward
    } else {
        pb::Partitioning::Rebalance
    }
}

/// A node already added: its id and parallelism.
#[derive(Clone, Copy)]
struct Added {
    id: u32,
    parallelism: u32,
}

#[derive(Default)]
struct GraphBuilder {
    nodes: Vec<pb::Node>,
    edges: Vec<pb::Edge>,
    /// How many nodes of each base name exist; the second `filter` is `filter-2`.
    names: HashMap<&'static str, u32>,
}

impl GraphBuilder {
    fn add_node(
        &mut self,
        base: &'static str,
        parallelism: u32,
        at: Pos,
        kind: pb::node::Kind,
    ) -> Added {
        let count = self.names.entry(base).or_insert(0);
        *count += 1;
        let name = match *count {
            1 => base.to_owned(),
            n => format!("{base}-{n}"),
        };
        let id = u32::try_from(self.nodes.len()).unwrap_or(u32::MAX);
        self.nodes.push(pb::Node {
            id,
            name,
            parallelism,
            location: Some(at.to_location()),
            kind: Some(kind),
        });
        Added { id, parallelism }
    }

    /// A source node reading `spec`: the node that reads it already when there is one
    /// (a table joined with a query over itself is read once, and feeds both).
    fn source(&mut self, parallelism: u32, at: Pos, spec: pb::SourceSpec) -> Added {
        let kind = pb::node::Kind::Source(spec);
        match self
            .nodes
            .iter()
            .find(|n| n.parallelism == parallelism && n.kind.as_ref() == Some(&kind))
        {
            Some(n) => Added {
                id: n.id,
                parallelism,
            },
            None => self.add_node("source", parallelism, at, kind),
        }
    }

    fn connect(
        &mut self,
        from: Added,
        to: Added,
        partitioning: pb::Partitioning,
        key_columns: Vec<String>,
        side_output: &str,
    ) {
        self.edges.push(pb::Edge {
            source: from.id,
            target: to.id,
            partitioning: partitioning as i32,
            key_columns,
            side_output: side_output.to_owned(),
            target_input: 0,
        });
    }

    /// Connects `from` to input `input` of `to` (1: a join's right).
    fn connect_input(
        &mut self,
        from: Added,
        to: Added,
        partitioning: pb::Partitioning,
        key_columns: Vec<String>,
        input: u32,
    ) {
        self.connect(from, to, partitioning, key_columns, "");
        if let Some(e) = self.edges.last_mut() {
            e.target_input = input;
        }
    }
}
