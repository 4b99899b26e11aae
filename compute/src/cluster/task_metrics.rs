//! Samples per-task metrics (DESIGN §6) for printing, reports and OpenTelemetry.
//!
//! A [`Sampler`] turns the tasks' cumulative counters ([`TaskMetrics`]) and the live
//! figures of their remote channels ([`NetworkProbes`]) into per-second rates and
//! gauges. [`LiveTasks`] publishes what only the worker sees of them as the worker
//! process's metrics (`sluice-telemetry`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use sluice_common::pb::cluster as pbc;
use sluice_telemetry::{Collect, Metric, Snapshot};

use crate::network::environment::NetworkProbes;
use crate::runtime::metrics::{TaskMetrics, now_ns};

#[derive(Debug, Clone, Copy)]
struct Prev {
    /// When the last sample was taken ([`now_ns`]).
    at: u64,
    work: u64,
    bp: u64,
    idle: u64,
    paused: u64,
    /// The send blocked at the last sample: its start and the time counted for it.
    blocked: Option<(u64, u64)>,
    /// The same for a wait for input.
    waiting: Option<(u64, u64)>,
}

/// How much of an [`Ongoing`](crate::runtime::metrics::Ongoing) span to count in a
/// sample at `now`, and how much of what its counter gained was counted before: a span
/// open at the last sample had its time up to then counted already, and its counter
/// holds all of it once it ended. Returns (to add, to take off the counter's delta).
fn ongoing(prev: &mut Option<(u64, u64)>, open: Option<u64>, last: u64, now: u64) -> (u64, u64) {
    match (*prev, open) {
        (Some((start, counted)), Some(s)) if s == start => {
            let add = now.saturating_sub(start.max(last));
            *prev = Some((start, counted + add));
            (add, 0)
        }
        (before, open) => {
            let counted = before.map_or(0, |(_, c)| c);
            let add = open.map_or(0, |s| now.saturating_sub(s.max(last)));
            *prev = open.map(|s| (s, add));
            (add, counted)
        }
    }
}

/// Hot keys reported per keyed task.
const HOT_KEYS: usize = 3;

/// Turns counters into rates between calls.
#[derive(Debug)]
pub struct Sampler {
    tasks: Vec<Arc<TaskMetrics>>,
    probes: NetworkProbes,
    prev: Vec<Prev>,
}

impl Sampler {
    /// A sampler over `tasks` and their remote channels.
    pub fn new(tasks: Vec<Arc<TaskMetrics>>, probes: NetworkProbes) -> Self {
        let now = now_ns();
        let prev = tasks
            .iter()
            .map(|_| Prev {
                at: now,
                work: 0,
                bp: 0,
                idle: 0,
                paused: 0,
                blocked: None,
                waiting: None,
            })
            .collect();
        Self {
            tasks,
            probes,
            prev,
        }
    }

    /// The figures of every task since the last call.
    pub fn sample(&mut self) -> Vec<pbc::TaskMetrics> {
        self.sample_at(now_ns())
    }

    /// [`Self::sample`] at `now` ([`now_ns`]; tests drive the clock).
    fn sample_at(&mut self, now: u64) -> Vec<pbc::TaskMetrics> {
        let mut out = Vec::with_capacity(self.tasks.len());
        for (t, prev) in self.tasks.iter().zip(self.prev.iter_mut()) {
            // Open spans first, counters second: a span that ends in between is in
            // its counter, and counted twice rather than not at all (the next sample
            // takes it off).
            let blocked = t.blocked.since();
            let waiting = t.waiting.since();
            let work = t.work_ns.load(Ordering::Relaxed);
            let bp = t.backpressured_ns.load(Ordering::Relaxed);
            let idle = t.idle_ns.load(Ordering::Relaxed);
            let paused = t.alignment_paused_ns.load(Ordering::Relaxed);
            let secs = (now.saturating_sub(prev.at) as f64 / 1e9).max(1e-3);
            let per_s = |ns: u64| ((ns as f64 / 1e6) / secs).min(1000.0) as u64;
            // A blocked send is inside the work of pushing an element: both counters
            // get it when it ends.
            let (add_bp, counted_bp) = ongoing(&mut prev.blocked, blocked, prev.at, now);
            let (add_idle, counted_idle) = ongoing(&mut prev.waiting, waiting, prev.at, now);
            let d_work = work.saturating_sub(prev.work).saturating_sub(counted_bp) + add_bp;
            let d_bp = bp.saturating_sub(prev.bp).saturating_sub(counted_bp) + add_bp;
            let d_idle = idle.saturating_sub(prev.idle).saturating_sub(counted_idle) + add_idle;
            let d_paused = paused.saturating_sub(prev.paused);
            prev.at = now;
            prev.work = work;
            prev.bp = bp;
            prev.idle = idle;
            prev.paused = paused;
            let watermark = t.watermark.load(Ordering::Relaxed);
            let o = self.probes.output_stats(&t.name);
            let i = self.probes.input_stats(&t.name);
            out.push(pbc::TaskMetrics {
                task: t.name.clone(),
                busy_ms_per_s: per_s(d_work.saturating_sub(d_bp)),
                backpressured_ms_per_s: per_s(d_bp),
                idle_ms_per_s: per_s(d_idle),
                records_in: t.records_in.load(Ordering::Relaxed),
                records_out: t.records_out.load(Ordering::Relaxed),
                bytes_in: t.bytes_in.load(Ordering::Relaxed),
                bytes_out: t.bytes_out.load(Ordering::Relaxed) + o.bytes_out,
                buffers_in_use_in: u64::from(i.in_use),
                buffers_in_use_out: u64::from(o.buffers),
                credits: u64::from(o.credit),
                backlog: u64::from(o.buffers),
                cache_hits: t.cache.hits.load(Ordering::Relaxed),
                cache_misses: t.cache.misses.load(Ordering::Relaxed),
                cache_reads: t.cache.reads.load(Ordering::Relaxed),
                cache_spills: t.cache.spills.load(Ordering::Relaxed),
                cache_bytes: t.cache.bytes.load(Ordering::Relaxed),
                watermark_held_by: t
                    .watermark_held_by
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
                watermark: (watermark != i64::MIN).then_some(watermark),
                hot_keys: t
                    .cache
                    .hot_keys
                    .get()
                    .map(|h| h.top(HOT_KEYS))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, share)| pbc::HotKey { key, share })
                    .collect(),
                alignment_paused_ms_per_s: per_s(d_paused),
                in_flight_bytes: t.input_in_flight_bytes(),
                input_bytes_per_s: t.input_bytes_per_s.load(Ordering::Relaxed),
                channel_limit_bytes: t.channel_limit_bytes.load(Ordering::Relaxed),
                buffer_bytes: u64::from(i.buffer_bytes),
            });
        }
        out
    }
}

