//! Builds the tasks of the subtasks placed on this process, wired to each other with
//! local queues and to other workers through the data plane.
//!
//! [`Placement`] says which worker runs each subtask: subtasks are dealt round-robin
//! over the workers in chain order (the `k`-th subtask of the job, counting chains in
//! order, goes to worker `k mod N`), which every worker computes alike from the same
//! plan. A channel whose both ends are on this worker is a byte-bounded queue; a channel
//! that crosses workers becomes a subpartition on the producer's side and a remote input
//! channel on the consumer's ([`NetworkBuilder`]). Channel ids are
//! `(consumer chain, consumer subtask, channel index)`, the same on both sides.
//!
//! `sluice run` without `--workers` is the one-worker case, under a coordinator too.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use sluice_common::channel_state::{ChannelKey, ChannelPart};
use sluice_common::key_group::key_group_range;
use sluice_common::pb;
use sluice_common::state::{MemoryStateStore, StateStore};

use crate::connector::SubtaskInfo;
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::keyed::OperatorState;
use crate::keys::KeyEncoder;
use crate::network::environment::NetworkBuilder;
use crate::network::frame::ChannelId;
use crate::operator::aggregate::AggregateOperator;
use crate::operator::dedup::DedupOperator;
use crate::operator::filter::FilterOperator;
use crate::operator::join::JoinOperator;
use crate::operator::lookup_join::LookupJoinOperator;
use crate::operator::over::OverOperator;
use crate::operator::select::SelectOperator;
use crate::operator::sink::SinkOperator;
use crate::operator::top_n::TopNOperator;
use crate::operator::union::UnionOperator;
use crate::operator::window::WindowOperator;
use crate::operator::{Operator, OperatorContext};
use crate::plan::PhysicalPlan;
use crate::queue::{self, QueueReceiver, QueueSender};
use crate::runtime::alignment::Alignment;
use crate::runtime::chain::{Chain, SideRoute, TaskOutput};
use crate::runtime::channel_state::{ReplayTarget, replay_for};
use crate::runtime::debloat::DebloatConfig;
use crate::runtime::input_gate::InputGate;
use crate::runtime::metrics::{JobMetrics, TaskMetrics};
use crate::runtime::router::{ChannelSender, OutputEdge, Partitioner};
use crate::runtime::task::{SourceInput, Task, TaskInput};
use crate::time::watermark::WatermarkGenerator;

/// Which worker runs each subtask.
#[derive(Debug, Clone)]
pub struct Placement {
    workers: u32,
    offsets: Vec<usize>,
}

impl Placement {
    /// Subtasks of `plan` dealt round-robin over `workers`.
    pub fn round_robin(plan: &PhysicalPlan, workers: u32) -> Self {
        let mut offsets = Vec::with_capacity(plan.chains.len());
        let mut k = 0;
        for c in &plan.chains {
            offsets.push(k);
            k += c.parallelism;
        }
        Self {
            workers: workers.max(1),
            offsets,
        }
    }

    /// The worker of `subtask` of `chain`.
    pub fn worker_of(&self, chain: usize, subtask: usize) -> u32 {
        ((self.offsets[chain] + subtask) % self.workers as usize) as u32
    }

    /// Number of workers.
    pub fn workers(&self) -> u32 {
        self.workers
    }
}

/// What every recorded source position's name starts with.
const POSITION_PREFIX: &str = "source/";

/// The name under which a checkpoint records where split `split` of source node `node`
/// stood.
pub fn position_key(node: u32, split: &str) -> String {
    format!("{POSITION_PREFIX}{node}/{split}")
}

/// Settings of task building.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Byte budget of each local channel.
    pub channel_bytes: usize,
    /// The job's keyed state: required for `state: { backend: remote }` (the state
    /// service); without it a job keeps its state in a store of its own in memory.
    pub state: Option<Arc<dyn StateStore>>,
    /// The epoch state writes start in (the restored checkpoint + 1).
    pub first_epoch: u64,
    /// The checkpoint the tasks resume from (a restart, a rescale, a savepoint).
    pub restore: Option<RestoreFrom>,
    /// The job takes checkpoints under its coordinator (sinks then wait for the final
    /// checkpoint to commit their last output).
    pub coordinated_checkpoints: bool,
    /// Where aligned sources join their groups (watermark alignment); without it (no
    /// coordinator to align across workers) sources never pause.
    pub alignment: Option<Arc<Alignment>>,
    /// The deployment attempt's fence (0: unfenced), given to sinks.
    pub fence: u64,
}

