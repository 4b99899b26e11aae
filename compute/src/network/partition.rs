//! Producer side of a remote channel: one subpartition of a task's result partition.
//!
//! The producing task encodes elements into the subpartition's byte stream
//! ([`SubpartitionWriter`]); the stream is cut into buffers of `buffer_bytes`. Finished
//! buffers queue in the subpartition until the consumer grants credit; the connection's
//! sender loop ([`send_loop`]) sends one buffer per credit and announces the backlog
//! (buffers still queued). A producer waits (that wait is back pressure) before it
//! starts an element while `capacity` finished buffers queue; an element it started it
//! finishes without waiting, in buffers beyond `capacity` if need be (Flink's overdraft
//! buffers). So memory is bounded by configuration plus one element, and a task whose
//! output had room ([`SubpartitionWriter::has_room`]) never stalls in the middle of a
//! send, where it cannot take a checkpoint's trigger: a back-pressured source that
//! stalled there until the slow consumer granted credit held up unaligned checkpoints
//! for seconds.
//!
//! An element is encoded as chunks ([`codec::encode_chunks`]: a batch's own Arrow
//! buffers behind a small header); where a chunk fills whole buffers those buffers are
//! slices of it (no copy), and only the bytes that share a buffer with other chunks are
//! copied into it.
//!
//! Flushing: a full buffer is finished at once; watermarks, barriers and the end of the
//! partition finish the current buffer immediately; batches either do too
//! (`flush_every_batch`, a buffer timeout of 0) or wait until the buffer is full or
//! `buffer_timeout` passed, which the sender loop checks.
//!
//! An unaligned barrier goes ahead of the queued buffers as a priority frame that needs
//! no credit; the buffers it overtook are returned as the channel's *output* state.
//!
//! An aligned barrier that may time out (`Barrier::times_out`) is written without
//! waiting for room, in a buffer of its own, and remembered while it queues: when its
//! time is up, [`SubpartitionWriter::overtake`] takes it out of the queue and sends it
//! ahead as an unaligned barrier (Flink's timeout of an aligned barrier at the
//! producer); the buffers in front of it become the channel's output state.
//!
//! Buffer debloating: the consumer may ask for smaller buffers ([`Subpartition::
//! set_buffer_bytes`]), which bounds what queues here to fewer bytes; buffers already
//! queued keep their size.
//!
//! Locks are held for queue operations only, never across an await.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::sync::{Notify, mpsc};

use crate::element::StreamElement;
use crate::error::{Error, Result};
use crate::network::codec;
use crate::network::frame::{ChannelId, Frame};

#[derive(Debug, Default)]
struct Inner {
    /// Bytes per buffer now: the configured size, or the smaller one the consumer asked
    /// for (buffer debloating).
    buffer_bytes: usize,
    current: BytesMut,
    current_since: Option<Instant>,
    queue: VecDeque<Bytes>,
    priority: VecDeque<(u64, Bytes)>,
    credit: u32,
    failed: Option<String>,
    finished: bool,
    elements: u64,
    bytes_out: u64,
    /// Buffers the sender loop took off the queue so far.
    sent_buffers: u64,
    /// Aligned barriers that may time out, while queued.
    barriers: Vec<QueuedBarrier>,
}

/// An aligned barrier in the queue, in a buffer of its own.
#[derive(Debug, Clone, Copy)]
struct QueuedBarrier {
    checkpoint_id: u64,
    /// Its buffer's number among all the subpartition's buffers.
    buffer: u64,
    /// Elements written before it.
    elements: u64,
}

/// One subpartition, shared by its producer and the connection's sender loop.
#[derive(Debug)]
pub struct Subpartition {
    id: ChannelId,
    peer: String,
    buffer_bytes: usize,
    capacity: usize,
    inner: Mutex<Inner>,
    space: Notify,
    ready: Notify,
}

/// Figures for metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct SubpartitionStats {
    /// Finished buffers queued, plus one for a partly filled buffer.
    pub buffers: u32,
    /// Credit granted by the consumer and not used yet.
    pub credit: u32,
    /// Bytes sent.
    pub bytes_out: u64,
}

