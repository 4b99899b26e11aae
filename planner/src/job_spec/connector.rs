//! The `source:` and `sink:` sections: which connector, and its settings.
//!
//! A section names exactly one connector (`nexmark` or `file` for sources; `stdout`,
//! `blackhole` or `file` for sinks). Object-store settings (`endpoint`, `region`,
//! `allow_http`, credentials) sit next to `path` in a `file` connector.

use super::fields::{
    Entry, Fields, Result, bool_value, choice, duration_ms, string, string_list, u32_in, u64_value,
};
use super::marked_yaml::{Node, PosError, Value};
use sluice_common::pb;

const SOURCE_CONNECTORS: &[&str] = &["nexmark", "file", "kafka"];
const SINK_CONNECTORS: &[&str] = &["stdout", "blackhole", "file", "kafka"];

const STORE_KEYS: &[&str] = &[
    "endpoint",
    "region",
    "allow_http",
    "access_key_id",
    "secret_access_key",
];

const FORMATS: &[(&str, pb::FileFormat)] = &[
    ("csv", pb::FileFormat::Csv),
    ("jsonl", pb::FileFormat::Jsonl),
    ("parquet", pb::FileFormat::Parquet),
];

/// Decodes `source:`; the watermark is added by the caller.
pub(super) fn source(node: &Node, path: &str) -> Result<pb::SourceSpec> {
    let allowed = [SOURCE_CONNECTORS, &["batch_size"]].concat();
    let fields = Fields::with_noun(node, path, &allowed, "source connector")?;
    let (name, entry) = exactly_one(&fields, SOURCE_CONNECTORS, "source")?;
    let kind = match name {
        "nexmark" => pb::source_spec::Kind::Nexmark(nexmark(entry.value, &fields.path_of(name))?),
        "kafka" => {
            pb::source_spec::Kind::Kafka(super::kafka::source(entry.value, &fields.path_of(name))?)
        }
        _ => pb::source_spec::Kind::File(file_source(entry.value, &fields.path_of(name))?),
    };
    let batch_size = fields
        .opt("batch_size", |node, path| u32_in(node, path, 1, u32::MAX))?
        .unwrap_or(0);
    Ok(pb::SourceSpec {
        kind: Some(kind),
        watermark: None,
        batch_size,
        // Chosen by the planner from what the job reads.
        columns: Vec::new(),
    })
}

/// Decodes a sink section (`sink:` or a late-records `sink:`).
pub(super) fn sink(node: &Node, path: &str) -> Result<pb::SinkSpec> {
    let allowed = [SINK_CONNECTORS, &["parallelism"]].concat();
    let fields = Fields::with_noun(node, path, &allowed, "sink connector")?;
    let (name, entry) = exactly_one(&fields, SINK_CONNECTORS, "sink")?;
    let parallelism = fields
        .opt("parallelism", |node, path| u32_in(node, path, 1, 32_768))?
        .unwrap_or(0);
    let path = fields.path_of(name);
    let kind = match name {
        "stdout" => {
            let fields = Fields::or_empty(entry.value, &path, &["format"])?;
            let format = fields
                .opt("format", |node, path| choice(node, path, &FORMATS[..2]))?
                .unwrap_or(pb::FileFormat::Jsonl);
            pb::sink_spec::Kind::Stdout(pb::StdoutSink {
                format: format as i32,
            })
        }
        "kafka" => pb::sink_spec::Kind::Kafka(super::kafka::sink(entry.value, &path)?),
        "blackhole" => {
            let fields = Fields::or_empty(entry.value, &path, &["delay_per_batch"])?;
            pb::sink_spec::Kind::Blackhole(pb::BlackholeSink {
                delay_per_batch_ms: fields.opt("delay_per_batch", duration_ms)?.unwrap_or(0),
            })
        }
        _ => {
            let allowed = [
                &["path", "format", "delay_per_batch", "partition_by"][..],
                STORE_KEYS,
            ]
            .concat();
            let fields = Fields::new(entry.value, &path, &allowed)?;
            let file_path = string(
                fields.require("path", "; where should output go?")?.value,
                &fields.path_of("path"),
            )?;
            let format = fields
                .opt("format", |node, path| choice(node, path, FORMATS))?
                .unwrap_or(pb::FileFormat::Jsonl);
            pb::sink_spec::Kind::File(pb::FileSink {
                path: file_path,
                format: format as i32,
                store: object_store(&fields)?,
                delay_per_batch_ms: fields.opt("delay_per_batch", duration_ms)?.unwrap_or(0),
                partition_by: match fields.get("partition_by") {
                    Some(entry) => string_list(entry.value, &fields.path_of("partition_by"), true)?
                        .into_iter()
                        .map(|(column, _)| column)
                        .collect(),
                    None => Vec::new(),
                },
            })
        }
    };
    Ok(pb::SinkSpec {
        kind: Some(kind),
        parallelism,
    })
}

/// The one connector key of a section; `what` is "source" or "sink".
fn exactly_one<'a>(
    fields: &Fields<'a>,
    connectors: &[&str],
    what: &str,
) -> Result<(&'a str, Entry<'a>)> {
    let present = fields.present(connectors);
    match present.as_slice() {
        [] => Err(PosError::new(
            fields.pos,
            format!(
                "`{}` names no connector; expected one of {}",
                fields.path,
                connectors.join(", ")
            ),
        )),
        [one] => Ok(*one),
        [(first, _), (second, entry), ..] => Err(PosError::new(
            entry.key.pos,
            format!(
                "`{}` has two connectors (`{first}` and `{second}`); a {what} has exactly one",
                fields.path
            ),
        )),
    }
}