/// A checkpoint to resume from.
#[derive(Debug, Clone, Default)]
pub struct RestoreFrom {
    /// Its id; 0 when the job restarts before any checkpoint completed.
    pub checkpoint_id: u64,
    /// Where every source split stood, by split name.
    pub positions: HashMap<String, Bytes>,
    /// What sinks pre-committed, by state key.
    pub sink_states: HashMap<String, Bytes>,
    /// The in-flight elements of an unaligned checkpoint, every task's parts.
    pub channel_state: Vec<ChannelPart>,
}

impl RestoreFrom {
    /// Checkpoint `checkpoint_id` with what its tasks recorded: source positions and
    /// (under [`SinkOperator::state_key`]s) sinks' states, told apart here.
    pub fn new(checkpoint_id: u64, recorded: impl IntoIterator<Item = (String, Bytes)>) -> Self {
        let (sink_states, positions) = recorded
            .into_iter()
            .partition(|(k, _)| SinkOperator::is_state_key(k));
        Self {
            checkpoint_id,
            positions,
            sink_states,
            channel_state: Vec::new(),
        }
    }

    /// Where the splits of source node `node` stood, by split name. A checkpoint taken
    /// before positions were recorded per source node holds bare split names, which
    /// all belong to its one source.
    pub fn positions_of(&self, node: u32) -> HashMap<String, Bytes> {
        let prefix = position_key(node, "");
        if !self
            .positions
            .keys()
            .any(|k| k.starts_with(POSITION_PREFIX))
        {
            return self.positions.clone();
        }
        self.positions
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), v.clone())))
            .collect()
    }

    /// With the channel-state objects its tasks recorded (an unaligned checkpoint).
    pub fn with_channel_state(mut self, objects: &[Bytes]) -> Result<Self> {
        for object in objects {
            let parts = sluice_common::channel_state::decode(object).map_err(|e| {
                Error::Plan(format!(
                    "checkpoint {}'s channel state cannot be read: {e}",
                    self.checkpoint_id
                ))
            })?;
            self.channel_state.extend(parts);
        }
        Ok(self)
    }

    /// The lines every subtask of sink node `node` recorded, in subtask order.
    pub fn sink_state(&self, node: u32) -> Vec<String> {
        let prefix = SinkOperator::state_prefix(node);
        let mut states: Vec<(usize, &Bytes)> = self
            .sink_states
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.parse().ok()?, v)))
            .collect();
        states.sort_by_key(|(subtask, _)| *subtask);
        states
            .into_iter()
            .flat_map(|(_, v)| SinkOperator::decode_state(v))
            .collect()
    }
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            channel_bytes: queue::DEFAULT_CHANNEL_BYTES,
            state: None,
            first_epoch: 1,
            restore: None,
            coordinated_checkpoints: false,
            alignment: None,
            fence: 0,
        }
    }
}

/// Whether the job keeps its state in the state service.
pub fn wants_remote_state(plan: &PhysicalPlan) -> bool {
    plan.graph
        .state
        .as_ref()
        .is_some_and(|s| s.backend() == pb::StateBackend::Remote)
}

/// Whether the job takes checkpoints.
pub fn takes_checkpoints(plan: &PhysicalPlan) -> bool {
    plan.graph
        .checkpoint
        .as_ref()
        .is_some_and(|c| c.interval_ms > 0)
}

/// The job's store: the one given, or (memory state) a new one in this process; an
/// error when the job asks for the state service and none was given.
pub fn job_store(plan: &PhysicalPlan, options: &BuildOptions) -> Result<Arc<dyn StateStore>> {
    match (&options.state, wants_remote_state(plan)) {
        (Some(s), _) => Ok(s.clone()),
        (None, true) => Err(Error::Plan(
            "the job asks for `state: { backend: remote }` but no state service was given".into(),
        )),
        (None, false) => Ok(Arc::new(MemoryStateStore::new(takes_checkpoints(plan)))),
    }
}

/// Whether operators of this kind keep keyed state.
fn keeps_state(kind: Option<&pb::node::Kind>) -> bool {
    kind.is_some_and(pb::node::Kind::keeps_state)
}

fn task_name(plan: &PhysicalPlan, chain: usize, subtask: usize) -> String {
    format!("{}[{subtask}]", plan.node(first_node(plan, chain)).name)
}

/// The id of a chain's first node, which names its tasks to the coordinator.
fn first_node(plan: &PhysicalPlan, chain: usize) -> u32 {
    let c = &plan.chains[chain];
    c.source
        .or(c.operators.first().copied())
        .unwrap_or_default()
}

