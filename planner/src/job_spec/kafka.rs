//! The `kafka` connector of `source:` and `sink:`.
//!
//! ```yaml
//! source:
//!   kafka:
//!     brokers: 127.0.0.1:9092
//!     topic: bids                 # or topics: [a, b], or topic_pattern: "bids-.*"
//!     format: json                # json | csv | raw
//!     schema: { auction: int64, price: int64, date_time: timestamp }
//!     start: earliest             # latest | group_offsets | { timestamp: 2026-01-01T00:00:00Z }
//!     bounded: latest             # none (default) | latest
//!     on_error: skip              # fail | skip | dead_letter (with dead_letter: DIR)
//!     group_id: monitor           # with commit_offsets: true, checkpointed offsets go there
//!     properties: { fetch.min.bytes: 1 }
//! sink:
//!   kafka: { brokers: 127.0.0.1:9092, topic: out, format: json, key: [auction] }
//! ```

use std::collections::HashMap;

use super::connector::{bad_records, schema};
use super::fields::{
    Fields, Result, bool_value, choice, duration_ms, positive_duration_ms, string, string_list,
};
use super::marked_yaml::{Node, Pos, PosError, Value};
use sluice_common::pb;

const SOURCE_KEYS: &[&str] = &[
    "brokers",
    "topic",
    "topics",
    "topic_pattern",
    "format",
    "schema",
    "start",
    "bounded",
    "group_id",
    "properties",
    "on_error",
    "dead_letter",
    "discovery_interval",
    "commit_offsets",
];

const SINK_KEYS: &[&str] = &[
    "brokers",
    "topic",
    "format",
    "key",
    "delivery",
    "transaction_timeout",
    "transactional_id_prefix",
    "properties",
];

const FORMATS: &[(&str, pb::KafkaFormat)] = &[
    ("json", pb::KafkaFormat::Json),
    ("csv", pb::KafkaFormat::Csv),
    ("raw", pb::KafkaFormat::Raw),
];

/// Decodes `source: { kafka: ... }`.
pub(super) fn source(node: &Node, path: &str) -> Result<pb::KafkaSource> {
    let fields = Fields::new(node, path, SOURCE_KEYS)?;
    let brokers = brokers(&fields)?;
    let named = fields.present(&["topic", "topics", "topic_pattern"]);
    let (topics, topic_pattern) = match named.as_slice() {
        [] => {
            return Err(PosError::new(
                fields.pos,
                format!("`{path}` names no topic; add `topic`, `topics` or `topic_pattern`"),
            ));
        }
        [("topic_pattern", entry)] => (
            Vec::new(),
            string(entry.value, &fields.path_of("topic_pattern"))?,
        ),
        [(name, entry)] => (
            string_list(entry.value, &fields.path_of(name), *name == "topic")?
                .into_iter()
                .map(|(t, _)| t)
                .collect(),
            String::new(),
        ),
        [(first, _), (second, entry), ..] => {
            return Err(PosError::new(
                entry.key.pos,
                format!("`{path}` has both `{first}` and `{second}`; name the topics one way"),
            ));
        }
    };
    let format = fields
        .opt("format", |node, path| choice(node, path, FORMATS))?
        .unwrap_or(pb::KafkaFormat::Json);
    let schema = fields.opt("schema", schema)?.unwrap_or_default();
    match (format, schema.is_empty(), fields.get("schema")) {
        (pb::KafkaFormat::Raw, false, Some(entry)) => {
            return Err(PosError::new(
                entry.key.pos,
                format!(
                    "`format: raw` reads each record as one string column, `value`; remove \
                     `schema` from {path} or use json or csv"
                ),
            ));
        }
        (pb::KafkaFormat::Json | pb::KafkaFormat::Csv, true, _) => {
            return Err(PosError::new(
                fields.pos,
                format!(
                    "`{path}` needs a `schema:` for {} records, e.g. `schema: {{ auction: \
                     int64, date_time: timestamp }}`",
                    if format == pb::KafkaFormat::Csv {
                        "csv"
                    } else {
                        "json"
                    }
                ),
            ));
        }
        _ => {}
    }
    let (start, start_timestamp_ms) = match fields.get("start") {
        None => (pb::KafkaStart::Earliest, 0),
        Some(entry) => start(entry.value, &fields.path_of("start"))?,
    };
    let bounded_latest = fields
        .opt("bounded", |node, path| {
            choice(node, path, &[("none", false), ("latest", true)])
        })?
        .unwrap_or(false);
    let group_id = fields.opt("group_id", string)?.unwrap_or_default();
    if start == pb::KafkaStart::GroupOffsets && group_id.is_empty() {
        return Err(PosError::new(
            fields.get("start").map_or(fields.pos, |e| e.value.pos),
            format!("`start: group_offsets` needs `group_id` in {path}: whose offsets?"),
        ));
    }
    let commit_offsets = fields.opt("commit_offsets", bool_value)?.unwrap_or(false);
    if commit_offsets && group_id.is_empty() {
        return Err(PosError::new(
            fields
                .get("commit_offsets")
                .map_or(fields.pos, |e| e.value.pos),
            format!("`commit_offsets: true` needs `group_id` in {path}: which group?"),
        ));
    }
    let (on_error, dead_letter_path) = bad_records(&fields, path)?;
    Ok(pb::KafkaSource {
        brokers,
        topics,
        topic_pattern,
        format: format as i32,
        schema,
        start: start as i32,
        start_timestamp_ms,
        bounded_latest,
        group_id,
        properties: fields.opt("properties", properties)?.unwrap_or_default(),
        on_error: on_error as i32,
        dead_letter_path,
        discovery_interval_ms: fields.opt("discovery_interval", duration_ms)?.unwrap_or(0),
        commit_offsets,
    })
}

