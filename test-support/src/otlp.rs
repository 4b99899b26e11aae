//! The OTLP receiver tests check exports with (it lives in `sluice-telemetry`, where the
//! telemetry benchmark uses it too).

pub use sluice_telemetry::receiver::{OtlpReceiver, Point, ReceivedLog, ReceivedSpan};
