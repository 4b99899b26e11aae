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
    /// For an aligned barrier of a job with an `aligned_timeout`: the wall-clock time
    /// (Unix milliseconds) from which, still queued behind data or waiting for
    /// alignment, it goes on unaligned. It is the checkpoint's start plus the timeout,
    /// as in Flink, so the time a barrier spent queued upstream counts. 0: never.
    pub timeout_at_ms: u64,
}

impl Barrier {
    /// A barrier of checkpoint `checkpoint_id` that never times out.
    pub fn new(checkpoint_id: u64, kind: BarrierKind) -> Self {
        Self {
            checkpoint_id,
            kind,
            timeout_at_ms: 0,
        }
    }

    /// Whether this is an aligned barrier that may go on unaligned.
    pub fn times_out(&self) -> bool {
        self.kind == BarrierKind::Aligned && self.timeout_at_ms > 0
    }
}

/// Now, in Unix milliseconds (barrier deadlines cross processes, so they are wall-clock
/// times).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The instant of wall-clock time `at_ms` (now, when it has passed).
pub fn instant_of_unix_ms(at_ms: u64) -> std::time::Instant {
    let now = unix_ms();
    std::time::Instant::now() + std::time::Duration::from_millis(at_ms.saturating_sub(now))
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