/// Decodes `sink: { kafka: ... }`.
pub(super) fn sink(node: &Node, path: &str) -> Result<pb::KafkaSink> {
    let fields = Fields::new(node, path, SINK_KEYS)?;
    let brokers = brokers(&fields)?;
    let topic = string(
        fields
            .require("topic", "; which topic should records go to?")?
            .value,
        &fields.path_of("topic"),
    )?;
    let format = fields
        .opt("format", |node, path| choice(node, path, &FORMATS[..2]))?
        .unwrap_or(pb::KafkaFormat::Json);
    let key_columns = fields
        .opt("key", |node, path| string_list(node, path, true))?
        .unwrap_or_default()
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    let deliveries = [
        ("at_least_once", pb::KafkaDelivery::AtLeastOnce),
        ("exactly_once", pb::KafkaDelivery::ExactlyOnce),
    ];
    let delivery = fields
        .opt("delivery", |node, path| choice(node, path, &deliveries))?
        .unwrap_or(pb::KafkaDelivery::AtLeastOnce);
    let exactly_once = delivery == pb::KafkaDelivery::ExactlyOnce;
    for key in ["transaction_timeout", "transactional_id_prefix"] {
        if let Some(entry) = fields.get(key)
            && !exactly_once
        {
            return Err(PosError::new(
                entry.key.pos,
                format!("`{key}` applies to `delivery: exactly_once` only; remove it"),
            ));
        }
    }
    let properties = fields.opt("properties", properties)?.unwrap_or_default();
    if exactly_once && let Some(entry) = fields.get("properties") {
        return Err(PosError::new(
            entry.key.pos,
            "`properties` configure librdkafka, which the exactly-once Kafka sink does not \
             use (it speaks the protocol itself, plaintext); remove them",
        ));
    }
    let transaction_timeout_ms = fields
        .opt("transaction_timeout", positive_duration_ms)?
        .unwrap_or(0);
    let transactional_id_prefix = fields
        .opt("transactional_id_prefix", |node, path| {
            let text = string(node, path)?;
            if text.is_empty() || !text.chars().all(id_char) {
                return Err(PosError::new(
                    node.pos,
                    format!(
                        "`{path}` may hold only letters, digits, `.`, `_` and `-` (found \
                         `{text}`)"
                    ),
                ));
            }
            Ok(text)
        })?
        .unwrap_or_default();
    Ok(pb::KafkaSink {
        brokers,
        topic,
        format: format as i32,
        key_columns,
        delivery: delivery as i32,
        properties,
        transactional_id_prefix,
        transaction_timeout_ms,
    })
}

