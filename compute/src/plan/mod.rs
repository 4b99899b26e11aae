//! Physical planning: a [`pb::JobGraph`] checked, typed and cut into chains.
//!
//! Planning runs before any task starts and is where a job's mistakes surface: a graph
//! that does not hang together, an unknown column, a type error in an expression, a
//! watermark on a column the source does not have. Every such error is an
//! [`Error::Plan`] prefixed with `file:line:column` of the node or expression in the
//! job file. Planning also resolves each node's output schema (sources may read file
//! metadata for that) and groups nodes into chains: a node joins its upstream's chain when
//! the edge between them is forward, on the main output, between equal parallelisms, and
//! the upstream has no other main consumer.
//!
//! The plan says nothing about threads, processes or queues: `runtime::local` runs it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use sluice_common::pb;
use sluice_common::state::MemoryStateBackend;

use crate::connector;
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::expr::aggregate::AggregateCall;
use crate::operator::filter::FilterOperator;
use crate::operator::select::SelectOperator;
use crate::operator::window::{WindowCounters, WindowOperator};
use crate::time::watermark::WatermarkGenerator;

/// An edge between two chains.
#[derive(Debug, Clone)]
pub struct ChainEdge {
    /// The consuming chain.
    pub to_chain: usize,
    /// `None` for the producing chain's main output; otherwise the index (within the
    /// chain's operators) of the operator whose side output feeds the edge.
    pub side_operator: Option<usize>,
    /// The side output's name (empty for main).
    pub tag: String,
    /// How records are spread over the consumer's subtasks.
    pub partitioning: pb::Partitioning,
    /// Key columns for hash partitioning.
    pub key_columns: Vec<String>,
    /// Schema of the records on the edge.
    pub schema: SchemaRef,
}

/// Nodes that run as one task per subtask.
#[derive(Debug, Clone)]
pub struct ChainPlan {
    /// Index in [`PhysicalPlan::chains`].
    pub id: usize,
    /// Subtasks.
    pub parallelism: usize,
    /// The source node, when the chain starts with one.
    pub source: Option<u32>,
    /// The other nodes, in order.
    pub operators: Vec<u32>,
    /// The producing chain and its parallelism, when the chain starts with an input gate.
    pub input: Option<(usize, usize)>,
    /// Outgoing edges.
    pub outputs: Vec<ChainEdge>,
}

/// A checked, typed, chained job.
#[derive(Debug)]
pub struct PhysicalPlan {
    /// The graph as given.
    pub graph: pb::JobGraph,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// The chains, producers before consumers.
    pub chains: Vec<ChainPlan>,
    nodes: HashMap<u32, pb::Node>,
    /// Input schema of every non-source node; output schema of sources.
    inputs: HashMap<u32, SchemaRef>,
    outputs: HashMap<u32, SchemaRef>,
}

impl PhysicalPlan {
    /// The node with `id`.
    pub fn node(&self, id: u32) -> &pb::Node {
        &self.nodes[&id]
    }

    /// The schema of the records `id` receives (for a source: that it produces).
    pub fn input_schema(&self, id: u32) -> SchemaRef {
        self.inputs[&id].clone()
    }

    /// The schema of the records `id` emits.
    pub fn output_schema(&self, id: u32) -> SchemaRef {
        self.outputs[&id].clone()
    }

    /// Prefixes `err` with where `node` is in the job file.
    pub fn locate(&self, node: &pb::Node, err: Error) -> Error {
        locate(&self.graph, node.location.as_ref(), &node.name, err)
    }
}

fn locate(graph: &pb::JobGraph, loc: Option<&pb::Location>, what: &str, err: Error) -> Error {
    match err {
        Error::Plan(msg) => {
            let file = if graph.origin_file.is_empty() {
                "<job>"
            } else {
                &graph.origin_file
            };
            let (line, col) = loc.map(|l| (l.line, l.column)).unwrap_or((0, 0));
            Error::Plan(format!("{file}:{line}:{col}: {what}: {msg}"))
        }
        Error::DataFusion(e) => locate(graph, loc, what, Error::Plan(e.strip_backtrace())),
        Error::Arrow(e) => locate(graph, loc, what, Error::Plan(e.to_string())),
        other => other,
    }
}

fn plan_err(msg: impl Into<String>) -> Error {
    Error::Plan(msg.into())
}

