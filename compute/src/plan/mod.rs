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
//! The plan says nothing about threads, processes or queues: `runtime::build` turns the
//! share of it placed on a worker into tasks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use sluice_common::pb;

use crate::changelog;
use crate::connector::Connectors;
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::expr::aggregate::AggregateCall;
use crate::expr::wildcard;
use crate::operator::aggregate::AggregateOperator;
use crate::operator::dedup::DedupOperator;
use crate::operator::filter::FilterOperator;
use crate::operator::join::{JoinOperator, side_wildcard};
use crate::operator::lookup_join::LookupJoinOperator;
use crate::operator::over::OverOperator;
use crate::operator::select::SelectOperator;
use crate::operator::top_n::TopNOperator;
use crate::operator::union::UnionOperator;
use crate::operator::window::{WindowCounters, WindowOperator};
use crate::time::watermark::WatermarkGenerator;

/// An edge between two chains.
#[derive(Debug, Clone)]
pub struct ChainEdge {
    /// The consuming chain.
    pub to_chain: usize,
    /// Which of the consuming chain's inputs the edge feeds (1: a join's right).
    pub to_input: usize,
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
    /// The producing chains and their parallelisms, by input (a join has two), when the
    /// chain starts with an input gate; empty when it starts with a source.
    pub input: Vec<(usize, usize)>,
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
    /// Where the job's sources and sinks come from.
    pub connectors: Arc<dyn Connectors>,
    nodes: HashMap<u32, pb::Node>,
    /// Input schema of every non-source node (a join's left); output schema of sources.
    inputs: HashMap<u32, SchemaRef>,
    /// A join's right input schema.
    right_inputs: HashMap<u32, SchemaRef>,
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

    /// The schema of the records a join `id` receives on its right input; an internal
    /// error for a node planning gave no right input (a bug).
    pub fn right_input_schema(&self, id: u32) -> Result<SchemaRef> {
        self.right_inputs
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("join node {id} has no right input")))
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

/// Compiles each aggregate call over `input`; an error names where the call is written.
fn check_aggregates(
    graph: &pb::JobGraph,
    compiler: &ExprCompiler,
    input: &SchemaRef,
    calls: &[pb::Expr],
) -> Result<()> {
    for e in calls {
        AggregateCall::compile(compiler, &e.sql, input)
            .map_err(|err| locate(graph, e.location.as_ref(), "aggregate", err))?;
    }
    Ok(())
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

/// Checks, types and chains `graph`; sources are told to produce only the columns the
/// job reads (see [`prune_sources`]).
pub async fn plan(graph: pb::JobGraph, connectors: Arc<dyn Connectors>) -> Result<PhysicalPlan> {
    let first = plan_once(graph, connectors.clone()).await?;
    match prune_sources(&first)? {
        Some(pruned) => plan_once(pruned, connectors).await,
        None => Ok(first),
    }
}

/// Which input columns a node reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Needs {
    All,
    Columns(BTreeSet<String>),
}

impl Needs {
    fn union(self, other: Needs) -> Needs {
        match (self, other) {
            (Needs::Columns(mut a), Needs::Columns(b)) => {
                a.extend(b);
                Needs::Columns(a)
            }
            _ => Needs::All,
        }
    }
}

/// The graph with every source's `columns` set to what the job reads, when that is
/// fewer than the source has: CSV and JSON decoders then skip the other columns, and
/// exchanges move less. `None` when nothing can be pruned.
fn prune_sources(plan: &PhysicalPlan) -> Result<Option<pb::JobGraph>> {
    let mut consumers: HashMap<u32, Vec<&pb::Edge>> = HashMap::new();
    for e in &plan.graph.edges {
        consumers.entry(e.source).or_default().push(e);
    }
    let compiler = ExprCompiler::new();
    let mut memo = HashMap::new();
    let mut graph = plan.graph.clone();
    let mut changed = false;
    for node in &mut graph.nodes {
        let Some(pb::node::Kind::Source(spec)) = node.kind.as_mut() else {
            continue;
        };
        if !spec.columns.is_empty() {
            continue;
        }
        let Needs::Columns(mut cols) =
            output_needs(plan, node.id, &consumers, &compiler, &mut memo)?
        else {
            continue;
        };
        if let Some(wm) = &spec.watermark {
            cols.insert(wm.column.clone());
        }
        let schema = plan.output_schema(node.id);
        let kept: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| cols.contains(n))
            .collect();
        if kept.len() < schema.fields().len() && !kept.is_empty() {
            spec.columns = kept;
            changed = true;
        }
    }
    Ok(changed.then_some(graph))
}

