//! Traces: one per checkpoint across roles. The coordinator opens the checkpoint's root
//! span and hands its W3C `traceparent` to the workers in the trigger message and to the
//! state nodes in gRPC metadata; each role adds its own spans under it. Spans go to the
//! global tracer, which [`crate::otlp::start`] installs (batched, in a bounded queue that
//! drops when the collector cannot keep up); without an exporter every call here is a
//! no-op, and a `traceparent` is empty.

use std::collections::HashMap;
use std::time::SystemTime;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanBuilder, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The gRPC metadata key (and W3C header) carrying a span's context.
pub const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of `cx`'s span; empty when it has none (tracing off).
pub fn traceparent(cx: &Context) -> String {
    if !cx.span().span_context().is_valid() {
        return String::new();
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove(TRACEPARENT).unwrap_or_default()
}

/// The `traceparent` of the span current in this task (see
/// `opentelemetry::context::FutureExt::with_context`).
pub fn current_traceparent() -> String {
    traceparent(&Context::current())
}

/// The context a remote `traceparent` names (an empty context for an empty or malformed
/// one: a span started under it is a new trace's root).
pub fn remote_parent(traceparent: &str) -> Context {
    if traceparent.is_empty() {
        return Context::new();
    }
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// Starts span `name` under `parent` (at `start`, else now); the context holding it.
pub fn start(
    name: &'static str,
    parent: &Context,
    attributes: Vec<KeyValue>,
    start: Option<SystemTime>,
) -> Context {
    let mut builder = SpanBuilder::from_name(name).with_attributes(attributes);
    if let Some(t) = start {
        builder = builder.with_start_time(t);
    }
    let span = global::tracer("sluice").build_with_context(builder, parent);
    parent.with_span(span)
}

/// Ends the span `cx` holds, now (or at `end`), marked failed with `error`.
pub fn end(cx: &Context, end: Option<SystemTime>, error: Option<String>) {
    let span = cx.span();
    if let Some(e) = error {
        span.set_status(Status::error(e));
    }
    match end {
        Some(t) => span.end_with_timestamp(t),
        None => span.end(),
    }
}

/// A span of `name` under `parent` that already happened, from `start` to `end`.
pub fn record(
    name: &'static str,
    parent: &Context,
    attributes: Vec<KeyValue>,
    start_at: SystemTime,
    end_at: SystemTime,
) -> Context {
    let cx = start(name, parent, attributes, Some(start_at));
    end(&cx, Some(end_at), None);
    cx
}

/// Marks the span `cx` holds with an attribute.
pub fn set_attribute(cx: &Context, kv: KeyValue) {
    cx.span().set_attribute(kv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips_and_an_empty_one_is_no_parent() {
        assert!(!remote_parent("").span().span_context().is_valid());
        assert!(!remote_parent("garbage").span().span_context().is_valid());
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = remote_parent(tp);
        assert!(cx.span().span_context().is_valid());
        assert_eq!(traceparent(&cx), tp);
        // Without an installed tracer a child is not recording, but stays in the trace.
        let child = start("x", &cx, Vec::new(), None);
        assert_eq!(
            child.span().span_context().trace_id(),
            cx.span().span_context().trace_id()
        );
        assert_eq!(traceparent(&Context::new()), "");
    }
}
