//! One task: an input (a source or an input gate), a chain of operators and an output.
//!
//! The task loop takes one input element at a time and pushes it through the chain; a
//! processing-time tick interleaves when an operator asks for one (or the source tracks
//! idleness). At the end of a bounded input a source emits the final watermark
//! (`i64::MAX`, so every event-time window fires), the chain is closed, and
//! `EndOfPartition` goes downstream.
//!
//! Checkpoint barriers come from the coordinator only ([`CheckpointLink`], in every run:
//! `sluice run` embeds one): a source task records its reader's positions, injects the
//! barrier and acknowledges; every other task acknowledges once the barrier has passed
//! through its chain (the chain cut its operators' state epochs, its sink
//! pre-committed) and the state of those epochs is durable, which it does not wait for:
//! a spawned acknowledgement waits while the task goes on with the next epoch (as
//! Flink's asynchronous snapshot phase), and all are sent before the task says it
//! finished its input; a completed checkpoint is passed to the chain so sinks commit and
//! state lets go of what only a rollback needed. A task without a link (a deployment
//! run by hand, without a coordinator) takes no checkpoints. The task times where it
//! spends its time into its [`TaskMetrics`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_common::channel_state::{ChannelKey, ChannelPart};
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use crate::connector::{SourceReader, SourceStep};
use crate::element::{Barrier, BarrierKind, StreamElement, Timestamp};
use crate::error::{Error, Result};
use crate::operator::OperatorContext;
use crate::runtime::alignment::SourceAlignment;
use crate::runtime::chain::{Chain, TaskOutput};
use crate::runtime::channel_state::input_parts;
use crate::runtime::input_gate::InputGate;
use crate::runtime::metrics::TaskMetrics;
use crate::time::watermark::WatermarkGenerator;

/// How often a back-pressured task under the coordinator looks for a checkpoint's
/// trigger or unaligned barrier while it waits for room (room itself wakes it at once).
const ROOM_POLL: Duration = Duration::from_millis(1);
/// How often a task waiting for input looks at its held acknowledgements.
const HELD_POLL: Duration = Duration::from_millis(5);

/// How often processing-time operators and source idleness are checked.
const TICK: Duration = Duration::from_millis(100);

/// The longest a task runs before it gives its thread back to the scheduler. A source
/// whose reader is always ready (or a gate that always has input) never waits, and a
/// task that never waits starves everything else on its runtime thread: the
/// coordinator's timers in `sluice run`, the worker's control stream, barriers.
const SLICE: Duration = Duration::from_millis(2);

/// A source subtask's reader with its watermark generator.
pub struct SourceInput {
    /// The connector's reader.
    pub reader: Box<dyn SourceReader>,
    /// Watermarks per split, when the job uses event time.
    pub watermarks: Option<WatermarkGenerator>,
    /// The source's alignment group, when its watermark spec asks for alignment.
    pub alignment: Option<SourceAlignment>,
    /// Job-wide count of records read.
    pub records_in: Arc<AtomicU64>,
    /// Job-wide count of malformed records skipped.
    pub skipped: Arc<AtomicU64>,
    /// The split last named as holding the watermark.
    pub holder: Option<usize>,
    /// Positions reported for checkpoints not known to be complete yet, oldest first.
    pub reported: std::collections::VecDeque<(u64, Vec<(String, Bytes)>)>,
}

/// What a task tells the coordinator about a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointEvent {
    /// The barrier passed through the task's chain.
    Ack {
        /// The checkpoint.
        checkpoint_id: u64,
        /// The task: its chain's first node and its subtask.
        task: (u32, u32),
        /// Where the source's splits stood at the barrier (source tasks).
        positions: Vec<(String, Bytes)>,
        /// What the chain's sinks pre-committed at the barrier, under
        /// [`SinkOperator::state_key`](crate::operator::sink::SinkOperator::state_key):
        /// recorded with the checkpoint and handed back to the sinks on restore.
        sink_states: Vec<(String, Bytes)>,
        /// Time the chain took to handle the barrier.
        sync_micros: u64,
        /// Time the barrier waited at the input gate for every channel (aligned).
        alignment_micros: u64,
        /// Records the task's source read in this attempt before the barrier (0 for
        /// tasks without a source).
        source_records: u64,
        /// An unaligned checkpoint's channel state (`sluice_common::channel_state`):
        /// the in-flight elements the barrier overtook at this task's input and output.
        channel_state: Option<Bytes>,
    },
    /// The task finished its input and waits for the job's final checkpoint.
    Finished {
        /// The task.
        task: (u32, u32),
    },
    /// The task passed the completion of a checkpoint to its operators (sinks
    /// committed it).
    Committed {
        /// The checkpoint.
        checkpoint_id: u64,
        /// The task.
        task: (u32, u32),
    },
    /// The task could not take its part of the checkpoint.
    Decline {
        /// The checkpoint.
        checkpoint_id: u64,
        /// The task.
        task: (u32, u32),
        /// Why.
        reason: String,
    },
}

