//! The queues in front of a task's input gate: every channel of one consumer feeds one
//! receiver, each element tagged with its channel and its sequence number there.
//!
//! Memory is bounded per channel, never by input rate. A local channel (producer in the
//! same process) has a byte budget (a semaphore of bytes): a sender waits until the
//! consumer has taken enough off the queue. A remote channel is fed by the network
//! (`network::input_channel`) and bounded by credits: each element holds a
//! [`Release`] of the network buffer it came in, and the buffer's credit goes back to
//! the producer only when the gate lets go of the element. Either way the bound holds
//! while the gate keeps an element aside (a channel blocked for barrier alignment).
//!
//! Buffer debloating may limit a channel below its budget ([`ChannelBound::set_limit`]):
//! a local sender then waits while the channel holds the limit, a remote channel
//! withholds credit.
//!
//! A second, unbounded lane carries priority events (unaligned barriers), which overtake
//! queued elements; there is at most one per checkpoint and channel. A priority event
//! carries the channel's sequence number at the moment it was sent, so the gate knows
//! exactly which queued elements it overtook.
//!
//! An aligned barrier that may time out (`Barrier::times_out`) is *announced* as it is
//! queued ([`QueueReceiver::announced`]), as Flink's input channels announce a barrier
//! behind buffers: the gate learns of it before it reaches it, and when its time is up
//! takes the elements in front of it aside and lets it overtake them. Such a barrier is
//! also sent without waiting for the channel's budget (16 bytes over it at most), so a
//! back-pressured producer can pass it on.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{Notify, Semaphore, mpsc};

use crate::element::{Barrier, StreamElement};
use crate::error::{Error, Result};

/// Aligned barriers that may time out, queued in front of one gate and not taken yet.
#[derive(Debug, Default)]
pub struct Announced {
    count: AtomicUsize,
    barriers: Mutex<Vec<Announcement>>,
}

/// One announced barrier.
#[derive(Debug, Clone, Copy)]
pub struct Announcement {
    /// The channel index in the gate.
    pub channel: usize,
    /// The barrier's position in its channel.
    pub sequence: u64,
    /// The barrier.
    pub barrier: Barrier,
}

impl Announced {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Announcement>> {
        self.barriers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, a: Announcement) {
        let mut b = self.lock();
        b.push(a);
        self.count.store(b.len(), Ordering::Release);
    }
}

/// Default byte budget of one channel.
pub const DEFAULT_CHANNEL_BYTES: usize = 2 << 20;

/// Something that frees capacity when the element holding it is let go.
pub trait Releasable: Send + Sync + std::fmt::Debug {}

/// The bytes one channel may hold in front of its gate: what its elements are charged
/// to until the gate lets go of them, and the limit buffer debloating sets. A local
/// channel's sender waits while the channel holds its limit; a remote channel withholds
/// credit instead.
pub trait ChannelBound: Send + Sync + std::fmt::Debug {
    /// Bytes of elements the channel holds now (delivered, not yet let go by the gate).
    fn held_bytes(&self) -> usize;
    /// The channel takes more only while it holds less than `bytes` (at least one
    /// element always passes).
    fn set_limit(&self, bytes: usize);
    /// The gate let go of an element charged `bytes`.
    fn give_back(&self, bytes: usize);
}

/// Frees an element's share of its channel's bound when dropped.
#[derive(Debug, Default)]
pub struct Release {
    charged: Option<(Arc<dyn ChannelBound>, usize)>,
    // Held only so that dropping the element frees the buffer (after its bytes were
    // given back: fields drop after `drop`).
    _buffer: Option<Arc<dyn Releasable>>,
}

impl Release {
    /// Holds `buffer` (freed when the last holder lets go).
    pub fn buffer(buffer: Arc<dyn Releasable>) -> Self {
        Self {
            charged: None,
            _buffer: Some(buffer),
        }
    }

    /// Also gives `bytes` back to `bound` when let go (the caller charged them).
    pub fn charged(mut self, bound: Arc<dyn ChannelBound>, bytes: usize) -> Self {
        self.charged = Some((bound, bytes));
        self
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if let Some((bound, bytes)) = self.charged.take() {
            bound.give_back(bytes);
        }
    }
}

/// A local channel's byte budget: a semaphore of `capacity` bytes (the configured
/// maximum), and below it the limit debloating sets, which a sender waits for.
#[derive(Debug)]
struct LocalBound {
    permits: Semaphore,
    capacity: u32,
    limit: AtomicUsize,
    room: Notify,
}