impl Subpartition {
    /// A subpartition of channel `id` to `peer`.
    pub fn new(id: ChannelId, peer: String, buffer_bytes: usize, capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            id,
            peer,
            buffer_bytes: buffer_bytes.max(64),
            capacity: capacity.max(1),
            inner: Mutex::new(Inner {
                buffer_bytes: buffer_bytes.max(64),
                ..Inner::default()
            }),
            space: Notify::new(),
            ready: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The channel.
    pub fn id(&self) -> ChannelId {
        self.id
    }

    /// The consumer granted `credits` more buffers.
    pub fn add_credit(&self, credits: u32) {
        let mut s = self.lock();
        s.credit = s.credit.saturating_add(credits);
        drop(s);
        self.ready.notify_one();
    }

    /// The consumer asks for buffers of `bytes` from now on; errors (a protocol
    /// violation) when that is more than the configured size or less than 64 bytes.
    pub fn set_buffer_bytes(&self, bytes: usize) -> std::result::Result<(), String> {
        if !(64..=self.buffer_bytes).contains(&bytes) {
            return Err(format!(
                "channel {} asked for buffers of {bytes} bytes; they must be 64 to {}",
                self.id, self.buffer_bytes
            ));
        }
        self.lock().buffer_bytes = bytes;
        Ok(())
    }

    /// Bytes per buffer now.
    pub fn buffer_bytes(&self) -> usize {
        self.lock().buffer_bytes
    }

    /// The connection failed: the producer fails on its next write.
    pub fn fail(&self, message: String) {
        let mut s = self.lock();
        if s.failed.is_none() && !(s.finished && s.queue.is_empty() && s.current.is_empty()) {
            s.failed = Some(message);
        }
        drop(s);
        self.space.notify_one();
        self.ready.notify_one();
    }

    /// True once everything, end of partition included, was handed to the connection.
    pub fn is_done(&self) -> bool {
        let s = self.lock();
        s.finished && s.queue.is_empty() && s.current.is_empty() && s.priority.is_empty()
    }

    /// Current figures.
    pub fn stats(&self) -> SubpartitionStats {
        let s = self.lock();
        SubpartitionStats {
            buffers: s.queue.len() as u32 + u32::from(!s.current.is_empty()),
            credit: s.credit,
            bytes_out: s.bytes_out,
        }
    }

    fn error(&self, message: &str) -> Error {
        Error::Network {
            peer: self.peer.clone(),
            message: format!("channel {}: {message}", self.id),
        }
    }

    /// Waits until fewer than `capacity` finished buffers queue (or the subpartition
    /// failed, which the append reports): back pressure, taken between elements.
    async fn wait_for_room(&self) {
        loop {
            {
                let s = self.lock();
                if s.failed.is_some() || s.queue.len() < self.capacity {
                    return;
                }
            }
            self.space.notified().await;
        }
    }

    /// Appends one chunk of an encoded element, finishing full buffers, without waiting
    /// (see the module doc: an element once started is finished). Where the chunk fills
    /// whole buffers from an empty one, they are slices of `data` itself, sent without
    /// a copy; only the bytes that share a buffer with other chunks are copied into it.
    fn append(&self, mut data: Bytes, flush: bool, end: bool) -> Result<()> {
        let mut s = self.lock();
        if let Some(f) = &s.failed {
            return Err(self.error(f));
        }
        loop {
            let size = s.buffer_bytes;
            if s.current.is_empty() && data.len() >= size {
                let buf = data.split_to(size);
                s.queue.push_back(buf);
                s.current_since = None;
                self.ready.notify_one();
            } else {
                if s.current.is_empty() {
                    s.current.reserve(size);
                    s.current_since = Some(Instant::now());
                }
                let room = size.saturating_sub(s.current.len());
                let take = room.min(data.len());
                s.current.extend_from_slice(&data[..take]);
                data.advance(take);
                let full = s.current.len() >= size;
                if full || (data.is_empty() && flush && !s.current.is_empty()) {
                    let buf = s.current.split().freeze();
                    s.queue.push_back(buf);
                    s.current_since = None;
                    self.ready.notify_one();
                }
            }
            if data.is_empty() && (!flush || s.current.is_empty()) {
                if end {
                    s.finished = true;
                    self.ready.notify_one();
                }
                return Ok(());
            }
        }
    }
}

/// The producer's handle: encodes elements into the subpartition.
#[derive(Debug)]
pub struct SubpartitionWriter {
    part: Arc<Subpartition>,
    scratch: Vec<u8>,
    flush_every_batch: bool,
}

impl SubpartitionWriter {
    /// A writer into `part`.
    pub fn new(part: Arc<Subpartition>, flush_every_batch: bool) -> Self {
        Self {
            part,
            scratch: Vec::new(),
            flush_every_batch,
        }
    }

