//! A task's input gate: merges its input channels into one ordered stream of elements.
//!
//! The gate owns the per-channel bookkeeping that makes event time and checkpoints work
//! across parallel inputs:
//!
//! - **Watermarks**: the task's watermark is the minimum over channels that are neither
//!   idle nor finished, and only moves forward. A channel that sent `Idle` is left out
//!   until it sends anything else; when every open channel is idle the gate reports
//!   `Idle` itself.
//! - **Aligned barriers**: a channel that delivered barrier N is *blocked* (its further
//!   elements are kept aside, still holding their share of the channel's bound, so its
//!   producer is back-pressured) until every open channel delivered N; then the barrier
//!   is passed on once and the channels are unblocked in order.
//! - **Aligned-checkpoint timeout**: an aligned barrier carries the time its checkpoint
//!   stops waiting (`Barrier::timeout_at_ms`: the checkpoint's start plus the job's
//!   `aligned_timeout`, as in Flink). Then it is passed on as an unaligned one: the
//!   channels that delivered it are unblocked, and the others record what they deliver
//!   until their barrier arrives (the checkpoint's channel state). A barrier still
//!   queued behind elements of its channel was announced by the queue; when its time is
//!   up the gate takes the elements in front of it aside and lets it overtake them, as
//!   an unaligned barrier would have (the producer does the same with what it has not
//!   sent yet, `network::partition`). So a task with one input switches too.
//! - **Unaligned barriers** arrive on the priority lane and are passed on at once, when
//!   the first channel delivers them. Elements they overtook are the checkpoint's
//!   *channel state*: for each channel, the elements sent before that channel's barrier
//!   but not processed by the task before the barrier was passed on. They are still
//!   processed as usual, and captured (cheap clones) in a [`ChannelState`] that
//!   [`InputGate::take_channel_state`] hands to whoever stores checkpoints.
//! - **Throughput and debloating** ([`GateMonitor`]): every period the gate measures
//!   its throughput and, with buffer debloating, limits what each channel may hold.
//! - The gate ends when every channel has ended; a failed channel fails the gate.
//!
//! The gate does not know whether a channel is local or remote (see `crate::queue`).

use std::collections::VecDeque;

use bytes::Bytes;

use crate::element::{Barrier, BarrierKind, StreamElement, Timestamp};
use crate::error::{Error, Result};
use crate::queue::{Envelope, PriorityEnvelope, QueueReceiver, Received};
use crate::runtime::debloat::{DebloatConfig, GateMonitor};
use crate::runtime::metrics::TaskMetrics;

#[derive(Debug)]
struct ChannelInfo {
    watermark: Timestamp,
    idle: bool,
    finished: bool,
    /// Last barrier this channel delivered.
    barrier: Option<u64>,
    /// Blocked for alignment: elements go to `stash`.
    blocked: bool,
    stash: VecDeque<Envelope>,
    /// Record processed elements into the pending channel state.
    recording: bool,
}

/// The in-flight elements an unaligned barrier overtook, per input channel.
#[derive(Debug, Clone)]
pub struct ChannelState {
    /// The checkpoint.
    pub checkpoint_id: u64,
    /// Per channel (by gate index): the overtaken elements, in channel order.
    pub channels: Vec<Vec<StreamElement>>,
    /// Per channel: the bytes of an element it had begun to receive when its barrier
    /// arrived (a remote channel; the element's rest is the producer's output state).
    pub partial: Vec<Bytes>,
    /// False when a newer barrier arrived before every channel delivered this one: the
    /// capture is cut short and the checkpoint cannot use it.
    pub complete: bool,
}

/// Merges the channels of one consumer.
pub struct InputGate {
    rx: QueueReceiver,
    channels: Vec<ChannelInfo>,
    emitted_watermark: Timestamp,
    all_idle: bool,
    pending_barrier: Option<Barrier>,
    ready: VecDeque<StreamElement>,
    capturing: Option<ChannelState>,
    captured: Vec<ChannelState>,
    next_stash: usize,
    /// The newest barrier passed on: barriers leave the gate in increasing order.
    last_emitted: u64,
    /// When the first channel delivered the pending aligned barrier.
    alignment_started: Option<std::time::Instant>,
    /// How long the last aligned barrier waited for every channel.
    last_alignment: Option<std::time::Duration>,
    /// An aligned barrier waiting longer than this goes on unaligned.
    aligned_timeout: Option<std::time::Duration>,
    /// The job takes unaligned checkpoints.
    unaligned: bool,
    monitor: Option<GateMonitor>,
    /// Each channel's input (a join's gate merges two; otherwise all 0).
    inputs: Vec<usize>,
    /// The input of each batch in `ready`, in order.
    batch_inputs: VecDeque<usize>,
    /// The input of the batch `next` returned last.
    last_input: usize,
}