impl LocalBound {
    fn new(capacity: u32) -> Self {
        Self {
            permits: Semaphore::new(capacity as usize),
            capacity,
            limit: AtomicUsize::new(usize::MAX),
            room: Notify::new(),
        }
    }

    fn under_limit(&self) -> bool {
        self.held_bytes() < self.limit.load(Ordering::Acquire)
    }

    /// Waits until the channel holds less than its limit.
    async fn wait_under_limit(&self) {
        self.wait_until(Self::under_limit).await;
    }

    /// Waits until `ready` holds, checked again whenever bytes are given back.
    async fn wait_until(&self, ready: impl Fn(&Self) -> bool) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(self) {
                return;
            }
            notified.await;
        }
    }

    /// A quarter of the budget is free and the channel holds less than its limit.
    fn has_room(&self) -> bool {
        self.permits.available_permits() as u64 * 4 >= u64::from(self.capacity)
            && self.under_limit()
    }
}

impl ChannelBound for LocalBound {
    fn held_bytes(&self) -> usize {
        (self.capacity as usize).saturating_sub(self.permits.available_permits())
    }

    fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes.max(1), Ordering::Release);
        self.room.notify_waiters();
    }

    fn give_back(&self, bytes: usize) {
        self.permits.add_permits(bytes);
        // Wakes a sender waiting under a debloating limit or for room
        // (`QueueSender::room`): a lock per element taken.
        self.room.notify_waiters();
    }
}

/// One element (or a channel failure) on its way to a gate.
#[derive(Debug)]
pub struct Envelope {
    /// The channel index in the gate.
    pub channel: usize,
    /// 1-based position of the element in its channel (0 for failures).
    pub sequence: u64,
    /// The element, or why the channel failed.
    pub item: Result<StreamElement>,
    /// Frees the element's share of the channel's bound when dropped.
    pub release: Release,
}

/// A priority event on its way to a gate.
#[derive(Debug)]
pub struct PriorityEnvelope {
    /// The channel index in the gate.
    pub channel: usize,
    /// Elements of the channel sent before the event.
    pub sequence: u64,
    /// The event.
    pub element: StreamElement,
    /// The bytes of an element the channel had begun to receive when the event arrived
    /// (remote channels; its rest was overtaken at the producer).
    pub partial: Bytes,
}

/// The raw entry of one channel into a gate; used by remote input channels, which bound
/// themselves with credits.
#[derive(Debug, Clone)]
pub struct Inlet {
    tx: mpsc::UnboundedSender<Envelope>,
    priority: mpsc::UnboundedSender<PriorityEnvelope>,
    announced: Arc<Announced>,
    channel: usize,
}

impl Inlet {
    /// Delivers the element at position `sequence`.
    pub fn deliver(&self, sequence: u64, element: StreamElement, release: Release) -> Result<()> {
        if let StreamElement::Barrier(barrier) = &element
            && barrier.times_out()
        {
            self.announced.add(Announcement {
                channel: self.channel,
                sequence,
                barrier: *barrier,
            });
        }
        self.tx
            .send(Envelope {
                channel: self.channel,
                sequence,
                item: Ok(element),
                release,
            })
            .map_err(|_| Error::Disconnected("the downstream task is gone"))
    }

    /// Delivers a priority event sent after `sequence` elements, with the `partial`
    /// bytes of an element the channel had begun to receive.
    pub fn deliver_priority(
        &self,
        sequence: u64,
        element: StreamElement,
        partial: Bytes,
    ) -> Result<()> {
        self.priority
            .send(PriorityEnvelope {
                channel: self.channel,
                sequence,
                element,
                partial,
            })
            .map_err(|_| Error::Disconnected("the downstream task is gone"))
    }

    /// Tells the gate the channel failed; the consuming task fails with `error`.
    pub fn fail(&self, error: Error) {
        let _ = self.tx.send(Envelope {
            channel: self.channel,
            sequence: 0,
            item: Err(error),
            release: Release::default(),
        });
    }

    /// The channel index in the gate.
    pub fn channel(&self) -> usize {
        self.channel
    }
}

/// The sending end of one local channel.
#[derive(Clone)]
pub struct QueueSender {
    inlet: Inlet,
    budget: Arc<LocalBound>,
    sequence: Arc<AtomicU64>,
}

impl std::fmt::Debug for QueueSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSender")
            .field("channel", &self.inlet.channel)
            .finish()
    }
}

