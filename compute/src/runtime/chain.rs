//! Chained operators: several operators of one task called in sequence, no queue between.
//!
//! What operator `i` emits on its main output is handed to operator `i + 1` before the
//! chain takes the next input element; what the last one emits goes to the task's router.
//! Side outputs (e.g. late records) are routed from whichever operator emitted them.
//!
//! # State epochs
//! The chain drives the keyed state of its operators: when a barrier has passed operator
//! `i` (its `on_barrier` returned), the chain cuts operator `i`'s epoch before the
//! barrier reaches operator `i + 1` (later writes belong to the next epoch) and keeps
//! the future of its durability for the task, which acknowledges the checkpoint once
//! every such future completed, processing on meanwhile; at the end of the input it
//! seals what the operators wrote on closing; a completed checkpoint reaches every
//! operator's state after the operator itself. Operators never do either.

use bytes::Bytes;

use crate::element::{Barrier, StreamElement};
use crate::error::Result;
use crate::keyed::{Durable, OperatorState};
use crate::operator::{Operator, OperatorContext, Output};
use crate::runtime::router::OutputEdge;

/// Where side outputs of one operator of the chain go.
#[derive(Debug)]
pub struct SideRoute {
    /// Index of the emitting operator in the chain.
    pub operator: usize,
    /// The side output's name.
    pub tag: String,
    /// Its edge.
    pub edge: OutputEdge,
}

/// The output of a task: main edges after the last operator, side edges per operator.
#[derive(Debug, Default)]
pub struct TaskOutput {
    /// Edges fed by the chain's main output.
    pub main: Vec<OutputEdge>,
    /// Edges fed by side outputs.
    pub side: Vec<SideRoute>,
}

impl TaskOutput {
    /// Sends `element` on every main edge.
    pub async fn emit(&mut self, element: &StreamElement) -> Result<()> {
        for edge in &mut self.main {
            edge.emit(element).await?;
        }
        Ok(())
    }

    /// Whether every channel of every edge has room for an ordinary element.
    pub fn has_room(&self) -> bool {
        self.main.iter().all(OutputEdge::has_room) && self.side.iter().all(|r| r.edge.has_room())
    }

    /// Until every channel of every edge has had room (the caller checks again).
    pub async fn room(&self) {
        for edge in self.main.iter().chain(self.side.iter().map(|r| &r.edge)) {
            edge.room().await;
        }
    }

    /// Whether aligned barrier `checkpoint_id` still queues at a remote channel.
    pub fn barrier_queued(&self, checkpoint_id: u64) -> bool {
        self.main
            .iter()
            .chain(self.side.iter().map(|r| &r.edge))
            .any(|e| e.barrier_queued(checkpoint_id))
    }

    /// Aligned barrier `checkpoint_id` overtakes what queues in front of it on every
    /// edge ([`Self::take_output_state`] returns what it overtook).
    pub fn overtake(&mut self, checkpoint_id: u64) -> Result<()> {
        for e in self
            .main
            .iter_mut()
            .chain(self.side.iter_mut().map(|r| &mut r.edge))
        {
            e.overtake(checkpoint_id)?;
        }
        Ok(())
    }

    /// Whether every consumer took everything this (finished) task sent.
    pub fn drained(&self) -> bool {
        self.main
            .iter()
            .chain(self.side.iter().map(|r| &r.edge))
            .all(OutputEdge::drained)
    }

    /// Sends unaligned barrier `element` ahead of what queues on every edge.
    pub fn emit_priority(&mut self, element: &StreamElement) -> Result<()> {
        for e in self
            .main
            .iter_mut()
            .chain(self.side.iter_mut().map(|r| &mut r.edge))
        {
            e.emit_priority(element)?;
        }
        Ok(())
    }

    /// The output channel state the last unaligned barrier left on every edge.
    pub fn take_output_state(&mut self) -> Vec<sluice_common::channel_state::ChannelPart> {
        let side = self.side.iter_mut().map(|r| &mut r.edge);
        self.main
            .iter_mut()
            .chain(side)
            .flat_map(OutputEdge::take_output_state)
            .collect()
    }