/// A task's link to the coordinator's checkpoints (cluster runs).
pub struct CheckpointLink {
    /// The task's chain's first node and its subtask, as acknowledgements name it.
    pub task: (u32, u32),
    /// Barriers to inject (source tasks only).
    pub triggers: Option<mpsc::UnboundedReceiver<Barrier>>,
    /// The job's final checkpoint, taken by every task once all finished their input.
    pub final_checkpoint: watch::Receiver<u64>,
    /// The newest checkpoint committed job-wide.
    pub completed: watch::Receiver<u64>,
    /// Where acknowledgements and declines go.
    pub events: mpsc::UnboundedSender<CheckpointEvent>,
    /// The last completed checkpoint passed to the chain.
    notified: u64,
}

impl CheckpointLink {
    /// The link of `task`; `triggers` only for a source task.
    pub fn new(
        task: (u32, u32),
        triggers: Option<mpsc::UnboundedReceiver<Barrier>>,
        final_checkpoint: watch::Receiver<u64>,
        completed: watch::Receiver<u64>,
        events: mpsc::UnboundedSender<CheckpointEvent>,
    ) -> Self {
        Self {
            task,
            triggers,
            final_checkpoint,
            completed,
            events,
            notified: 0,
        }
    }
}

impl Task {
    /// Whether the task starts with a source.
    pub fn is_source(&self) -> bool {
        matches!(self.input, TaskInput::Source(_))
    }
}

/// Where a task's elements come from.
#[allow(clippy::large_enum_variant)] // one per task, never moved in a loop
pub enum TaskInput {
    /// The task starts with a source.
    Source(Box<SourceInput>),
    /// The task reads its upstream channels.
    Gate(InputGate),
}

/// One subtask of one chain, ready to run.
pub struct Task {
    /// `node[subtask]` of the chain's first node, for messages.
    pub name: String,
    /// The chain's first node id and the subtask: the task's id for the coordinator.
    pub id: (u32, u32),
    /// The input.
    pub input: TaskInput,
    /// The operators.
    pub chain: Chain,
    /// Their contexts, one per operator.
    pub contexts: Vec<OperatorContext>,
    /// The output router.
    pub output: TaskOutput,
    /// Where the task's time goes.
    pub metrics: Arc<TaskMetrics>,
    /// The gate's channels as channel state names them (tasks with a gate).
    pub channel_keys: Vec<ChannelKey>,
    /// Unaligned checkpoints whose barrier passed while the gate still captures the
    /// elements it overtook: their acknowledgements wait for the channel state.
    pub unaligned: Vec<PendingUnaligned>,
    /// Aligned checkpoints whose barrier still queues at a remote output and may time
    /// out there: their acknowledgements wait to learn whether it overtakes anything.
    pub held: Vec<HeldAck>,
    /// The job's `aligned_timeout`: a source's aligned barriers carry the time it ends.
    pub aligned_timeout: Option<Duration>,
    /// The coordinator's checkpoints.
    pub link: Option<CheckpointLink>,
}

impl Task {
    /// Runs to the end of the input, or until `cancel` turns true.
    pub async fn run(mut self, cancel: watch::Receiver<bool>) -> Result<()> {
        let name = self.name.clone();
        let result = self.run_inner(cancel).await;
        result.map_err(|e| Error::Task {
            task: name,
            source: Box::new(e),
        })
    }

