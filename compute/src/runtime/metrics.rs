//! Job-wide counters the progress line and `sluice bench` read while a job runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::element::Timestamp;
use crate::keyed::CacheCounters;
use crate::operator::window::WindowCounters;

/// Counters shared by every task of one job.
#[derive(Debug, Default)]
pub struct JobMetrics {
    /// Records read by all sources.
    pub records_in: Arc<AtomicU64>,
    /// Records written by all sinks (late side outputs included).
    pub records_out: Arc<AtomicU64>,
    /// Malformed input records skipped or sent to a dead-letter output.
    pub skipped_records: Arc<AtomicU64>,
    /// Barriers that reached sinks (in order; a sink fails otherwise).
    pub sink_barriers: Arc<AtomicU64>,
    /// Every source subtask's counters (their `watermark` is the job's progress).
    pub sources: std::sync::Mutex<Vec<Arc<TaskMetrics>>>,
    /// Late-record counters of every window subtask.
    pub windows: std::sync::Mutex<Vec<Arc<WindowCounters>>>,
    /// Every task's counters, once deployed (the progress reports sample them).
    pub tasks: std::sync::Mutex<Vec<Arc<TaskMetrics>>>,
}

impl JobMetrics {
    /// Registers a source subtask, whose watermark counts for the job's progress.
    pub fn add_source(&self, task: Arc<TaskMetrics>) {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }

    /// Registers the counters of a window subtask whose cache reports to `cache`.
    pub fn window_counters(&self, cache: Arc<CacheCounters>) -> Arc<WindowCounters> {
        let c = Arc::new(WindowCounters {
            cache,
            ..WindowCounters::default()
        });
        self.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(c.clone());
        c
    }

    /// The job's event-time progress: the minimum source watermark, if all have one.
    pub fn watermark(&self) -> Option<Timestamp> {
        let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let min = sources
            .iter()
            .map(|t| t.watermark.load(Ordering::Relaxed))
            .min()?;
        (min != Timestamp::MIN).then_some(min)
    }

    /// Late records counted by all windows.
    pub fn late_records(&self) -> u64 {
        let w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        w.iter()
            .map(|c| c.late_records.load(Ordering::Relaxed))
            .sum()
    }
}

/// Per-task figures (DESIGN §6): where the task's time goes and what flows through it.
///
/// Times are cumulative nanoseconds; a reporter turns deltas into milliseconds per
/// second. *Idle* is time waiting for input, *back-pressured* time waiting for room
/// downstream (a full queue or subpartition), *busy* the rest of the time spent on
/// elements.
#[derive(Debug, Default)]
pub struct TaskMetrics {
    /// `node[subtask]`.
    pub name: String,
    /// Nanoseconds handling elements (including back-pressured time).
    pub work_ns: AtomicU64,
    /// Nanoseconds waiting for room downstream.
    pub backpressured_ns: AtomicU64,
    /// Nanoseconds waiting for input.
    pub idle_ns: AtomicU64,
    /// A send waiting for room downstream now (counted in `backpressured_ns` and
    /// `work_ns` only when it ends).
    pub blocked: Ongoing,
    /// A wait for input at the task's gate now (counted in `idle_ns` when it ends).
    pub waiting: Ongoing,
    /// Records taken in (read by a source or received).
    pub records_in: AtomicU64,
    /// Records sent downstream.
    pub records_out: AtomicU64,
    /// Bytes received (approximate in-memory size for local channels).
    pub bytes_in: AtomicU64,
    /// Bytes sent on local channels (remote ones are counted by their subpartitions).
    pub bytes_out: AtomicU64,
    /// Barriers this task passed on.
    pub barriers: AtomicU64,
    /// The task's keyed operators' cache of decoded state.
    pub cache: Arc<CacheCounters>,
    /// A source task's split that holds its watermark back (empty: none).
    pub watermark_held_by: std::sync::Mutex<String>,
    /// The newest watermark the task passed on (`i64::MIN`: none yet).
    pub watermark: AtomicI64,
    /// Nanoseconds a source task paused because it was ahead of its alignment group
    /// (counted in `idle_ns` too).
    pub alignment_paused_ns: AtomicU64,
    /// What bounds each channel of the task's input gate (for its in-flight bytes).
    pub input_bounds: std::sync::OnceLock<Vec<Arc<dyn crate::queue::ChannelBound>>>,
    /// Bytes each input channel may hold, as buffer debloating last set it (0: not
    /// debloated).
    pub channel_limit_bytes: AtomicU64,
    /// The input gate's measured throughput: bytes received per second of time not
    /// spent waiting for input, smoothed (0: not measured yet).
    pub input_bytes_per_s: AtomicU64,
}

/// Nanoseconds since this process first asked, plus one (never 0): the clock of
/// [`Ongoing`] spans and of the samplers that read them.
pub fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
        + 1
}

/// A span of time a task is in right now, so that a sampler can count it before it
/// ends: a send that waits five seconds for credit is back pressure during those
/// seconds, not only once it is over.
#[derive(Debug, Default)]
pub struct Ongoing(AtomicU64);

impl Ongoing {
    /// The span starts now; returns when ([`now_ns`]).
    pub fn begin(&self) -> u64 {
        let t = now_ns();
        self.0.store(t, Ordering::Relaxed);
        t
    }

    /// The span started at `t` ([`now_ns`]; tests drive the clock).
    #[cfg(test)]
    pub(crate) fn begin_at(&self, t: u64) {
        self.0.store(t, Ordering::Relaxed);
    }

    /// The span ended (after its time was added to its counter).
    pub fn end(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// When the current span started, if one is open.
    pub fn since(&self) -> Option<u64> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }
}

/// Sends slower than this count as waiting for room downstream.
const BLOCKED_AFTER: std::time::Duration = std::time::Duration::from_micros(50);

impl TaskMetrics {
    /// Metrics of task `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            watermark: AtomicI64::new(Timestamp::MIN),
            ..Self::default()
        }
    }

    /// One send of `rows` records that took `took`.
    pub fn add_send(&self, rows: u64, took: std::time::Duration) {
        self.records_out.fetch_add(rows, Ordering::Relaxed);
        if took > BLOCKED_AFTER {
            self.backpressured_ns
                .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// Bytes the task's input channels hold (received, not yet let go by its gate).
    pub fn input_in_flight_bytes(&self) -> u64 {
        self.input_bounds
            .get()
            .map_or(0, |b| b.iter().map(|b| b.held_bytes() as u64).sum())
    }

    /// Bytes sent on a local channel.
    pub fn add_bytes_out(&self, bytes: u64) {
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }
}