/// What the main consumers of `id` read of its output.
fn output_needs(
    plan: &PhysicalPlan,
    id: u32,
    consumers: &HashMap<u32, Vec<&pb::Edge>>,
    compiler: &ExprCompiler,
    memo: &mut HashMap<u32, Needs>,
) -> Result<Needs> {
    let mut needs = Needs::Columns(BTreeSet::new());
    for e in consumers
        .get(&id)
        .into_iter()
        .flatten()
        .filter(|e| e.side_output.is_empty())
    {
        let reads = match plan.node(e.target).kind.as_ref() {
            // A semi or anti join passes its left rows on as they are: the left input
            // gives what the join's readers read, and each side its keys.
            Some(pb::node::Kind::Join(j))
                if matches!(
                    j.r#type(),
                    pb::JoinType::Semi | pb::JoinType::Anti | pb::JoinType::NotIn
                ) && j.exprs.is_empty()
                    && j.condition.is_none() =>
            {
                let keys = match e.target_input {
                    0 => &j.left_keys,
                    _ => &j.right_keys,
                };
                let own = Needs::Columns(keys.iter().cloned().collect());
                match e.target_input {
                    0 => own.union(output_needs(plan, e.target, consumers, compiler, memo)?),
                    _ => own,
                }
            }
            Some(pb::node::Kind::Join(j)) => {
                let right = plan.right_input_schema(e.target)?;
                match JoinOperator::input_columns(
                    j,
                    &plan.input_schema(e.target),
                    &right,
                    compiler,
                    e.target_input as usize,
                )? {
                    Some(columns) => Needs::Columns(columns),
                    None => Needs::All,
                }
            }
            // A union's columns are its inputs' by position, under the left's names:
            // what its readers read, named as this input names it.
            Some(pb::node::Kind::Union(_)) => {
                match output_needs(plan, e.target, consumers, compiler, memo)? {
                    Needs::All => Needs::All,
                    Needs::Columns(names) => {
                        let out = plan.output_schema(e.target);
                        let input = match e.target_input {
                            0 => plan.input_schema(e.target),
                            _ => plan.right_input_schema(e.target)?,
                        };
                        let data = usize::from(crate::changelog::is_changelog(&out));
                        Needs::Columns(
                            out.fields()
                                .iter()
                                .zip(input.fields().iter())
                                .enumerate()
                                .filter(|(i, (o, _))| *i < data || names.contains(o.name()))
                                .map(|(_, (_, f))| f.name().clone())
                                .collect(),
                        )
                    }
                }
            }
            _ => input_needs(plan, e.target, consumers, compiler, memo)?,
        };
        needs = needs.union(reads);
    }
    Ok(needs)
}