    async fn run_inner(&mut self, mut cancel: watch::Receiver<bool>) -> Result<()> {
        self.chain.open(&self.contexts).await?;
        let ticks = self.chain.wants_processing_time()
            || matches!(&self.input, TaskInput::Source(s) if s.watermarks.is_some());
        let mut last_tick = Instant::now();
        // The alignment of the barrier the gate just passed on, for its acknowledgement.
        let mut alignment = None;
        // Acknowledgements waiting for their checkpoint's state to become durable.
        let mut acking: Vec<AbortOnDropHandle<()>> = Vec::new();
        let mut slice = Instant::now();
        loop {
            if *cancel.borrow() {
                return Err(Error::Cancelled);
            }
            if slice.elapsed() >= SLICE {
                tokio::task::yield_now().await;
                slice = Instant::now();
            }
            if ticks && last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                self.on_tick().await?;
            }
            self.on_coordinator().await?;
            self.release_held(&mut acking, false)?;
            // Only the wait for input races the clock and cancellation: receiving is
            // cancel-safe, pushing through the chain is not, so it happens outside.
            let waiting = Instant::now();
            let element = match &mut self.input {
                TaskInput::Gate(gate) => {
                    let next = if gate.overtaking()
                        && self.link.is_some()
                        && !self.output.has_room()
                    {
                        // Back pressure where barriers may overtake: as a source does,
                        // wait for room here rather than in a send, taking only an
                        // unaligned barrier meanwhile, so that it passes this task at
                        // once instead of after the slow consumer took an element.
                        match gate.poll_unaligned() {
                            Some(barrier) => Some(barrier),
                            None => {
                                // Barriers taken meanwhile may have finished a capture.
                                self.finish_unaligned(&mut acking, false);
                                self.wait_for_room(&mut cancel).await?;
                                continue;
                            }
                        }
                    } else {
                        // Ends the open wait once its time was counted, whichever way
                        // the wait ends.
                        let _waiting = OpenWhile::begin(&self.metrics.waiting);
                        let completed = self.link.as_mut().map(|l| &mut l.completed);
                        let holding = !self.held.is_empty();
                        tokio::select! {
                            biased;
                            _ = cancel.changed() => continue,
                            _ = changed(completed) => continue,
                            // A held acknowledgement is looked at again soon.
                            _ = tokio::time::sleep(HELD_POLL), if holding => continue,
                            _ = tokio::time::sleep(TICK), if ticks => {
                                self.metrics.idle_ns.fetch_add(waiting.elapsed().as_nanos() as u64, Ordering::Relaxed);
                                continue;
                            }
                            element = gate.next() => element?,
                        }
                    };
                    if matches!(next, Some(StreamElement::Barrier(_))) {
                        self.metrics.barriers.fetch_add(1, Ordering::Relaxed);
                        alignment = gate.take_alignment();
                    }
                    if let Some(e) = &next {
                        publish(e, &self.metrics);
                    }
                    if let Some(StreamElement::Batch(b)) = &next {
                        self.metrics
                            .records_in
                            .fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                        self.metrics
                            .bytes_in
                            .fetch_add(b.get_array_memory_size() as u64, Ordering::Relaxed);
                    }
                    self.metrics
                        .idle_ns
                        .fetch_add(waiting.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    next
                }
                TaskInput::Source(src) => {
                    if src.ahead_of_its_group() {
                        self.wait_for_alignment(&mut cancel).await?;
                        continue;
                    }
                    if self.link.as_ref().is_some_and(|l| l.triggers.is_some())
                        && !self.output.has_room()
                    {
                        // Back pressure: wait for room here rather than in a send, so
                        // that a checkpoint's trigger is taken at once (an unaligned
                        // barrier then overtakes what is queued) instead of after the
                        // slow consumer took an element.
                        self.wait_for_room(&mut cancel).await?;
                        continue;
                    }
                    let step = self.step_source().await?;
                    let spent = if step == SourceProgress::Waited {
                        &self.metrics.idle_ns
                    } else {
                        &self.metrics.work_ns
                    };
                    spent.fetch_add(waiting.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    if step != SourceProgress::Ended {
                        continue;
                    }
                    None
                }
            };
            match element {
                Some(element) => {
                    let start = Instant::now();
                    let barrier = match &element {
                        StreamElement::Barrier(b) => Some(*b),
                        _ => None,
                    };
                    let input = match &self.input {
                        TaskInput::Gate(gate) => gate.last_input(),
                        TaskInput::Source(_) => 0,
                    };
                    match element {
                        StreamElement::Batch(b) if input > 0 => {
                            self.chain.push_input(input, b, &mut self.output).await?
                        }
                        element => self.chain.push(element, &mut self.output).await?,
                    }
                    let took = start.elapsed();
                    self.metrics
                        .work_ns
                        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                    if let Some(b) = barrier {
                        let (id, kind) = (b.checkpoint_id, b.kind);
                        let durable = self.chain.take_durable(id);
                        match &self.link {
                            Some(link) => {
                                let ack = CheckpointEvent::Ack {
                                    checkpoint_id: id,
                                    task: link.task,
                                    positions: Vec::new(),
                                    sink_states: self.chain.sink_states(),
                                    sync_micros: took.as_micros() as u64,
                                    alignment_micros: alignment
                                        .take()
                                        .map_or(0, |d| d.as_micros() as u64),
                                    source_records: 0,
                                    channel_state: None,
                                };
                                if kind == BarrierKind::Unaligned {
                                    // Acknowledged once the gate captured what the
                                    // barrier overtook on every channel.
                                    self.unaligned.push(PendingUnaligned {
                                        ack,
                                        durable,
                                        output: self.output.take_output_state(),
                                    });
                                } else if b.times_out() && self.output.barrier_queued(id) {
                                    self.held.push(HeldAck {
                                        ack,
                                        durable,
                                        finished: false,
                                        timeout_at_ms: b.timeout_at_ms,
                                    });
                                } else {
                                    send_ack(link, ack, durable, &mut acking);
                                }
                            }
                            None => {
                                for d in durable {
                                    d.await?;
                                }
                            }
                        }
                    }
                }
                None => break,
            }
            self.finish_unaligned(&mut acking, false);
        }
        self.finish_unaligned(&mut acking, true);
        self.release_held(&mut acking, true)?;
        // Every checkpoint this task passed is acknowledged (or declined) before it says
        // it finished.
        for h in acking {
            h.await
                .map_err(|e| Error::Internal(format!("acknowledging a checkpoint: {e}")))?;
        }
        self.chain.close(&mut self.output).await?;
        self.output
            .broadcast(&StreamElement::EndOfPartition)
            .await?;
        self.await_final_checkpoint(cancel).await
    }

    /// Under the coordinator, a task that finished its input stays until the job's final
    /// checkpoint completed: its sinks commit their last output only then, so a restore
    /// never repeats output that was already visible. Meanwhile it still takes part in
    /// the job's checkpoints: a source task acknowledges triggers (one without splits
    /// finishes at once), and every task passes completed checkpoints on and confirms
    /// them.
    async fn await_final_checkpoint(&mut self, mut cancel: watch::Receiver<bool>) -> Result<()> {
        let Some(link) = self.link.as_ref() else {
            return Ok(());
        };
        let _ = link
            .events
            .send(CheckpointEvent::Finished { task: link.task });
        let mut taken = 0u64;
        // The newest checkpoint this task took here.
        let mut last = 0u64;
        let mut acking = Vec::new();
        loop {
            self.release_held(&mut acking, false)?;
            let holding = !self.held.is_empty();
            let Some(link) = self.link.as_mut() else {
                return Ok(());
            };
            let done = *link.completed.borrow();
            if taken > 0 && done >= taken {
                self.release_held(&mut acking, true)?;
                return self.pass_on_completed(taken).await;
            }
            if done > link.notified {
                // Still a participant: a completed checkpoint commits what this task's
                // sinks hold for it, and a stop waits for every task to say so.
                self.pass_on_completed(done).await?;
                continue;
            }
            // Biased, triggers before the final checkpoint: the coordinator asked for a
            // periodic checkpoint before the final one, and its trigger is queued by the
            // time the final one shows, so barriers reach the sinks in id order.
            let (id, kind) = tokio::select! {
                biased;
                _ = cancel.changed() => return Err(Error::Cancelled),
                barrier = next_trigger(link.triggers.as_mut()) => (barrier.checkpoint_id, barrier.kind),
                _ = link.completed.changed() => continue,
                // A held acknowledgement is looked at again soon.
                _ = tokio::time::sleep(HELD_POLL), if holding => continue,
                changed = link.final_checkpoint.changed() => {
                    if changed.is_err() {
                        return Err(Error::Cancelled);
                    }
                    (*link.final_checkpoint.borrow_and_update(), BarrierKind::Aligned)
                }
            };
            if id == 0 || id <= last {
                // Nothing, or a checkpoint older than one this task took (aborted).
                continue;
            }
            last = id;
            self.take_checkpoint(Barrier::new(id, kind), true).await?;
            if self
                .link
                .as_ref()
                .is_some_and(|l| *l.final_checkpoint.borrow() == id)
            {
                taken = id;
            }
        }
    }

    /// Injects the barriers the coordinator triggered (a source task) and passes on
    /// completed checkpoints.
    async fn on_coordinator(&mut self) -> Result<()> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        let id = *link.completed.borrow();
        if id > link.notified {
            self.pass_on_completed(id).await?;
        }
        let Some(triggers) = self.link.as_mut().and_then(|l| l.triggers.as_mut()) else {
            return Ok(());
        };
        let mut due = Vec::new();
        while let Ok(b) = triggers.try_recv() {
            due.push(b);
        }
        for barrier in due {
            self.take_checkpoint(barrier, false).await?;
        }
        Ok(())
    }

