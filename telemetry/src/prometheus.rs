//! `GET /metrics`: a role's metrics in the Prometheus text exposition format (version
//! 0.0.4), for users who scrape rather than run an OpenTelemetry collector.

use std::fmt::Write;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::task::AbortOnDropHandle;

use crate::family::{Collect, Kind, Metric, Snapshot};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition of `metrics` with the values in `snapshot`: every family is declared
/// (`# HELP`, `# TYPE`) even when it has no sample yet.
pub fn render(metrics: &[Metric], snapshot: &Snapshot) -> String {
    let mut out = String::new();
    for m in metrics {
        let name = m.prometheus_name();
        let kind = match m.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {name} {}", m.help);
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for s in snapshot.samples(m.name) {
            out.push_str(&name);
            if !s.labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in s.labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape(v));
                }
                out.push('}');
            }
            out.push(' ');
            push_value(&mut out, s.value);
            out.push('\n');
        }
    }
    out
}

/// What `collector` publishes now, rendered.
pub fn render_collector(collector: &dyn Collect) -> String {
    let mut snapshot = Snapshot::default();
    collector.collect(&mut snapshot);
    render(&collector.metrics(), &snapshot)
}

fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
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

async fn metrics(State(c): State<Arc<dyn Collect>>) -> Response {
    (
        [("content-type", CONTENT_TYPE)],
        render_collector(c.as_ref()),
    )
        .into_response()
}

/// A router with `GET /metrics` over `collector`, for roles without a REST API of their
/// own (the coordinator mounts [`render_collector`] in its API instead).
pub fn router(collector: Arc<dyn Collect>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(collector)
}

/// Serves [`router`] on `listener` until the handle is dropped.
pub fn serve(collector: Arc<dyn Collect>, listener: TcpListener) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        crate::http::serve(listener, router(collector), crate::http::Limits::default()).await;
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORDS: Metric = Metric::counter("sluice.task.records_in", "{record}", "Records in.");
    const BUSY: Metric = Metric::gauge("sluice.task.busy", "1", "Busy share.");
    const EMPTY: Metric = Metric::gauge("sluice.job.last_checkpoint", "{checkpoint}", "Id.");

    #[test]
    fn families_are_declared_and_labels_escaped() {
        let mut s = Snapshot::default();
        s.add(
            &RECORDS,
            [("job", "a \"q\"\\b\nc"), ("task", "map[0]")],
            42.0,
        );
        s.add(&BUSY, [("task", "map[0]")], 0.25);
        s.add(&BUSY, [("task", "map[1]")], f64::NAN);
        let text = render(&[RECORDS, BUSY, EMPTY], &s);
        assert!(text.contains("# TYPE sluice_task_records_in_total counter\n"));
        assert!(text.contains(
            "sluice_task_records_in_total{job=\"a \\\"q\\\"\\\\b\\nc\",task=\"map[0]\"} 42\n"
        ));
        assert!(text.contains("sluice_task_busy_ratio{task=\"map[0]\"} 0.25\n"));
        assert!(text.contains("sluice_task_busy_ratio{task=\"map[1]\"} NaN\n"));
        assert!(text.contains("# TYPE sluice_job_last_checkpoint gauge\n"));
        assert!(!text.contains("sluice_job_last_checkpoint{"));
    }
}
