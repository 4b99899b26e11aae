//! Samples per-task metrics (DESIGN §6) for printing, reports and OpenTelemetry.
//!
//! A [`Sampler`] turns the tasks' cumulative counters ([`TaskMetrics`]) and the live
//! figures of their remote channels ([`NetworkProbes`]) into per-second rates and
//! gauges. [`LiveTasks`] publishes what only the worker sees of them as the worker
//! process's metrics (`sluice-telemetry`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use sluice_common::pb::cluster as pbc;
use sluice_telemetry::{Collect, Metric, Snapshot};

use crate::network::environment::NetworkProbes;
use crate::runtime::metrics::TaskMetrics;

#[derive(Debug, Clone, Copy)]
struct Prev {
    at: Instant,
    work: u64,
    bp: u64,
    idle: u64,
    paused: u64,
}

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
        let now = Instant::now();
        let prev = tasks
            .iter()
            .map(|_| Prev {
                at: now,
                work: 0,
                bp: 0,
                idle: 0,
                paused: 0,
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
        let now = Instant::now();
        let mut out = Vec::with_capacity(self.tasks.len());
        for (t, prev) in self.tasks.iter().zip(self.prev.iter_mut()) {
            let work = t.work_ns.load(Ordering::Relaxed);
            let bp = t.backpressured_ns.load(Ordering::Relaxed);
            let idle = t.idle_ns.load(Ordering::Relaxed);
            let paused = t.alignment_paused_ns.load(Ordering::Relaxed);
            let secs = now.duration_since(prev.at).as_secs_f64().max(1e-3);
            let per_s = |ns: u64| ((ns as f64 / 1e6) / secs).min(1000.0) as u64;
            let d_work = work.saturating_sub(prev.work);
            let d_bp = bp.saturating_sub(prev.bp);
            let d_idle = idle.saturating_sub(prev.idle);
            let d_paused = paused.saturating_sub(prev.paused);
            *prev = Prev {
                at: now,
                work,
                bp,
                idle,
                paused,
            };
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
                alignment_paused_ms_per_s: per_s(d_paused),
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

const FIGURES: [Figure; 7] = [
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
