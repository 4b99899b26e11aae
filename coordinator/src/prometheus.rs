//! The coordinator's metrics: what it knows of its jobs, their tasks (from the workers'
//! progress reports) and its workers, rendered on `GET /metrics` and exported over OTLP
//! ([`CoordinatorMetrics`]). Names and units are listed in `docs/metrics.md`.
//!
//! It reads the same [`JobStatus`] and [`WorkerView`] the REST API serves, so it adds no
//! bookkeeping of its own and cannot disagree with `sluice status`. What only a worker
//! sees (bytes, buffers, credits and backlog of its channels) is the worker's to publish.

use sluice_telemetry::{Collect, Metric, Snapshot};

use crate::cluster::registry::WorkerView;
use crate::job::lifecycle::JobState;
use crate::job::status::{JobStatus, TaskStatus};

/// The content type of the text format.
pub use sluice_telemetry::prometheus::CONTENT_TYPE;

/// The labels naming a job.
fn job(j: &JobStatus) -> [(&'static str, String); 2] {
    [("job_id", j.id.clone()), ("job_name", j.name.clone())]
}

/// A metric of jobs and its value for a job (`None`: no sample).
type JobFigure = (Metric, fn(&JobStatus) -> Option<f64>);

const JOB_FIGURES: [JobFigure; 11] = [
    (
        Metric::counter(
            "sluice.job.records_in",
            "{record}",
            "Records the job's sources read, from the workers' last reports.",
        ),
        |j| Some(j.records_in as f64),
    ),
    (
        Metric::counter(
            "sluice.job.records_out",
            "{record}",
            "Records the job's sinks wrote, from the workers' last reports.",
        ),
        |j| Some(j.records_out as f64),
    ),
    (
        Metric::counter(
            "sluice.job.restarts",
            "{restart}",
            "Restarts after failures.",
        ),
        |j| Some(f64::from(j.restarts)),
    ),
    (
        Metric::counter(
            "sluice.job.checkpoints_aborted",
            "{checkpoint}",
            "Checkpoints aborted.",
        ),
        |j| Some(j.checkpoints_aborted as f64),
    ),
    (
        Metric::counter(
            "sluice.job.late_records",
            "{record}",
            "Records the windows and OVER aggregates dropped as late (reported at the end).",
        ),
        |j| Some(j.late as f64),
    ),
    (
        Metric::counter(
            "sluice.job.skipped_records",
            "{record}",
            "Malformed records skipped (reported at the end).",
        ),
        |j| Some(j.skipped as f64),
    ),
    (
        Metric::gauge(
            "sluice.job.parallelism",
            "{subtask}",
            "Parallelism of the job's nodes (the largest).",
        ),
        |j| Some(f64::from(j.parallelism)),
    ),
    (
        Metric::gauge(
            "sluice.job.last_checkpoint",
            "{checkpoint}",
            "Id of the newest completed checkpoint.",
        ),
        |j| j.last_checkpoint.map(|c| c as f64),
    ),
    (
        Metric::gauge(
            "sluice.job.last_checkpoint.duration",
            "s",
            "Trigger to commit of the newest completed checkpoint.",
        ),
        |j| j.checkpoints.last().map(|c| c.duration_ms as f64 / 1000.0),
    ),
    (
        Metric::gauge(
            "sluice.job.last_checkpoint.alignment",
            "s",
            "Longest barrier alignment of a task in the newest completed checkpoint.",
        ),
        |j| {
            j.checkpoints
                .last()
                .map(|c| c.max_alignment_micros as f64 / 1e6)
        },
    ),
    (
        Metric::gauge(
            "sluice.job.watermark",
            "s",
            "The smallest source watermark, in seconds since the Unix epoch.",
        ),
        |j| j.watermark.map(|w| w as f64 / 1000.0),
    ),
];

/// A metric of tasks and its value for a task.
type TaskFigure = (Metric, fn(&TaskStatus) -> f64);

const TASK_FIGURES: [TaskFigure; 10] = [
    (
        Metric::gauge(
            "sluice.task.busy",
            "1",
            "Share of the last second a task spent handling elements, back pressure excluded.",
        ),
        |t| t.busy_ms_per_s as f64 / 1000.0,
    ),
    (
        Metric::gauge(
            "sluice.task.backpressured",
            "1",
            "Share of the last second a task waited for room downstream.",
        ),
        |t| t.backpressured_ms_per_s as f64 / 1000.0,
    ),
    (
        Metric::gauge(
            "sluice.task.idle",
            "1",
            "Share of the last second a task waited for input.",
        ),
        |t| t.idle_ms_per_s as f64 / 1000.0,
    ),
    (
        Metric::gauge(
            "sluice.task.alignment_paused",
            "1",
            "Share of the last second a source task paused because its watermark was ahead of its alignment group's (part of idle).",
        ),
        |t| t.alignment_paused_ms_per_s as f64 / 1000.0,
    ),
    (
        Metric::counter(
            "sluice.task.records_in",
            "{record}",
            "Records a task received.",
        ),
        |t| t.records_in as f64,
    ),
    (
        Metric::counter(
            "sluice.task.records_out",
            "{record}",
            "Records a task emitted.",
        ),
        |t| t.records_out as f64,
    ),
    (
        Metric::counter(
            "sluice.task.state_cache.hits",
            "{record}",
            "Records whose keyed state was in the operator cache.",
        ),
        |t| t.cache_hits as f64,
    ),
    (
        Metric::counter(
            "sluice.task.state_cache.misses",
            "{record}",
            "Records whose keyed state was not in the operator cache.",
        ),
        |t| t.cache_misses as f64,
    ),
    (
        Metric::counter(
            "sluice.task.state_cache.spills",
            "{entry}",
            "Entries spilled from the operator cache to the state backend.",
        ),
        |t| t.cache_spills as f64,
    ),
    (
        Metric::gauge(
            "sluice.task.state_cache",
            "By",
            "Bytes of decoded state the operator cache holds.",
        ),
        |t| t.cache_bytes as f64,
    ),
];

/// `sluice.job.state`: 1 for the state a job is in.
const JOB_STATE: Metric = Metric::gauge(
    "sluice.job.state",
    "",
    "1 for the state each job is in, 0 for the others.",
);

/// `sluice.workers`: worker processes attached.
const WORKERS: Metric = Metric::gauge(
    "sluice.workers",
    "{worker}",
    "Worker processes attached to the coordinator.",
);

/// A gauge of workers and its value for a worker.
type WorkerFigure = (Metric, fn(&WorkerView) -> f64);

const WORKER_FIGURES: [WorkerFigure; 3] = [
    (
        Metric::gauge("sluice.worker.slots", "{slot}", "A worker's slots."),
        |w| f64::from(w.slots),
    ),
    (
        Metric::gauge(
            "sluice.worker.jobs",
            "{job}",
            "Jobs using a worker's slots.",
        ),
        |w| w.jobs.len() as f64,
    ),
    (
        Metric::gauge(
            "sluice.worker.memory.rss",
            "By",
            "A worker's resident memory at its last heartbeat.",
        ),
        |w| w.rss_bytes as f64,
    ),
];

/// Every metric of the coordinator, in the order `/metrics` lists them.
pub fn metrics() -> Vec<Metric> {
    let mut all = vec![JOB_STATE];
    all.extend(JOB_FIGURES.iter().map(|(m, _)| *m));
    all.extend(TASK_FIGURES.iter().map(|(m, _)| *m));
    all.push(WORKERS);
    all.extend(WORKER_FIGURES.iter().map(|(m, _)| *m));
    all
}

/// Adds the figures of `jobs` and `workers` to `out`.
pub fn collect(jobs: &[JobStatus], workers: &[WorkerView], out: &mut Snapshot) {
    for j in jobs {
        for s in JobState::ALL {
            let [a, b] = job(j);
            out.add(
                &JOB_STATE,
                [a, b, ("state", s.to_string())],
                f64::from(u8::from(j.state == s)),
            );
        }
        for (m, value) in &JOB_FIGURES {
            if let Some(v) = value(j) {
                out.add(m, job(j), v);
            }
        }
        for t in &j.tasks {
            for (m, value) in &TASK_FIGURES {
                let [a, b] = job(j);
                let labels = [a, b, ("task", t.task.clone()), ("worker", t.worker.clone())];
                out.add(m, labels, value(t));
            }
        }
    }
    let none: [(&str, String); 0] = [];
    out.add(&WORKERS, none, workers.len() as f64);
    for w in workers {
        for (m, value) in &WORKER_FIGURES {
            out.add(
                m,
                [("worker", w.id.clone()), ("host", w.host.clone())],
                value(w),
            );
        }
    }
}

/// The coordinator's metrics as a role's collector (for OTLP export).
pub struct CoordinatorMetrics(pub std::sync::Arc<crate::service::Coordinator>);

impl Collect for CoordinatorMetrics {
    fn metrics(&self) -> Vec<Metric> {
        metrics()
    }

    fn collect(&self, out: &mut Snapshot) {
        collect(&self.0.jobs(), &self.0.workers(), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exposition of `jobs` and `workers`.
    fn render(jobs: &[JobStatus], workers: &[WorkerView]) -> String {
        let mut snapshot = Snapshot::default();
        collect(jobs, workers, &mut snapshot);
        sluice_telemetry::prometheus::render(&metrics(), &snapshot)
    }

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
            watermark: None,
            alignment_paused_ms_per_s: 0,
            in_flight_bytes: 0,
            input_bytes_per_s: 0,
            channel_limit_bytes: 0,
            buffer_bytes: 0,
            hot_keys: Vec::new(),
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
        let labels = r#"job_id="j-1",job_name="a \"quoted\"\\name\nwith a newline""#;
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