/// What `id` reads of its input (side outputs carry its input, so their readers count).
fn input_needs(
    plan: &PhysicalPlan,
    id: u32,
    consumers: &HashMap<u32, Vec<&pb::Edge>>,
    compiler: &ExprCompiler,
    memo: &mut HashMap<u32, Needs>,
) -> Result<Needs> {
    if let Some(n) = memo.get(&id) {
        return Ok(n.clone());
    }
    let input = plan.input_schema(id);
    let refs = |sqls: &mut dyn Iterator<Item = &str>| -> Result<Needs> {
        let mut cols = BTreeSet::new();
        for sql in sqls {
            if wildcard(sql).is_some() {
                return Ok(Needs::All);
            }
            let (expr, _) = compiler.parse(sql, &input)?;
            #[allow(deprecated)]
            if matches!(
                crate::expr::strip_aliases(expr.clone()).1,
                datafusion::logical_expr::Expr::Wildcard { .. }
            ) {
                return Ok(Needs::All);
            }
            cols.extend(expr.column_refs().into_iter().map(|c| c.name.clone()));
        }
        Ok(Needs::Columns(cols))
    };
    let mut needs = match plan.node(id).kind.as_ref() {
        Some(pb::node::Kind::Filter(f)) => {
            let pred = f.predicate.as_ref().map(|e| e.sql.as_str());
            refs(&mut pred.into_iter())?.union(output_needs(plan, id, consumers, compiler, memo)?)
        }
        Some(pb::node::Kind::Select(s)) => {
            let (stars, items): (Vec<&pb::Expr>, Vec<&pb::Expr>) =
                s.exprs.iter().partition(|e| wildcard(&e.sql).is_some());
            let needs = refs(&mut items.iter().map(|e| e.sql.as_str()))?;
            if stars.is_empty() {
                needs
            } else {
                // `*` passes its columns on under their names: what the readers need.
                needs.union(output_needs(plan, id, consumers, compiler, memo)?)
            }
        }
        Some(pb::node::Kind::Window(w)) => {
            let mut needs = refs(&mut w.aggregates.iter().map(|e| e.sql.as_str()))?;
            let mut own: BTreeSet<String> = w.key_columns.iter().cloned().collect();
            if w.time() == pb::TimeCharacteristic::TimeEvent {
                own.insert(w.time_column.clone());
            }
            needs = needs.union(Needs::Columns(own));
            needs
        }
        Some(pb::node::Kind::Dedup(d)) => Needs::Columns(d.key_columns.iter().cloned().collect())
            .union(output_needs(plan, id, consumers, compiler, memo)?),
        Some(pb::node::Kind::Over(o)) => {
            // The input's columns pass through: what the readers need, less the aggregates.
            let own: BTreeSet<String> = o
                .partition_columns
                .iter()
                .chain([&o.time_column])
                .cloned()
                .collect();
            refs(&mut o.aggregates.iter().map(|e| e.sql.as_str()))?
                .union(Needs::Columns(own))
                .union(output_needs(plan, id, consumers, compiler, memo)?)
        }
        Some(pb::node::Kind::Aggregate(a)) => {
            refs(&mut a.aggregates.iter().map(|e| e.sql.as_str()))?
                .union(Needs::Columns(a.key_columns.iter().cloned().collect()))
        }
        Some(pb::node::Kind::LookupJoin(j)) => {
            let table = plan.right_input_schema(id)?;
            let join = LookupJoinOperator::join_spec(j);
            match JoinOperator::input_columns(&join, &input, &table, compiler, 0)? {
                Some(columns) => Needs::Columns(columns),
                None => Needs::All,
            }
        }
        _ => Needs::All,
    };
    for e in consumers
        .get(&id)
        .into_iter()
        .flatten()
        .filter(|e| !e.side_output.is_empty())
    {
        needs = needs.union(input_needs(plan, e.target, consumers, compiler, memo)?);
    }
    memo.insert(id, needs.clone());
    Ok(needs)
}

