//! OTLP export over gRPC: a role's [`Collect`]or observed by OpenTelemetry instruments
//! and pushed to a collector by the SDK's periodic reader, the role's spans
//! ([`crate::trace`]) through the global tracer, and its logged events
//! ([`crate::logs`]), both batched.
//!
//! Export is on only when an endpoint is given (`--otlp-endpoint` or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`); the SDK's other standard variables keep their meaning
//! (`OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`). Metrics are cumulative and observed
//! at export time, so nothing queues while the collector is down: a failed export is
//! dropped and counted (`sluice.telemetry.export.failures`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{AsyncInstrument, AsyncInstrumentBuilder, Meter, MeterProvider as _};
use opentelemetry_otlp::{LogExporter, MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::resource::EnvResourceDetector;
use opentelemetry_sdk::trace::SdkTracerProvider;

use crate::family::{Collect, Kind, Metric, Snapshot};

/// The standard variable naming the collector.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Export interval when `OTEL_METRIC_EXPORT_INTERVAL` is not set (the SDK's own default,
/// 60 s, is long for watching a job).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Exports that failed (the collector down or refusing): each drops one interval's
/// figures, and the next export carries the cumulative values again.
pub const EXPORT_FAILURES: Metric = Metric::counter(
    "sluice.telemetry.export.failures",
    "{export}",
    "OTLP exports that failed and were dropped.",
);

/// Who is exporting, for the resource attributes.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `coordinator`, `worker`, `state-service` or `run` (attribute `sluice.role`).
    pub role: &'static str,
    /// This process among others of its role (`service.instance.id`): a worker's or a
    /// node's id, or host and pid.
    pub instance: String,
    /// How often metrics are exported; `None`: `OTEL_METRIC_EXPORT_INTERVAL`, else 10 s.
    pub interval: Option<Duration>,
}

/// The collector endpoint: the flag's value, else `OTEL_EXPORTER_OTLP_ENDPOINT`, else
/// none (no export).
pub fn endpoint(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned)
        .or_else(|| std::env::var(ENDPOINT_VAR).ok())
        .filter(|e| !e.trim().is_empty())
}

/// Export running; dropping it exports once more and stops.
pub struct Exporter {
    provider: SdkMeterProvider,
    snapshots: Arc<Shared>,
    tracer: SdkTracerProvider,
    logs: SdkLoggerProvider,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        // A final export of fresh figures (not a snapshot the last periodic export took
        // moments ago), so a short run's end reaches the collector too.
        self.snapshots.invalidate();
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
        let _ = self.tracer.force_flush();
        let _ = self.tracer.shutdown();
        // Spans started from now on cost nothing, as before export began.
        opentelemetry::global::set_tracer_provider(
            opentelemetry::trace::noop::NoopTracerProvider::new(),
        );
        crate::logs::uninstall();
        let _ = self.logs.force_flush();
        let _ = self.logs.shutdown();
    }
}

/// Starts exporting `collector`'s metrics to `endpoint` (`http://host:4317`). Must be
/// called inside a Tokio runtime (the gRPC channel lives on it), which must outlive the
/// returned [`Exporter`].
pub fn start(
    endpoint: &str,
    identity: &Identity,
    collector: Arc<dyn Collect>,
) -> Result<Exporter, String> {
    let inner = MetricExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("OTLP endpoint {endpoint}: {e}"))?;
    let failures = Arc::new(AtomicU64::new(0));
    let exporter = Counting {
        inner,
        failures: failures.clone(),
    };
    let mut reader = PeriodicReader::builder(exporter);
    match identity.interval {
        Some(interval) => reader = reader.with_interval(interval),
        None if std::env::var("OTEL_METRIC_EXPORT_INTERVAL").is_err() => {
            reader = reader.with_interval(DEFAULT_INTERVAL);
        }
        None => {}
    }
    let provider = SdkMeterProvider::builder()
        .with_reader(reader.build())
        .with_resource(resource(identity))
        .build();
    // Spans (the checkpoint traces of `crate::trace`) in the SDK's batch processor: a
    // bounded queue (2048 spans) that drops rather than grows when export falls behind.
    let spans = SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("OTLP endpoint {endpoint}: {e}"))?;
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .with_resource(resource(identity))
        .build();
    opentelemetry::global::set_tracer_provider(tracer.clone());
    // Logged events (`crate::logs`), batched the same way.
    let log_exporter = LogExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("OTLP endpoint {endpoint}: {e}"))?;
    let logs = SdkLoggerProvider::builder()
        .with_batch_exporter(log_exporter)
        .with_resource(resource(identity))
        .build();
    crate::logs::install(&logs);
    let snapshots = register(
        &provider.meter("sluice"),
        Arc::new(WithFailures {
            inner: collector,
            failures,
        }),
    );
    tracing::info!(
        "exporting metrics over OTLP to {endpoint} as {} {}",
        identity.role,
        identity.instance
    );
    Ok(Exporter {
        provider,
        snapshots,
        tracer,
        logs,
    })
}

