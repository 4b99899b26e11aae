//! The top level of a job file: name, parallelism, state, and the order in which the
//! sections are decoded (the watermark before the pipeline, whose event-time windows need
//! it).

use super::connector;
use super::fields::{
    Fields, Result, bool_value, choice, duration_ms, positive_duration_ms, string, u32_in,
};
use super::kafka;
use super::marked_yaml::{Node, PosError};
use super::pipeline;
use super::spec::{JobSpec, Operator};
use sluice_common::{DEFAULT_MAX_PARALLELISM, pb};

/// Largest number of key groups a job may have (DESIGN §4).
const MAX_KEY_GROUPS: u32 = 32_768;

const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "parallelism",
    "max_parallelism",
    "state",
    "checkpoint",
    "network",
    "source",
    "watermark",
    "pipeline",
    "sink",
];

pub(super) fn job(root: &Node) -> Result<JobSpec> {
    let fields = Fields::new(root, "", TOP_LEVEL_KEYS)?;
    let name = string(
        fields.require("name", "; every job needs a name")?.value,
        "name",
    )?;
    let parallelism = fields
        .opt("parallelism", |node, path| {
            u32_in(node, path, 1, MAX_KEY_GROUPS)
        })?
        .unwrap_or(1);
    let max_parallelism = match fields.get("max_parallelism") {
        // Room to scale out later: 1.5 x parallelism rounded up to a power of two, at
        // least the default (Flink's rule).
        None => (parallelism + parallelism / 2)
            .next_power_of_two()
            .clamp(DEFAULT_MAX_PARALLELISM, MAX_KEY_GROUPS),
        Some(entry) => {
            let value = u32_in(entry.value, "max_parallelism", 1, MAX_KEY_GROUPS)?;
            if value < parallelism {
                return Err(PosError::new(
                    entry.value.pos,
                    format!(
                        "`max_parallelism` ({value}) must be at least `parallelism` \
                         ({parallelism})"
                    ),
                ));
            }
            value
        }
    };
    let state = fields.opt("state", state)?.unwrap_or_default();

    let checkpoint = fields.opt("checkpoint", checkpoint)?;
    let network = fields.opt("network", network)?;

    let source_entry = fields.require("source", "; e.g. `source: { nexmark: { stream: bid } }`")?;
    let mut source = connector::source(source_entry.value, "source")?;
    source.watermark = fields.opt("watermark", watermark)?;

    let pipeline = match fields.get("pipeline") {
        Some(entry) => pipeline::pipeline(entry.value, source.watermark.as_ref())?,
        None => Vec::new(),
    };

    let sink_entry = fields.require("sink", "; e.g. `sink: { stdout: {} }`")?;
    let mut sink = connector::sink(sink_entry.value, "sink")?;
    let mut pipeline = pipeline;
    let cp = checkpoint.as_ref();
    if let Some(pb::sink_spec::Kind::Kafka(k)) = sink.kind.as_mut() {
        kafka::check_exactly_once(k, &name, "sink", "sink", cp, sink_entry.key.pos)?;
    }
    for (i, stage) in pipeline.iter_mut().enumerate() {
        if let Operator::Window(w) = &mut stage.op
            && let Some((late, at)) = w.late_sink.as_mut()
            && let Some(pb::sink_spec::Kind::Kafka(k)) = late.kind.as_mut()
        {
            let what = format!("late sink of pipeline step {}", i + 1);
            kafka::check_exactly_once(k, &name, &what, &format!("late-{i}"), cp, *at)?;
        }
    }

    Ok(JobSpec {
        name,
        parallelism,
        max_parallelism,
        state,
        checkpoint,
        network,
        source,
        source_at: source_entry.key.pos,
        pipeline,
        sink,
        sink_at: sink_entry.key.pos,
    })
}

fn state(node: &Node, path: &str) -> Result<pb::StateConfig> {
    let fields = Fields::new(node, path, &["backend", "shards", "cache"])?;
    let backends = [
        ("memory", pb::StateBackend::Memory),
        ("remote", pb::StateBackend::Remote),
    ];
    let backend = choice(
        fields
            .require("backend", "; expected memory or remote")?
            .value,
        &fields.path_of("backend"),
        &backends,
    )?;
    let shards = fields
        .opt("shards", |n, p| u32_in(n, p, 1, 32768))?
        .unwrap_or(0);
    let cache_bytes = fields
        .opt("cache", |n, p| {
            let text = string(n, p)?;
            match sluice_common::byte_size::parse(&text) {
                Ok(bytes) if bytes > 0 => Ok(bytes),
                Ok(_) => Err(PosError::new(n.pos, format!("`{p}` must be more than 0"))),
                Err(e) => Err(PosError::new(
                    n.pos,
                    format!("`{p}`: {e} (e.g. `cache: 256MiB`)"),
                )),
            }
        })?
        .unwrap_or(0);
    Ok(pb::StateConfig {
        backend: backend as i32,
        shards,
        cache_bytes,
    })
}

