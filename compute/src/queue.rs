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
//! A second, unbounded lane carries priority events (unaligned barriers), which overtake
//! queued elements; there is at most one per checkpoint and channel. A priority event
//! carries the channel's sequence number at the moment it was sent, so the gate knows
//! exactly which queued elements it overtook.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc};

use crate::element::StreamElement;
use crate::error::{Error, Result};

/// Default byte budget of one channel.
pub const DEFAULT_CHANNEL_BYTES: usize = 2 << 20;

/// Something that frees capacity when the element holding it is let go.
pub trait Releasable: Send + Sync + std::fmt::Debug {}

/// Frees an element's share of its channel's bound when dropped.
#[derive(Debug, Default)]
pub struct Release {
    bytes: Option<(Arc<Semaphore>, u32)>,
    // Held only so that dropping the element frees the buffer.
    _buffer: Option<Arc<dyn Releasable>>,
}

impl Release {
    /// Holds `buffer` (freed when the last holder lets go).
    pub fn buffer(buffer: Arc<dyn Releasable>) -> Self {
        Self {
            bytes: None,
            _buffer: Some(buffer),
        }
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if let Some((budget, permits)) = self.bytes.take() {
            budget.add_permits(permits as usize);
        }
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
    channel: usize,
}

impl Inlet {
    /// Delivers the element at position `sequence`.
    pub fn deliver(&self, sequence: u64, element: StreamElement, release: Release) -> Result<()> {
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
    budget: Arc<Semaphore>,
    capacity: u32,
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
    /// Sends `element`, waiting while the channel holds its full byte budget.
    pub async fn send(&self, element: StreamElement) -> Result<()> {
        let permits = (element.size_bytes().max(1) as u64).min(u64::from(self.capacity)) as u32;
        self.budget
            .acquire_many(permits)
            .await
            .map_err(|_| Error::Disconnected("queue closed"))?
            .forget();
        let sequence = self.sequence.fetch_add(1, Ordering::AcqRel) + 1;
        let release = Release {
            bytes: Some((self.budget.clone(), permits)),
            _buffer: None,
        };
        self.inlet.deliver(sequence, element, release)
    }

    /// Sends a priority event past everything queued.
    pub fn send_priority(&self, element: StreamElement) -> Result<()> {
        let sequence = self.sequence.load(Ordering::Acquire);
        self.inlet.deliver_priority(sequence, element, Bytes::new())
    }

    /// Whether a quarter of the channel's budget is free: a send of an ordinary element
    /// would not wait.
    pub fn has_room(&self) -> bool {
        self.budget.available_permits() as u64 * 4 >= u64::from(self.capacity)
    }

    /// Bytes of the budget in use (queued, not yet taken by the gate).
    pub fn bytes_in_use(&self) -> usize {
        (self.capacity as usize).saturating_sub(self.budget.available_permits())
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
    channels: usize,
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

    /// Number of input channels.
    pub fn channels(&self) -> usize {
        self.channels
    }
}

/// Creates a consumer with `channels` input channels of `capacity_bytes` each.
pub fn input_queue(channels: usize, capacity_bytes: usize) -> (Vec<QueueSender>, QueueReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (ptx, prx) = mpsc::unbounded_channel();
    let capacity = capacity_bytes.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize)) as u32;
    let senders = (0..channels)
        .map(|channel| QueueSender {
            inlet: Inlet {
                tx: tx.clone(),
                priority: ptx.clone(),
                channel,
            },
            budget: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
            sequence: Arc::new(AtomicU64::new(0)),
        })
        .collect();
    (
        senders,
        QueueReceiver {
            rx,
            priority: prx,
            channels,
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
}