/// One line of figures for people and tests; a task with a keyed operator's cache adds
/// its figures (`cache_hit_ratio` is hits over hits and misses).
pub fn format_line(worker: u32, m: &pbc::TaskMetrics, rss_bytes: u64) -> String {
    let mut line = format!(
        "metrics worker={worker} task={} busy_ms_per_s={} backpressured_ms_per_s={} idle_ms_per_s={} \
         records_in={} records_out={} bytes_in={} bytes_out={} buffers_in_use_in={} \
         buffers_in_use_out={} credits={} backlog={} rss_kb={}",
        m.task,
        m.busy_ms_per_s,
        m.backpressured_ms_per_s,
        m.idle_ms_per_s,
        m.records_in,
        m.records_out,
        m.bytes_in,
        m.bytes_out,
        m.buffers_in_use_in,
        m.buffers_in_use_out,
        m.credits,
        m.backlog,
        rss_bytes / 1024
    );
    if m.input_bytes_per_s > 0 || m.in_flight_bytes > 0 {
        line.push_str(&format!(
            " in_flight_bytes={} input_bytes_per_s={}",
            m.in_flight_bytes, m.input_bytes_per_s
        ));
    }
    if m.channel_limit_bytes > 0 {
        line.push_str(&format!(" channel_limit_bytes={}", m.channel_limit_bytes));
    }
    if m.buffer_bytes > 0 {
        line.push_str(&format!(" buffer_bytes={}", m.buffer_bytes));
    }
    if !m.watermark_held_by.is_empty() {
        line.push_str(&format!(" watermark_held_by={}", m.watermark_held_by));
    }
    if m.alignment_paused_ms_per_s > 0 {
        line.push_str(&format!(
            " alignment_paused_ms_per_s={}",
            m.alignment_paused_ms_per_s
        ));
    }
    let lookups = m.cache_hits + m.cache_misses;
    if lookups > 0 {
        line.push_str(&format!(
            " cache_hit_ratio={:.3} cache_reads={} cache_spills={} cache_kb={}",
            m.cache_hits as f64 / lookups as f64,
            m.cache_reads,
            m.cache_spills,
            m.cache_bytes / 1024
        ));
    }
    line
}

/// Resident set size of this process, as reports carry it (Linux; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    sluice_common::process::self_rss_bytes().unwrap_or(0)
}

/// The sampled figures of every attempt running in this worker process, as the
/// worker's metrics (`GET /metrics`, OTLP): what only the worker sees of its tasks, the
/// bytes, buffers, credits and backlog of their channels. Rates and record counts of
/// the same tasks reach the coordinator in progress reports and are published there.
#[derive(Debug, Default)]
pub struct LiveTasks {
    running: Mutex<Vec<Published>>,
    next: AtomicU64,
}

/// A running attempt: its registration token, its job's id and its sampler.
type Published = (u64, String, Weak<Mutex<Sampler>>);

/// An attempt's place in [`LiveTasks`]; dropping it removes the attempt's figures.
#[derive(Debug)]
pub struct Registration {
    live: Arc<LiveTasks>,
    token: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.live.running).retain(|(t, _, _)| *t != self.token);
    }
}