    /// Whether the subpartition can take another buffer without waiting for credit (or
    /// has failed, which the next write reports).
    pub fn has_room(&self) -> bool {
        let s = self.part.lock();
        s.failed.is_some() || s.queue.len() < self.part.capacity
    }

    /// Until [`Self::has_room`] holds.
    pub async fn room(&self) {
        self.part.wait_for_room().await;
    }

    /// The subpartition.
    pub fn subpartition(&self) -> &Arc<Subpartition> {
        &self.part
    }

    /// Writes `element`; waits before it while the subpartition is full, never during.
    pub async fn write(&mut self, element: &StreamElement) -> Result<()> {
        if let StreamElement::Barrier(b) = element
            && b.times_out()
        {
            return self.write_barrier(b);
        }
        self.part.wait_for_room().await;
        let (flush, end) = match element {
            StreamElement::Batch(_) => (self.flush_every_batch, false),
            StreamElement::EndOfPartition => (true, true),
            _ => (true, false),
        };
        let chunks = codec::encode_chunks(element)?;
        self.part.lock().elements += 1;
        let last = chunks.len().saturating_sub(1);
        for (i, chunk) in chunks.into_iter().enumerate() {
            let (flush, end) = if i == last {
                (flush, end)
            } else {
                (false, false)
            };
            self.part.append(chunk, flush, end)?;
        }
        Ok(())
    }

    /// Queues aligned barrier `b`, which may time out, in a buffer of its own without
    /// waiting for room, and remembers where.
    fn write_barrier(&mut self, b: &crate::element::Barrier) -> Result<()> {
        self.scratch.clear();
        codec::encode(&StreamElement::Barrier(*b), &mut self.scratch)?;
        let mut s = self.part.lock();
        if let Some(f) = &s.failed {
            return Err(self.part.error(f));
        }
        if !s.current.is_empty() {
            let buf = s.current.split().freeze();
            s.queue.push_back(buf);
            s.current_since = None;
        }
        let at = QueuedBarrier {
            checkpoint_id: b.checkpoint_id,
            buffer: s.sent_buffers + s.queue.len() as u64,
            elements: s.elements,
        };
        s.barriers.push(at);
        s.elements += 1;
        s.queue.push_back(Bytes::copy_from_slice(&self.scratch));
        drop(s);
        self.part.ready.notify_one();
        Ok(())
    }

    /// Whether aligned barrier `checkpoint_id` still queues here.
    pub fn barrier_queued(&self, checkpoint_id: u64) -> bool {
        let mut s = self.part.lock();
        let sent = s.sent_buffers;
        s.barriers.retain(|b| b.buffer >= sent);
        s.barriers.iter().any(|b| b.checkpoint_id == checkpoint_id)
    }

    /// Aligned barrier `checkpoint_id`, if it still queues here, leaves ahead of the
    /// buffers in front of it as an unaligned one; returns those buffers (its output
    /// state), or `None` when it had left already.
    pub fn overtake(&mut self, checkpoint_id: u64) -> Result<Option<Vec<Bytes>>> {
        self.scratch.clear();
        let unaligned =
            crate::element::Barrier::new(checkpoint_id, crate::element::BarrierKind::Unaligned);
        codec::encode(&StreamElement::Barrier(unaligned), &mut self.scratch)?;
        let mut s = self.part.lock();
        if let Some(f) = &s.failed {
            return Err(self.part.error(f));
        }
        let sent = s.sent_buffers;
        s.barriers.retain(|b| b.buffer >= sent);
        let Some(i) = s
            .barriers
            .iter()
            .position(|b| b.checkpoint_id == checkpoint_id)
        else {
            return Ok(None);
        };
        let at = s.barriers.remove(i);
        let index = (at.buffer - sent) as usize;
        let overtaken: Vec<Bytes> = s.queue.iter().take(index).cloned().collect();
        s.queue.remove(index);
        // The consumer never sees the barrier in band: what follows it is numbered one
        // lower there, and so it is here from now on.
        s.elements -= 1;
        for b in &mut s.barriers {
            if b.buffer > at.buffer {
                b.buffer -= 1;
                b.elements -= 1;
            }
        }
        s.priority
            .push_back((at.elements, Bytes::copy_from_slice(&self.scratch)));
        drop(s);
        self.part.ready.notify_one();
        self.part.space.notify_one();
        Ok(Some(overtaken))
    }