/// Builds the tasks that `placement` puts on worker `me`; remote channels are
/// registered with `net` (required when there is more than one worker).
pub async fn build_tasks(
    plan: &PhysicalPlan,
    metrics: &Arc<JobMetrics>,
    options: &BuildOptions,
    placement: &Placement,
    me: u32,
    mut net: Option<&mut NetworkBuilder>,
) -> Result<Vec<Task>> {
    let local = |chain: usize, subtask: usize| placement.worker_of(chain, subtask) == me;
    let no_net = || Error::Internal("a remote channel without a network".into());
    // Input queues of every local subtask that reads from another chain; a slot per
    // channel, `None` where the producer is remote.
    let mut senders: Vec<Vec<Vec<Option<QueueSender>>>> = Vec::with_capacity(plan.chains.len());
    let mut receivers: Vec<Vec<Option<QueueReceiver>>> = Vec::with_capacity(plan.chains.len());
    for chain in &plan.chains {
        let (mut s, mut r) = (Vec::new(), Vec::new());
        if !chain.input.is_empty() {
            let layout = gate_layout(plan, chain.id);
            let channels = layout.len();
            for subtask in 0..chain.parallelism {
                if !local(chain.id, subtask) {
                    s.push(Vec::new());
                    r.push(None);
                    continue;
                }
                let (tx, mut rx) = queue::input_queue(channels, options.channel_bytes);
                let pool = net.as_ref().map(|n| n.floating_pool());
                let mut slots = Vec::with_capacity(channels);
                for (c, sender) in tx.into_iter().enumerate() {
                    let producer = layout[c].producer.unwrap_or(subtask);
                    let worker = placement.worker_of(layout[c].from, producer);
                    if worker == me {
                        slots.push(Some(sender));
                    } else {
                        let n = net.as_deref_mut().ok_or_else(no_net)?;
                        let id = ChannelId {
                            chain: chain.id as u32,
                            subtask: subtask as u32,
                            channel: c as u32,
                        };
                        let pool = pool.as_ref().ok_or_else(no_net)?;
                        let credit = n.input(
                            &task_name(plan, chain.id, subtask),
                            worker,
                            id,
                            sender.into_inlet(),
                            pool,
                        );
                        rx.set_bound(c, credit);
                        slots.push(None);
                    }
                }
                s.push(slots);
                r.push(Some(rx));
            }
        }
        senders.push(s);
        receivers.push(r);
    }

    let compiler = ExprCompiler::new();
    let keyed = plan
        .graph
        .nodes
        .iter()
        .any(|n| keeps_state(n.kind.as_ref()));
    let store = if keyed {
        Some(job_store(plan, options)?)
    } else {
        None
    };
    let checkpointed = takes_checkpoints(plan);
    let cache_bytes = plan
        .graph
        .state
        .as_ref()
        .map_or(0, |s| usize::try_from(s.cache_bytes).unwrap_or(usize::MAX));
    let aligned_timeout = plan
        .graph
        .checkpoint
        .as_ref()
        .filter(|c| c.aligned_timeout_ms > 0)
        .map(|c| std::time::Duration::from_millis(c.aligned_timeout_ms));
    let unaligned = plan.graph.checkpoint.as_ref().is_some_and(|c| {
        c.interval_ms > 0 && c.mode == sluice_common::pb::CheckpointMode::Unaligned as i32
    });
    let debloat = plan
        .graph
        .network
        .as_ref()
        .filter(|n| n.debloat_target_ms > 0)
        .map(|n| DebloatConfig {
            target: std::time::Duration::from_millis(n.debloat_target_ms),
            max_channel_bytes: options.channel_bytes,
        });
    let mut tasks = Vec::new();
    for chain in &plan.chains {
        // `subtask` names the task, its channels and its contexts, not only an index.
        #[allow(clippy::needless_range_loop)]
        for subtask in 0..chain.parallelism {
            if !local(chain.id, subtask) {
                continue;
            }
            let name = task_name(plan, chain.id, subtask);
            let task_metrics = Arc::new(TaskMetrics::new(name.clone()));
            let info = SubtaskInfo {
                index: subtask,
                parallelism: chain.parallelism,
                fence: options.fence,
            };
            let mut operators: Vec<Box<dyn Operator>> = Vec::new();
            let mut contexts = Vec::new();
            for &id in &chain.operators {
                let node = plan.node(id);
                let state = match &store {
                    Some(store) if keeps_state(node.kind.as_ref()) => {
                        let groups = key_group_range(
                            plan.max_parallelism,
                            chain.parallelism as u32,
                            subtask as u32,
                        );
                        let state = OperatorState::new(
                            store.clone(),
                            id,
                            groups,
                            options.first_epoch,
                            checkpointed,
                        );
                        Some(match cache_bytes {
                            0 => state,
                            n => state.with_cache_bytes(n),
                        })
                    }
                    _ => None,
                };
                let restored = options.restore.as_ref();
                let coordinated = options.coordinated_checkpoints;
                let op = build_operator(
                    plan,
                    node,
                    info,
                    &compiler,
                    metrics,
                    &task_metrics,
                    restored,
                    coordinated,
                )
                .await
                .map_err(|e| plan.locate(node, e))?;
                operators.push(op);
                contexts.push(OperatorContext {
                    node_id: id,
                    node_name: node.name.clone(),
                    subtask,
                    parallelism: chain.parallelism,
                    max_parallelism: plan.max_parallelism,
                    state,
                });
            }
            let mut output = TaskOutput::default();
            for edge in &chain.outputs {
                let to = edge.to_chain;
                let consumers = plan.chains[to].parallelism;
                let forward = edge.partitioning == pb::Partitioning::Forward;
                let offset = input_offset(plan, to, edge.to_input);
                let mut channel = |consumer: usize| -> Result<ChannelSender> {
                    let c = offset + if forward { 0 } else { subtask };
                    if local(to, consumer) {
                        let s = senders[to][consumer][c]
                            .clone()
                            .ok_or_else(|| Error::Internal("local channel missing".into()))?;
                        Ok(ChannelSender::Local(s))
                    } else {
                        let n = net.as_deref_mut().ok_or_else(no_net)?;
                        let id = ChannelId {
                            chain: to as u32,
                            subtask: consumer as u32,
                            channel: c as u32,
                        };
                        Ok(ChannelSender::Remote(n.output(
                            &name,
                            placement.worker_of(to, consumer),
                            id,
                        )))
                    }
                };
                let (partitioner, targets): (Partitioner, Vec<ChannelSender>) = match edge
                    .partitioning
                {
                    pb::Partitioning::Forward => (Partitioner::Forward, vec![channel(subtask)?]),
                    pb::Partitioning::Hash => (
                        Partitioner::Hash {
                            encoder: KeyEncoder::new(&edge.schema, &edge.key_columns)?,
                            max_parallelism: plan.max_parallelism,
                        },
                        (0..consumers).map(&mut channel).collect::<Result<_>>()?,
                    ),
                    pb::Partitioning::Rebalance => (
                        Partitioner::Rebalance,
                        (0..consumers).map(&mut channel).collect::<Result<_>>()?,
                    ),
                    pb::Partitioning::Broadcast => (
                        Partitioner::Broadcast,
                        (0..consumers).map(&mut channel).collect::<Result<_>>()?,
                    ),
                };
                let keys = match edge.partitioning {
                    pb::Partitioning::Forward => vec![subtask],
                    _ => (0..consumers).collect(),
                }
                .into_iter()
                .map(|consumer| ChannelKey {
                    consumer_node: first_node(plan, to),
                    consumer_subtask: consumer as u32,
                    consumer_parallelism: consumers as u32,
                    producer_subtask: subtask as u32,
                    producer_parallelism: chain.parallelism as u32,
                })
                .collect();
                let out_edge =
                    OutputEdge::with_channels(partitioner, targets, task_metrics.clone())
                        .with_channel_keys(keys);
                match edge.side_operator {
                    Some(operator) if !edge.tag.is_empty() => output.side.push(SideRoute {
                        operator,
                        tag: edge.tag.clone(),
                        edge: out_edge,
                    }),
                    _ => output.main.push(out_edge),
                }
            }
            let mut channel_keys = Vec::new();
            let input = match chain.source {
                Some(id) => {
                    let node = plan.node(id);
                    let Some(pb::node::Kind::Source(spec)) = &node.kind else {
                        return Err(Error::Internal("chain source is not a source".into()));
                    };
                    let mut reader = plan
                        .connectors
                        .create_source(spec, info)
                        .await
                        .map_err(|e| plan.locate(node, e))?;
                    if let Some(r) = &options.restore {
                        reader
                            .restore(&r.positions_of(id))
                            .map_err(|e| plan.locate(node, e))?;
                    }
                    let watermarks = match &spec.watermark {
                        Some(wm) => Some(WatermarkGenerator::new(
                            wm,
                            &reader.schema(),
                            reader.num_splits(),
                            reader.splits_read_concurrently(),
                        )?),
                        None => None,
                    };
                    metrics.add_source(task_metrics.clone());
                    let alignment = match (
                        spec.watermark.as_ref().and_then(|w| w.alignment.as_ref()),
                        &options.alignment,
                    ) {
                        (Some(a), Some(hub)) => {
                            Some(hub.join((first_node(plan, chain.id), subtask as u32), a))
                        }
                        (Some(_), None) => {
                            tracing::warn!(
                                "{name}: watermark alignment needs a coordinator; the source \
                                 reads without pausing"
                            );
                            None
                        }
                        _ => None,
                    };
                    TaskInput::Source(Box::new(SourceInput {
                        reader,
                        watermarks,
                        alignment,
                        records_in: metrics.records_in.clone(),
                        skipped: metrics.skipped_records.clone(),
                        holder: None,
                        reported: Default::default(),
                    }))
                }
                None => {
                    let rx = receivers[chain.id][subtask]
                        .take()
                        .ok_or_else(|| Error::Internal("input queue taken twice".into()))?;
                    let layout = gate_layout(plan, chain.id);
                    let mut gate = InputGate::new(rx)
                        .with_inputs(layout.iter().map(|g| g.input).collect())
                        .with_aligned_timeout(aligned_timeout)
                        .with_unaligned(unaligned)
                        .with_monitor(task_metrics.clone(), debloat);
                    let target = replay_target(plan, chain.id, subtask)?;
                    channel_keys = layout
                        .iter()
                        .map(|g| ChannelKey {
                            consumer_node: target.consumer_node,
                            consumer_subtask: target.consumer_subtask,
                            consumer_parallelism: target.consumer_parallelism,
                            producer_subtask: g.producer.unwrap_or(subtask) as u32,
                            producer_parallelism: plan.chains[g.from].parallelism as u32,
                        })
                        .collect();
                    if let Some(r) = options.restore.as_ref()
                        && !r.channel_state.is_empty()
                    {
                        for (ch, elements) in replay_for(&r.channel_state, &target)? {
                            gate.replay(ch, elements);
                        }
                    }
                    TaskInput::Gate(gate)
                }
            };
            tasks.push(Task {
                name,
                id: (first_node(plan, chain.id), subtask as u32),
                input,
                chain: Chain::with_contexts(operators, &contexts),
                contexts,
                output,
                metrics: task_metrics,
                channel_keys,
                unaligned: Vec::new(),
                held: Vec::new(),
                aligned_timeout,
                link: None,
            });
        }
    }
    Ok(tasks)
}

