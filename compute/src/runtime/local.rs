//! Runs a [`PhysicalPlan`] inside this process: the embedded local runtime.
//!
//! Every subtask of every chain becomes a tokio task on the current (multi-threaded)
//! runtime, so parallelism > 1 runs in parallel on as many cores as the runtime has.
//! Chains are wired with byte-bounded queues (`runtime::queue`): a consumer subtask has
//! one channel per producer subtask (one for a forward edge). The first task to fail
//! cancels the others, and its error (not the knock-on "downstream gone" ones) is
//! returned.

use std::sync::Arc;

use sluice_common::key_group::key_group_range;
use sluice_common::pb;
use sluice_common::state::{KeyedStateBackend, MemoryStateBackend};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::connector::{self, SubtaskInfo};
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::keys::KeyEncoder;
use crate::operator::filter::FilterOperator;
use crate::operator::select::SelectOperator;
use crate::operator::sink::SinkOperator;
use crate::operator::window::WindowOperator;
use crate::operator::{Operator, OperatorContext};
use crate::plan::PhysicalPlan;
use crate::runtime::chain::{Chain, SideRoute, TaskOutput};
use crate::runtime::input_gate::InputGate;
use crate::runtime::metrics::JobMetrics;
use crate::runtime::queue::{self, QueueReceiver, QueueSender};
use crate::runtime::router::{OutputEdge, Partitioner};
use crate::runtime::task::{SourceInput, Task, TaskInput};
use crate::state_client::{RemoteState, RemoteStateBackend};
use crate::time::watermark::WatermarkGenerator;

/// Settings of the local runtime.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Byte budget of each channel between tasks.
    pub channel_bytes: usize,
    /// The state service a job with `state: { backend: remote }` uses.
    pub remote_state: Option<Arc<RemoteState>>,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            channel_bytes: queue::DEFAULT_CHANNEL_BYTES,
            remote_state: None,
        }
    }
}

/// Runs `plan` to completion (bounded inputs) or failure.
pub async fn run(
    plan: &PhysicalPlan,
    metrics: Arc<JobMetrics>,
    options: &LocalOptions,
) -> Result<()> {
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let remote = remote_state(plan, options)?;
    let first_epoch = match remote {
        Some(r) => r.open_all().await? + 1,
        None => 1,
    };
    let tasks = build_tasks(plan, &metrics, options, first_epoch).await?;
    let mut set = JoinSet::new();
    for task in tasks {
        set.spawn(task.run(cancel_rx.clone()));
    }
    let mut first: Option<Error> = None;
    while let Some(joined) = set.join_next().await {
        let result = joined.map_err(|e| Error::Internal(format!("a task panicked: {e}")))?;
        if let Err(e) = result {
            let _ = cancel_tx.send(true);
            if first
                .as_ref()
                .is_none_or(|f| is_knock_on(f) && !is_knock_on(&e))
            {
                first = Some(e);
            }
        }
    }
    if let Some(e) = first {
        return Err(e);
    }
    if let Some(r) = remote
        && let Some(epoch) = r.last_flushed_epoch()
    {
        // Every task flushed its last epoch at the end of input: with no coordinator to
        // commit checkpoints, the finished run commits that epoch as its checkpoint.
        r.commit(epoch, &[epoch]).await?;
    }
    Ok(())
}

/// The remote state a job needs, or an error when it asks for it and none was given.
fn remote_state<'a>(
    plan: &PhysicalPlan,
    options: &'a LocalOptions,
) -> Result<Option<&'a Arc<RemoteState>>> {
    let wants = plan
        .graph
        .state
        .as_ref()
        .is_some_and(|s| s.backend() == pb::StateBackend::Remote);
    match (&options.remote_state, wants) {
        (Some(r), true) => Ok(Some(r)),
        (None, true) => Err(Error::Plan(
            "the job asks for `state: { backend: remote }` but no state service was given".into(),
        )),
        (_, false) => Ok(None),
    }
}

/// Errors that only say another task failed first.
fn is_knock_on(e: &Error) -> bool {
    let msg = e.to_string();
    msg.contains("cancelled")
        || msg.contains("downstream task is gone")
        || msg.contains("queue closed")
}