    /// Passes checkpoint `id`'s completion to the chain (sinks commit) and says so.
    async fn pass_on_completed(&mut self, id: u64) -> Result<()> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        link.notified = id;
        let task = link.task;
        let events = link.events.clone();
        if let TaskInput::Source(src) = &mut self.input {
            // The newest positions this checkpoint (or an earlier one, when this task's
            // part of it was an older report) covers; older ones are obsolete.
            let mut newest = None;
            while src.reported.front().is_some_and(|(cid, _)| *cid <= id) {
                newest = src.reported.pop_front();
            }
            if let Some((_, positions)) = newest {
                src.reader.checkpoint_committed(&positions);
            }
        }
        self.chain.notify_checkpoint_complete(id).await?;
        let _ = events.send(CheckpointEvent::Committed {
            checkpoint_id: id,
            task,
        });
        Ok(())
    }

    /// This task's part of a checkpoint it is asked for directly (not by a barrier from
    /// upstream): a source's positions, then the barrier through the chain (injected
    /// downstream; or, once the input `ended`, only handled by the operators), then the
    /// acknowledgement. A source that cannot record its positions declines.
    async fn take_checkpoint(&mut self, mut barrier: Barrier, ended: bool) -> Result<()> {
        let Some(link) = self.link.as_ref() else {
            return Ok(());
        };
        // The job's final checkpoint is taken where every task waits: nothing queues.
        let last = *link.final_checkpoint.borrow() == barrier.checkpoint_id;
        if let Some(timeout) = self.aligned_timeout
            && barrier.kind == BarrierKind::Aligned
            && !last
        {
            barrier.timeout_at_ms = crate::element::unix_ms() + timeout.as_millis() as u64;
        }
        let (id, task, events) = (barrier.checkpoint_id, link.task, link.events.clone());
        let positions = match &self.input {
            TaskInput::Source(src) => src.reader.positions(),
            TaskInput::Gate(_) => Ok(Vec::new()),
        };
        let positions = match positions {
            Ok(p) => p,
            Err(e) => {
                let _ = events.send(CheckpointEvent::Decline {
                    checkpoint_id: id,
                    task,
                    reason: e.to_string(),
                });
                return Ok(());
            }
        };
        if let TaskInput::Source(src) = &mut self.input
            && !positions.is_empty()
        {
            src.reported.push_back((id, positions.clone()));
        }
        let start = Instant::now();
        if ended {
            self.chain.final_barrier(barrier).await?;
            if barrier.kind == BarrierKind::Unaligned {
                // What this finished task sent may still be queued downstream: the
                // barrier overtakes it (it becomes this task's output channel state), so
                // the consumers snapshot now rather than after draining it. A consumer
                // that is gone took its part already.
                let _ = self.output.emit(&StreamElement::Barrier(barrier)).await;
            }
        } else {
            self.metrics.barriers.fetch_add(1, Ordering::Relaxed);
            self.chain
                .push(StreamElement::Barrier(barrier), &mut self.output)
                .await?;
        }
        let source_records = match &self.input {
            TaskInput::Source(_) => self.metrics.records_in.load(Ordering::Relaxed),
            TaskInput::Gate(_) => 0,
        };
        // A source's unaligned barrier overtook what its outputs queued; nothing is
        // in flight into it.
        let output = self.output.take_output_state();
        let channel_state = match channel_state_object(id, Vec::new(), output) {
            Ok(c) => c,
            Err(reason) => {
                let _ = events.send(CheckpointEvent::Decline {
                    checkpoint_id: id,
                    task,
                    reason,
                });
                return Ok(());
            }
        };
        // Recorded under the source node's name: two sources of one job (a join's) may
        // have splits of the same name.
        let positions = positions
            .into_iter()
            .map(|(split, at)| (crate::runtime::build::position_key(self.id.0, &split), at))
            .collect();
        let ack = CheckpointEvent::Ack {
            checkpoint_id: id,
            task,
            positions,
            sink_states: self.chain.sink_states(),
            sync_micros: start.elapsed().as_micros() as u64,
            alignment_micros: 0,
            source_records,
            channel_state,
        };
        let queued = if ended {
            !self.output.drained()
        } else {
            self.output.barrier_queued(id)
        };
        if barrier.times_out() && queued {
            self.held.push(HeldAck {
                ack,
                durable: Vec::new(),
                finished: ended,
                timeout_at_ms: barrier.timeout_at_ms,
            });
        } else {
            let _ = events.send(ack);
        }
        Ok(())
    }

    /// Sends the held acknowledgements whose barrier left its outputs; a barrier whose
    /// time is up overtakes what queues in front of it first, which becomes the
    /// acknowledgement's output state. At the `end` of the input every one is sent: its
    /// barrier stays in band.
    fn release_held(&mut self, acking: &mut Vec<AbortOnDropHandle<()>>, end: bool) -> Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let Some(link) = &self.link else {
            self.held.clear();
            return Ok(());
        };
        let now = crate::element::unix_ms();
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            let id = match &h.ack {
                CheckpointEvent::Ack { checkpoint_id, .. } => *checkpoint_id,
                _ => 0,
            };
            let queued = !end
                && if h.finished {
                    !self.output.drained()
                } else {
                    self.output.barrier_queued(id)
                };
            if queued && now < h.timeout_at_ms {
                i += 1;
                continue;
            }
            let HeldAck {
                mut ack,
                durable,
                finished,
                ..
            } = self.held.remove(i);
            tracing::debug!(task = %self.name, checkpoint = id, queued, finished, "held acknowledgement released");
            if queued {
                if finished {
                    let unaligned = Barrier::new(id, BarrierKind::Unaligned);
                    self.output
                        .emit_priority(&StreamElement::Barrier(unaligned))?;
                } else {
                    self.output.overtake(id)?;
                }
                let output = self.output.take_output_state();
                match channel_state_object(id, Vec::new(), output) {
                    Ok(object) => {
                        if let CheckpointEvent::Ack { channel_state, .. } = &mut ack {
                            *channel_state = object;
                        }
                    }
                    Err(reason) => {
                        let _ = link.events.send(CheckpointEvent::Decline {
                            checkpoint_id: id,
                            task: link.task,
                            reason,
                        });
                        continue;
                    }
                }
            }
            send_ack(link, ack, durable, acking);
        }
        Ok(())
    }

    /// Acknowledges the unaligned checkpoints whose channel state the gate finished
    /// capturing; at the `end` of the input, declines those it never will.
    fn finish_unaligned(&mut self, acking: &mut Vec<AbortOnDropHandle<()>>, end: bool) {
        if self.unaligned.is_empty() {
            return;
        }
        let TaskInput::Gate(gate) = &mut self.input else {
            return;
        };
        if !gate.has_channel_state() && !end {
            return;
        }
        let Some(link) = &self.link else {
            return;
        };
        for state in gate.take_channel_state() {
            let Some(i) = self
                .unaligned
                .iter()
                .position(|p| p.checkpoint_id() == state.checkpoint_id)
            else {
                continue;
            };
            let PendingUnaligned {
                mut ack,
                durable,
                output,
            } = self.unaligned.remove(i);
            let id = state.checkpoint_id;
            let object = if state.complete {
                input_parts(&state, &self.channel_keys)
                    .map_err(|e| format!("encoding the channel state of checkpoint {id}: {e}"))
                    .and_then(|input| channel_state_object(id, input, output))
            } else {
                Err(format!(
                    "checkpoint {id}'s barrier had not arrived on every input channel when a \
                     newer checkpoint's did"
                ))
            };
            match object {
                Ok(object) => {
                    if let CheckpointEvent::Ack { channel_state, .. } = &mut ack {
                        *channel_state = object;
                    }
                    send_ack(link, ack, durable, acking);
                }
                Err(reason) => {
                    let _ = link.events.send(CheckpointEvent::Decline {
                        checkpoint_id: id,
                        task: link.task,
                        reason,
                    });
                }
            }
        }
        if end {
            for p in self.unaligned.drain(..) {
                let id = p.checkpoint_id();
                let _ = link.events.send(CheckpointEvent::Decline {
                    checkpoint_id: id,
                    task: link.task,
                    reason: format!(
                        "the input ended before checkpoint {id}'s barrier arrived on every channel"
                    ),
                });
            }
        }
    }

    /// A back-pressured task waits a moment for room downstream (counted as back
    /// pressure), then goes round its loop, where a source takes triggers and a gate's
    /// task an unaligned barrier.
    async fn wait_for_room(&mut self, cancel: &mut watch::Receiver<bool>) -> Result<()> {
        let start = Instant::now();
        self.metrics.blocked.begin();
        let cancelled = tokio::select! {
            _ = cancel.changed() => true,
            _ = self.output.room() => false,
            _ = tokio::time::sleep(ROOM_POLL) => false,
        };
        let took = start.elapsed().as_nanos() as u64;
        self.metrics
            .backpressured_ns
            .fetch_add(took, Ordering::Relaxed);
        self.metrics.work_ns.fetch_add(took, Ordering::Relaxed);
        self.metrics.blocked.end();
        if cancelled {
            return Err(Error::Cancelled);
        }
        Ok(())
    }

    /// A source ahead of its alignment group waits (at most a tick) for the group to
    /// catch up, still taking the checkpoints it is asked for; the wait counts as idle.
    async fn wait_for_alignment(&mut self, cancel: &mut watch::Receiver<bool>) -> Result<()> {
        let TaskInput::Source(src) = &mut self.input else {
            return Ok(());
        };
        let Some(alignment) = src.alignment.as_mut() else {
            return Ok(());
        };
        let triggers = self.link.as_mut().and_then(|l| l.triggers.as_mut());
        let started = Instant::now();
        let barrier = tokio::select! {
            biased;
            _ = cancel.changed() => None,
            barrier = next_trigger(triggers) => Some(barrier),
            _ = alignment.changed() => None,
            _ = tokio::time::sleep(TICK) => None,
        };
        let paused = started.elapsed();
        if let Some(g) = src.watermarks.as_mut() {
            g.exclude_pause(paused);
        }
        let ns = paused.as_nanos() as u64;
        self.metrics.idle_ns.fetch_add(ns, Ordering::Relaxed);
        self.metrics
            .alignment_paused_ns
            .fetch_add(ns, Ordering::Relaxed);
        if let Some(barrier) = barrier {
            self.take_checkpoint(barrier, false).await?;
        }
        Ok(())
    }

    async fn on_tick(&mut self) -> Result<()> {
        if let TaskInput::Source(src) = &mut self.input {
            let element = src.watermarks.as_mut().and_then(|w| w.on_tick());
            note_holder(src, &self.metrics);
            if let Some(element) = &element {
                publish(element, &self.metrics);
            }
            src.tell_alignment();
            if let Some(element) = element {
                self.chain.push(element, &mut self.output).await?;
            }
        }
        if self.chain.wants_processing_time() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or_default();
            self.chain.tick(now, &mut self.output).await?;
        }
        Ok(())
    }

    /// Reads one batch from the source and pushes it (and any new watermark) through the
    /// chain, waiting at most a tick for it.
    async fn step_source(&mut self) -> Result<SourceProgress> {
        let TaskInput::Source(src) = &mut self.input else {
            return Ok(SourceProgress::Ended);
        };
        let sb = match src.reader.poll_batch(TICK).await? {
            SourceStep::Batch(sb) => Some(sb),
            SourceStep::Pending => return Ok(SourceProgress::Waited),
            SourceStep::End => None,
        };
        let Some(sb) = sb else {
            src.skipped
                .fetch_add(src.reader.counters().skipped, Ordering::Relaxed);
            if let Some(a) = &src.alignment {
                a.set(None);
            }
            if src.watermarks.is_some() {
                // End of a bounded input: the final watermark closes every window.
                let last = StreamElement::Watermark(Timestamp::MAX);
                publish(&last, &self.metrics);
                self.chain.push(last, &mut self.output).await?;
            }
            return Ok(SourceProgress::Ended);
        };
        src.records_in
            .fetch_add(sb.batch.num_rows() as u64, Ordering::Relaxed);
        let read = self
            .metrics
            .records_in
            .fetch_add(sb.batch.num_rows() as u64, Ordering::Relaxed);
        super::fault::check_source(read + sb.batch.num_rows() as u64)?;
        // Before the batch: a split opened with it holds what the batch may advance.
        let opened = src.reader.take_opened_splits();
        let mut wm = match src.watermarks.as_mut() {
            Some(g) => {
                for split in opened {
                    g.on_split_opened(split);
                }
                g.on_batch(sb.split, &sb.batch)?
            }
            None => None,
        };
        for split in src.reader.take_finished_splits() {
            if let Some(w) = src
                .watermarks
                .as_mut()
                .and_then(|g| g.on_split_finished(split))
            {
                wm = Some(w);
            }
        }
        if let Some(w) = &wm {
            publish(w, &self.metrics);
        }
        src.tell_alignment();
        note_holder(src, &self.metrics);
        self.chain
            .push(StreamElement::Batch(sb.batch), &mut self.output)
            .await?;
        if let Some(w) = wm {
            self.chain.push(w, &mut self.output).await?;
        }
        Ok(SourceProgress::Read)
    }
}

