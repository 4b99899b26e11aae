//! Samples per-task metrics (DESIGN §6) for printing, reports and OpenTelemetry.
//!
//! A [`Sampler`] turns the tasks' cumulative counters ([`TaskMetrics`]) and the live
//! figures of their remote channels ([`NetworkProbes`]) into per-second rates and
//! gauges. [`register_otel`] publishes the same figures as observable instruments of
//! the global OpenTelemetry meter `sluice` (a no-op until an exporter is installed).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::ObservableGauge;
use sluice_common::pb::cluster as pbc;

use crate::network::environment::NetworkProbes;
use crate::runtime::metrics::TaskMetrics;

#[derive(Debug, Clone, Copy)]
struct Prev {
    at: Instant,
    work: u64,
    bp: u64,
    idle: u64,
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
            let secs = now.duration_since(prev.at).as_secs_f64().max(1e-3);
            let per_s = |ns: u64| ((ns as f64 / 1e6) / secs).min(1000.0) as u64;
            let d_work = work.saturating_sub(prev.work);
            let d_bp = bp.saturating_sub(prev.bp);
            let d_idle = idle.saturating_sub(prev.idle);
            *prev = Prev {
                at: now,
                work,
                bp,
                idle,
            };
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

/// Publishes the sampler's figures as OpenTelemetry observable gauges (attribute
/// `task`); the instruments live as long as the returned handles.
pub fn register_otel(sampler: Arc<Mutex<Sampler>>) -> Vec<ObservableGauge<u64>> {
    let meter = opentelemetry::global::meter("sluice");
    type Pick = fn(&pbc::TaskMetrics) -> u64;
    let figures: [(&str, Pick); 11] = [
        ("sluice.task.busy_ms_per_s", |m| m.busy_ms_per_s),
        ("sluice.task.backpressured_ms_per_s", |m| {
            m.backpressured_ms_per_s
        }),
        ("sluice.task.idle_ms_per_s", |m| m.idle_ms_per_s),
        ("sluice.task.records_in", |m| m.records_in),
        ("sluice.task.records_out", |m| m.records_out),
        ("sluice.task.bytes_in", |m| m.bytes_in),
        ("sluice.task.bytes_out", |m| m.bytes_out),
        ("sluice.task.buffers_in_use_in", |m| m.buffers_in_use_in),
        ("sluice.task.buffers_in_use_out", |m| m.buffers_in_use_out),
        ("sluice.task.credits", |m| m.credits),
        ("sluice.task.backlog", |m| m.backlog),
    ];
    figures
        .into_iter()
        .map(|(name, pick)| {
            let sampler = sampler.clone();
            meter
                .u64_observable_gauge(name)
                .with_callback(move |obs| {
                    let figures = sampler.lock().unwrap_or_else(|e| e.into_inner()).peek();
                    for m in &figures {
                        obs.observe(pick(m), &[KeyValue::new("task", m.task.clone())]);
                    }
                })
                .build()
        })
        .collect()
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