    /// Sends control `element` on every edge, side ones included.
    pub async fn broadcast(&mut self, element: &StreamElement) -> Result<()> {
        self.emit(element).await?;
        for route in &mut self.side {
            route.edge.emit(element).await?;
        }
        Ok(())
    }
}

/// The operators of one task.
pub struct Chain {
    operators: Vec<Box<dyn Operator>>,
    /// Each operator's keyed state, when it keeps any.
    states: Vec<Option<OperatorState>>,
    /// Durability of the epochs cut at barriers, by checkpoint, until the task takes it.
    durable: Vec<(u64, Durable)>,
}

impl Chain {
    /// A chain of `operators`, called in order; none keeps keyed state.
    pub fn new(operators: Vec<Box<dyn Operator>>) -> Self {
        let states = operators.iter().map(|_| None).collect();
        Self {
            operators,
            states,
            durable: Vec::new(),
        }
    }

    /// A chain of `operators` with the state each one's context gives it.
    pub fn with_contexts(operators: Vec<Box<dyn Operator>>, contexts: &[OperatorContext]) -> Self {
        let states = contexts.iter().map(|c| c.state.clone()).collect();
        Self {
            operators,
            states,
            durable: Vec::new(),
        }
    }

    /// Whether any operator needs processing-time ticks.
    pub fn wants_processing_time(&self) -> bool {
        self.operators.iter().any(|o| o.wants_processing_time())
    }

    /// Opens every operator.
    pub async fn open(&mut self, ctxs: &[crate::operator::OperatorContext]) -> Result<()> {
        for (op, ctx) in self.operators.iter_mut().zip(ctxs) {
            op.open(ctx).await?;
        }
        Ok(())
    }

    /// Pushes one input element through the chain into `output`.
    pub async fn push(&mut self, element: StreamElement, output: &mut TaskOutput) -> Result<()> {
        self.run_from(0, vec![element], output).await
    }

    /// Pushes a batch of input `input` (of a two-input head operator) through the chain.
    pub async fn push_input(
        &mut self,
        input: usize,
        batch: arrow::record_batch::RecordBatch,
        output: &mut TaskOutput,
    ) -> Result<()> {
        if input == 0 {
            return self.push(StreamElement::Batch(batch), output).await;
        }
        let Some(head) = self.operators.first_mut() else {
            return Err(crate::error::Error::Internal(
                "a batch of a second input reached an empty chain".into(),
            ));
        };
        let mut out = Output::default();
        head.process_input(input, batch, &mut out).await?;
        self.forward(0, out, output).await?;
        self.drain_more(0, output).await
    }

    /// A processing-time tick for every operator.
    pub async fn tick(&mut self, now: i64, output: &mut TaskOutput) -> Result<()> {
        for i in 0..self.operators.len() {
            let mut out = Output::default();
            self.operators[i].on_processing_time(now, &mut out).await?;
            self.forward(i, out, output).await?;
            self.drain_more(i, output).await?;
        }
        Ok(())
    }

    /// Takes a checkpoint after the input ended: every operator handles `barrier` as if
    /// it had arrived (windows flush their state epoch, sinks pre-commit), and what they
    /// emit is dropped: the chain's outputs have ended.
    pub async fn final_barrier(&mut self, barrier: Barrier) -> Result<()> {
        for i in 0..self.operators.len() {
            let mut out = Output::default();
            self.operators[i].on_barrier(barrier, &mut out).await?;
            if let Some(state) = &self.states[i] {
                state.seal(barrier.checkpoint_id).await?;
            }
        }
        Ok(())
    }

    /// The futures of checkpoint `checkpoint_id`'s state becoming durable (one per
    /// operator with state that the barrier passed).
    pub fn take_durable(&mut self, checkpoint_id: u64) -> Vec<Durable> {
        let (taken, kept) = std::mem::take(&mut self.durable)
            .into_iter()
            .partition(|(id, _)| *id == checkpoint_id);
        self.durable = kept;
        taken.into_iter().map(|(_, d)| d).collect()
    }

