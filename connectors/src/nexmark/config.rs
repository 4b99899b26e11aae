//! The generator's settings, read from a [`pb::NexmarkSource`] with defaults applied.

use sluice_common::pb;

/// Event-time rate when the spec says 0: events of all streams per second.
pub const DEFAULT_EVENTS_PER_SECOND: u64 = 10_000;

/// Event time of event 0: 2015-07-15T00:00:00Z in milliseconds.
pub const BASE_TIME_MS: i64 = 1_436_918_400_000;

/// What the generator needs to know, defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NexmarkConfig {
    /// The stream generated.
    pub stream: pb::NexmarkStream,
    /// Events of that stream; `None` means unbounded.
    pub events: Option<u64>,
    /// Seed of every random choice.
    pub seed: u64,
    /// Event times are moved back by up to this many milliseconds.
    pub max_out_of_orderness_ms: u64,
    /// Events of all streams per second of event time.
    pub events_per_second: u64,
}

impl NexmarkConfig {
    /// Reads `spec`, applying defaults.
    pub fn from_spec(spec: &pb::NexmarkSource) -> Self {
        NexmarkConfig {
            stream: spec.stream(),
            events: (spec.events != 0).then_some(spec.events),
            seed: spec.seed,
            max_out_of_orderness_ms: spec.max_out_of_orderness_ms,
            events_per_second: match spec.events_per_second {
                0 => DEFAULT_EVENTS_PER_SECOND,
                n => n,
            },
        }
    }

    /// Event time of event number `n` before jitter, in milliseconds.
    #[inline]
    pub fn base_time(&self, n: u64) -> i64 {
        let eps = self.events_per_second;
        BASE_TIME_MS + ((n / eps) * 1000 + (n % eps) * 1000 / eps) as i64
    }
}