/// `service.name` (sluice, or `OTEL_SERVICE_NAME`), `service.version`, `sluice.role`,
/// `service.instance.id`, `host.name` and `process.pid`; `OTEL_RESOURCE_ATTRIBUTES`
/// adds to them and wins on a clash.
fn resource(id: &Identity) -> Resource {
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "sluice".into());
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", service),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("sluice.role", id.role),
            KeyValue::new("service.instance.id", id.instance.clone()),
            KeyValue::new("host.name", host_name()),
            KeyValue::new("process.pid", i64::from(std::process::id())),
        ])
        .with_detector(Box::new(EnvResourceDetector::new()))
        .build()
}

/// This machine's name (Linux), else `unknown`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// One observable instrument per metric; each collection takes one snapshot shared by
/// all the callbacks of that collection (returned, to be invalidated).
fn register(meter: &Meter, collector: Arc<dyn Collect>) -> Arc<Shared> {
    let shared = Arc::new(Shared {
        collector: collector.clone(),
        last: Mutex::new(None),
    });
    for m in collector.metrics() {
        let shared = shared.clone();
        let name = m.name;
        let observe = move |obs: &dyn AsyncInstrument<f64>| {
            let snapshot = shared.snapshot();
            for s in snapshot.samples(name) {
                let attrs: Vec<KeyValue> = s
                    .labels
                    .iter()
                    .map(|(k, v)| KeyValue::new(*k, v.clone()))
                    .collect();
                obs.observe(s.value, &attrs);
            }
        };
        match m.kind {
            Kind::Counter => {
                described(meter.f64_observable_counter(name), &m, observe).build();
            }
            Kind::Gauge => {
                described(meter.f64_observable_gauge(name), &m, observe).build();
            }
        }
    }
    shared
}

/// An instrument builder with `m`'s unit and help, observed by `observe`.
fn described<'a, I>(
    builder: AsyncInstrumentBuilder<'a, I, f64>,
    m: &Metric,
    observe: impl Fn(&dyn AsyncInstrument<f64>) + Send + Sync + 'static,
) -> AsyncInstrumentBuilder<'a, I, f64> {
    builder
        .with_unit(m.unit)
        .with_description(m.help)
        .with_callback(observe)
}

/// Callbacks of one collection run within microseconds of each other: a snapshot younger
/// than this is reused instead of collecting once per instrument.
const SNAPSHOT_REUSE: Duration = Duration::from_millis(50);

struct Shared {
    collector: Arc<dyn Collect>,
    last: Mutex<Option<(Instant, Arc<Snapshot>)>>,
}

impl Shared {
    /// The next collection takes a fresh snapshot.
    fn invalidate(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, s)) = last.as_ref()
            && at.elapsed() < SNAPSHOT_REUSE
        {
            return s.clone();
        }
        let mut s = Snapshot::default();
        self.collector.collect(&mut s);
        let s = Arc::new(s);
        *last = Some((Instant::now(), s.clone()));
        s
    }
}

/// The exporter, counting the exports that fail.
struct Counting {
    inner: MetricExporter,
    failures: Arc<AtomicU64>,
}

impl PushMetricExporter for Counting {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        if result.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// A role's collector plus the export-failure counter.
struct WithFailures {
    inner: Arc<dyn Collect>,
    failures: Arc<AtomicU64>,
}

impl Collect for WithFailures {
    fn metrics(&self) -> Vec<Metric> {
        let mut m = self.inner.metrics();
        m.push(EXPORT_FAILURES);
        m
    }

    fn collect(&self, out: &mut Snapshot) {
        self.inner.collect(out);
        let none: [(&str, String); 0] = [];
        out.add(
            &EXPORT_FAILURES,
            none,
            self.failures.load(Ordering::Relaxed) as f64,
        );
    }
}