impl LiveTasks {
    /// Publishes `sampler`'s tasks under `job` until the registration is dropped.
    pub fn register(self: &Arc<Self>, job: String, sampler: &Arc<Mutex<Sampler>>) -> Registration {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.running).push((token, job, Arc::downgrade(sampler)));
        Registration {
            live: self.clone(),
            token,
        }
    }
}

/// `m` locked; a panic elsewhere while it was held leaves the figures usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A task figure of the worker: the metric and its value.
type Figure = (Metric, fn(&pbc::TaskMetrics) -> f64);

const FIGURES: [Figure; 10] = [
    (
        Metric::counter(
            "sluice.task.network.received",
            "By",
            "Bytes a task received from remote channels.",
        ),
        |m| m.bytes_in as f64,
    ),
    (
        Metric::counter(
            "sluice.task.network.sent",
            "By",
            "Bytes a task sent on remote channels.",
        ),
        |m| m.bytes_out as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.network.input_buffers",
            "{buffer}",
            "Buffers a task's remote input channels hold.",
        ),
        |m| m.buffers_in_use_in as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.network.output_buffers",
            "{buffer}",
            "Buffers queued in a task's remote output channels.",
        ),
        |m| m.buffers_in_use_out as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.network.credits",
            "{buffer}",
            "Credit a task's remote output channels hold from their receivers.",
        ),
        |m| m.credits as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.network.backlog",
            "{buffer}",
            "Buffers a task's remote output channels have waiting for credit.",
        ),
        |m| m.backlog as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.network.in_flight",
            "By",
            "Bytes a task's input channels hold, received and not yet processed.",
        ),
        |m| m.in_flight_bytes as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.network.channel_limit",
            "By",
            "Bytes each input channel of a task may hold under buffer debloating (0: not debloated).",
        ),
        |m| m.channel_limit_bytes as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.network.buffer_size",
            "By",
            "Network buffer size a task's remote input channels ask of their producers.",
        ),
        |m| m.buffer_bytes as f64,
    ),
    (
        Metric::counter(
            "sluice.task.state_cache.reads",
            "{value}",
            "Values a task's operator cache read from the state backend.",
        ),
        |m| m.cache_reads as f64,
    ),
];

impl Collect for LiveTasks {
    fn metrics(&self) -> Vec<Metric> {
        FIGURES.iter().map(|(m, _)| *m).collect()
    }

    fn collect(&self, out: &mut Snapshot) {
        let running: Vec<(String, Arc<Mutex<Sampler>>)> = lock(&self.running)
            .iter()
            .filter_map(|(_, job, s)| Some((job.clone(), s.upgrade()?)))
            .collect();
        for (job, sampler) in running {
            for m in lock(&sampler).peek() {
                for (metric, value) in &FIGURES {
                    out.add(
                        metric,
                        [("job_id", job.clone()), ("task", m.task.clone())],
                        value(&m),
                    );
                }
            }
        }
    }
}

impl Sampler {
    /// The figures without moving the rate window (for observers).
    pub fn peek(&self) -> Vec<pbc::TaskMetrics> {
        let mut copy = Sampler {
            tasks: self.tasks.clone(),
            probes: self.probes.clone(),
            prev: self.prev.clone(),
        };
        copy.sample()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn figures(s: &mut Sampler, at: u64) -> (u64, u64, u64) {
        let m = &s.sample_at(at)[0];
        (m.busy_ms_per_s, m.backpressured_ms_per_s, m.idle_ms_per_s)
    }

    #[test]
    fn a_long_wait_for_credit_is_back_pressure_while_it_lasts_and_counted_once() {
        let t = Arc::new(TaskMetrics::new("source[0]"));
        let mut s = Sampler::new(vec![t.clone()], NetworkProbes::default());
        let t0 = s.prev[0].at;
        // 200 ms of work, then a send that blocks for 2.8 s, across three samples.
        t.work_ns.fetch_add(200 * MS, Ordering::Relaxed);
        t.blocked.begin_at(t0 + 200 * MS);
        assert_eq!(figures(&mut s, t0 + 1000 * MS), (200, 800, 0));
        assert_eq!(figures(&mut s, t0 + 2000 * MS), (0, 1000, 0));
        // It ends at 3 s: the whole push lands in the counters now, of which 1.8 s was
        // counted already.
        t.work_ns.fetch_add(2800 * MS, Ordering::Relaxed);
        t.backpressured_ns.fetch_add(2800 * MS, Ordering::Relaxed);
        t.blocked.end();
        assert_eq!(figures(&mut s, t0 + 3000 * MS), (0, 1000, 0));
        // Then a wait for input that has not ended.
        t.waiting.begin_at(t0 + 3500 * MS);
        assert_eq!(figures(&mut s, t0 + 4000 * MS), (0, 0, 500));
        t.idle_ns.fetch_add(1000 * MS, Ordering::Relaxed);
        t.waiting.end();
        assert_eq!(figures(&mut s, t0 + 5000 * MS), (0, 0, 500));
    }
}