async fn build_tasks(
    plan: &PhysicalPlan,
    metrics: &Arc<JobMetrics>,
    options: &LocalOptions,
    first_epoch: u64,
) -> Result<Vec<Task>> {
    // Input queues of every subtask of every chain that reads from another chain.
    let mut senders: Vec<Vec<Vec<QueueSender>>> = Vec::with_capacity(plan.chains.len());
    let mut receivers: Vec<Vec<Option<QueueReceiver>>> = Vec::with_capacity(plan.chains.len());
    for chain in &plan.chains {
        let (mut s, mut r) = (Vec::new(), Vec::new());
        if let Some((from, producers)) = chain.input {
            let forward = plan.chains[from]
                .outputs
                .iter()
                .any(|e| e.to_chain == chain.id && e.partitioning == pb::Partitioning::Forward);
            let channels = if forward { 1 } else { producers };
            for _ in 0..chain.parallelism {
                let (tx, rx) = queue::input_queue(channels, options.channel_bytes);
                s.push(tx);
                r.push(Some(rx));
            }
        }
        senders.push(s);
        receivers.push(r);
    }

    let compiler = ExprCompiler::new();
    let mut tasks = Vec::new();
    for chain in &plan.chains {
        for subtask in 0..chain.parallelism {
            let info = SubtaskInfo {
                index: subtask,
                parallelism: chain.parallelism,
            };
            let mut operators: Vec<Box<dyn Operator>> = Vec::new();
            let mut contexts = Vec::new();
            for &id in &chain.operators {
                let node = plan.node(id);
                let remote = remote_state(plan, options)?.map(|r| {
                    let groups = key_group_range(
                        plan.max_parallelism,
                        chain.parallelism as u32,
                        subtask as u32,
                    );
                    Arc::new(r.backend(groups, first_epoch))
                });
                let op = build_operator(plan, node, info, &compiler, metrics, remote)
                    .await
                    .map_err(|e| plan.locate(node, e))?;
                operators.push(op);
                contexts.push(OperatorContext {
                    node_id: id,
                    node_name: node.name.clone(),
                    subtask,
                    parallelism: chain.parallelism,
                    max_parallelism: plan.max_parallelism,
                });
            }
            let mut output = TaskOutput::default();
            for edge in &chain.outputs {
                let targets = &senders[edge.to_chain];
                let channel = |consumer: usize| -> QueueSender {
                    let chans = &targets[consumer];
                    if chans.len() == 1 {
                        chans[0].clone()
                    } else {
                        chans[subtask].clone()
                    }
                };
                let (partitioner, to): (Partitioner, Vec<QueueSender>) = match edge.partitioning {
                    pb::Partitioning::Forward => (Partitioner::Forward, vec![channel(subtask)]),
                    pb::Partitioning::Hash => (
                        Partitioner::Hash {
                            encoder: KeyEncoder::new(&edge.schema, &edge.key_columns)?,
                            max_parallelism: plan.max_parallelism,
                        },
                        (0..targets.len()).map(channel).collect(),
                    ),
                    pb::Partitioning::Rebalance => (
                        Partitioner::Rebalance,
                        (0..targets.len()).map(channel).collect(),
                    ),
                    pb::Partitioning::Broadcast => (
                        Partitioner::Broadcast,
                        (0..targets.len()).map(channel).collect(),
                    ),
                };
                let out_edge = OutputEdge::new(partitioner, to);
                match edge.side_operator {
                    Some(operator) if !edge.tag.is_empty() => output.side.push(SideRoute {
                        operator,
                        tag: edge.tag.clone(),
                        edge: out_edge,
                    }),
                    _ => output.main.push(out_edge),
                }
            }
            let input = match chain.source {
                Some(id) => {
                    let node = plan.node(id);
                    let Some(pb::node::Kind::Source(spec)) = &node.kind else {
                        return Err(Error::Internal("chain source is not a source".into()));
                    };
                    let reader = connector::create_source(spec, info)
                        .await
                        .map_err(|e| plan.locate(node, e))?;
                    let watermarks = match &spec.watermark {
                        Some(wm) => Some(WatermarkGenerator::new(
                            wm,
                            &reader.schema(),
                            reader.num_splits(),
                        )?),
                        None => None,
                    };
                    TaskInput::Source(Box::new(SourceInput {
                        reader,
                        watermarks,
                        watermark_cell: metrics.source_watermark(),
                        records_in: metrics.records_in.clone(),
                        skipped: metrics.skipped_records.clone(),
                    }))
                }
                None => {
                    let rx = receivers[chain.id][subtask]
                        .take()
                        .ok_or_else(|| Error::Internal("input queue taken twice".into()))?;
                    TaskInput::Gate(InputGate::new(rx))
                }
            };
            let first = chain
                .source
                .or(chain.operators.first().copied())
                .unwrap_or_default();
            tasks.push(Task {
                name: format!("{}[{subtask}]", plan.node(first).name),
                input,
                chain: Chain::new(operators),
                contexts,
                output,
            });
        }
    }
    Ok(tasks)
}

async fn build_operator(
    plan: &PhysicalPlan,
    node: &pb::Node,
    info: SubtaskInfo,
    compiler: &ExprCompiler,
    metrics: &Arc<JobMetrics>,
    remote: Option<Arc<RemoteStateBackend>>,
) -> Result<Box<dyn Operator>> {
    let input = plan.input_schema(node.id);
    Ok(match &node.kind {
        Some(pb::node::Kind::Filter(spec)) => {
            Box::new(FilterOperator::build(spec, &input, compiler)?)
        }
        Some(pb::node::Kind::Select(spec)) => {
            Box::new(SelectOperator::build(spec, &input, compiler)?)
        }
        Some(pb::node::Kind::Window(spec)) => {
            let state: Arc<dyn KeyedStateBackend> = Arc::new(MemoryStateBackend::new());
            let op = WindowOperator::build(
                node.id,
                spec,
                &input,
                compiler,
                state,
                metrics.window_counters(),
            )?;
            Box::new(match remote {
                Some(remote) => op.with_remote_state(remote),
                None => op,
            })
        }
        Some(pb::node::Kind::Sink(spec)) => {
            let writer = connector::create_sink(spec, input, info).await?;
            Box::new(SinkOperator::new(writer, metrics.records_out.clone()))
        }
        Some(pb::node::Kind::Source(_)) | None => {
            return Err(Error::Internal(format!(
                "node `{}` cannot be a chained operator",
                node.name
            )));
        }
    })
}