impl QueueSender {
    /// Sends `element`, waiting while the channel holds its full byte budget (or the
    /// smaller limit debloating set). An element sent while the channel has room
    /// ([`Self::has_room`]) never waits: it is charged no more than what is free (an
    /// overdraft of at most one element, as a subpartition's), so a task that checked
    /// for room is not stuck in the send where it cannot take a checkpoint's trigger.
    pub async fn send(&self, element: StreamElement) -> Result<()> {
        if let StreamElement::Barrier(b) = &element
            && b.times_out()
        {
            let sequence = self.sequence.fetch_add(1, Ordering::AcqRel) + 1;
            return self.inlet.deliver(sequence, element, Release::default());
        }
        let budget = &self.budget;
        let mut permits =
            (element.size_bytes().max(1) as u64).min(u64::from(budget.capacity)) as u32;
        if self.has_room() {
            permits = permits
                .min(budget.permits.available_permits() as u32)
                .max(1);
        }
        budget.wait_under_limit().await;
        budget
            .permits
            .acquire_many(permits)
            .await
            .map_err(|_| Error::Disconnected("queue closed"))?
            .forget();
        let sequence = self.sequence.fetch_add(1, Ordering::AcqRel) + 1;
        let release = Release {
            charged: Some((
                self.budget.clone() as Arc<dyn ChannelBound>,
                permits as usize,
            )),
            _buffer: None,
        };
        self.inlet.deliver(sequence, element, release)
    }

    /// Sends a priority event past everything queued.
    pub fn send_priority(&self, element: StreamElement) -> Result<()> {
        let sequence = self.sequence.load(Ordering::Acquire);
        self.inlet.deliver_priority(sequence, element, Bytes::new())
    }

    /// Whether a quarter of the channel's budget is free and it holds less than its
    /// limit: a send of an ordinary element would not wait.
    pub fn has_room(&self) -> bool {
        self.budget.has_room()
    }

    /// Until [`Self::has_room`] holds.
    pub async fn room(&self) {
        self.budget.wait_until(LocalBound::has_room).await;
    }

    /// Bytes of the budget in use (queued, not yet taken by the gate).
    pub fn bytes_in_use(&self) -> usize {
        self.budget.held_bytes()
    }

    /// This channel's raw inlet (for a remote channel, which bounds itself by credit).
    pub fn into_inlet(self) -> Inlet {
        self.inlet
    }
}

/// The receiving end of all channels of one consumer.
pub struct QueueReceiver {
    rx: mpsc::UnboundedReceiver<Envelope>,
    priority: mpsc::UnboundedReceiver<PriorityEnvelope>,
    announced: Arc<Announced>,
    channels: usize,
    bounds: Vec<Arc<dyn ChannelBound>>,
}

impl std::fmt::Debug for QueueReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueReceiver")
            .field("channels", &self.channels)
            .finish()
    }
}

/// What the receiver got next.
#[derive(Debug)]
pub enum Received {
    /// An element (or a failure) in channel order.
    Element(Envelope),
    /// A priority event.
    Priority(PriorityEnvelope),
}

impl QueueReceiver {
    /// The next priority event, or else the next element; `None` once every sender is
    /// dropped. Cancel-safe.
    pub async fn recv(&mut self) -> Option<Received> {
        tokio::select! {
            biased;
            Some(p) = self.priority.recv() => Some(Received::Priority(p)),
            e = self.rx.recv() => e.map(Received::Element),
        }
    }

    /// A priority event already queued.
    pub fn try_recv_priority(&mut self) -> Option<PriorityEnvelope> {
        self.priority.try_recv().ok()
    }

    /// An element already queued.
    pub fn try_recv(&mut self) -> Option<Envelope> {
        self.rx.try_recv().ok()
    }

    /// The announced barriers not taken yet (see the module doc); cheap when none are.
    pub fn announced(&self) -> Vec<Announcement> {
        if self.announced.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.announced.lock().clone()
    }

    /// The gate took (or let overtake) barrier `checkpoint_id` of `channel`, and every
    /// older one there.
    pub fn taken(&self, channel: usize, checkpoint_id: u64) {
        if self.announced.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut b = self.announced.lock();
        b.retain(|a| a.channel != channel || a.barrier.checkpoint_id > checkpoint_id);
        self.announced.count.store(b.len(), Ordering::Release);
    }

    /// Number of input channels.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// What bounds each channel, by channel index.
    pub fn bounds(&self) -> &[Arc<dyn ChannelBound>] {
        &self.bounds
    }

