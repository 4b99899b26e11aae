//! Logs over OTLP: a `tracing` layer that hands every event the process logs (the same
//! `SLUICE_LOG` filter as stderr) to the OTLP log exporter once [`crate::otlp::start`]
//! installed one. Before that, and without an endpoint, it does nothing. The exporter's
//! own crates (OpenTelemetry, tonic, h2, hyper) are not exported, so that a failing
//! export cannot feed itself.

use std::sync::RwLock;
use std::time::SystemTime;

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

static LOGGER: RwLock<Option<SdkLogger>> = RwLock::new(None);

/// Sends logged events to `provider` from now on.
pub fn install(provider: &SdkLoggerProvider) {
    *LOGGER.write().unwrap_or_else(|e| e.into_inner()) = Some(provider.logger("sluice"));
}

/// Stops sending logged events anywhere.
pub fn uninstall() {
    *LOGGER.write().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The layer; add it to the process's subscriber once, at start.
#[derive(Debug, Default)]
pub struct OtlpLogs;

/// Targets whose events are never exported (the exporter's own stack).
const QUIET: [&str; 4] = ["opentelemetry", "tonic", "h2", "hyper"];

impl<S: Subscriber> Layer<S> for OtlpLogs {
    fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
        let guard = LOGGER.read().unwrap_or_else(|e| e.into_inner());
        let Some(logger) = guard.as_ref() else {
            return;
        };
        let meta = event.metadata();
        if QUIET.iter().any(|q| meta.target().starts_with(q)) {
            return;
        }
        let (number, text) = match *meta.level() {
            Level::ERROR => (Severity::Error, "ERROR"),
            Level::WARN => (Severity::Warn, "WARN"),
            Level::INFO => (Severity::Info, "INFO"),
            Level::DEBUG => (Severity::Debug, "DEBUG"),
            Level::TRACE => (Severity::Trace, "TRACE"),
        };
        let mut record = logger.create_log_record();
        record.set_timestamp(SystemTime::now());
        record.set_severity_number(number);
        record.set_severity_text(text);
        record.set_target(meta.target().to_owned());
        let mut fields = Fields::default();
        event.record(&mut fields);
        record.set_body(AnyValue::from(fields.message));
        record.add_attributes(fields.attributes);
        logger.emit(record);
    }
}

/// An event's message and its other fields as attributes.
#[derive(Default)]
struct Fields {
    message: String,
    attributes: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.attributes.push((field.name().to_owned(), text));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.attributes
                .push((field.name().to_owned(), value.to_owned()));
        }
    }
}