/// Marks a span open while it lives.
struct OpenWhile<'a>(&'a crate::runtime::metrics::Ongoing);

impl<'a> OpenWhile<'a> {
    fn begin(span: &'a crate::runtime::metrics::Ongoing) -> Self {
        span.begin();
        Self(span)
    }
}

impl Drop for OpenWhile<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// What one step of a source task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceProgress {
    /// Pushed a batch through the chain.
    Read,
    /// Waited a tick for data that did not come.
    Waited,
    /// The input is over.
    Ended,
}

/// The next barrier a source task was asked to inject; never for other tasks.
async fn next_trigger(triggers: Option<&mut mpsc::UnboundedReceiver<Barrier>>) -> Barrier {
    match triggers {
        Some(rx) => match rx.recv().await {
            Some(b) => b,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Resolves when `completed` changes; never without a link.
async fn changed(completed: Option<&mut watch::Receiver<u64>>) {
    match completed {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Names the split that holds the source's watermark in the task's metrics, when it
/// changed.
fn note_holder(src: &mut SourceInput, metrics: &TaskMetrics) {
    let holder = src.watermarks.as_ref().and_then(|w| w.holder());
    if holder == src.holder {
        return;
    }
    src.holder = holder;
    let name = holder
        .map(|i| {
            src.reader
                .split_name(i)
                .unwrap_or_else(|| format!("split {i}"))
        })
        .unwrap_or_default();
    *metrics
        .watermark_held_by
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = name;
}

/// The task's watermark, for its figures and the job's progress.
fn publish(element: &StreamElement, metrics: &TaskMetrics) {
    if let StreamElement::Watermark(ts) = element {
        metrics.watermark.store(*ts, Ordering::Relaxed);
    }
}

impl SourceInput {
    /// Whether the source is more than its drift ahead of its alignment group.
    fn ahead_of_its_group(&mut self) -> bool {
        match (&mut self.alignment, &self.watermarks) {
            (Some(a), Some(g)) => g.current() != Timestamp::MIN && !a.allows(g.current()),
            _ => false,
        }
    }

    /// Tells the alignment group where this source stands: its watermark, or nothing
    /// while it has none or is idle (it then holds nobody back).
    fn tell_alignment(&self) {
        if let (Some(a), Some(g)) = (&self.alignment, &self.watermarks) {
            a.set((!g.is_idle()).then(|| g.current()));
        }
    }
}

/// An aligned checkpoint's acknowledgement waiting for its barrier to leave the task's
/// outputs or to overtake what queues there.
pub struct HeldAck {
    ack: CheckpointEvent,
    durable: Vec<crate::keyed::Durable>,
    /// Taken by a task that finished: its barrier is, in effect, behind everything its
    /// outputs still hold, and overtakes it all when its time is up.
    finished: bool,
    /// When the barrier overtakes (Unix milliseconds).
    timeout_at_ms: u64,
}

/// An unaligned checkpoint's acknowledgement waiting for the gate's channel state.
pub struct PendingUnaligned {
    /// The acknowledgement, without its channel state yet.
    ack: CheckpointEvent,
    /// The checkpoint's state epochs becoming durable.
    durable: Vec<crate::keyed::Durable>,
    /// What the barrier overtook at the task's outputs.
    output: Vec<ChannelPart>,
}

impl PendingUnaligned {
    fn checkpoint_id(&self) -> u64 {
        match &self.ack {
            CheckpointEvent::Ack { checkpoint_id, .. } => *checkpoint_id,
            _ => 0,
        }
    }
}

/// The largest channel state one task sends with an acknowledgement (it travels over the
/// control stream to the coordinator).
pub const MAX_CHANNEL_STATE_BYTES: usize = 256 << 20;

/// The channel-state object of checkpoint `id` from its `input` and `output` parts
/// (`None`: nothing was in flight); an error when it is too large to send.
fn channel_state_object(
    id: u64,
    mut input: Vec<ChannelPart>,
    output: Vec<ChannelPart>,
) -> std::result::Result<Option<Bytes>, String> {
    input.extend(output);
    if input.is_empty() {
        return Ok(None);
    }
    let object = sluice_common::channel_state::encode(&input);
    if object.len() > MAX_CHANNEL_STATE_BYTES {
        return Err(format!(
            "checkpoint {id}'s channel state is {} MiB, more than the {} MiB a task may \
             send; give the job smaller network buffers or aligned checkpoints",
            object.len() >> 20,
            MAX_CHANNEL_STATE_BYTES >> 20
        ));
    }
    Ok(Some(object))
}

/// Sends `ack` now when its checkpoint left no state to wait for, else once that state
/// is durable (the wait joins `acking`).
fn send_ack(
    link: &CheckpointLink,
    ack: CheckpointEvent,
    durable: Vec<crate::keyed::Durable>,
    acking: &mut Vec<AbortOnDropHandle<()>>,
) {
    if durable.is_empty() {
        let _ = link.events.send(ack);
    } else {
        acking.retain(|h| !h.is_finished());
        acking.push(ack_when_durable(link, ack, durable));
    }
}

/// Sends `ack` once every future in `durable` completed (the state its checkpoint
/// covers is durable), or declines the checkpoint when one failed.
fn ack_when_durable(
    link: &CheckpointLink,
    ack: CheckpointEvent,
    durable: Vec<crate::keyed::Durable>,
) -> AbortOnDropHandle<()> {
    let events = link.events.clone();
    let task = link.task;
    AbortOnDropHandle::new(tokio::spawn(async move {
        let CheckpointEvent::Ack { checkpoint_id, .. } = &ack else {
            return;
        };
        let checkpoint_id = *checkpoint_id;
        let event = match futures::future::try_join_all(durable).await {
            Ok(_) => ack,
            Err(e) => CheckpointEvent::Decline {
                checkpoint_id,
                task,
                reason: format!(
                    "the state of checkpoint {checkpoint_id} did not become durable: {e}"
                ),
            },
        };
        let _ = events.send(event);
    }))
}
