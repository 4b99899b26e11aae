//! A task's input gate: merges its input channels into one ordered stream of elements.
//!
//! The gate owns the per-channel bookkeeping that makes event time work across parallel
//! inputs: a task's watermark is the minimum over channels that are neither idle nor
//! finished, and it only moves forward. A channel that sent `Idle` is left out until it
//! sends anything else; when every open channel is idle the gate reports `Idle` itself.
//! A barrier is passed on once every open channel has delivered it (the alignment point);
//! blocking channels during alignment arrives with the network stack. The gate ends when
//! every channel has ended.

use crate::element::{StreamElement, Timestamp};
use crate::runtime::queue::QueueReceiver;

#[derive(Debug, Clone, Copy)]
struct ChannelState {
    watermark: Timestamp,
    idle: bool,
    finished: bool,
    barrier: Option<u64>,
}

/// Merges the channels of one consumer.
pub struct InputGate {
    rx: QueueReceiver,
    channels: Vec<ChannelState>,
    emitted_watermark: Timestamp,
    all_idle: bool,
    pending_barrier: Option<crate::element::Barrier>,
}

impl InputGate {
    /// A gate over `rx`.
    pub fn new(rx: QueueReceiver) -> Self {
        let n = rx.channels();
        Self {
            rx,
            channels: vec![
                ChannelState {
                    watermark: Timestamp::MIN,
                    idle: false,
                    finished: false,
                    barrier: None
                };
                n
            ],
            emitted_watermark: Timestamp::MIN,
            all_idle: false,
            pending_barrier: None,
        }
    }

    /// The current combined watermark.
    pub fn watermark(&self) -> Timestamp {
        self.emitted_watermark
    }

    /// The next element for the task; `None` once all channels ended.
    pub async fn next(&mut self) -> Option<StreamElement> {
        loop {
            if self.channels.iter().all(|c| c.finished) {
                return None;
            }
            let Some((ch, element)) = self.rx.recv().await else {
                // Every sender dropped without EndOfPartition: an upstream task failed.
                return None;
            };
            if let Some(out) = self.handle(ch, element) {
                return Some(out);
            }
        }
    }

    fn handle(&mut self, ch: usize, element: StreamElement) -> Option<StreamElement> {
        match element {
            StreamElement::Batch(b) => {
                self.activate(ch);
                Some(StreamElement::Batch(b))
            }
            StreamElement::Watermark(ts) => {
                self.activate(ch);
                let c = &mut self.channels[ch];
                c.watermark = c.watermark.max(ts);
                self.advance()
            }
            StreamElement::Idle => {
                self.channels[ch].idle = true;
                self.advance().or_else(|| self.check_all_idle())
            }
            StreamElement::EndOfPartition => {
                self.channels[ch].finished = true;
                if let Some(b) = self.barrier_complete() {
                    return Some(b);
                }
                self.advance()
            }
            StreamElement::Barrier(barrier) => {
                self.channels[ch].barrier = Some(barrier.checkpoint_id);
                self.pending_barrier = Some(barrier);
                self.barrier_complete()
            }
        }
    }

    fn activate(&mut self, ch: usize) {
        self.channels[ch].idle = false;
        self.all_idle = false;
    }

    /// Emits a new watermark when the minimum over open channels moved forward.
    fn advance(&mut self) -> Option<StreamElement> {
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
            })?;
        if min > self.emitted_watermark {
            self.emitted_watermark = min;
            Some(StreamElement::Watermark(min))
        } else {
            None
        }
    }

    fn check_all_idle(&mut self) -> Option<StreamElement> {
        let open: Vec<_> = self.channels.iter().filter(|c| !c.finished).collect();
        if !open.is_empty() && open.iter().all(|c| c.idle) && !self.all_idle {
            self.all_idle = true;
            Some(StreamElement::Idle)
        } else {
            None
        }
    }

    fn barrier_complete(&mut self) -> Option<StreamElement> {
        let barrier = self.pending_barrier?;
        let done = self
            .channels
            .iter()
            .all(|c| c.finished || c.barrier == Some(barrier.checkpoint_id));
        if done {
            self.pending_barrier = None;
            Some(StreamElement::Barrier(barrier))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::queue::input_queue;

    #[tokio::test]
    async fn watermark_is_the_minimum_of_active_channels() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx);
        tx[0].send(StreamElement::Watermark(10)).await.unwrap();
        tx[1].send(StreamElement::Watermark(5)).await.unwrap();
        assert!(matches!(
            gate.next().await,
            Some(StreamElement::Watermark(5))
        ));
        tx[1].send(StreamElement::Idle).await.unwrap();
        // Channel 1 idle: channel 0 alone decides.
        assert!(matches!(
            gate.next().await,
            Some(StreamElement::Watermark(10))
        ));
        tx[0].send(StreamElement::EndOfPartition).await.unwrap();
        tx[1].send(StreamElement::Watermark(20)).await.unwrap();
        assert!(matches!(
            gate.next().await,
            Some(StreamElement::Watermark(20))
        ));
        tx[1].send(StreamElement::EndOfPartition).await.unwrap();
        assert!(gate.next().await.is_none());
    }

    #[tokio::test]
    async fn all_idle_channels_make_the_gate_idle() {
        let (tx, rx) = input_queue(2, 1 << 20);
        let mut gate = InputGate::new(rx);
        tx[0].send(StreamElement::Idle).await.unwrap();
        tx[1].send(StreamElement::Idle).await.unwrap();
        assert!(matches!(gate.next().await, Some(StreamElement::Idle)));
    }
}