fn checkpoint(node: &Node, path: &str) -> Result<pb::CheckpointConfig> {
    let fields = Fields::new(
        node,
        path,
        &["interval", "mode", "timeout", "aligned_timeout"],
    )?;
    let interval_ms = positive_duration_ms(
        fields.require("interval", "; e.g. `interval: 1s`")?.value,
        &fields.path_of("interval"),
    )?;
    let timeout_ms = fields.opt("timeout", positive_duration_ms)?.unwrap_or(0);
    let modes = [
        ("aligned", pb::CheckpointMode::Aligned),
        ("unaligned", pb::CheckpointMode::Unaligned),
    ];
    let mode = fields
        .opt("mode", |node, path| choice(node, path, &modes))?
        .unwrap_or(pb::CheckpointMode::Aligned);
    let aligned_timeout_ms = fields
        .opt("aligned_timeout", positive_duration_ms)?
        .unwrap_or(0);
    if aligned_timeout_ms > 0
        && mode == pb::CheckpointMode::Unaligned
        && let Some(entry) = fields.get("aligned_timeout")
    {
        return Err(PosError::new(
            entry.key.pos,
            format!(
                "`{}` applies to aligned checkpoints (it switches one that waits too long \
                 to unaligned); with `mode: unaligned` every barrier overtakes at once: \
                 leave one of the two out",
                fields.path_of("aligned_timeout")
            ),
        ));
    }
    Ok(pb::CheckpointConfig {
        interval_ms,
        mode: mode as i32,
        timeout_ms,
        aligned_timeout_ms,
    })
}

/// Flink's default debloating target.
const DEFAULT_DEBLOAT_TARGET_MS: u64 = 1000;

fn network(node: &Node, path: &str) -> Result<pb::NetworkSettings> {
    let fields = Fields::new(node, path, &["debloat"])?;
    let debloat_target_ms = fields
        .opt("debloat", |node, path| match bool_value(node, path) {
            Ok(true) => Ok(DEFAULT_DEBLOAT_TARGET_MS),
            Ok(false) => Ok(0),
            Err(_) => positive_duration_ms(node, path).map_err(|e| {
                PosError::new(
                    node.pos,
                    format!(
                        "{}; `{path}` is true (in-flight data drains in about 1s), false, \
                         or the time in-flight data should take to drain, e.g. `500ms`",
                        e.message
                    ),
                )
            }),
        })?
        .unwrap_or(0);
    Ok(pb::NetworkSettings { debloat_target_ms })
}

pub(super) fn watermark(node: &Node, path: &str) -> Result<pb::WatermarkSpec> {
    let fields = Fields::new(
        node,
        path,
        &["column", "max_out_of_orderness", "idleness", "alignment"],
    )?;
    let column = string(
        fields
            .require("column", "; which column holds the event time?")?
            .value,
        &fields.path_of("column"),
    )?;
    Ok(pb::WatermarkSpec {
        column,
        max_out_of_orderness_ms: fields
            .opt("max_out_of_orderness", duration_ms)?
            .unwrap_or(0),
        idleness_ms: fields.opt("idleness", duration_ms)?.unwrap_or(0),
        alignment: fields.opt("alignment", alignment)?,
    })
}

/// `alignment: { max_drift: 10s, group: bids, update_interval: 1s }`.
fn alignment(node: &Node, path: &str) -> Result<pb::WatermarkAlignment> {
    let fields = Fields::new(node, path, &["max_drift", "group", "update_interval"])?;
    let max_drift_ms = positive_duration_ms(
        fields
            .require(
                "max_drift",
                "; how far a source may run ahead, e.g. `max_drift: 10s`",
            )?
            .value,
        &fields.path_of("max_drift"),
    )?;
    Ok(pb::WatermarkAlignment {
        group: fields
            .opt("group", string)?
            .unwrap_or_else(|| "default".into()),
        max_drift_ms,
        update_interval_ms: fields
            .opt("update_interval", positive_duration_ms)?
            .unwrap_or(1000),
    })
}