/// Whether `chain` reads its (first) input over a forward edge (one channel).
fn forward_input(plan: &PhysicalPlan, chain: usize) -> bool {
    input_edge(plan, chain, 0).is_some_and(|e| e.partitioning == pb::Partitioning::Forward)
}

/// The edge into input `input` of `chain` from its upstream chain.
fn input_edge(plan: &PhysicalPlan, chain: usize, input: usize) -> Option<&crate::plan::ChainEdge> {
    let (from, _) = *plan.chains[chain].input.get(input)?;
    plan.chains[from]
        .outputs
        .iter()
        .find(|e| e.to_chain == chain && e.to_input == input)
}

/// One channel of a chain's input gate.
struct GateChannel {
    /// Which input of the chain it belongs to.
    input: usize,
    /// The producing chain.
    from: usize,
    /// The producing subtask; `None` over a forward edge: the consumer's own.
    producer: Option<usize>,
}

/// The channels of `chain`'s input gate, input after input: one over a forward edge,
/// one per producing subtask otherwise.
fn gate_layout(plan: &PhysicalPlan, chain: usize) -> Vec<GateChannel> {
    let mut layout = Vec::new();
    for (input, &(from, producers)) in plan.chains[chain].input.iter().enumerate() {
        let forward = input_edge(plan, chain, input)
            .is_some_and(|e| e.partitioning == pb::Partitioning::Forward);
        if forward {
            layout.push(GateChannel {
                input,
                from,
                producer: None,
            });
        } else {
            layout.extend((0..producers).map(|p| GateChannel {
                input,
                from,
                producer: Some(p),
            }));
        }
    }
    layout
}