/// Checks, types and chains `graph`.
pub async fn plan(graph: pb::JobGraph) -> Result<PhysicalPlan> {
    let max_parallelism = match graph.max_parallelism {
        0 => sluice_common::DEFAULT_MAX_PARALLELISM,
        n => n,
    };
    let file = if graph.origin_file.is_empty() {
        "<job>".to_string()
    } else {
        graph.origin_file.clone()
    };
    let mut nodes = HashMap::new();
    for n in &graph.nodes {
        if n.parallelism == 0 || n.parallelism > max_parallelism {
            return Err(plan_err(format!(
                "{file}: node `{}` has parallelism {}; it must be between 1 and max_parallelism ({max_parallelism})",
                n.name, n.parallelism
            )));
        }
        if nodes.insert(n.id, n.clone()).is_some() {
            return Err(plan_err(format!("{file}: two nodes have id {}", n.id)));
        }
    }
    let mut incoming: HashMap<u32, &pb::Edge> = HashMap::new();
    let mut outgoing: BTreeMap<u32, Vec<&pb::Edge>> = BTreeMap::new();
    for e in &graph.edges {
        for end in [e.source, e.target] {
            if !nodes.contains_key(&end) {
                return Err(plan_err(format!(
                    "{file}: an edge refers to unknown node {end}"
                )));
            }
        }
        if incoming.insert(e.target, e).is_some() {
            return Err(plan_err(format!(
                "{file}: node `{}` has more than one input; joins and unions are not supported yet",
                nodes[&e.target].name
            )));
        }
        outgoing.entry(e.source).or_default().push(e);
    }
    // Topological order (Kahn); with one input per node this also rejects cycles.
    let mut order = Vec::with_capacity(nodes.len());
    let mut ready: Vec<u32> = graph
        .nodes
        .iter()
        .filter(|n| !incoming.contains_key(&n.id))
        .map(|n| n.id)
        .collect();
    ready.sort_unstable_by(|a, b| b.cmp(a));
    while let Some(id) = ready.pop() {
        order.push(id);
        for e in outgoing.get(&id).into_iter().flatten() {
            ready.push(e.target);
        }
    }
    if order.len() != nodes.len() {
        return Err(plan_err(format!("{file}: the job graph has a cycle")));
    }

    let compiler = ExprCompiler::new();
    let mut inputs: HashMap<u32, SchemaRef> = HashMap::new();
    let mut outputs: HashMap<u32, SchemaRef> = HashMap::new();
    let mut has_source = false;
    for &id in &order {
        let node = &nodes[&id];
        let at = |err: Error| locate(&graph, node.location.as_ref(), &node.name, err);
        let Some(kind) = node.kind.as_ref() else {
            return Err(at(plan_err("the node has no operator")));
        };
        let input = incoming.get(&id).map(|e| outputs[&e.source].clone());
        let is_source = matches!(kind, pb::node::Kind::Source(_));
        if is_source != input.is_none() {
            return Err(at(plan_err(if is_source {
                "a source cannot have an input"
            } else {
                "the node has no input"
            })));
        }
        let output = match kind {
            pb::node::Kind::Source(spec) => {
                has_source = true;
                let schema = connector::source_schema(spec).await.map_err(at)?;
                if let Some(wm) = &spec.watermark {
                    WatermarkGenerator::new(wm, &schema, 1).map_err(at)?;
                }
                inputs.insert(id, schema.clone());
                schema
            }
            pb::node::Kind::Filter(spec) => {
                let input = input.unwrap_or_else(unreachable_schema);
                if let Some(e) = &spec.predicate {
                    compiler
                        .compile(&e.sql, &input)
                        .map_err(|err| locate(&graph, e.location.as_ref(), "filter", err))?;
                }
                FilterOperator::build(spec, &input, &compiler).map_err(at)?;
                inputs.insert(id, input.clone());
                input
            }
            pb::node::Kind::Select(spec) => {
                let input = input.unwrap_or_else(unreachable_schema);
                for e in &spec.exprs {
                    compiler
                        .compile(&e.sql, &input)
                        .map_err(|err| locate(&graph, e.location.as_ref(), "select", err))?;
                }
                let schema = SelectOperator::build(spec, &input, &compiler)
                    .map_err(at)?
                    .schema();
                inputs.insert(id, input);
                schema
            }
            pb::node::Kind::Window(spec) => {
                let input = input.unwrap_or_else(unreachable_schema);
                for e in &spec.aggregates {
                    AggregateCall::compile(&compiler, &e.sql, &input)
                        .map_err(|err| locate(&graph, e.location.as_ref(), "aggregate", err))?;
                }
                let op = WindowOperator::build(
                    id,
                    spec,
                    &input,
                    &compiler,
                    Arc::new(MemoryStateBackend::new()),
                    Arc::new(WindowCounters::default()),
                )
                .map_err(at)?;
                inputs.insert(id, input);
                op.schema()
            }
            pb::node::Kind::Sink(_) => {
                let input = input.unwrap_or_else(unreachable_schema);
                inputs.insert(id, input.clone());
                input
            }
        };
        if let Some(e) = incoming.get(&id) {
            check_edge(&graph, &nodes, e, &outputs[&e.source]).map_err(at)?;
            if !e.side_output.is_empty() {
                // Side outputs carry the emitting operator's input records.
                let side = inputs[&e.source].clone();
                inputs.insert(id, side.clone());
                if matches!(kind, pb::node::Kind::Sink(_)) {
                    outputs.insert(id, side);
                    continue;
                }
            }
        }
        outputs.insert(id, output);
    }
    if !has_source {
        return Err(plan_err(format!("{file}: the job has no source")));
    }
    if !graph
        .nodes
        .iter()
        .any(|n| matches!(n.kind, Some(pb::node::Kind::Sink(_))))
    {
        return Err(plan_err(format!("{file}: the job has no sink")));
    }
    if graph
        .state
        .as_ref()
        .is_some_and(|s| s.backend() == pb::StateBackend::Remote)
    {
        return Err(plan_err(format!(
            "{file}: state backend `remote` is not available in this build yet; use `memory`"
        )));
    }

    let chains = chain(&order, &nodes, &incoming, &outgoing, &inputs);
    Ok(PhysicalPlan {
        graph,
        max_parallelism,
        chains,
        nodes,
        inputs,
        outputs,
    })
}