impl InputGate {
    /// A gate over `rx`.
    pub fn new(rx: QueueReceiver) -> Self {
        let n = rx.channels();
        Self {
            rx,
            channels: (0..n)
                .map(|_| ChannelInfo {
                    watermark: Timestamp::MIN,
                    idle: false,
                    finished: false,
                    barrier: None,
                    blocked: false,
                    stash: VecDeque::new(),
                    recording: false,
                })
                .collect(),
            emitted_watermark: Timestamp::MIN,
            all_idle: false,
            pending_barrier: None,
            ready: VecDeque::new(),
            capturing: None,
            captured: Vec::new(),
            next_stash: 0,
            last_emitted: 0,
            alignment_started: None,
            last_alignment: None,
            aligned_timeout: None,
            unaligned: false,
            monitor: None,
            inputs: vec![0; n],
            batch_inputs: VecDeque::new(),
            last_input: 0,
        }
    }

    /// Marks which input each channel belongs to (by gate index), for a task whose
    /// head operator has two.
    pub fn with_inputs(mut self, inputs: Vec<usize>) -> Self {
        if inputs.len() == self.channels.len() {
            self.inputs = inputs;
        }
        self
    }

    /// The input the last batch [`InputGate::next`] returned came from.
    pub fn last_input(&self) -> usize {
        self.last_input
    }

    /// Marks a gate whose job takes unaligned checkpoints.
    pub fn with_unaligned(mut self, unaligned: bool) -> Self {
        self.unaligned = unaligned;
        self
    }

    /// Whether barriers may overtake data at this gate (unaligned checkpoints, or an
    /// aligned timeout): its task, when it cannot send, still takes an unaligned
    /// barrier ([`Self::poll_unaligned`]).
    pub fn overtaking(&self) -> bool {
        self.unaligned || self.aligned_timeout.is_some()
    }

    /// For a task whose output has no room, which must not take an ordinary element:
    /// takes the priority events that arrived (and an aligned barrier's timeout) and
    /// returns an unaligned barrier if one is next. Never waits. A barrier behind
    /// elements already taken from their channels stays behind them: overtaking those
    /// would leave them in neither the snapshot nor the channel state.
    pub fn poll_unaligned(&mut self) -> Option<StreamElement> {
        while let Some(p) = self.rx.try_recv_priority() {
            self.on_priority(p);
        }
        if self
            .alignment_deadline()
            .is_some_and(|d| d <= std::time::Instant::now())
        {
            self.alignment_timed_out();
        }
        match self.ready.front() {
            // An aligned barrier that may time out is sent on without waiting for room.
            Some(StreamElement::Barrier(b))
                if b.kind == BarrierKind::Unaligned || b.times_out() =>
            {
                self.ready.pop_front()
            }
            _ => None,
        }
    }

    /// Measures the gate's throughput from `metrics` (its task's counters) and, with
    /// `debloat`, limits what its channels hold to about its target time of it.
    pub fn with_monitor(
        mut self,
        metrics: std::sync::Arc<TaskMetrics>,
        debloat: Option<DebloatConfig>,
    ) -> Self {
        let bounds = self.rx.bounds().to_vec();
        self.monitor = Some(GateMonitor::new(metrics, bounds, debloat));
        self
    }

    /// The current combined watermark.
    pub fn watermark(&self) -> Timestamp {
        self.emitted_watermark
    }

    /// Channels currently blocked for barrier alignment.
    pub fn blocked_channels(&self) -> usize {
        self.channels.iter().filter(|c| c.blocked).count()
    }

