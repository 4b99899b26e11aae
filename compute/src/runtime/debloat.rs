//! Buffer debloating (Flink's): an input gate sizes what its channels may hold so that
//! the data in flight in front of it takes about a target time to drain.
//!
//! Every [`PERIOD`] the gate's throughput is measured from its task's counters: bytes
//! received over the time the task did not wait for input (a task that waits is not
//! slowed by its buffers), smoothed over about a second. Each open channel may then
//! hold `throughput x target / open channels` bytes, between [`MIN_CHANNEL_BYTES`] and
//! the channel's configured budget. A local channel's sender waits while its channel
//! holds that much; a remote channel withholds credit and asks its producer for buffers
//! of an eighth of it (`crate::network::credit`). Under back pressure this is what makes
//! an aligned barrier reach the task in about the target time instead of behind every
//! buffer the settings allow.
//!
//! It knows channel bounds ([`ChannelBound`]), not whether a channel is local or remote.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::queue::ChannelBound;
use crate::runtime::metrics::TaskMetrics;

/// How often a gate measures its throughput and resizes its channels.
pub const PERIOD: Duration = Duration::from_millis(200);
/// The least a debloated channel may hold: room for a few small batches.
pub const MIN_CHANNEL_BYTES: usize = 16 << 10;
/// Weight of the newest throughput sample (five samples, about a second, dominate).
const SMOOTHING: f64 = 0.3;
/// Limits closer than this to the current one are not applied (no churn of credit
/// announcements and buffer-size frames on noise).
const CHANGE_THRESHOLD: f64 = 0.1;

/// What a gate debloats to.
#[derive(Debug, Clone, Copy)]
pub struct DebloatConfig {
    /// In-flight data should drain in about this long.
    pub target: Duration,
    /// The most a channel may hold (its configured budget).
    pub max_channel_bytes: usize,
}

/// Measures a gate's throughput and, when debloating, sets its channels' limits.
#[derive(Debug)]
pub struct GateMonitor {
    metrics: Arc<TaskMetrics>,
    bounds: Vec<Arc<dyn ChannelBound>>,
    debloat: Option<DebloatConfig>,
    last_at: Instant,
    last_bytes: u64,
    last_idle_ns: u64,
    /// Smoothed bytes per second of time not spent waiting for input.
    rate: Option<f64>,
    /// The per-channel limit applied last (0: none yet).
    limit: usize,
}

impl GateMonitor {
    /// A monitor of the gate whose channels `bounds` bound, reading `metrics`.
    pub fn new(
        metrics: Arc<TaskMetrics>,
        bounds: Vec<Arc<dyn ChannelBound>>,
        debloat: Option<DebloatConfig>,
    ) -> Self {
        let _ = metrics.input_bounds.set(bounds.clone());
        Self {
            last_bytes: metrics.bytes_in.load(Ordering::Relaxed),
            last_idle_ns: metrics.idle_ns.load(Ordering::Relaxed),
            metrics,
            bounds,
            debloat,
            last_at: Instant::now(),
            rate: None,
            limit: 0,
        }
    }

    /// Whether a period has passed since the last measurement.
    pub fn due(&self, now: Instant) -> bool {
        now.duration_since(self.last_at) >= PERIOD
    }

    /// Measures the period up to `now` and resizes the channels (`open` of them have not
    /// finished).
    pub fn tick(&mut self, now: Instant, open: usize) {
        let bytes = self.metrics.bytes_in.load(Ordering::Relaxed);
        let idle_ns = self.metrics.idle_ns.load(Ordering::Relaxed);
        let wall = now.duration_since(self.last_at).as_nanos() as u64;
        let active = wall.saturating_sub(idle_ns.saturating_sub(self.last_idle_ns));
        let received = bytes.saturating_sub(self.last_bytes);
        self.last_at = now;
        self.last_bytes = bytes;
        self.last_idle_ns = idle_ns;
        // A task that hardly worked in the period tells nothing of how fast it drains.
        if active < wall / 100 || active == 0 {
            return;
        }
        let sample = received as f64 * 1e9 / active as f64;
        let rate = match self.rate {
            None => sample,
            Some(r) => r + SMOOTHING * (sample - r),
        };
        self.rate = Some(rate);
        self.metrics
            .input_bytes_per_s
            .store(rate as u64, Ordering::Relaxed);
        if let Some(config) = self.debloat {
            self.resize(&config, rate, open);
        }
    }

    fn resize(&mut self, config: &DebloatConfig, rate: f64, open: usize) {
        let want = rate * config.target.as_secs_f64() / open.max(1) as f64;
        let max = config.max_channel_bytes.max(MIN_CHANNEL_BYTES);
        let limit = (want as usize).clamp(MIN_CHANNEL_BYTES, max);
        let change = (limit as f64 - self.limit as f64).abs() / self.limit.max(1) as f64;
        if self.limit != 0 && change < CHANGE_THRESHOLD {
            return;
        }
        self.limit = limit;
        for bound in &self.bounds {
            bound.set_limit(limit);
        }
        self.metrics
            .channel_limit_bytes
            .store(limit as u64, Ordering::Relaxed);
    }

    /// The per-channel limit applied last (0: none).
    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Debug, Default)]
    struct Probe(Mutex<Vec<usize>>);

    impl ChannelBound for Probe {
        fn held_bytes(&self) -> usize {
            0
        }
        fn set_limit(&self, bytes: usize) {
            self.0.lock().unwrap().push(bytes);
        }
        fn give_back(&self, _: usize) {}
    }

    #[test]
    fn channels_hold_about_the_target_time_of_throughput_between_the_bounds() {
        let metrics = Arc::new(TaskMetrics::new("t"));
        let probe = Arc::new(Probe::default());
        let bounds: Vec<Arc<dyn ChannelBound>> =
            vec![probe.clone() as Arc<dyn ChannelBound>, probe.clone()];
        let config = DebloatConfig {
            target: Duration::from_secs(1),
            max_channel_bytes: 2 << 20,
        };
        let mut m = GateMonitor::new(metrics.clone(), bounds, Some(config));
        let start = m.last_at;
        // 1 MB in a second, half of it spent waiting for input: 2 MB/s of work, 1 MB
        // per channel of two.
        metrics.bytes_in.store(1_000_000, Ordering::Relaxed);
        metrics.idle_ns.store(500_000_000, Ordering::Relaxed);
        m.tick(start + Duration::from_secs(1), 2);
        assert_eq!(m.limit(), 1_000_000);
        assert_eq!(*probe.0.lock().unwrap(), vec![1_000_000, 1_000_000]);
        // Then a trickle: 1 KB/s, never waiting; the limit falls to the floor, not to 0.
        for s in 2..30u64 {
            metrics
                .bytes_in
                .fetch_add(1_000, std::sync::atomic::Ordering::Relaxed);
            m.tick(start + Duration::from_secs(s), 1);
        }
        assert_eq!(m.limit(), MIN_CHANNEL_BYTES);
        // A fast input asks for more than the channel's budget: the budget it is.
        metrics.bytes_in.fetch_add(100_000_000, Ordering::Relaxed);
        for s in 30..40u64 {
            metrics.bytes_in.fetch_add(100_000_000, Ordering::Relaxed);
            m.tick(start + Duration::from_secs(s), 1);
        }
        assert_eq!(m.limit(), 2 << 20);
        assert_eq!(metrics.channel_limit_bytes.load(Ordering::Relaxed), 2 << 20);
    }
}
