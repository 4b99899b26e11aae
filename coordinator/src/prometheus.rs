//! `GET /metrics`: what the coordinator knows of its jobs and workers, in the Prometheus
//! text exposition format (version 0.0.4), for users who scrape rather than run an
//! OpenTelemetry collector. Names and units are listed in `docs/metrics.md`.
//!
//! It renders the same [`JobStatus`] and [`WorkerView`] the REST API serves, so it adds
//! no bookkeeping of its own and cannot disagree with `sluice status`. Per-task metrics
//! (busy and back-pressured time, buffers) live on the workers, not here.

use std::fmt::Write;

use crate::cluster::registry::WorkerView;
use crate::job::lifecycle::JobState;
use crate::job::status::{JobStatus, TaskStatus};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One metric family being written: its `# HELP` and `# TYPE` lines, then samples.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &'static str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out, name }
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A label value as the text format wants it: backslash, double quote and line feed
/// escaped (job names come from users' files).
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// The labels naming a job.
fn job(j: &JobStatus) -> [(&'static str, &str); 2] {
    [("job", j.id.as_str()), ("name", j.name.as_str())]
}

/// A metric of jobs: name, type, help, and its value for a job (`None`: no sample).
type JobFigure = (
    &'static str,
    &'static str,
    &'static str,
    fn(&JobStatus) -> Option<f64>,
);

const JOB_FIGURES: [JobFigure; 11] = [
    (
        "sluice_job_records_in_total",
        "counter",
        "Records the job's sources read, from the workers' last reports.",
        |j| Some(j.records_in as f64),
    ),
    (
        "sluice_job_records_out_total",
        "counter",
        "Records the job's sinks wrote, from the workers' last reports.",
        |j| Some(j.records_out as f64),
    ),
    (
        "sluice_job_restarts_total",
        "counter",
        "Restarts after failures.",
        |j| Some(f64::from(j.restarts)),
    ),
    (
        "sluice_job_checkpoints_aborted_total",
        "counter",
        "Checkpoints aborted.",
        |j| Some(j.checkpoints_aborted as f64),
    ),
    (
        "sluice_job_late_records_total",
        "counter",
        "Records the windows dropped as late (reported at the end).",
        |j| Some(j.late as f64),
    ),
    (
        "sluice_job_skipped_records_total",
        "counter",
        "Malformed records skipped (reported at the end).",
        |j| Some(j.skipped as f64),
    ),
    (
        "sluice_job_parallelism",
        "gauge",
        "Parallelism of the job's nodes (the largest).",
        |j| Some(f64::from(j.parallelism)),
    ),
    (
        "sluice_job_last_checkpoint",
        "gauge",
        "Id of the newest completed checkpoint.",
        |j| j.last_checkpoint.map(|c| c as f64),
    ),
    (
        "sluice_job_last_checkpoint_duration_seconds",
        "gauge",
        "Trigger to commit of the newest completed checkpoint.",
        |j| j.checkpoints.last().map(|c| c.duration_ms as f64 / 1000.0),
    ),
    (
        "sluice_job_last_checkpoint_alignment_seconds",
        "gauge",
        "Longest barrier alignment of a task in the newest completed checkpoint.",
        |j| {
            j.checkpoints
                .last()
                .map(|c| c.max_alignment_micros as f64 / 1e6)
        },
    ),
    (
        "sluice_job_watermark_seconds",
        "gauge",
        "The smallest source watermark, in seconds since the Unix epoch.",
        |j| j.watermark.map(|w| w as f64 / 1000.0),
    ),
];

/// A metric of tasks: name, type, help, and its value for a task.
type TaskFigure = (
    &'static str,
    &'static str,
    &'static str,
    fn(&TaskStatus) -> f64,
);

const TASK_FIGURES: [TaskFigure; 9] = [
    (
        "sluice_task_busy_ratio",
        "gauge",
        "Share of the last second a task spent handling elements, back pressure excluded.",
        |t| t.busy_ms_per_s as f64 / 1000.0,
    ),
    (
        "sluice_task_backpressured_ratio",
        "gauge",
        "Share of the last second a task waited for room downstream.",
        |t| t.backpressured_ms_per_s as f64 / 1000.0,
    ),
    (
        "sluice_task_idle_ratio",
        "gauge",
        "Share of the last second a task waited for input.",
        |t| t.idle_ms_per_s as f64 / 1000.0,
    ),
    (
        "sluice_task_records_in_total",
        "counter",
        "Records a task received.",
        |t| t.records_in as f64,
    ),
    (
        "sluice_task_records_out_total",
        "counter",
        "Records a task emitted.",
        |t| t.records_out as f64,
    ),
    (
        "sluice_task_state_cache_hits_total",
        "counter",
        "Records whose keyed state was in the operator cache.",
        |t| t.cache_hits as f64,
    ),
    (
        "sluice_task_state_cache_misses_total",
        "counter",
        "Records whose keyed state was not in the operator cache.",
        |t| t.cache_misses as f64,
    ),
    (
        "sluice_task_state_cache_spills_total",
        "counter",
        "Entries spilled from the operator cache to the state backend.",
        |t| t.cache_spills as f64,
    ),
    (
        "sluice_task_state_cache_bytes",
        "gauge",
        "Bytes of decoded state the operator cache holds.",
        |t| t.cache_bytes as f64,
    ),
];

/// A gauge of workers: name, help, and its value for a worker.
type WorkerFigure = (&'static str, &'static str, fn(&WorkerView) -> f64);

const WORKER_FIGURES: [WorkerFigure; 3] = [
    ("sluice_worker_slots", "A worker's slots.", |w| {
        f64::from(w.slots)
    }),
    ("sluice_worker_jobs", "Jobs using a worker's slots.", |w| {
        w.jobs.len() as f64
    }),
    (
        "sluice_worker_memory_rss_bytes",
        "A worker's resident memory at its last heartbeat.",
        |w| w.rss_bytes as f64,
    ),
];

/// The exposition of `jobs` and `workers`.
pub fn render(jobs: &[JobStatus], workers: &[WorkerView]) -> String {
    let mut out = String::new();

    let mut f = Family::new(
        &mut out,
        "sluice_job_state",
        "gauge",
        "1 for the state each job is in, 0 for the others.",
    );
    for j in jobs {
        for s in JobState::ALL {
            let name = s.to_string();
            let [a, b] = job(j);
            f.sample(&[a, b, ("state", name.as_str())], u8::from(j.state == s));
        }
    }
    for (name, kind, help, value) in JOB_FIGURES {
        let mut f = Family::new(&mut out, name, kind, help);
        for j in jobs {
            if let Some(v) = value(j) {
                f.sample(&job(j), v);
            }
        }
    }
    for (name, kind, help, value) in TASK_FIGURES {
        let mut f = Family::new(&mut out, name, kind, help);
        for j in jobs {
            for t in &j.tasks {
                let [a, b] = job(j);
                let labels = [
                    a,
                    b,
                    ("task", t.task.as_str()),
                    ("worker", t.worker.as_str()),
                ];
                f.sample(&labels, value(t));
            }
        }
    }

    let mut f = Family::new(
        &mut out,
        "sluice_workers",
        "gauge",
        "Worker processes attached to the coordinator.",
    );
    f.sample(&[], workers.len());
    for (name, help, value) in WORKER_FIGURES {
        let mut f = Family::new(&mut out, name, "gauge", help);
        for w in workers {
            f.sample(
                &[("worker", w.id.as_str()), ("host", w.host.as_str())],
                value(w),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_and_worker_is_one_sample_per_family_with_escaped_labels() {
        let mut j = JobStatus::new("j-1", "a \"quoted\"\\name\nwith a newline", 2, 0);
        j.state = JobState::Running;
        j.records_in = 42;
        j.watermark = Some(1_500);
        j.tasks.push(TaskStatus {
            task: "window[1]".into(),
            worker: "w1".into(),
            busy_ms_per_s: 250,
            backpressured_ms_per_s: 700,
            idle_ms_per_s: 50,
            records_in: 9,
            records_out: 3,
            cache_hits: 0,
            cache_misses: 0,
            cache_spills: 0,
            cache_bytes: 0,
            watermark_held_by: String::new(),
        });
        let w = WorkerView {
            id: "w1".into(),
            pid: 7,
            host: "127.0.0.1".into(),
            name: "w".into(),
            slots: 4,
            jobs: vec!["j-1".into()],
            rss_bytes: 1 << 20,
        };
        let text = render(&[j], &[w]);
        let labels = r#"job="j-1",name="a \"quoted\"\\name\nwith a newline""#;
        assert!(
            text.contains(&format!("sluice_job_records_in_total{{{labels}}} 42\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "sluice_job_state{{{labels},state=\"running\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "sluice_job_state{{{labels},state=\"failed\"}} 0\n"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("sluice_job_watermark_seconds{{{labels}}} 1.5\n")));
        assert!(
            text.contains(&format!(
                "sluice_task_backpressured_ratio{{{labels},task=\"window[1]\",worker=\"w1\"}} 0.7\n"
            )),
            "{text}"
        );
        assert!(text.contains("sluice_workers 1\n"));
        assert!(text.contains(
            "sluice_worker_memory_rss_bytes{worker=\"w1\",host=\"127.0.0.1\"} 1048576\n"
        ));
        // No checkpoint yet: no sample, but the family is declared.
        assert!(text.contains("# TYPE sluice_job_last_checkpoint gauge\n"));
        assert!(!text.contains("sluice_job_last_checkpoint{"));
        // Every line is a comment or `name{labels} value` with a number for the value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
            assert!(line.starts_with("sluice_"), "{line}");
        }
    }
}