    /// Passes an aligned barrier on as unaligned once it has waited `timeout` for its
    /// channels (`None`: it waits as long as it takes).
    pub fn with_aligned_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.aligned_timeout = timeout;
        self
    }

    /// How long the aligned barrier the gate passed on last waited for its channels
    /// (from the first channel delivering it to the last), once.
    pub fn take_alignment(&mut self) -> Option<std::time::Duration> {
        self.last_alignment.take()
    }

    /// Channel state of the unaligned checkpoints completed (or cut short by a newer
    /// barrier, see [`ChannelState::complete`]) at this gate so far.
    pub fn take_channel_state(&mut self) -> Vec<ChannelState> {
        std::mem::take(&mut self.captured)
    }

    /// Whether a capture finished since the last [`take_channel_state`](Self::take_channel_state).
    pub fn has_channel_state(&self) -> bool {
        !self.captured.is_empty()
    }

    /// Queues `elements` (a restored checkpoint's channel state) on channel `ch` ahead
    /// of everything the channel delivers.
    pub fn replay(&mut self, ch: usize, elements: Vec<StreamElement>) {
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        let queued = std::mem::take(&mut c.stash);
        c.stash = elements
            .into_iter()
            .map(|element| Envelope {
                channel: ch,
                sequence: 0,
                item: Ok(element),
                release: Default::default(),
            })
            .chain(queued)
            .collect();
    }

    /// The next element for the task; `None` once all channels ended. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<StreamElement>> {
        if let Some(m) = &mut self.monitor {
            let now = std::time::Instant::now();
            if m.due(now) {
                m.tick(now, self.channels.iter().filter(|c| !c.finished).count());
            }
        }
        loop {
            if let Some(e) = self.ready.pop_front() {
                if matches!(e, StreamElement::Batch(_)) {
                    self.last_input = self.batch_inputs.pop_front().unwrap_or(0);
                }
                return Ok(Some(e));
            }
            if self.channels.iter().all(|c| c.finished) {
                return Ok(None);
            }
            // A priority event sent before a kept-aside element must be seen first.
            if let Some(p) = self.rx.try_recv_priority() {
                self.on_priority(p);
                continue;
            }
            // Before what is kept aside: a barrier's time may be up while the gate works
            // through elements an earlier barrier overtook.
            let deadline = self.alignment_deadline();
            if deadline.is_some_and(|d| d <= std::time::Instant::now()) {
                self.alignment_timed_out();
                continue;
            }
            if let Some(env) = self.pop_stash() {
                self.process(env)?;
                continue;
            }
            let received = match deadline {
                Some(d) => tokio::select! {
                    r = self.rx.recv() => r,
                    _ = tokio::time::sleep_until(d.into()) => continue,
                },
                None => self.rx.recv().await,
            };
            match received {
                None => {
                    return Err(Error::Disconnected(
                        "every upstream channel closed before its end",
                    ));
                }
                Some(Received::Priority(p)) => self.on_priority(p),
                Some(Received::Element(env)) => {
                    // A priority event delivered before this element must be seen first,
                    // with this element among what is queued when it is.
                    if let Some(p) = self.rx.try_recv_priority() {
                        self.channels[env.channel].stash.push_back(env);
                        self.on_priority(p);
                        continue;
                    }
                    let c = &mut self.channels[env.channel];
                    if c.blocked || !c.stash.is_empty() {
                        c.stash.push_back(env);
                    } else {
                        self.process(env)?;
                    }
                }
            }
        }
    }

    /// An element kept aside on a channel that is no longer blocked.
    fn pop_stash(&mut self) -> Option<Envelope> {
        let n = self.channels.len();
        for i in 0..n {
            let ch = (self.next_stash + i) % n;
            let c = &mut self.channels[ch];
            if !c.blocked
                && let Some(env) = c.stash.pop_front()
            {
                self.next_stash = ch;
                return Some(env);
            }
        }
        None
    }

    fn process(&mut self, env: Envelope) -> Result<()> {
        let Envelope {
            channel: ch,
            item,
            release,
            ..
        } = env;
        let element = item?;
        if self.channels[ch].recording
            && let Some(state) = &mut self.capturing
        {
            state.channels[ch].push(element.clone());
        }
        match element {
            StreamElement::Batch(b) => {
                self.activate(ch);
                self.batch_inputs.push_back(self.inputs[ch]);
                self.ready.push_back(StreamElement::Batch(b));
            }
            StreamElement::Watermark(ts) => {
                self.activate(ch);
                let c = &mut self.channels[ch];
                c.watermark = c.watermark.max(ts);
                self.advance();
            }
            StreamElement::Idle => {
                self.channels[ch].idle = true;
                self.advance();
                self.check_all_idle();
            }
            StreamElement::EndOfPartition => {
                let c = &mut self.channels[ch];
                c.finished = true;
                c.blocked = false;
                c.recording = false;
                self.barrier_complete();
                self.capture_complete();
                self.advance();
            }
            StreamElement::Barrier(barrier) if barrier.kind == BarrierKind::Unaligned => {
                self.rx.taken(ch, barrier.checkpoint_id);
                // An unaligned barrier in band (its producer could not send it ahead):
                // it overtook nothing on this channel.
                let sequence = 0;
                self.on_unaligned(ch, sequence, barrier, Bytes::new());
            }
            StreamElement::Barrier(barrier) if barrier.checkpoint_id <= self.last_emitted => {
                self.rx.taken(ch, barrier.checkpoint_id);
                // Barrier N, aligned, after N went on unaligned (a timeout here, or
                // another channel's unaligned barrier): this channel's part of the
                // channel state is complete.
                let c = &mut self.channels[ch];
                c.barrier = Some(
                    c.barrier
                        .map_or(barrier.checkpoint_id, |b| b.max(barrier.checkpoint_id)),
                );
                if self
                    .capturing
                    .as_ref()
                    .is_some_and(|s| s.checkpoint_id == barrier.checkpoint_id)
                {
                    c.recording = false;
                }
                self.capture_complete();
            }
            StreamElement::Barrier(barrier) => {
                self.rx.taken(ch, barrier.checkpoint_id);
                let c = &mut self.channels[ch];
                c.barrier = Some(barrier.checkpoint_id);
                if self
                    .pending_barrier
                    .is_none_or(|p| p.checkpoint_id < barrier.checkpoint_id)
                {
                    self.pending_barrier = Some(barrier);
                    self.alignment_started = Some(std::time::Instant::now());
                }
                if !self.barrier_complete() {
                    self.channels[ch].blocked = true;
                }
            }
        }
        drop(release);
        Ok(())
    }

    fn on_priority(&mut self, p: PriorityEnvelope) {
        match p.element {
            StreamElement::Barrier(b) => self.on_unaligned(p.channel, p.sequence, b, p.partial),
            other => self.ready.push_back(other),
        }
    }

    /// Barrier `b` arrived ahead of the elements of `ch` after position `sequence`.
    fn on_unaligned(&mut self, ch: usize, sequence: u64, b: Barrier, partial: Bytes) {
        let id = b.checkpoint_id;
        if id > self.last_emitted {
            self.start_capture(b);
        }
        // Everything already queued goes aside so that the overtaken part is visible.
        while let Some(env) = self.rx.try_recv() {
            self.channels[env.channel].stash.push_back(env);
        }
        let c = &mut self.channels[ch];
        c.barrier = Some(c.barrier.map_or(id, |last| last.max(id)));
        if let Some(state) = &mut self.capturing
            && state.checkpoint_id == id
        {
            c.recording = false;
            for env in c.stash.iter().filter(|e| e.sequence <= sequence) {
                if let Ok(element) = &env.item {
                    state.channels[ch].push(element.clone());
                }
            }
            state.partial[ch] = partial;
        }
        self.capture_complete();
    }

    /// Barrier `b`, newer than any passed on, goes on unaligned now (a capture still
    /// under way is cut short): the task snapshots, and every channel that has
    /// not delivered it records until it does. An aligned barrier of the same or an
    /// older checkpoint waiting for alignment is superseded: its channels (which
    /// delivered it, so what they hold aside comes after it) are unblocked.
    fn start_capture(&mut self, b: Barrier) {
        let id = b.checkpoint_id;
        self.last_emitted = id;
        if let Some(mut old) = self.capturing.take() {
            // Cut short: its checkpoint cannot use it.
            old.complete = false;
            self.captured.push(old);
        }
        self.ready.push_back(StreamElement::Barrier(Barrier::new(
            id,
            BarrierKind::Unaligned,
        )));
        if self.pending_barrier.is_some_and(|p| p.checkpoint_id <= id) {
            self.pending_barrier = None;
            self.last_alignment = self.alignment_started.take().map(|t| t.elapsed());
            for c in &mut self.channels {
                c.blocked = false;
            }
        }
        self.capturing = Some(ChannelState {
            checkpoint_id: id,
            channels: vec![Vec::new(); self.channels.len()],
            partial: vec![Bytes::new(); self.channels.len()],
            complete: true,
        });
        for c in &mut self.channels {
            c.recording = !c.finished && c.barrier.is_none_or(|delivered| delivered < id);
        }
    }

    /// When the pending aligned barrier, or the first announced one still queued, stops
    /// waiting (with an aligned timeout).
    fn alignment_deadline(&self) -> Option<std::time::Instant> {
        match (self.pending_deadline(), self.queued_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn pending_deadline(&self) -> Option<std::time::Instant> {
        let b = self.pending_barrier?;
        if b.timeout_at_ms > 0 {
            Some(crate::element::instant_of_unix_ms(b.timeout_at_ms))
        } else {
            Some(self.alignment_started? + self.aligned_timeout?)
        }
    }

    /// The first deadline of an announced barrier that would still make a difference:
    /// of a checkpoint not passed on yet, or whose channel state is being recorded.
    fn queued_deadline(&self) -> Option<std::time::Instant> {
        let capturing = self.capturing.as_ref().map(|c| c.checkpoint_id);
        self.rx
            .announced()
            .iter()
            .filter(|a| {
                let id = a.barrier.checkpoint_id;
                id > self.last_emitted || capturing == Some(id)
            })
            .map(|a| a.barrier.timeout_at_ms)
            .min()
            .map(crate::element::instant_of_unix_ms)
    }

    /// An aligned barrier's time is up: the pending one goes on unaligned, and those
    /// still queued overtake what is in front of them.
    fn alignment_timed_out(&mut self) {
        let now = crate::element::unix_ms();
        if let Some(b) = self.pending_barrier
            && b.checkpoint_id > self.last_emitted
            && self
                .pending_deadline()
                .is_some_and(|d| d <= std::time::Instant::now())
        {
            tracing::debug!(checkpoint = b.checkpoint_id, "alignment timed out");
            self.start_capture(b);
            self.capture_complete();
        }
        let due: Vec<_> = self
            .rx
            .announced()
            .into_iter()
            .filter(|a| a.barrier.timeout_at_ms <= now)
            .collect();
        if due.is_empty() {
            return;
        }
        // Everything queued goes aside, the due barriers with it.
        while let Some(env) = self.rx.try_recv() {
            self.channels[env.channel].stash.push_back(env);
        }
        for a in due {
            self.rx.taken(a.channel, a.barrier.checkpoint_id);
            let c = &mut self.channels[a.channel];
            let Some(at) = c.stash.iter().position(|e| {
                e.sequence == a.sequence
                    && matches!(&e.item, Ok(StreamElement::Barrier(b)) if b.checkpoint_id == a.barrier.checkpoint_id)
            }) else {
                // Taken already (processed, or aside behind a block): nothing to do.
                continue;
            };
            if a.barrier.checkpoint_id <= c.barrier.unwrap_or(0) {
                continue;
            }
            c.stash.remove(at);
            tracing::debug!(
                channel = a.channel,
                checkpoint = a.barrier.checkpoint_id,
                queued = c.stash.len(),
                "a queued aligned barrier timed out and overtakes"
            );
            let barrier = Barrier::new(a.barrier.checkpoint_id, BarrierKind::Unaligned);
            self.on_unaligned(a.channel, a.sequence - 1, barrier, Bytes::new());
        }
    }

    fn capture_complete(&mut self) {
        let Some(state) = &self.capturing else {
            return;
        };
        let id = state.checkpoint_id;
        if self
            .channels
            .iter()
            .all(|c| c.finished || c.barrier.is_some_and(|b| b >= id))
            && let Some(state) = self.capturing.take()
        {
            self.captured.push(state);
        }
    }

    fn activate(&mut self, ch: usize) {
        self.channels[ch].idle = false;
        self.all_idle = false;
    }

    /// Emits a new watermark when the minimum over open channels moved forward.
    fn advance(&mut self) {
        let min = self
            .channels
            .iter()
            .filter(|c| !c.idle && !c.finished)
            .map(|c| c.watermark)
            .min()
            .or_else(|| {
                // Every channel finished: the furthest watermark any of them reached.
                self.channels.iter().all(|c| c.finished).then(|| {
                    self.channels
                        .iter()
                        .map(|c| c.watermark)
                        .max()
                        .unwrap_or(Timestamp::MIN)
                })
            });
        if let Some(min) = min
            && min > self.emitted_watermark
        {
            self.emitted_watermark = min;
            self.ready.push_back(StreamElement::Watermark(min));
        }
    }

    fn check_all_idle(&mut self) {
        let mut open = self.channels.iter().filter(|c| !c.finished).peekable();
        if open.peek().is_some() && open.all(|c| c.idle) && !self.all_idle {
            self.all_idle = true;
            self.ready.push_back(StreamElement::Idle);
        }
    }

    /// Passes the pending aligned barrier on once every open channel delivered it.
    fn barrier_complete(&mut self) -> bool {
        let Some(barrier) = self.pending_barrier else {
            return false;
        };
        let done = self
            .channels
            .iter()
            .all(|c| c.finished || c.barrier == Some(barrier.checkpoint_id));
        if done {
            self.pending_barrier = None;
            for c in &mut self.channels {
                c.blocked = false;
            }
            if barrier.checkpoint_id > self.last_emitted {
                self.last_emitted = barrier.checkpoint_id;
                self.last_alignment = self.alignment_started.take().map(|t| t.elapsed());
                self.ready.push_back(StreamElement::Barrier(barrier));
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::*;
    use crate::queue::input_queue;

    fn batch(v: i64) -> StreamElement {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        StreamElement::Batch(
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![v]))]).unwrap(),
        )
    }

    fn value(e: &StreamElement) -> i64 {
        let StreamElement::Batch(b) = e else {
            panic!("not a batch: {e:?}")
        };
        b.column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0)
    }

    fn barrier(id: u64, kind: BarrierKind) -> StreamElement {
        StreamElement::Barrier(Barrier {
            checkpoint_id: id,
            kind,
            timeout_at_ms: 0,
        })
    }

    async fn next(gate: &mut InputGate) -> StreamElement {
        tokio::time::timeout(Duration::from_secs(5), gate.next())
            .await
            .expect("gate stalled")
            .unwrap()
            .expect("gate ended")
    }

    #[tokio::test]
    async fn watermark_is_the_minimum_of_active_channels() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx);
        tx[0].send(StreamElement::Watermark(10)).await.unwrap();
        tx[1].send(StreamElement::Watermark(5)).await.unwrap();
        assert!(matches!(next(&mut gate).await, StreamElement::Watermark(5)));
        tx[1].send(StreamElement::Idle).await.unwrap();
        // Channel 1 idle: channel 0 alone decides.
        assert!(matches!(
            next(&mut gate).await,
            StreamElement::Watermark(10)
        ));
        tx[0].send(StreamElement::EndOfPartition).await.unwrap();
        tx[1].send(StreamElement::Watermark(20)).await.unwrap();
        assert!(matches!(
            next(&mut gate).await,
            StreamElement::Watermark(20)
        ));
        tx[1].send(StreamElement::EndOfPartition).await.unwrap();
        assert!(gate.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn all_idle_channels_make_the_gate_idle() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx);
        tx[0].send(StreamElement::Idle).await.unwrap();
        tx[1].send(StreamElement::Idle).await.unwrap();
        assert!(matches!(next(&mut gate).await, StreamElement::Idle));
    }

    #[tokio::test]
    async fn aligned_barrier_blocks_the_channel_that_delivered_it() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx);
        tx[0].send(barrier(1, BarrierKind::Aligned)).await.unwrap();
        tx[0].send(batch(1)).await.unwrap();
        tx[1].send(batch(2)).await.unwrap();
        // Channel 0 is blocked behind barrier 1: only channel 1's record comes through.
        assert_eq!(value(&next(&mut gate).await), 2);
        assert_eq!(gate.blocked_channels(), 1);
        let stalled = tokio::time::timeout(Duration::from_millis(50), gate.next()).await;
        assert!(stalled.is_err(), "channel 0 must stay blocked");
        tx[1].send(barrier(1, BarrierKind::Aligned)).await.unwrap();
        assert!(matches!(
            next(&mut gate).await,
            StreamElement::Barrier(Barrier {
                checkpoint_id: 1,
                ..
            })
        ));
        assert_eq!(value(&next(&mut gate).await), 1);
        assert_eq!(gate.blocked_channels(), 0);
    }

    #[tokio::test]
    async fn blocked_channel_keeps_its_budget() {
        let (tx, rx) = input_queue(2, 100);
        let mut gate = InputGate::new(rx);
        tx[0].send(barrier(1, BarrierKind::Aligned)).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_millis(50), gate.next()).await;
        assert_eq!(gate.blocked_channels(), 1);
        // Fill channel 0 behind its barrier: six 16-byte elements fit in 100 bytes.
        for _ in 0..6 {
            tx[0].send(StreamElement::Idle).await.unwrap();
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), gate.next()).await;
        let blocked =
            tokio::time::timeout(Duration::from_millis(50), tx[0].send(StreamElement::Idle)).await;
        assert!(
            blocked.is_err(),
            "a blocked channel's producer must be back-pressured"
        );
    }

    #[tokio::test]
    async fn unaligned_barrier_overtakes_and_captures_in_flight_elements() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx);
        // Channel 0: 1, 2 queued, then the barrier (priority), then 3.
        tx[0].send(batch(1)).await.unwrap();
        tx[0].send(batch(2)).await.unwrap();
        tx[1].send(batch(10)).await.unwrap();
        tx[0]
            .send_priority(barrier(7, BarrierKind::Unaligned))
            .unwrap();
        tx[0].send(batch(3)).await.unwrap();
        // The barrier comes first, ahead of everything queued.
        assert!(matches!(
            next(&mut gate).await,
            StreamElement::Barrier(Barrier {
                checkpoint_id: 7,
                ..
            })
        ));
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(value(&next(&mut gate).await));
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 3, 10]);
        // Channel 1 sends 11 (processed after the snapshot, before its barrier), then
        // its barrier, then 12.
        tx[1].send(batch(11)).await.unwrap();
        assert_eq!(value(&next(&mut gate).await), 11);
        tx[1]
            .send_priority(barrier(7, BarrierKind::Unaligned))
            .unwrap();
        tx[1].send(batch(12)).await.unwrap();
        assert_eq!(value(&next(&mut gate).await), 12);
        let states = gate.take_channel_state();
        assert_eq!(states.len(), 1);
        let captured: Vec<Vec<i64>> = states[0]
            .channels
            .iter()
            .map(|c| c.iter().map(value).collect())
            .collect();
        // Exactly the overtaken elements: 1 and 2 on channel 0; 10 and 11 on channel 1.
        assert_eq!(captured, vec![vec![1, 2], vec![10, 11]]);
    }

    #[tokio::test]
    async fn a_task_without_room_takes_only_an_unaligned_barrier_and_it_captures_the_queue() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx).with_unaligned(true);
        tx[0].send(batch(1)).await.unwrap();
        tx[1].send(batch(10)).await.unwrap();
        // Nothing overtakes yet: ordinary elements are not taken.
        assert!(gate.poll_unaligned().is_none());
        tx[0]
            .send_priority(barrier(3, BarrierKind::Unaligned))
            .unwrap();
        tx[0].send(batch(2)).await.unwrap();
        assert!(matches!(
            gate.poll_unaligned(),
            Some(StreamElement::Barrier(Barrier {
                checkpoint_id: 3,
                kind: BarrierKind::Unaligned,
                timeout_at_ms: 0,
            }))
        ));
        assert!(gate.poll_unaligned().is_none());
        // The queued elements are still delivered, in order per channel.
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(value(&next(&mut gate).await));
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 10]);
        tx[1]
            .send_priority(barrier(3, BarrierKind::Unaligned))
            .unwrap();
        tx[1].send(batch(11)).await.unwrap();
        assert_eq!(value(&next(&mut gate).await), 11);
        let states = gate.take_channel_state();
        let captured: Vec<Vec<i64>> = states[0]
            .channels
            .iter()
            .map(|c| c.iter().map(value).collect())
            .collect();
        // What the barrier overtook: 1 on channel 0, 10 on channel 1.
        assert_eq!(captured, vec![vec![1], vec![10]]);
    }

    #[tokio::test]
    async fn a_queued_barrier_whose_time_is_up_overtakes_what_is_in_front_of_it() {
        // One channel: no alignment ever waits, yet the barrier queued behind elements
        // goes on unaligned once its checkpoint's time is up, as in Flink.
        let (tx, rx) = input_queue(1, 1 << 20);
        let mut gate = InputGate::new(rx);
        let timeout_at_ms = crate::element::unix_ms() + 100;
        tx[0].send(batch(1)).await.unwrap();
        tx[0].send(batch(2)).await.unwrap();
        let aligned = StreamElement::Barrier(Barrier {
            checkpoint_id: 3,
            kind: BarrierKind::Aligned,
            timeout_at_ms,
        });
        tx[0].send(aligned).await.unwrap();
        tx[0].send(batch(4)).await.unwrap();
        assert_eq!(value(&next(&mut gate).await), 1);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(matches!(
            next(&mut gate).await,
            StreamElement::Barrier(Barrier {
                checkpoint_id: 3,
                kind: BarrierKind::Unaligned,
                ..
            })
        ));
        assert_eq!(value(&next(&mut gate).await), 2);
        assert_eq!(value(&next(&mut gate).await), 4);
        let states = gate.take_channel_state();
        assert_eq!(states.len(), 1);
        assert!(states[0].complete);
        let captured: Vec<i64> = states[0].channels[0].iter().map(value).collect();
        assert_eq!(captured, [2], "what the barrier overtook");

        // Reached before its time is up, it is an ordinary aligned barrier.
        let (tx, rx) = input_queue(1, 1 << 20);
        let mut gate = InputGate::new(rx);
        tx[0].send(batch(1)).await.unwrap();
        tx[0]
            .send(StreamElement::Barrier(Barrier {
                checkpoint_id: 3,
                kind: BarrierKind::Aligned,
                timeout_at_ms: crate::element::unix_ms() + 60_000,
            }))
            .await
            .unwrap();
        assert_eq!(value(&next(&mut gate).await), 1);
        assert!(matches!(
            next(&mut gate).await,
            StreamElement::Barrier(Barrier {
                kind: BarrierKind::Aligned,
                ..
            })
        ));
        assert!(gate.take_channel_state().is_empty());
        assert!(gate.rx.announced().is_empty());
    }

    #[tokio::test]
    async fn an_aligned_barrier_that_waits_too_long_goes_on_unaligned() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx).with_aligned_timeout(Some(Duration::from_millis(100)));
        tx[0].send(barrier(3, BarrierKind::Aligned)).await.unwrap();
        tx[0].send(batch(1)).await.unwrap();
        // Channel 1 is silent: after the timeout the barrier goes on, unaligned.
        let started = std::time::Instant::now();
        assert!(matches!(
            next(&mut gate).await,
            StreamElement::Barrier(Barrier {
                checkpoint_id: 3,
                kind: BarrierKind::Unaligned,
                ..
            })
        ));
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(
            gate.take_alignment()
                .map(|d| d >= Duration::from_millis(100)),
            Some(true)
        );
        // Channel 0 is unblocked; what it sent after its barrier is not channel state.
        assert_eq!(value(&next(&mut gate).await), 1);
        tx[1].send(batch(2)).await.unwrap();
        tx[1].send(barrier(3, BarrierKind::Aligned)).await.unwrap();
        tx[1].send(batch(4)).await.unwrap();
        assert_eq!(value(&next(&mut gate).await), 2);
        // Channel 1's own barrier completes the capture and is not passed on again.
        assert_eq!(value(&next(&mut gate).await), 4);
        let states = gate.take_channel_state();
        assert_eq!(states.len(), 1);
        assert!(states[0].complete);
        assert!(states[0].channels[0].is_empty());
        let recorded: Vec<i64> = states[0].channels[1]
            .iter()
            .filter(|e| matches!(e, StreamElement::Batch(_)))
            .map(value)
            .collect();
        assert_eq!(recorded, vec![2]);
    }

    #[tokio::test]
    async fn unaligned_barriers_leave_the_gate_once_and_in_order() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx);
        // Channel 0 runs ahead by two checkpoints; channel 1 catches up later.
        for id in 1..=3 {
            tx[0]
                .send_priority(barrier(id, BarrierKind::Unaligned))
                .unwrap();
        }
        for id in 1..=3 {
            tx[1]
                .send_priority(barrier(id, BarrierKind::Unaligned))
                .unwrap();
        }
        tx[0].send(StreamElement::EndOfPartition).await.unwrap();
        tx[1].send(StreamElement::EndOfPartition).await.unwrap();
        let mut ids = Vec::new();
        while let Some(e) = gate.next().await.unwrap() {
            if let StreamElement::Barrier(b) = e {
                ids.push(b.checkpoint_id);
            }
        }
        assert_eq!(ids, [1, 2, 3]);
    }
}