/// Sources always have an input schema of their own; other nodes always have an input.
fn unreachable_schema() -> SchemaRef {
    Arc::new(arrow::datatypes::Schema::empty())
}

fn check_edge(
    graph: &pb::JobGraph,
    nodes: &HashMap<u32, pb::Node>,
    e: &pb::Edge,
    upstream: &SchemaRef,
) -> Result<()> {
    let (from, to) = (&nodes[&e.source], &nodes[&e.target]);
    match e.partitioning() {
        pb::Partitioning::Forward if from.parallelism != to.parallelism => Err(plan_err(format!(
            "a forward edge from `{}` (parallelism {}) to `{}` (parallelism {}) needs equal parallelism",
            from.name, from.parallelism, to.name, to.parallelism
        ))),
        pb::Partitioning::Hash => {
            crate::keys::KeyEncoder::new(upstream, &e.key_columns)?;
            Ok(())
        }
        _ => {
            let _ = graph;
            Ok(())
        }
    }
}

fn chain(
    order: &[u32],
    nodes: &HashMap<u32, pb::Node>,
    incoming: &HashMap<u32, &pb::Edge>,
    outgoing: &BTreeMap<u32, Vec<&pb::Edge>>,
    inputs: &HashMap<u32, SchemaRef>,
) -> Vec<ChainPlan> {
    let mut chains: Vec<ChainPlan> = Vec::new();
    // For every node: its chain, and its index among the chain's operators (None: source).
    let mut place: HashMap<u32, (usize, Option<usize>)> = HashMap::new();
    for &id in order {
        let node = &nodes[&id];
        let is_source = matches!(node.kind, Some(pb::node::Kind::Source(_)));
        let joins = incoming.get(&id).and_then(|e| {
            let up = &nodes[&e.source];
            let main_consumers = outgoing[&e.source]
                .iter()
                .filter(|o| o.side_output.is_empty())
                .count();
            (e.partitioning() == pb::Partitioning::Forward
                && e.side_output.is_empty()
                && up.parallelism == node.parallelism
                && main_consumers == 1)
                .then(|| place[&e.source].0)
        });
        match joins {
            Some(c) => {
                chains[c].operators.push(id);
                place.insert(id, (c, Some(chains[c].operators.len() - 1)));
            }
            None => {
                let c = chains.len();
                let input = incoming.get(&id).map(|e| {
                    let (up, side) = place[&e.source];
                    let up_chain = &mut chains[up];
                    up_chain.outputs.push(ChainEdge {
                        to_chain: c,
                        side_operator: if e.side_output.is_empty() { None } else { side },
                        tag: e.side_output.clone(),
                        partitioning: e.partitioning(),
                        key_columns: e.key_columns.clone(),
                        schema: inputs[&id].clone(),
                    });
                    (up, up_chain.parallelism)
                });
                chains.push(ChainPlan {
                    id: c,
                    parallelism: node.parallelism as usize,
                    source: is_source.then_some(id),
                    operators: if is_source { Vec::new() } else { vec![id] },
                    input,
                    outputs: Vec::new(),
                });
                place.insert(id, (c, (!is_source).then_some(0)));
            }
        }
    }
    chains
}