    /// What the chain's sinks pre-committed at the barrier that just passed, by state key.
    pub fn sink_states(&self) -> Vec<(String, Bytes)> {
        self.operators
            .iter()
            .filter_map(|op| op.sink_state())
            .collect()
    }

    /// Tells every operator, then its state, that checkpoint `checkpoint_id` is
    /// committed job-wide.
    pub async fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        for (op, state) in self.operators.iter_mut().zip(&self.states) {
            op.notify_checkpoint_complete(checkpoint_id).await?;
            if let Some(state) = state {
                state.committed(checkpoint_id).await?;
            }
        }
        Ok(())
    }

    /// Closes every operator in order; what one emits on closing flows through the rest.
    /// What an operator wrote to its state becomes durable with its open epoch.
    pub async fn close(&mut self, output: &mut TaskOutput) -> Result<()> {
        for i in 0..self.operators.len() {
            let mut out = Output::default();
            self.operators[i].close(&mut out).await?;
            self.forward(i, out, output).await?;
            self.drain_more(i, output).await?;
            if let Some(state) = &self.states[i] {
                state.seal_open_epoch().await?;
            }
        }
        Ok(())
    }

    /// Passes on the parts operator `i` still has of its last call's output, each one
    /// through the rest of the chain before the next is built.
    async fn drain_more(&mut self, i: usize, output: &mut TaskOutput) -> Result<()> {
        while self.operators[i].has_more() {
            let mut out = Output::default();
            self.operators[i].resume(&mut out).await?;
            Box::pin(self.forward(i, out, output)).await?;
        }
        Ok(())
    }

    /// Routes operator `i`'s output: side outputs now, main output into operator `i + 1`.
    async fn forward(&mut self, i: usize, out: Output, output: &mut TaskOutput) -> Result<()> {
        route_side(i, out.side, output).await?;
        self.run_from(i + 1, out.main, output).await
    }

    async fn run_from(
        &mut self,
        start: usize,
        mut elements: Vec<StreamElement>,
        output: &mut TaskOutput,
    ) -> Result<()> {
        for i in start..self.operators.len() {
            if elements.is_empty() {
                return Ok(());
            }
            let mut out = Output::default();
            for element in elements {
                let op = &mut self.operators[i];
                match element {
                    StreamElement::Batch(b) => op.process_batch(b, &mut out).await?,
                    StreamElement::Watermark(ts) => op.on_watermark(ts, &mut out).await?,
                    StreamElement::Barrier(b) => {
                        op.on_barrier(b, &mut out).await?;
                        if let Some(state) = &self.states[i]
                            && let Some(durable) = state.cut(b.checkpoint_id).await?
                        {
                            self.durable.push((b.checkpoint_id, durable));
                        }
                    }
                    other @ (StreamElement::Idle | StreamElement::EndOfPartition) => {
                        out.main.push(other)
                    }
                }
                if self.operators[i].has_more() {
                    // What came before goes on first, then the parts, then the rest.
                    let part = std::mem::take(&mut out);
                    Box::pin(self.forward(i, part, output)).await?;
                    Box::pin(self.drain_more(i, output)).await?;
                }
            }
            route_side(i, out.side, output).await?;
            elements = out.main;
        }
        for element in &elements {
            output.emit(element).await?;
        }
        Ok(())
    }
}

async fn route_side(
    operator: usize,
    side: Vec<(&'static str, arrow::record_batch::RecordBatch)>,
    output: &mut TaskOutput,
) -> Result<()> {
    for (tag, batch) in side {
        let element = StreamElement::Batch(batch);
        for route in output
            .side
            .iter_mut()
            .filter(|r| r.operator == operator && r.tag == tag)
        {
            route.edge.emit(&element).await?;
        }
    }
    Ok(())
}
