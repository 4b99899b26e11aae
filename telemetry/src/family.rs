//! The metric model shared by the Prometheus endpoint and OTLP export.

use std::collections::BTreeMap;

/// Whether a metric only grows (a cumulative counter) or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Cumulative since the process (or the job) started.
    Counter,
    /// A current value.
    Gauge,
}

/// One metric: its OpenTelemetry name, unit (UCUM, as OpenTelemetry's conventions
/// write them: `s`, `By`, `1`, `{record}`), kind and one-line help.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Dotted OpenTelemetry name, e.g. `sluice.task.records_in`.
    pub name: &'static str,
    /// UCUM unit; `{…}` annotations name what is counted.
    pub unit: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// One sentence for `# HELP` and the instrument's description.
    pub help: &'static str,
}

impl Metric {
    /// A counter.
    pub const fn counter(name: &'static str, unit: &'static str, help: &'static str) -> Self {
        Metric {
            name,
            unit,
            kind: Kind::Counter,
            help,
        }
    }

    /// A gauge.
    pub const fn gauge(name: &'static str, unit: &'static str, help: &'static str) -> Self {
        Metric {
            name,
            unit,
            kind: Kind::Gauge,
            help,
        }
    }

    /// The name Prometheus sees, by OpenTelemetry's Prometheus compatibility rules: dots
    /// become underscores, the unit is appended in words (`_seconds`, `_bytes`, `_ratio`
    /// for a gauge of unit `1`; annotations like `{record}` add nothing), and counters
    /// end in `_total`.
    pub fn prometheus_name(&self) -> String {
        let mut name: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let unit = match self.unit {
            "s" => Some("seconds"),
            "ms" => Some("milliseconds"),
            "By" => Some("bytes"),
            "1" if self.kind == Kind::Gauge => Some("ratio"),
            _ => None,
        };
        if let Some(unit) = unit
            && !name.ends_with(unit)
        {
            name.push('_');
            name.push_str(unit);
        }
        if self.kind == Kind::Counter {
            name.push_str("_total");
        }
        name
    }
}

/// One value of a metric, with its labels (attributes, in OpenTelemetry's words).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Label names and values, in the order they are rendered.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: f64,
}

/// The current values of a role's metrics, by metric name.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    samples: BTreeMap<&'static str, Vec<Sample>>,
}

impl Snapshot {
    /// Records `value` of `metric` with `labels`.
    pub fn add<L, V>(&mut self, metric: &Metric, labels: L, value: f64)
    where
        L: IntoIterator<Item = (&'static str, V)>,
        V: Into<String>,
    {
        let labels = labels.into_iter().map(|(k, v)| (k, v.into())).collect();
        self.samples
            .entry(metric.name)
            .or_default()
            .push(Sample { labels, value });
    }

    /// The samples of the metric named `name` (none when nothing was recorded).
    pub fn samples(&self, name: &str) -> &[Sample] {
        self.samples.get(name).map_or(&[], Vec::as_slice)
    }
}

/// A role's metrics: the list, and their values now.
pub trait Collect: Send + Sync + 'static {
    /// Every metric this role may publish (a family is declared even without samples).
    fn metrics(&self) -> Vec<Metric>;
    /// Adds the current values to `out`.
    fn collect(&self, out: &mut Snapshot);
}

/// Several collectors seen as one (a `sluice run` process is a coordinator and a worker).
pub struct Merged(pub Vec<std::sync::Arc<dyn Collect>>);

impl Collect for Merged {
    fn metrics(&self) -> Vec<Metric> {
        let mut all: Vec<Metric> = Vec::new();
        for c in &self.0 {
            for m in c.metrics() {
                if !all.iter().any(|a| a.name == m.name) {
                    all.push(m);
                }
            }
        }
        all
    }

    fn collect(&self, out: &mut Snapshot) {
        for c in &self.0 {
            c.collect(out);
        }
    }
}

/// Metrics every role has: about its own process.
pub struct ProcessMetrics;

/// `process.memory.usage`: the semantic conventions' name for the resident set.
pub const PROCESS_MEMORY: Metric = Metric::gauge(
    "process.memory.usage",
    "By",
    "Resident memory of this process (Linux; 0 elsewhere).",
);

/// `process.uptime`: seconds since the process started.
pub const PROCESS_UPTIME: Metric =
    Metric::gauge("process.uptime", "s", "Seconds since this process started.");

fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

impl Collect for ProcessMetrics {
    fn metrics(&self) -> Vec<Metric> {
        started();
        vec![PROCESS_MEMORY, PROCESS_UPTIME]
    }

    fn collect(&self, out: &mut Snapshot) {
        let none: [(&str, String); 0] = [];
        out.add(
            &PROCESS_MEMORY,
            none.clone(),
            sluice_common::process::self_rss_bytes().unwrap_or(0) as f64,
        );
        out.add(&PROCESS_UPTIME, none, started().elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_names_follow_the_otel_compatibility_rules() {
        let cases = [
            (
                Metric::counter("sluice.task.records_in", "{record}", ""),
                "sluice_task_records_in_total",
            ),
            (
                Metric::gauge("sluice.task.busy", "1", ""),
                "sluice_task_busy_ratio",
            ),
            (
                Metric::gauge("sluice.job.last_checkpoint.duration", "s", ""),
                "sluice_job_last_checkpoint_duration_seconds",
            ),
            (
                Metric::gauge("sluice.task.state_cache", "By", ""),
                "sluice_task_state_cache_bytes",
            ),
            (
                Metric::counter("sluice.state.restore", "By", ""),
                "sluice_state_restore_bytes_total",
            ),
            (
                Metric::gauge("process.memory.usage", "By", ""),
                "process_memory_usage_bytes",
            ),
            (
                Metric::gauge("sluice.job.watermark.seconds", "s", ""),
                "sluice_job_watermark_seconds",
            ),
        ];
        for (m, want) in cases {
            assert_eq!(m.prometheus_name(), want, "{}", m.name);
        }
    }
}
