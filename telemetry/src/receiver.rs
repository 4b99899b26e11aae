//! An OTLP/gRPC receiver: the collector's `MetricsService`, `TraceService` and
//! `LogsService`, generated
//! from OpenTelemetry's own protos, on 127.0.0.1, keeping every export it is sent. Tests
//! check what roles export with it; `sluice bench telemetry` exports to it.
//!
//! It runs on a thread and runtime of its own, so synchronous callers that start `sluice`
//! processes can use it; the server stops when the receiver is dropped. It keeps
//! everything it receives: it is for bounded runs, not a collector.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};

/// One data point as received: its resource's and its own attributes, and its value.
#[derive(Debug, Clone)]
pub struct Point {
    /// Resource attributes (`sluice.role`, `service.name`, ...).
    pub resource: BTreeMap<String, String>,
    /// The metric's name.
    pub metric: String,
    /// The metric's unit.
    pub unit: String,
    /// `sum` (a counter) or `gauge`.
    pub kind: &'static str,
    /// The point's attributes (`job`, `task`, ...).
    pub attributes: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

#[derive(Default)]
struct Received(Arc<Mutex<Vec<ExportMetricsServiceRequest>>>);

#[derive(Default)]
struct ReceivedSpans(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[derive(Default)]
struct ReceivedLogs(Arc<Mutex<Vec<ExportLogsServiceRequest>>>);

#[tonic::async_trait]
impl LogsService for ReceivedLogs {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse {
            partial_success: None,
        }))
    }
}

/// One log record as received.
#[derive(Debug, Clone)]
pub struct ReceivedLog {
    /// Resource attributes of the process that sent it.
    pub resource: BTreeMap<String, String>,
    /// `ERROR`, `WARN`, `INFO`, ...
    pub severity: String,
    /// The message.
    pub body: String,
    /// Its other fields.
    pub attributes: BTreeMap<String, String>,
}

#[tonic::async_trait]
impl TraceService for ReceivedSpans {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// One span as received.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Resource attributes of the process that sent it.
    pub resource: BTreeMap<String, String>,
    /// The span's name.
    pub name: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex id of its parent (empty for a root).
    pub parent_span_id: String,
    /// The span's attributes.
    pub attributes: BTreeMap<String, String>,
    /// Start and end, ns since the Unix epoch.
    pub start_ns: u64,
    /// End, ns since the Unix epoch.
    pub end_ns: u64,
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// The receiver; `endpoint()` is what `OTEL_EXPORTER_OTLP_ENDPOINT` should say.
pub struct OtlpReceiver {
    addr: std::net::SocketAddr,
    received: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    spans: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    logs: Arc<Mutex<Vec<ExportLogsServiceRequest>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Starts a receiver on a free port of 127.0.0.1.
    ///
    /// # Panics
    /// When it cannot bind or start its thread (a broken machine, not an input).
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the OTLP receiver");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("receiver address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let service = Received(received.clone());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let span_service = ReceivedSpans(spans.clone());
        let logs = Arc::new(Mutex::new(Vec::new()));
        let log_service = ReceivedLogs(logs.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("receiver runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(MetricsServiceServer::new(service))
                    .add_service(TraceServiceServer::new(span_service))
                    .add_service(LogsServiceServer::new(log_service))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Self {
            addr,
            received,
            spans,
            logs,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many metric exports and span exports arrived.
    pub fn exports(&self) -> (usize, usize) {
        let metrics = self
            .received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        let spans = self.spans.lock().unwrap_or_else(|e| e.into_inner()).len();
        (metrics, spans)
    }

    /// Every data point received so far, in arrival order.
    pub fn points(&self) -> Vec<Point> {
        let received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for request in received.iter() {
            for rm in &request.resource_metrics {
                let resource = rm
                    .resource
                    .as_ref()
                    .map(|r| attributes(&r.attributes))
                    .unwrap_or_default();
                for sm in &rm.scope_metrics {
                    for m in &sm.metrics {
                        let (kind, points) = match &m.data {
                            Some(metric::Data::Sum(s)) => ("sum", &s.data_points),
                            Some(metric::Data::Gauge(g)) => ("gauge", &g.data_points),
                            _ => continue,
                        };
                        for p in points {
                            let value = match p.value {
                                Some(number_data_point::Value::AsDouble(v)) => v,
                                Some(number_data_point::Value::AsInt(v)) => v as f64,
                                None => continue,
                            };
                            out.push(Point {
                                resource: resource.clone(),
                                metric: m.name.clone(),
                                unit: m.unit.clone(),
                                kind,
                                attributes: attributes(&p.attributes),
                                value,
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// Every log record received so far, in arrival order.
    pub fn logs(&self) -> Vec<ReceivedLog> {
        let received = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for request in received.iter() {
            for rl in &request.resource_logs {
                let resource = rl
                    .resource
                    .as_ref()
                    .map(|r| attributes(&r.attributes))
                    .unwrap_or_default();
                for sl in &rl.scope_logs {
                    for r in &sl.log_records {
                        out.push(ReceivedLog {
                            resource: resource.clone(),
                            severity: r.severity_text.clone(),
                            body: r.body.as_ref().map(text).unwrap_or_default(),
                            attributes: attributes(&r.attributes),
                        });
                    }
                }
            }
        }
        out
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        let received = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for request in received.iter() {
            for rs in &request.resource_spans {
                let resource = rs
                    .resource
                    .as_ref()
                    .map(|r| attributes(&r.attributes))
                    .unwrap_or_default();
                for ss in &rs.scope_spans {
                    for s in &ss.spans {
                        out.push(ReceivedSpan {
                            resource: resource.clone(),
                            name: s.name.clone(),
                            trace_id: hex(&s.trace_id),
                            span_id: hex(&s.span_id),
                            parent_span_id: hex(&s.parent_span_id),
                            attributes: attributes(&s.attributes),
                            start_ns: s.start_time_unix_nano,
                            end_ns: s.end_time_unix_nano,
                        });
                    }
                }
            }
        }
        out
    }

    /// The metric names received from processes whose `sluice.role` is `role`.
    pub fn names_of_role(&self, role: &str) -> BTreeSet<String> {
        self.points()
            .into_iter()
            .filter(|p| p.resource.get("sluice.role").map(String::as_str) == Some(role))
            .map(|p| p.metric)
            .collect()
    }

    /// Waits up to `timeout` for `done` to hold over the points received.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&[Point]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.points()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map(text).unwrap_or_default(),
            )
        })
        .collect()
}

fn text(v: &AnyValue) -> String {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
