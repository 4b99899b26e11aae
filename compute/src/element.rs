//! The messages that flow on a stream (DESIGN §3).

use arrow::record_batch::RecordBatch;

/// Event time in milliseconds since the Unix epoch.
pub type Timestamp = i64;

/// Why a barrier was injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierKind {
    /// Channels that delivered the barrier wait for the others.
    Aligned,
    /// The barrier overtakes queued buffers.
    Unaligned,
    /// A user-named checkpoint that is kept.
    Savepoint,
}

/// A checkpoint barrier travelling in-band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    /// The checkpoint (epoch) this barrier closes.
    pub checkpoint_id: u64,
    /// Alignment mode.
    pub kind: BarrierKind,
}

/// One element of a stream.
#[derive(Debug, Clone)]
pub enum StreamElement {
    /// Records.
    Batch(RecordBatch),
    /// No record with an event time at or below this will follow on this channel.
    Watermark(Timestamp),
    /// The channel's producer is idle: leave it out of the watermark minimum until it
    /// sends again.
    Idle,
    /// A checkpoint barrier.
    Barrier(Barrier),
    /// The producer finished; nothing follows on this channel.
    EndOfPartition,
}

impl StreamElement {
    /// Rows carried (0 for control elements).
    pub fn num_rows(&self) -> usize {
        match self {
            StreamElement::Batch(b) => b.num_rows(),
            _ => 0,
        }
    }

    /// Approximate bytes held, used to bound queues.
    pub fn size_bytes(&self) -> usize {
        match self {
            StreamElement::Batch(b) => b.get_array_memory_size(),
            _ => 16,
        }
    }
}
