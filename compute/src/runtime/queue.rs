//! Bounded queues between tasks, bounded in bytes.
//!
//! Every producer→consumer channel has its own byte budget (a semaphore of bytes); a
//! sender waits until the consumer has taken enough off the queue. All channels of one
//! consumer feed one receiver, each element tagged with its channel index, so the
//! consumer's input gate can track watermarks and end-of-partition per channel. A batch
//! larger than the whole budget takes the whole budget, so it still passes alone.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};

use crate::element::StreamElement;
use crate::error::{Error, Result};

/// Default byte budget of one channel.
pub const DEFAULT_CHANNEL_BYTES: usize = 2 << 20;

struct Envelope {
    channel: usize,
    element: StreamElement,
    permits: u32,
}

/// The sending end of one channel.
#[derive(Clone)]
pub struct QueueSender {
    tx: mpsc::UnboundedSender<Envelope>,
    budget: Arc<Semaphore>,
    capacity: u32,
    channel: usize,
}

impl std::fmt::Debug for QueueSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSender")
            .field("channel", &self.channel)
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
        self.tx
            .send(Envelope {
                channel: self.channel,
                element,
                permits,
            })
            .map_err(|_| Error::Disconnected("the downstream task is gone"))
    }
}

/// The receiving end of all channels of one consumer.
pub struct QueueReceiver {
    rx: mpsc::UnboundedReceiver<Envelope>,
    budgets: Vec<Arc<Semaphore>>,
}

impl std::fmt::Debug for QueueReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueReceiver")
            .field("channels", &self.budgets.len())
            .finish()
    }
}

impl QueueReceiver {
    /// The next element and the channel it came on; `None` once every sender is dropped.
    pub async fn recv(&mut self) -> Option<(usize, StreamElement)> {
        let env = self.rx.recv().await?;
        self.budgets[env.channel].add_permits(env.permits as usize);
        Some((env.channel, env.element))
    }

    /// Number of input channels.
    pub fn channels(&self) -> usize {
        self.budgets.len()
    }
}

/// Creates a consumer with `channels` input channels of `capacity_bytes` each.
pub fn input_queue(channels: usize, capacity_bytes: usize) -> (Vec<QueueSender>, QueueReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let capacity = capacity_bytes.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize)) as u32;
    let budgets: Vec<_> = (0..channels)
        .map(|_| Arc::new(Semaphore::new(capacity as usize)))
        .collect();
    let senders = budgets
        .iter()
        .enumerate()
        .map(|(channel, budget)| QueueSender {
            tx: tx.clone(),
            budget: budget.clone(),
            capacity,
            channel,
        })
        .collect();
    (senders, QueueReceiver { rx, budgets })
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
        assert!(matches!(
            rx.recv().await,
            Some((0, StreamElement::Watermark(1)))
        ));
        tokio::time::timeout(Duration::from_secs(5), s.send(StreamElement::Idle))
            .await
            .unwrap()
            .unwrap();
    }
}