    /// Sends `element` (an unaligned barrier) ahead of every queued buffer; returns the
    /// buffers it overtook (the partly filled one finished first).
    pub fn write_priority(&mut self, element: &StreamElement) -> Result<Vec<Bytes>> {
        self.scratch.clear();
        codec::encode(element, &mut self.scratch)?;
        let mut s = self.part.lock();
        if let Some(f) = &s.failed {
            return Err(self.part.error(f));
        }
        if s.finished && s.queue.is_empty() && s.current.is_empty() {
            // Its end is out (a finished task's checkpoint): nothing is in flight to
            // overtake, and a frame queued now would never be sent.
            return Ok(Vec::new());
        }
        if !s.current.is_empty() {
            let buf = s.current.split().freeze();
            s.queue.push_back(buf);
            s.current_since = None;
        }
        let overtaken: Vec<Bytes> = s.queue.iter().cloned().collect();
        let sequence = s.elements;
        s.priority
            .push_back((sequence, Bytes::copy_from_slice(&self.scratch)));
        drop(s);
        self.part.ready.notify_one();
        Ok(overtaken)
    }
}

enum Step {
    Send(Frame),
    Wait(Option<Instant>),
    Done,
    Failed(String),
}

/// Sends the subpartition's buffers against credit until its end of partition is out.
/// `timeout` is the buffer timeout (`None`: buffers are finished by the producer).
pub async fn send_loop(
    part: Arc<Subpartition>,
    frames: mpsc::Sender<Frame>,
    timeout: Option<Duration>,
) -> Result<()> {
    loop {
        let step = {
            let mut s = part.lock();
            if let Some(f) = &s.failed {
                Step::Failed(f.clone())
            } else if let Some((sequence, data)) = s.priority.pop_front() {
                Step::Send(Frame::Priority {
                    id: part.id,
                    sequence,
                    data,
                })
            } else if s.credit > 0 && !s.queue.is_empty() {
                s.credit -= 1;
                let data = s.queue.pop_front().unwrap_or_default();
                s.sent_buffers += 1;
                s.bytes_out += data.len() as u64;
                Step::Send(Frame::Buffer {
                    id: part.id,
                    backlog: s.queue.len() as u32,
                    data,
                })
            } else if s.finished && s.queue.is_empty() && s.current.is_empty() {
                Step::Done
            } else {
                let due = match (timeout, s.current_since) {
                    (Some(t), Some(since)) if !s.current.is_empty() => {
                        if since.elapsed() >= t && s.queue.len() < part.capacity {
                            let buf = s.current.split().freeze();
                            s.queue.push_back(buf);
                            s.current_since = None;
                            continue;
                        }
                        Some(since + t)
                    }
                    _ => None,
                };
                Step::Wait(due)
            }
        };
        match step {
            Step::Send(frame) => {
                let is_buffer = matches!(frame, Frame::Buffer { .. });
                frames
                    .send(frame)
                    .await
                    .map_err(|_| part.error("connection closed"))?;
                if is_buffer {
                    part.space.notify_one();
                }
            }
            Step::Wait(due) => match due {
                Some(due) => {
                    tokio::select! {
                        _ = part.ready.notified() => {}
                        _ = tokio::time::sleep_until(due.into()) => {}
                    }
                }
                None => part.ready.notified().await,
            },
            Step::Done => return Ok(()),
            Step::Failed(f) => return Err(part.error(&f)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc as StdArc;

    use tokio_util::task::AbortOnDropHandle;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::*;
    use crate::element::{Barrier, BarrierKind};

    fn id() -> ChannelId {
        ChannelId {
            chain: 1,
            subtask: 0,
            channel: 0,
        }
    }

    fn batch(rows: i64) -> StreamElement {
        let schema = StdArc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        StreamElement::Batch(
            RecordBatch::try_new(
                schema,
                vec![StdArc::new(Int64Array::from_iter_values(0..rows))],
            )
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn producer_blocks_without_credit_between_elements_and_resumes_with_it() {
        let part = Subpartition::new(id(), "peer".into(), 1024, 2);
        let mut w = SubpartitionWriter::new(part.clone(), true);
        // A 1000-row batch is ~8 KiB: more than two 1 KiB buffers, yet a write that
        // starts with room finishes (overdraft), so its task is never stuck mid-element.
        tokio::time::timeout(Duration::from_secs(5), w.write(&batch(1000)))
            .await
            .expect("an element started with room is finished without waiting")
            .unwrap();
        let queued = part.stats().buffers;
        assert!(
            queued > 2,
            "the element went beyond capacity: {queued} buffers"
        );
        assert!(!w.has_room(), "a full subpartition has no room");
        // The next element waits for the queue to drain below capacity.
        let blocked = tokio::time::timeout(Duration::from_millis(100), w.write(&batch(10))).await;
        assert!(
            blocked.is_err(),
            "the producer must block on a full subpartition"
        );
        assert_eq!(
            part.stats().buffers,
            queued,
            "nothing of the waiting element queued"
        );
        let (tx, mut rx) = mpsc::channel(64);
        let sender = tokio::spawn(send_loop(part.clone(), tx, None));
        part.add_credit(1);
        let Some(Frame::Buffer { backlog, data, .. }) = rx.recv().await else {
            panic!("expected a buffer")
        };
        assert_eq!(data.len(), 1024);
        assert_eq!(backlog, queued - 1);
        // Credit for all but one queued buffer: room again, the next element goes in.
        part.add_credit(queued - 2);
        tokio::time::timeout(Duration::from_secs(5), w.write(&batch(10)))
            .await
            .expect("room after credit")
            .unwrap();
        part.add_credit(100);
        w.write(&StreamElement::EndOfPartition).await.unwrap();
        let mut n = 1;
        while let Some(f) = rx.recv().await {
            assert!(matches!(f, Frame::Buffer { .. }));
            n += 1;
        }
        assert!(n as u32 > queued);
        sender.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn priority_barrier_overtakes_queued_buffers_and_returns_them() {
        let part = Subpartition::new(id(), "peer".into(), 1 << 20, 8);
        let mut w = SubpartitionWriter::new(part.clone(), true);
        w.write(&batch(10)).await.unwrap();
        w.write(&batch(20)).await.unwrap();
        let overtaken = w
            .write_priority(&StreamElement::Barrier(Barrier {
                checkpoint_id: 1,
                kind: BarrierKind::Unaligned,
                timeout_at_ms: 0,
            }))
            .unwrap();
        assert_eq!(overtaken.len(), 2, "both queued buffers were overtaken");
        let (tx, mut rx) = mpsc::channel(16);
        let _sender = AbortOnDropHandle::new(tokio::spawn(send_loop(part.clone(), tx, None)));
        // No credit: only the priority frame goes out.
        let Some(Frame::Priority { sequence, .. }) = rx.recv().await else {
            panic!("expected the barrier first")
        };
        assert_eq!(sequence, 2);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), rx.recv())
                .await
                .is_err()
        );
        part.add_credit(2);
        let Some(Frame::Buffer { data, .. }) = rx.recv().await else {
            panic!("expected a buffer")
        };
        assert_eq!(data, overtaken[0]);
    }

    #[tokio::test]
    async fn an_aligned_barrier_whose_time_is_up_overtakes_the_buffers_in_front_of_it() {
        // Capacity 1: the second batch already fills the queue, yet the barrier that
        // may time out goes in without waiting.
        let part = Subpartition::new(id(), "peer".into(), 1 << 20, 1);
        let mut w = SubpartitionWriter::new(part.clone(), true);
        w.write(&batch(10)).await.unwrap();
        let aligned = Barrier {
            checkpoint_id: 4,
            kind: BarrierKind::Aligned,
            timeout_at_ms: 1,
        };
        tokio::time::timeout(
            Duration::from_secs(5),
            w.write(&StreamElement::Barrier(aligned)),
        )
        .await
        .expect("a barrier that may time out does not wait for room")
        .unwrap();
        part.add_credit(100);
        // Sent before its time was up: nothing to overtake.
        let (tx, mut rx) = mpsc::channel(16);
        let sender = AbortOnDropHandle::new(tokio::spawn(send_loop(part.clone(), tx, None)));
        for _ in 0..2 {
            assert!(matches!(rx.recv().await, Some(Frame::Buffer { .. })));
        }
        assert!(!w.barrier_queued(4));
        assert!(w.overtake(4).unwrap().is_none());
        drop(sender);

        let part = Subpartition::new(id(), "peer".into(), 1 << 20, 8);
        let mut w = SubpartitionWriter::new(part.clone(), true);
        w.write(&batch(10)).await.unwrap();
        w.write(&batch(20)).await.unwrap();
        w.write(&StreamElement::Barrier(aligned)).await.unwrap();
        w.write(&batch(30)).await.unwrap();
        assert!(w.barrier_queued(4));
        let overtaken = w.overtake(4).unwrap().expect("still queued");
        assert_eq!(overtaken.len(), 2, "the two batches in front of it");
        assert!(!w.barrier_queued(4));
        // A later unaligned barrier counts the elements the consumer will see: three
        // batches, the overtaken barrier not among them.
        let later = StreamElement::Barrier(Barrier {
            checkpoint_id: 5,
            kind: BarrierKind::Unaligned,
            timeout_at_ms: 0,
        });
        assert_eq!(w.write_priority(&later).unwrap().len(), 3);
        let (tx, mut rx) = mpsc::channel(16);
        let _sender = AbortOnDropHandle::new(tokio::spawn(send_loop(part.clone(), tx, None)));
        let mut priority = Vec::new();
        for _ in 0..2 {
            let Some(Frame::Priority { sequence, data, .. }) = rx.recv().await else {
                panic!("expected the barriers first")
            };
            let mut d = codec::Decoder::new(1 << 10);
            d.push(&data);
            let Ok(Some(StreamElement::Barrier(b))) = d.next_element() else {
                panic!("not a barrier")
            };
            priority.push((sequence, b.checkpoint_id, b.kind));
        }
        assert_eq!(
            priority,
            [
                (2, 4, BarrierKind::Unaligned),
                (3, 5, BarrierKind::Unaligned)
            ]
        );
        part.add_credit(8);
        let mut buffers = Vec::new();
        for _ in 0..3 {
            let Some(Frame::Buffer { data, .. }) = rx.recv().await else {
                panic!("expected a buffer")
            };
            buffers.push(data);
        }
        assert_eq!(
            &buffers[..2],
            &overtaken[..],
            "the barrier's buffer is gone"
        );
    }

    #[tokio::test]
    async fn a_barrier_after_the_end_went_out_is_not_queued_where_nothing_sends_it() {
        let part = Subpartition::new(id(), "peer".into(), 1 << 20, 8);
        let mut w = SubpartitionWriter::new(part.clone(), true);
        w.write(&batch(10)).await.unwrap();
        w.write(&StreamElement::EndOfPartition).await.unwrap();
        let barrier = StreamElement::Barrier(Barrier {
            checkpoint_id: 1,
            kind: BarrierKind::Unaligned,
            timeout_at_ms: 0,
        });
        // A finished task's barrier while its end is still queued overtakes it.
        assert_eq!(w.write_priority(&barrier).unwrap().len(), 2);
        let (tx, mut rx) = mpsc::channel(16);
        part.add_credit(8);
        let sender = tokio::spawn(send_loop(part.clone(), tx, None));
        let mut frames = 0;
        while rx.recv().await.is_some() {
            frames += 1;
        }
        assert_eq!(frames, 3, "the barrier, the batch and the end");
        sender.await.unwrap().unwrap();
        // Once the end is out, a later barrier has nothing to overtake and is not left
        // queued (the connection would count the channel as unfinished).
        assert!(w.write_priority(&barrier).unwrap().is_empty());
        assert!(part.lock().priority.is_empty());
    }

    #[tokio::test]
    async fn a_consumer_asks_for_smaller_buffers_within_the_configured_size() {
        let part = Subpartition::new(id(), "peer".into(), 4096, 64);
        assert!(part.set_buffer_bytes(8192).is_err(), "more than configured");
        assert!(part.set_buffer_bytes(10).is_err(), "less than 64 bytes");
        part.set_buffer_bytes(1024).unwrap();
        let mut w = SubpartitionWriter::new(part.clone(), true);
        w.write(&batch(1000)).await.unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        part.add_credit(64);
        w.write(&StreamElement::EndOfPartition).await.unwrap();
        send_loop(part.clone(), tx, None).await.unwrap();
        let mut sizes = Vec::new();
        while let Ok(Frame::Buffer { data, .. }) = rx.try_recv() {
            sizes.push(data.len());
        }
        assert!(sizes.len() > 4, "{sizes:?}");
        assert!(sizes.iter().all(|&n| n <= 1024), "{sizes:?}");
    }
}