async fn plan_once(graph: pb::JobGraph, connectors: Arc<dyn Connectors>) -> Result<PhysicalPlan> {
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
    // Every node's input edges, by input index (a join has two, every other node one).
    let mut all_incoming: HashMap<u32, Vec<&pb::Edge>> = HashMap::new();
    let mut outgoing: BTreeMap<u32, Vec<&pb::Edge>> = BTreeMap::new();
    for e in &graph.edges {
        for end in [e.source, e.target] {
            if !nodes.contains_key(&end) {
                return Err(plan_err(format!(
                    "{file}: an edge refers to unknown node {end}"
                )));
            }
        }
        all_incoming.entry(e.target).or_default().push(e);
        outgoing.entry(e.source).or_default().push(e);
    }
    for (target, edges) in &mut all_incoming {
        edges.sort_by_key(|e| e.target_input);
        let node = &nodes[target];
        let wanted = if matches!(
            node.kind,
            Some(pb::node::Kind::Join(_) | pb::node::Kind::Union(_))
        ) {
            2
        } else {
            1
        };
        let inputs: Vec<u32> = edges.iter().map(|e| e.target_input).collect();
        if inputs != (0..wanted).collect::<Vec<u32>>() {
            return Err(plan_err(format!(
                "{file}: node `{}` has inputs {inputs:?}; it takes {}",
                node.name,
                if wanted == 2 {
                    "exactly two, 0 (left) and 1 (right)"
                } else {
                    "exactly one"
                }
            )));
        }
    }
    let incoming: HashMap<u32, &pb::Edge> = all_incoming
        .iter()
        .map(|(id, edges)| (*id, edges[0]))
        .collect();
    // Topological order (Kahn), which also rejects cycles.
    let mut order = Vec::with_capacity(nodes.len());
    let mut waiting: HashMap<u32, usize> = all_incoming
        .iter()
        .map(|(id, edges)| (*id, edges.len()))
        .collect();
    let mut ready: Vec<u32> = graph
        .nodes
        .iter()
        .filter(|n| !all_incoming.contains_key(&n.id))
        .map(|n| n.id)
        .collect();
    ready.sort_unstable_by(|a, b| b.cmp(a));
    while let Some(id) = ready.pop() {
        order.push(id);
        for e in outgoing.get(&id).into_iter().flatten() {
            let left = waiting.entry(e.target).or_default();
            *left = left.saturating_sub(1);
            if *left == 0 {
                ready.push(e.target);
            }
        }
    }
    if order.len() != nodes.len() {
        return Err(plan_err(format!("{file}: the job graph has a cycle")));
    }

    let compiler = ExprCompiler::new();
    let mut inputs: HashMap<u32, SchemaRef> = HashMap::new();
    let mut right_inputs: HashMap<u32, SchemaRef> = HashMap::new();
    let mut outputs: HashMap<u32, SchemaRef> = HashMap::new();
    let mut has_source = false;
    for &id in &order {
        let node = &nodes[&id];
        let at = |err: Error| locate(&graph, node.location.as_ref(), &node.name, err);
        let Some(kind) = node.kind.as_ref() else {
            return Err(at(plan_err("the node has no operator")));
        };
        let is_source = matches!(kind, pb::node::Kind::Source(_));
        let input: SchemaRef = match (incoming.get(&id), is_source) {
            (Some(e), false) => outputs[&e.source].clone(),
            // A source reads no stream; its schema is its own (below).
            (None, true) => Arc::new(arrow::datatypes::Schema::empty()),
            (Some(_), true) => return Err(at(plan_err("a source cannot have an input"))),
            (None, false) => return Err(at(plan_err("the node has no input"))),
        };
        if changelog::is_changelog(&input) {
            check_updating_input(kind).map_err(at)?;
        }
        let output = match kind {
            pb::node::Kind::Source(spec) => {
                has_source = true;
                let schema = connectors.source_schema(spec).await.map_err(at)?;
                if let Some(wm) = &spec.watermark {
                    WatermarkGenerator::new(wm, &schema, 1, false).map_err(at)?;
                }
                inputs.insert(id, schema.clone());
                schema
            }
            pb::node::Kind::Filter(spec) => {
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
                for e in spec.exprs.iter().filter(|e| wildcard(&e.sql).is_none()) {
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
                check_aggregates(&graph, &compiler, &input, &spec.aggregates)?;
                let op = WindowOperator::build(
                    spec,
                    &input,
                    &compiler,
                    Arc::new(WindowCounters::default()),
                )
                .map_err(at)?;
                inputs.insert(id, input);
                op.schema()
            }
            pb::node::Kind::Dedup(spec) => {
                DedupOperator::build(spec, &input).map_err(at)?;
                inputs.insert(id, input.clone());
                input
            }
            pb::node::Kind::Aggregate(spec) => {
                check_aggregates(&graph, &compiler, &input, &spec.aggregates)?;
                let op = AggregateOperator::build(spec, &input, &compiler).map_err(at)?;
                inputs.insert(id, input);
                op.schema()
            }
            pb::node::Kind::Over(spec) => {
                check_aggregates(&graph, &compiler, &input, &spec.aggregates)?;
                let op = OverOperator::build(
                    spec,
                    &input,
                    &compiler,
                    Arc::new(WindowCounters::default()),
                )
                .map_err(at)?;
                inputs.insert(id, input);
                op.schema()
            }
            pb::node::Kind::TopN(spec) => {
                let op = TopNOperator::build(spec, &input).map_err(at)?;
                inputs.insert(id, input);
                op.schema()
            }
            pb::node::Kind::Join(spec) => {
                let right_edge = all_incoming[&id][1];
                let right = outputs[&right_edge.source].clone();
                check_edge(&nodes, right_edge, &right).map_err(at)?;
                check_join_edges(spec, all_incoming[&id].as_slice()).map_err(at)?;
                check_join_exprs(&graph, spec, &input, &right, &compiler)?;
                let op = JoinOperator::build(spec, &input, &right, &compiler).map_err(at)?;
                inputs.insert(id, input);
                right_inputs.insert(id, right);
                op.schema()
            }
            pb::node::Kind::Union(_) => {
                let right_edge = all_incoming[&id][1];
                let right = outputs[&right_edge.source].clone();
                check_edge(&nodes, right_edge, &right).map_err(at)?;
                let op = UnionOperator::build(&input, &right).map_err(at)?;
                inputs.insert(id, input);
                right_inputs.insert(id, right);
                op.schema()
            }
            pb::node::Kind::LookupJoin(spec) => {
                let Some(table_spec) = &spec.table else {
                    return Err(at(plan_err("a lookup join needs its table")));
                };
                // Every subtask reads the table to its end before its first row.
                let unbounded = match &table_spec.kind {
                    Some(pb::source_spec::Kind::Nexmark(n)) => n.events == 0,
                    Some(pb::source_spec::Kind::File(_)) => false,
                    Some(pb::source_spec::Kind::Kafka(_)) | None => true,
                };
                if unbounded {
                    return Err(at(plan_err(
                        "a lookup join's table must be bounded (files, or a generator with \
                         `events`): every subtask reads it whole before joining",
                    )));
                }
                let table = connectors.source_schema(table_spec).await.map_err(at)?;
                let join = LookupJoinOperator::join_spec(spec);
                check_join_exprs(&graph, &join, &input, &table, &compiler)?;
                let op = LookupJoinOperator::build(spec, &input, &table, &compiler).map_err(at)?;
                inputs.insert(id, input);
                right_inputs.insert(id, table);
                op.schema()
            }
            pb::node::Kind::Sink(spec) => {
                check_partitions(spec, &input).map_err(at)?;
                inputs.insert(id, input.clone());
                input
            }
        };
        if let Some(e) = incoming.get(&id) {
            check_edge(&nodes, e, &outputs[&e.source]).map_err(at)?;
            // A group aggregate, a join or a Top-N may read a changelog hashed by its own key:
            // every change of an upstream row goes, in order, to the subtask owning the
            // row's key (a join's right input is checked the same way below).
            let regrouped = e.partitioning() == pb::Partitioning::Hash
                && matches!(
                    kind,
                    pb::node::Kind::Aggregate(_)
                        | pb::node::Kind::Join(_)
                        | pb::node::Kind::TopN(_)
                );
            if changelog::is_changelog(&outputs[&e.source])
                && e.partitioning() != pb::Partitioning::Forward
                && !regrouped
            {
                return Err(at(plan_err(format!(
                    "reads an updating result from `{}` over a {} edge, which could reorder \
                     a key's changes (-U before its +U); give it the parallelism of `{}` \
                     ({})",
                    nodes[&e.source].name,
                    e.partitioning()
                        .as_str_name()
                        .trim_start_matches("PARTITIONING_")
                        .to_lowercase(),
                    nodes[&e.source].name,
                    nodes[&e.source].parallelism
                ))));
            }
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
    // Channel state of an unaligned checkpoint names its channels by producer subtask
    // alone, which is ambiguous for a task with two inputs.
    let join = graph.nodes.iter().find(|n| {
        matches!(
            n.kind,
            Some(pb::node::Kind::Join(_) | pb::node::Kind::Union(_))
        )
    });
    if let (Some(join), Some(c)) = (
        join,
        graph
            .checkpoint
            .as_ref()
            .filter(|c| c.mode == pb::CheckpointMode::Unaligned as i32 || c.aligned_timeout_ms > 0),
    ) {
        let what = if c.mode == pb::CheckpointMode::Unaligned as i32 {
            "unaligned checkpoints"
        } else {
            "an aligned-checkpoint timeout (which goes on unaligned)"
        };
        return Err(locate(
            &graph,
            join.location.as_ref(),
            &join.name,
            plan_err(format!(
                "a job with a join cannot take {what} yet: the in-flight records of a \
                 two-input task are not recorded; use aligned checkpoints"
            )),
        ));
    }
    let chains = chain(
        &order,
        &nodes,
        &all_incoming,
        &outgoing,
        &inputs,
        &right_inputs,
    );
    Ok(PhysicalPlan {
        graph,
        max_parallelism,
        chains,
        connectors,
        nodes,
        inputs,
        right_inputs,
        outputs,
    })
}

/// Compiles a join's condition and output items (a side's `t.*` aside) over its two
/// inputs, each error at the expression's own position.
fn check_join_exprs(
    graph: &pb::JobGraph,
    spec: &pb::JoinSpec,
    left: &SchemaRef,
    right: &SchemaRef,
    compiler: &ExprCompiler,
) -> Result<()> {
    let items = spec
        .exprs
        .iter()
        .filter(|e| side_wildcard(spec, &e.sql).is_none());
    for e in spec.condition.iter().chain(items) {
        JoinOperator::check_expr(spec, left, right, compiler, &e.sql)
            .map_err(|err| locate(graph, e.location.as_ref(), "join", err))?;
    }
    Ok(())
}

/// A partitioned file sink's partition columns must be columns of its input, each once,
/// and leave the files at least one column.
fn check_partitions(spec: &pb::SinkSpec, input: &SchemaRef) -> Result<()> {
    match &spec.kind {
        Some(pb::sink_spec::Kind::File(f)) if !f.partition_by.is_empty() => {
            crate::connector::partition_columns(&f.partition_by, input).map(|_| ())
        }
        _ => Ok(()),
    }
}

/// Refuses what cannot take an updating result (`+I -U +U -D`) as its input.
fn check_updating_input(kind: &pb::node::Kind) -> Result<()> {
    let what = match kind {
        pb::node::Kind::Filter(_)
        | pb::node::Kind::Select(_)
        | pb::node::Kind::Aggregate(_)
        | pb::node::Kind::Join(_)
        | pb::node::Kind::Union(_)
        | pb::node::Kind::TopN(_) => {
            return Ok(());
        }
        pb::node::Kind::Sink(sink) => match &sink.kind {
            Some(pb::sink_spec::Kind::Kafka(_)) => {
                "the Kafka sink takes only append-only results: a retraction (-U) cannot \
                 be taken back from a topic; write the changelog to a file or stdout sink"
            }
            _ => return Ok(()),
        },
        pb::node::Kind::Window(_) => {
            "a window needs append-only input, but this one reads an updating result (an \
             unbounded GROUP BY's changelog); window before aggregating"
        }
        pb::node::Kind::Over(_) => {
            "an OVER aggregate needs append-only input, but this one reads an updating result \
             (an unbounded GROUP BY's, a join's or a Top-N's changelog)"
        }
        pb::node::Kind::Dedup(_) => {
            "deduplication needs append-only input, but this one reads an updating result \
             (an unbounded GROUP BY's changelog)"
        }
        pb::node::Kind::LookupJoin(_) => {
            "a lookup join needs append-only input, but this one reads an updating result \
             (an unbounded GROUP BY's or a Top-N's changelog)"
        }
        pb::node::Kind::Source(_) => return Ok(()),
    };
    Err(plan_err(what))
}

fn check_edge(nodes: &HashMap<u32, pb::Node>, e: &pb::Edge, upstream: &SchemaRef) -> Result<()> {
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
        _ => Ok(()),
    }
}

/// A join's inputs are each hashed on its own side's key columns, so that a key's rows of
/// both sides meet in one subtask.
fn check_join_edges(spec: &pb::JoinSpec, edges: &[&pb::Edge]) -> Result<()> {
    if spec.left_keys.is_empty() || spec.left_keys.len() != spec.right_keys.len() {
        return Err(plan_err(format!(
            "a join needs as many left as right key columns, and at least one (an equality \
             between the two sides in ON); found {} and {}",
            spec.left_keys.len(),
            spec.right_keys.len()
        )));
    }
    for (edge, keys, side) in [
        (edges[0], &spec.left_keys, "left"),
        (edges[1], &spec.right_keys, "right"),
    ] {
        if edge.partitioning() != pb::Partitioning::Hash || &edge.key_columns != keys {
            return Err(plan_err(format!(
                "the join's {side} input must be hash-partitioned on its key columns {keys:?}"
            )));
        }
    }
    Ok(())
}

fn chain(
    order: &[u32],
    nodes: &HashMap<u32, pb::Node>,
    all_incoming: &HashMap<u32, Vec<&pb::Edge>>,
    outgoing: &BTreeMap<u32, Vec<&pb::Edge>>,
    inputs: &HashMap<u32, SchemaRef>,
    right_inputs: &HashMap<u32, SchemaRef>,
) -> Vec<ChainPlan> {
    let mut chains: Vec<ChainPlan> = Vec::new();
    // For every node: its chain, and its index among the chain's operators (None: source).
    let mut place: HashMap<u32, (usize, Option<usize>)> = HashMap::new();
    let incoming = |id: u32| all_incoming.get(&id).map(|edges| edges[0]);
    for &id in order {
        let node = &nodes[&id];
        let is_source = matches!(node.kind, Some(pb::node::Kind::Source(_)));
        let joins = incoming(id)
            .filter(|_| all_incoming[&id].len() == 1)
            .and_then(|e| {
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
                let mut input = Vec::new();
                for e in all_incoming.get(&id).into_iter().flatten() {
                    let (up, side) = place[&e.source];
                    let up_chain = &mut chains[up];
                    let schema = match e.target_input {
                        0 => inputs[&id].clone(),
                        _ => right_inputs[&id].clone(),
                    };
                    up_chain.outputs.push(ChainEdge {
                        to_chain: c,
                        to_input: e.target_input as usize,
                        side_operator: if e.side_output.is_empty() { None } else { side },
                        tag: e.side_output.clone(),
                        partitioning: e.partitioning(),
                        key_columns: e.key_columns.clone(),
                        schema,
                    });
                    input.push((up, up_chain.parallelism));
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn source_columns(yaml: &str) -> Vec<String> {
        let graph = sluice_planner::job_spec::parse_job("job.yaml", yaml).unwrap();
        let plan = plan(graph, crate::connector::testing::bids())
            .await
            .unwrap();
        let src = plan.chains[0].source.unwrap();
        let Some(pb::node::Kind::Source(spec)) = &plan.node(src).kind else {
            panic!()
        };
        spec.columns.clone()
    }

    const HEAD: &str = "name: t\nsource:\n  nexmark: { stream: bid, events: 10 }\nwatermark: { column: date_time, max_out_of_orderness: 1s }\n";

    #[tokio::test]
    async fn sources_produce_only_what_the_job_reads() {
        let keyed = format!(
            "{HEAD}pipeline:\n  - filter: \"price > 10\"\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    aggregate: [\"count(*) AS n\"]\nsink:\n  blackhole: {{}}\n"
        );
        assert_eq!(
            source_columns(&keyed).await,
            ["auction", "price", "date_time"]
        );
        let projected = format!(
            "{HEAD}pipeline:\n  - select: [\"bidder * 2 AS b\"]\nsink:\n  blackhole: {{}}\n"
        );
        assert_eq!(source_columns(&projected).await, ["bidder", "date_time"]);
    }

    #[tokio::test]
    async fn sinks_and_late_outputs_keep_every_column() {
        let passthrough = format!("{HEAD}sink:\n  blackhole: {{}}\n");
        assert!(source_columns(&passthrough).await.is_empty());
        let late = format!(
            "{HEAD}pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    aggregate: [\"count(*) AS n\"]\n    late: {{ sink: {{ blackhole: {{}} }} }}\nsink:\n  blackhole: {{}}\n"
        );
        assert!(source_columns(&late).await.is_empty());
    }

    #[tokio::test]
    async fn plan_errors_name_the_expression_position() {
        let bad =
            format!("{HEAD}pipeline:\n  - filter: \"pricee > 1\"\nsink:\n  blackhole: {{}}\n");
        let graph = sluice_planner::job_spec::parse_job("job.yaml", &bad).unwrap();
        let err = plan(graph, crate::connector::testing::bids())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("job.yaml:6:13:"), "{err}");
        assert!(err.contains("pricee"), "{err}");
    }
}