fn nexmark(node: &Node, path: &str) -> Result<pb::NexmarkSource> {
    let fields = Fields::or_empty(
        node,
        path,
        &[
            "stream",
            "events",
            "seed",
            "max_out_of_orderness",
            "events_per_second",
            "splits",
            "max_events_per_second",
            "repeat_batches",
        ],
    )?;
    let streams = [
        ("bid", pb::NexmarkStream::Bid),
        ("auction", pb::NexmarkStream::Auction),
        ("person", pb::NexmarkStream::Person),
        ("side_input", pb::NexmarkStream::SideInput),
    ];
    let stream = fields
        .opt("stream", |node, path| choice(node, path, &streams))?
        .unwrap_or(pb::NexmarkStream::Bid);
    Ok(pb::NexmarkSource {
        stream: stream as i32,
        events: fields.opt("events", u64_value)?.unwrap_or(0),
        seed: fields.opt("seed", u64_value)?.unwrap_or(0),
        max_out_of_orderness_ms: fields
            .opt("max_out_of_orderness", duration_ms)?
            .unwrap_or(0),
        events_per_second: fields.opt("events_per_second", u64_value)?.unwrap_or(0),
        splits: fields
            .opt("splits", |node, path| u32_in(node, path, 0, u32::MAX))?
            .unwrap_or(0),
        max_events_per_second: fields.opt("max_events_per_second", u64_value)?.unwrap_or(0),
        repeat_batches: fields
            .opt("repeat_batches", |node, path| {
                u32_in(node, path, 0, 1 << 16)
            })?
            .unwrap_or(0),
    })
}

fn file_source(node: &Node, path: &str) -> Result<pb::FileSource> {
    let allowed = [
        &["path", "format", "on_error", "dead_letter", "schema"][..],
        STORE_KEYS,
    ]
    .concat();
    let fields = Fields::new(node, path, &allowed)?;
    let file_path = string(
        fields
            .require("path", "; which file or directory should be read?")?
            .value,
        &fields.path_of("path"),
    )?;
    let format = choice(
        fields
            .require("format", "; expected one of csv, jsonl, parquet")?
            .value,
        &fields.path_of("format"),
        FORMATS,
    )?;
    let (on_error, dead_letter) = bad_records(&fields, path)?;
    Ok(pb::FileSource {
        path: file_path,
        format: format as i32,
        on_error: on_error as i32,
        dead_letter_path: dead_letter,
        schema: fields.opt("schema", schema)?.unwrap_or_default(),
        store: object_store(&fields)?,
    })
}

/// `on_error` and `dead_letter` of a source that decodes records: the policy and where
/// bad records go (empty unless `dead_letter`).
pub(super) fn bad_records(fields: &Fields<'_>, path: &str) -> Result<(pb::OnError, String)> {
    let policies = [
        ("fail", pb::OnError::Fail),
        ("skip", pb::OnError::Skip),
        ("dead_letter", pb::OnError::DeadLetter),
    ];
    let on_error = fields
        .opt("on_error", |node, path| choice(node, path, &policies))?
        .unwrap_or(pb::OnError::Fail);
    let dead_letter = fields.opt("dead_letter", string)?;
    match (
        on_error,
        &dead_letter,
        fields.get("on_error"),
        fields.get("dead_letter"),
    ) {
        (pb::OnError::DeadLetter, None, Some(entry), _) => {
            return Err(PosError::new(
                entry.value.pos,
                format!(
                    "`on_error: dead_letter` needs a `dead_letter:` path in {path} saying \
                     where bad records go"
                ),
            ));
        }
        (pb::OnError::Fail | pb::OnError::Skip, Some(_), _, Some(entry)) => {
            return Err(PosError::new(
                entry.key.pos,
                format!(
                    "`dead_letter` is only used with `on_error: dead_letter` in {path}; set \
                     that or remove `dead_letter`"
                ),
            ));
        }
        _ => {}
    }
    Ok((on_error, dead_letter.unwrap_or_default()))
}

/// `schema: { column: type, ... }` in file order; every column is nullable.
pub(super) fn schema(node: &Node, path: &str) -> Result<Vec<pb::Field>> {
    let types = [
        ("int64", "int64"),
        ("int32", "int32"),
        ("float64", "float64"),
        ("boolean", "boolean"),
        ("string", "string"),
        ("timestamp", "timestamp"),
    ];
    let Value::Map(entries) = &node.value else {
        return Err(PosError::new(
            node.pos,
            format!(
                "expected a mapping of column name to type for `{path}` (e.g. `{{ price: int64 \
                 }}`), found {}",
                node.describe()
            ),
        ));
    };
    entries
        .iter()
        .map(|(key, value)| {
            let name = string(key, &format!("{path} column name"))?;
            let data_type = choice(value, &format!("{path}.{name}"), &types)?;
            Ok(pb::Field {
                name,
                data_type: data_type.to_owned(),
                nullable: true,
            })
        })
        .collect()
}

/// The object-store keys of a `file` connector; `None` when none is given.
fn object_store(fields: &Fields<'_>) -> Result<Option<pb::ObjectStoreConfig>> {
    if fields.present(STORE_KEYS).is_empty() {
        return Ok(None);
    }
    Ok(Some(pb::ObjectStoreConfig {
        endpoint: fields.opt("endpoint", string)?.unwrap_or_default(),
        region: fields.opt("region", string)?.unwrap_or_default(),
        access_key_id: fields.opt("access_key_id", string)?.unwrap_or_default(),
        secret_access_key: fields.opt("secret_access_key", string)?.unwrap_or_default(),
        allow_http: fields.opt("allow_http", bool_value)?.unwrap_or(false),
    }))
}
