//! The telemetry flags every long-running role takes (`--otlp-endpoint`,
//! `--metrics-http`) and what they start: OTLP export of the role's metrics and a
//! Prometheus `GET /metrics` endpoint (`sluice-telemetry`).

use std::sync::Arc;

use clap::Args;
use sluice_telemetry::family::{Merged, ProcessMetrics};
use sluice_telemetry::otlp::{self, Exporter, Identity};
use sluice_telemetry::{Collect, prometheus};
use tokio_util::task::AbortOnDropHandle;

use crate::Failure;

/// Where a role's metrics go.
#[derive(Args, Clone, Debug, Default)]
pub struct TelemetryArgs {
    /// Export metrics and checkpoint traces over OTLP/gRPC to this collector
    /// (`http://host:4317`); default: `$OTEL_EXPORTER_OTLP_ENDPOINT`, and no export when
    /// neither is set (an empty value turns export off even when the variable is set).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Export metrics this often (ms); default: `$OTEL_METRIC_EXPORT_INTERVAL`, else
    /// 10 000.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub otlp_interval_ms: Option<u64>,
    /// Serve Prometheus `GET /metrics` on this address (port 0: any free port; the
    /// chosen one is printed).
    #[arg(long, value_name = "ADDR")]
    pub metrics_http: Option<String>,
}

/// Telemetry running for a role; stops (after a last export) when dropped.
pub struct Telemetry {
    exporter: Option<Exporter>,
    _http: Option<AbortOnDropHandle<()>>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(exporter) = self.exporter.take() {
            // The last export waits on a gRPC call served by this runtime's threads.
            match tokio::runtime::Handle::try_current() {
                Ok(_) => tokio::task::block_in_place(move || drop(exporter)),
                Err(_) => drop(exporter),
            }
        }
    }
}

impl TelemetryArgs {
    /// Starts what the flags ask for, publishing `collector` and this process's own
    /// figures as `role`. Call inside the runtime.
    pub async fn start(
        &self,
        role: &'static str,
        instance: String,
        collector: Vec<Arc<dyn Collect>>,
    ) -> Result<Telemetry, Failure> {
        let mut all = collector;
        all.push(Arc::new(ProcessMetrics));
        let collector: Arc<dyn Collect> = Arc::new(Merged(all));
        let http = match &self.metrics_http {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    Failure::usage(format!("--metrics-http: cannot listen on {addr}: {e}"))
                })?;
                let bound = listener
                    .local_addr()
                    .map_err(|e| Failure::usage(format!("--metrics-http {addr}: {e}")))?;
                // Scripts and tests read the bound address from this line.
                eprintln!("metrics on http://{bound}/metrics");
                Some(prometheus::serve(collector.clone(), listener))
            }
            None => None,
        };
        let exporter = match otlp::endpoint(self.otlp_endpoint.as_deref()) {
            Some(endpoint) => {
                let identity = Identity {
                    role,
                    instance,
                    interval: self.otlp_interval_ms.map(std::time::Duration::from_millis),
                };
                Some(
                    otlp::start(&endpoint, &identity, collector)
                        .map_err(|e| Failure::usage(format!("--otlp-endpoint: {e}")))?,
                )
            }
            None => None,
        };
        Ok(Telemetry {
            exporter,
            _http: http,
        })
    }
}

/// `host/pid`: a process's instance id where no better name exists.
pub fn instance() -> String {
    format!("{}/{}", otlp::host_name(), std::process::id())
}

/// Every metric a role may publish: `(role, metric)`, in the order `docs/metrics.md`
/// lists them.
#[cfg(test)]
fn catalogue() -> Vec<(&'static str, sluice_telemetry::Metric)> {
    use sluice_telemetry::family::{PROCESS_MEMORY, PROCESS_UPTIME};
    let mut all = Vec::new();
    all.extend(
        sluice_coordinator::prometheus::metrics()
            .into_iter()
            .map(|m| ("coordinator", m)),
    );
    let live = sluice_compute::cluster::task_metrics::LiveTasks::default();
    all.extend(live.metrics().into_iter().map(|m| ("worker", m)));
    all.extend(
        sluice_state_service::metrics::metrics()
            .into_iter()
            .map(|m| ("state-service", m)),
    );
    all.extend(
        [PROCESS_MEMORY, PROCESS_UPTIME, otlp::EXPORT_FAILURES]
            .into_iter()
            .map(|m| ("every role", m)),
    );
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dashboards in `infra/grafana/` query only metrics that exist, by their
    /// Prometheus names.
    #[test]
    fn dashboards_query_only_documented_metrics() {
        let known: Vec<String> = catalogue()
            .iter()
            .map(|(_, m)| m.prometheus_name())
            .collect();
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/grafana");
        let mut files = 0;
        for entry in std::fs::read_dir(dir).expect("infra/grafana") {
            let path = entry.expect("an entry").path();
            let text = std::fs::read_to_string(&path).expect("a dashboard");
            let dashboard: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            files += 1;
            let panels = dashboard["panels"].as_array().expect("panels");
            assert!(!panels.is_empty(), "{}", path.display());
            for target in panels
                .iter()
                .flat_map(|p| p["targets"].as_array().into_iter().flatten())
            {
                let expr = target["expr"].as_str().expect("an expr");
                let names = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("sluice_") || w.starts_with("process_"));
                for name in names {
                    assert!(
                        known.iter().any(|k| k == name),
                        "{}: `{name}` in `{expr}` is no metric of docs/metrics.md",
                        path.display()
                    );
                }
            }
        }
        assert_eq!(files, 3, "the job, state and exchange dashboards");
    }

    /// The documented list is the list: each metric appears in `docs/metrics.md` with its
    /// OpenTelemetry name, Prometheus name and unit on one table row.
    #[test]
    fn docs_metrics_md_lists_every_metric_with_both_names() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
        let doc = std::fs::read_to_string(path).expect("docs/metrics.md");
        let mut missing = Vec::new();
        for (role, m) in catalogue() {
            let prom = m.prometheus_name();
            let row = doc.lines().find(|l| {
                l.starts_with('|')
                    && l.contains(&format!("`{}`", m.name))
                    && l.contains(&format!("`{prom}`"))
            });
            match row {
                Some(row) if row.contains(&format!("`{}`", m.unit)) || m.unit.is_empty() => {}
                _ => missing.push(format!(
                    "| {role} | `{}` | `{prom}` | {} | `{}` | {} |",
                    m.name,
                    match m.kind {
                        sluice_telemetry::Kind::Counter => "counter",
                        sluice_telemetry::Kind::Gauge => "gauge",
                    },
                    m.unit,
                    m.help
                )),
            }
        }
        assert!(
            missing.is_empty(),
            "docs/metrics.md lacks these rows:\n{}",
            missing.join("\n")
        );
    }
}