    /// Channel `channel` is remote and bounded by `bound` (its credit) rather than by
    /// the local byte budget it was created with.
    pub fn set_bound(&mut self, channel: usize, bound: Arc<dyn ChannelBound>) {
        if let Some(b) = self.bounds.get_mut(channel) {
            *b = bound;
        }
    }
}

/// Creates a consumer with `channels` input channels of `capacity_bytes` each.
pub fn input_queue(channels: usize, capacity_bytes: usize) -> (Vec<QueueSender>, QueueReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (ptx, prx) = mpsc::unbounded_channel();
    let announced = Arc::new(Announced::default());
    let capacity = capacity_bytes.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize)) as u32;
    let senders: Vec<QueueSender> = (0..channels)
        .map(|channel| QueueSender {
            inlet: Inlet {
                tx: tx.clone(),
                priority: ptx.clone(),
                announced: announced.clone(),
                channel,
            },
            budget: Arc::new(LocalBound::new(capacity)),
            sequence: Arc::new(AtomicU64::new(0)),
        })
        .collect();
    let bounds = senders
        .iter()
        .map(|s| s.budget.clone() as Arc<dyn ChannelBound>)
        .collect();
    (
        senders,
        QueueReceiver {
            rx,
            priority: prx,
            announced,
            channels,
            bounds,
        },
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn sender_waits_for_budget() {
        let (senders, mut rx) = input_queue(1, 100);
        let s = senders[0].clone();
        // Control elements cost 16 bytes: six fit, the seventh waits.
        for _ in 0..6 {
            s.send(StreamElement::Watermark(1)).await.unwrap();
        }
        let blocked =
            tokio::time::timeout(Duration::from_millis(50), s.send(StreamElement::Idle)).await;
        assert!(blocked.is_err(), "the seventh element must wait for budget");
        let Some(Received::Element(env)) = rx.recv().await else {
            panic!("expected an element")
        };
        assert!(matches!(env.item, Ok(StreamElement::Watermark(1))));
        assert_eq!(env.sequence, 1);
        // The budget comes back only when the element is let go.
        let still =
            tokio::time::timeout(Duration::from_millis(50), s.send(StreamElement::Idle)).await;
        assert!(
            still.is_err(),
            "budget must stay taken while the element is held"
        );
        drop(env);
        tokio::time::timeout(Duration::from_secs(5), s.send(StreamElement::Idle))
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn room_wakes_a_waiting_sender_when_the_gate_lets_go_of_an_element() {
        // Control elements cost 16 bytes: with 40 of budget, two leave less than a
        // quarter free.
        let (senders, mut rx) = input_queue(1, 40);
        let s = senders[0].clone();
        s.send(StreamElement::Watermark(1)).await.unwrap();
        s.send(StreamElement::Watermark(2)).await.unwrap();
        assert!(!s.has_room());
        let no_room = tokio::time::timeout(Duration::from_millis(50), s.room()).await;
        assert!(no_room.is_err(), "room must wait while the channel is full");
        let waiting = tokio::spawn({
            let s = s.clone();
            async move { s.room().await }
        });
        let Some(Received::Element(env)) = rx.recv().await else {
            panic!("expected an element")
        };
        drop(env);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room must wake when bytes come back")
            .unwrap();
        assert!(s.has_room());
    }

    #[tokio::test]
    async fn a_debloated_channel_takes_elements_only_while_under_its_limit() {
        let (senders, mut rx) = input_queue(1, 1000);
        let s = senders[0].clone();
        let bound = rx.bounds()[0].clone();
        bound.set_limit(40);
        // Control elements cost 16 bytes: three pass (the third starts under 40).
        for _ in 0..3 {
            s.send(StreamElement::Watermark(1)).await.unwrap();
        }
        assert_eq!(bound.held_bytes(), 48);
        assert!(!s.has_room());
        let blocked =
            tokio::time::timeout(Duration::from_millis(50), s.send(StreamElement::Idle)).await;
        assert!(
            blocked.is_err(),
            "a channel at its limit must make the sender wait"
        );
        // The gate lets go of one element: the channel is under its limit again.
        let Some(Received::Element(env)) = rx.recv().await else {
            panic!("expected an element")
        };
        drop(env);
        tokio::time::timeout(Duration::from_secs(5), s.send(StreamElement::Idle))
            .await
            .unwrap()
            .unwrap();
        // Raising the limit wakes a waiting sender at once.
        let waiting = tokio::spawn({
            let s = s.clone();
            async move { s.send(StreamElement::Idle).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        bound.set_limit(1000);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