/// The index of input `input`'s first channel in `chain`'s gate.
fn input_offset(plan: &PhysicalPlan, chain: usize, input: usize) -> usize {
    let layout = gate_layout(plan, chain);
    layout
        .iter()
        .position(|g| g.input == input)
        .unwrap_or(layout.len())
}

/// Subtask `subtask` of `chain` as a restored checkpoint's channel state is replayed
/// into it.
fn replay_target(plan: &PhysicalPlan, chain: usize, subtask: usize) -> Result<ReplayTarget> {
    let edge = input_edge(plan, chain, 0);
    let hash = match edge {
        Some(e) if e.partitioning == pb::Partitioning::Hash => Some((
            KeyEncoder::new(&e.schema, &e.key_columns)?,
            plan.max_parallelism,
        )),
        _ => None,
    };
    Ok(ReplayTarget {
        consumer_node: first_node(plan, chain),
        consumer_subtask: subtask as u32,
        consumer_parallelism: plan.chains[chain].parallelism as u32,
        producer_parallelism: plan.chains[chain]
            .input
            .first()
            .map_or(0, |(_, p)| *p as u32),
        forward: forward_input(plan, chain),
        hash,
    })
}

#[allow(clippy::too_many_arguments)]
async fn build_operator(
    plan: &PhysicalPlan,
    node: &pb::Node,
    info: SubtaskInfo,
    compiler: &ExprCompiler,
    metrics: &Arc<JobMetrics>,
    task_metrics: &TaskMetrics,
    restored: Option<&RestoreFrom>,
    coordinated: bool,
) -> Result<Box<dyn Operator>> {
    let input = plan.input_schema(node.id);
    Ok(match &node.kind {
        Some(pb::node::Kind::Filter(spec)) => {
            Box::new(FilterOperator::build(spec, &input, compiler)?)
        }
        Some(pb::node::Kind::Select(spec)) => {
            Box::new(SelectOperator::build(spec, &input, compiler)?)
        }
        Some(pb::node::Kind::Window(spec)) => Box::new(WindowOperator::build(
            spec,
            &input,
            compiler,
            metrics.window_counters(task_metrics.cache.clone()),
        )?),
        Some(pb::node::Kind::Dedup(spec)) => Box::new(DedupOperator::build(spec, &input)?),
        Some(pb::node::Kind::Aggregate(spec)) => {
            Box::new(AggregateOperator::build(spec, &input, compiler)?)
        }
        Some(pb::node::Kind::TopN(spec)) => Box::new(TopNOperator::build(spec, &input)?),
        Some(pb::node::Kind::Over(spec)) => Box::new(OverOperator::build(
            spec,
            &input,
            compiler,
            metrics.window_counters(task_metrics.cache.clone()),
        )?),
        Some(pb::node::Kind::Join(spec)) => {
            let right = plan.right_input_schema(node.id)?;
            Box::new(JoinOperator::build(spec, &input, &right, compiler)?)
        }
        Some(pb::node::Kind::Union(_)) => {
            let right = plan.right_input_schema(node.id)?;
            Box::new(UnionOperator::build(&input, &right)?)
        }
        Some(pb::node::Kind::LookupJoin(spec)) => {
            let table = plan.right_input_schema(node.id)?;
            let mut op = LookupJoinOperator::build(spec, &input, &table, compiler)?;
            let Some(table_spec) = &spec.table else {
                return Err(Error::Internal("a lookup join without its table".into()));
            };
            // The whole table, whatever this subtask's index: one reader of every split.
            let whole = SubtaskInfo {
                index: 0,
                parallelism: 1,
                fence: 0,
            };
            let mut reader = plan.connectors.create_source(table_spec, whole).await?;
            while let Some(b) = reader.next_batch().await? {
                op.load(&b.batch)?;
            }
            tracing::debug!(node = %node.name, rows = op.table_rows(), "lookup join table read");
            Box::new(op)
        }
        Some(pb::node::Kind::Sink(spec)) => {
            let writer = plan.connectors.create_sink(spec, input, info).await?;
            let sink = SinkOperator::new(
                writer,
                metrics.records_out.clone(),
                metrics.sink_barriers.clone(),
            )
            .with_state_key(node.id, info.index);
            let sink = match restored {
                Some(r) => sink.restored_from(r.checkpoint_id, r.sink_state(node.id)),
                None => sink,
            };
            Box::new(if coordinated {
                sink.with_final_checkpoint()
            } else {
                sink
            })
        }
        Some(pb::node::Kind::Source(_)) | None => {
            return Err(Error::Internal(format!(
                "node `{}` cannot be a chained operator",
                node.name
            )));
        }
    })
}
