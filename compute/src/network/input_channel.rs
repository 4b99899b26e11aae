//! Consumer side of a remote channel: turns received buffers into elements for the gate.
//!
//! Owned by its connection's reader. Each buffer is checked against credit
//! ([`InputCredit::on_buffer`]), appended to the channel's [`Decoder`], and every element
//! it completes goes into the gate's queue holding a [`BufferGuard`], so the buffer's
//! credit returns to the producer only once the gate lets go of those elements. Bytes of
//! an element that spans buffers are copied into the decoder (bounded by the largest
//! element allowed) and their buffers freed at once, so a batch larger than all buffers
//! of a channel cannot dead-lock it. Each element is also charged its size to the
//! channel's credit until the gate lets go of it (the byte limit of buffer debloating).

use std::sync::Arc;

use bytes::Bytes;

use crate::element::StreamElement;
use crate::network::codec::Decoder;
use crate::network::credit::{BufferGuard, InputCredit};
use crate::network::frame::ChannelId;
use crate::queue::{Inlet, Release};

/// One remote input channel.
#[derive(Debug)]
pub struct RemoteInputChannel {
    id: ChannelId,
    credit: Arc<InputCredit>,
    inlet: Inlet,
    decoder: Decoder,
    sequence: u64,
    finished: bool,
}

impl RemoteInputChannel {
    /// Channel `id` feeding `inlet`, bounded by `credit`.
    pub fn new(id: ChannelId, credit: Arc<InputCredit>, inlet: Inlet, max_element: usize) -> Self {
        Self {
            id,
            credit,
            inlet,
            decoder: Decoder::new(max_element),
            sequence: 0,
            finished: false,
        }
    }

    /// The channel.
    pub fn id(&self) -> ChannelId {
        self.id
    }

    /// Its credit (for metrics and opening).
    pub fn credit(&self) -> &Arc<InputCredit> {
        &self.credit
    }

    /// True once the end of partition arrived.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// A buffer arrived; errors describe a protocol violation.
    pub fn on_buffer(&mut self, backlog: u32, data: &Bytes) -> Result<(), String> {
        if self.finished {
            return Err(format!("channel {} sent data after its end", self.id));
        }
        self.credit.on_buffer(backlog)?;
        let guard: Arc<BufferGuard> = Arc::new(BufferGuard(self.credit.clone()));
        self.decoder.push(data);
        loop {
            let element = self
                .decoder
                .next_element()
                .map_err(|e| format!("channel {}: {e}", self.id))?;
            let Some(element) = element else { break };
            self.sequence += 1;
            let end = matches!(element, StreamElement::EndOfPartition);
            let bytes = element.size_bytes();
            self.credit.charge(bytes);
            let release = Release::buffer(guard.clone()).charged(self.credit.clone(), bytes);
            // A consumer that is gone has failed or been cancelled; its task reports that.
            let _ = self.inlet.deliver(self.sequence, element, release);
            if end {
                self.finished = true;
                self.credit.finish();
                if self.decoder.pending_bytes() > 0 {
                    return Err(format!("channel {} sent data after its end", self.id));
                }
                break;
            }
        }
        Ok(())
    }

    /// A priority event sent after `sequence` elements of the channel. The gate is told
    /// how many elements arrived before it instead: those after, up to `sequence`, were
    /// overtaken at the producer (its output state holds them, the decoder the head of
    /// the first), so the gate must not count them as its own.
    pub fn on_priority(&mut self, sequence: u64, data: &Bytes) -> Result<(), String> {
        if self.sequence > sequence {
            return Err(format!(
                "channel {}: a priority event after {sequence} elements arrived after {}",
                self.id, self.sequence
            ));
        }
        let mut decoder = Decoder::new(data.len());
        decoder.push(data);
        match decoder.next_element() {
            Ok(Some(element)) if decoder.pending_bytes() == 0 => {
                let partial = self.decoder.pending();
                let _ = self.inlet.deliver_priority(self.sequence, element, partial);
                Ok(())
            }
            Ok(_) => Err(format!("channel {}: malformed priority event", self.id)),
            Err(e) => Err(format!("channel {}: {e}", self.id)),
        }
    }

    /// Fails the consuming task with `error`.
    pub fn fail(&self, error: crate::Error) {
        if !self.finished {
            self.inlet.fail(error);
        }
    }
}