/// A character a transactional id prefix may hold.
fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The default transaction timeout of the exactly-once sink (what most brokers allow at
/// most, `transaction.max.timeout.ms`).
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// The coordinator's default checkpoint timeout.
const DEFAULT_CHECKPOINT_TIMEOUT_MS: u64 = 120_000;

/// Checks an exactly-once Kafka sink (`what` in messages, `suffix` in its transactional
/// ids, declared at `at`) against the job's checkpoints and names its transactional ids
/// after the job when the file did not.
///
/// A transaction stays open from the first row after a barrier until the checkpoint
/// after that completes, and one checkpoint may fail and be covered by the next: up to
/// two intervals plus a checkpoint's timeout. A broker aborts a transaction open longer
/// than its timeout, losing what the checkpoint promised (Flink's sink-transaction-
/// timeout pathology), so such a job is refused.
pub(super) fn check_exactly_once(
    sink: &mut pb::KafkaSink,
    job: &str,
    what: &str,
    suffix: &str,
    checkpoint: Option<&pb::CheckpointConfig>,
    at: Pos,
) -> Result<()> {
    if sink.delivery() != pb::KafkaDelivery::ExactlyOnce {
        return Ok(());
    }
    let interval = checkpoint.map_or(0, |c| c.interval_ms);
    if interval == 0 {
        return Err(PosError::new(
            at,
            format!(
                "`delivery: exactly_once` commits one Kafka transaction per checkpoint, but \
                 the job takes none: add `checkpoint: {{ interval: 10s }}` (the {what})"
            ),
        ));
    }
    let checkpoint_timeout = checkpoint
        .map(|c| c.timeout_ms)
        .filter(|t| *t > 0)
        .unwrap_or(DEFAULT_CHECKPOINT_TIMEOUT_MS);
    let timeout = match sink.transaction_timeout_ms {
        0 => DEFAULT_TRANSACTION_TIMEOUT_MS,
        t => t,
    };
    let needed = 2 * interval + checkpoint_timeout;
    if timeout < needed {
        return Err(PosError::new(
            at,
            format!(
                "the {what}'s `transaction_timeout` ({}) is too short for checkpoints every \
                 {} that may take {}: a transaction stays open up to two intervals plus a \
                 checkpoint's timeout ({}), and the broker would abort it, losing records a \
                 checkpoint already counted; raise `transaction_timeout` (the broker's \
                 transaction.max.timeout.ms caps it) or checkpoint more often",
                secs(timeout),
                secs(interval),
                secs(checkpoint_timeout),
                secs(needed)
            ),
        ));
    }
    if sink.transactional_id_prefix.is_empty() {
        let job: String = job
            .chars()
            .map(|c| if id_char(c) { c } else { '-' })
            .collect();
        sink.transactional_id_prefix = format!("sluice-{job}-{suffix}");
    }
    Ok(())
}

fn secs(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn brokers(fields: &Fields<'_>) -> Result<String> {
    let entry = fields.require("brokers", "; e.g. `brokers: 127.0.0.1:9092`")?;
    let list = string_list(entry.value, &fields.path_of("brokers"), true)?;
    Ok(list
        .into_iter()
        .map(|(b, _)| b)
        .collect::<Vec<_>>()
        .join(","))
}

/// `start:` as a name, or `{ timestamp: T }` with T in epoch milliseconds or RFC 3339.
fn start(node: &Node, path: &str) -> Result<(pb::KafkaStart, i64)> {
    if let Value::Map(_) = &node.value {
        let fields = Fields::new(node, path, &["timestamp"])?;
        let entry = fields.require("timestamp", "; e.g. `{ timestamp: 2026-01-01T00:00:00Z }`")?;
        let text = string(entry.value, &fields.path_of("timestamp"))?;
        let ms = match text.parse::<i64>() {
            Ok(ms) => ms,
            Err(_) => chrono::DateTime::parse_from_rfc3339(&text)
                .map_err(|e| {
                    PosError::new(
                        entry.value.pos,
                        format!(
                            "bad timestamp `{text}` for `{path}.timestamp` ({e}); give epoch \
                             milliseconds or RFC 3339 such as 2026-01-01T00:00:00Z"
                        ),
                    )
                })?
                .timestamp_millis(),
        };
        return Ok((pb::KafkaStart::Timestamp, ms));
    }
    let names = [
        ("earliest", pb::KafkaStart::Earliest),
        ("latest", pb::KafkaStart::Latest),
        ("group_offsets", pb::KafkaStart::GroupOffsets),
    ];
    Ok((choice(node, path, &names)?, 0))
}

/// `properties: { key: value, ... }`: librdkafka settings, every scalar taken as text.
fn properties(node: &Node, path: &str) -> Result<HashMap<String, String>> {
    let Value::Map(entries) = &node.value else {
        return Err(PosError::new(
            node.pos,
            format!(
                "expected a mapping of librdkafka setting to value for `{path}`, found {}",
                node.describe()
            ),
        ));
    };
    entries
        .iter()
        .map(|(key, value)| {
            let name = string(key, &format!("{path} key"))?;
            let text = string(value, &format!("{path}.{name}"))?;
            Ok((name, text))
        })
        .collect()
}
