//! The `pipeline:` list: filters, projections, key-bys, windows, dedups and group-bys, in
//! order.
//!
//! A `top_n` item keeps the first rows per key (`{ partition_by, order_by, limit,
//! rank_column }`), also a changelog.
//! An `over` item is an OVER aggregate (`{ partition_by, order_by, rows | range }` and
//! its `aggregate` list beside it): each row with aggregates over the rows before it.
//! A `group_by` item holds its `aggregate` list too: an unbounded aggregate per key whose
//! output is a changelog (`op` is `+I`, `-U`, `+U`).
//!
//! Each item is a mapping with one operator key. A `window` item also holds its
//! `aggregate` list and `late` policy; a `key_by` item only sets the key of the window item
//! that must come right after it, so it becomes part of that window rather than a stage.

use super::connector;
use super::fields::{
    Fields, Result, choice, duration_ms, positive_duration_ms, signed_duration_ms, string,
    string_list,
};
use super::marked_yaml::{Node, Pos, PosError, Value};
use super::spec::{JoinStage, Operator, Stage, UnionStage, WindowStage};
use sluice_common::pb;

const OPERATORS: &[&str] = &[
    "filter",
    "select",
    "key_by",
    "window",
    "dedup",
    "group_by",
    "top_n",
    "over",
    "join",
    "lookup_join",
    "union",
];
/// Keys of a `lookup_join` item's mapping.
const LOOKUP_JOIN_KEYS: &[&str] = &[
    "table",
    "left_keys",
    "table_keys",
    "left_alias",
    "table_alias",
    "condition",
    "select",
];
/// Keys of a `join` item's mapping.
const JOIN_KEYS: &[&str] = &[
    "type",
    "right",
    "left_keys",
    "right_keys",
    "left_alias",
    "right_alias",
    "condition",
    "select",
    "ttl",
    "interval",
    "null_safe",
];
/// Keys of a join's `interval` mapping.
const INTERVAL_KEYS: &[&str] = &["left", "right", "lower", "upper"];
/// Keys a `window` item holds next to `window:`.
const WINDOW_COMPANIONS: &[&str] = &["aggregate", "late"];
const WINDOW_KINDS: &[&str] = &["tumbling", "sliding", "cumulate", "session", "cascade"];
const WINDOW_KEYS: &[&str] = &[
    "cascade",
    "tumbling",
    "sliding",
    "slide",
    "cumulate",
    "step",
    "session",
    "allowed_lateness",
    "time",
    "column",
];

/// A `key_by` waiting for its window.
struct PendingKey {
    columns: Vec<String>,
    at: Pos,
    index: usize,
}

/// Decodes the pipeline; `watermark` is the job's `watermark:` section, if any.
pub(super) fn pipeline(node: &Node, watermark: Option<&pb::WatermarkSpec>) -> Result<Vec<Stage>> {
    let items: &[Node] = match &node.value {
        Value::Null => &[],
        Value::Seq(items) => items,
        _ => {
            return Err(PosError::new(
                node.pos,
                format!(
                    "expected a list of operators for `pipeline` (e.g. `- filter: \"price > \
                     100\"`), found {}",
                    node.describe()
                ),
            ));
        }
    };
    let mut stages = Vec::new();
    let mut pending: Option<PendingKey> = None;
    for (index, item) in items.iter().enumerate() {
        let path = format!("pipeline[{index}]");
        let (op, at) = operator_of(item, &path)?;
        if let Some(key) = &pending
            && op != "window"
        {
            return Err(key_by_without_window(key, &format!("`{op}` in {path}")));
        }
        let allowed: &[&str] = match op {
            "window" => &["window", "aggregate", "late"],
            "filter" => &["filter"],
            "select" => &["select"],
            "dedup" => &["dedup"],
            "group_by" => &["group_by", "aggregate"],
            "top_n" => &["top_n"],
            "over" => &["over", "aggregate"],
            "join" => &["join"],
            "lookup_join" => &["lookup_join"],
            "union" => &["union"],
            _ => &["key_by"],
        };
        let fields = Fields::new(item, &path, allowed)?;
        let value = fields.require(op, "")?.value;
        let op_path = fields.path_of(op);
        let op = match op {
            "filter" => Operator::Filter(pb::FilterSpec {
                predicate: Some(expr(string(value, &op_path)?, value.pos)),
            }),
            "select" => Operator::Select(pb::SelectSpec {
                exprs: exprs(string_list(value, &op_path, false)?),
            }),
            "dedup" => Operator::Dedup(pb::DedupSpec {
                key_columns: string_list(value, &op_path, true)?
                    .into_iter()
                    .map(|(column, _)| column)
                    .collect(),
            }),
            "top_n" => top_n(value, &op_path)?,
            "over" => over(&fields, value, &op_path, watermark)?,
            "join" => join(value, &op_path)?,
            "lookup_join" => lookup_join(value, &op_path)?,
            "union" => union(value, &op_path)?,
            "group_by" => {
                let aggregate = fields.require(
                    "aggregate",
                    "; a group_by needs at least one, e.g. `aggregate: [\"count(*) AS n\"]`",
                )?;
                // `group_by: []` aggregates everything as one group.
                let keys = match &value.value {
                    Value::Seq(items) if items.is_empty() => Vec::new(),
                    _ => string_list(value, &op_path, true)?,
                };
                Operator::Aggregate(pb::AggregateSpec {
                    key_columns: keys.into_iter().map(|(column, _)| column).collect(),
                    aggregates: exprs(string_list(
                        aggregate.value,
                        &fields.path_of("aggregate"),
                        false,
                    )?),
                })
            }
            "key_by" => {
                let columns = string_list(value, &op_path, true)?;
                pending = Some(PendingKey {
                    columns: columns.into_iter().map(|(column, _)| column).collect(),
                    at,
                    index,
                });
                continue;
            }
            _ => {
                let keys = pending.take().map(|key| key.columns).unwrap_or_default();
                window(&fields, at, keys, watermark)?
            }
        };
        stages.push(Stage { at, op });
    }
    if let Some(key) = &pending {
        return Err(key_by_without_window(key, "the end of the pipeline"));
    }
    Ok(stages)
}

/// The operator key of a pipeline item and where it is written.
fn operator_of<'a>(item: &'a Node, path: &str) -> Result<(&'a str, Pos)> {
    let Value::Map(entries) = &item.value else {
        return Err(PosError::new(
            item.pos,
            format!(
                "expected {path} to be a mapping with one operator key ({}), found {}",
                OPERATORS.join(", "),
                item.describe()
            ),
        ));
    };
    let mut found: Option<(&str, Pos)> = None;
    for (key, _) in entries {
        let name = key.text();
        if OPERATORS.contains(&name) {
            if let Some((first, _)) = found {
                return Err(PosError::new(
                    key.pos,
                    format!(
                        "{path} has two operators (`{first}` and `{name}`); write each as its \
                         own list item"
                    ),
                ));
            }
            found = Some((name, key.pos));
        }
    }
    if let Some(found) = found {
        return Ok(found);
    }
    // No operator: explain the first key, which is either misplaced or misspelled.
    match entries.first() {
        Some((key, _)) if WINDOW_COMPANIONS.contains(&key.text()) => Err(PosError::new(
            key.pos,
            format!(
                "`{}` in {path} belongs in a `window` or `group_by` item, next to `window:` \
                 or `group_by:`",
                key.text()
            ),
        )),
        Some(_) => Err(Fields::with_noun(item, path, OPERATORS, "operator")
            .err()
            .unwrap_or_else(|| PosError::new(item.pos, format!("{path} has no operator")))),
        None => Err(PosError::new(
            item.pos,
            format!(
                "{path} is empty; expected one operator key ({})",
                OPERATORS.join(", ")
            ),
        )),
    }
}

fn key_by_without_window(key: &PendingKey, found: &str) -> PosError {
    PosError::new(
        key.at,
        format!(
            "`key_by` in pipeline[{}] must be followed by a `window` item, found {found}",
            key.index
        ),
    )
}

fn expr(sql: String, at: Pos) -> pb::Expr {
    pb::Expr {
        sql,
        location: Some(at.to_location()),
    }
}

fn exprs(list: Vec<(String, Pos)>) -> Vec<pb::Expr> {
    list.into_iter().map(|(sql, at)| expr(sql, at)).collect()
}

/// Decodes a window item; `at` is where its `window:` key is, `keys` its key_by columns.
fn window(
    item: &Fields<'_>,
    at: Pos,
    key_columns: Vec<String>,
    watermark: Option<&pb::WatermarkSpec>,
) -> Result<Operator> {
    let window_path = item.path_of("window");
    let window_node = item.require("window", "")?.value;
    if let Value::Map(entries) = &window_node.value
        && let Some((key, _)) = entries
            .iter()
            .find(|(key, _)| WINDOW_COMPANIONS.contains(&key.text()))
    {
        return Err(PosError::new(
            key.pos,
            format!(
                "`{}` goes next to `window:` in {}, not inside it",
                key.text(),
                item.path
            ),
        ));
    }
    let fields = Fields::new(window_node, &window_path, WINDOW_KEYS)?;
    let kinds = fields.present(WINDOW_KINDS);
    let (kind_name, kind_entry) = match kinds.as_slice() {
        [] => {
            return Err(PosError::new(
                fields.pos,
                format!(
                    "`{window_path}` names no window kind; expected one of {} (e.g. \
                     `window: {{ tumbling: 10s }}`)",
                    WINDOW_KINDS.join(", ")
                ),
            ));
        }
        [one] => *one,
        [(first, _), (second, entry), ..] => {
            return Err(PosError::new(
                entry.key.pos,
                format!(
                    "`{window_path}` has two kinds (`{first}` and `{second}`); a window has \
                     exactly one"
                ),
            ));
        }
    };
    if kind_name == "cascade" {
        return cascade_window(item, &fields, kind_entry.value, key_columns, watermark);
    }
    let size_path = fields.path_of(kind_name);
    let size_ms = positive_duration_ms(kind_entry.value, &size_path)?;
    for (field, owner) in [("slide", "sliding"), ("step", "cumulate")] {
        if kind_name != owner
            && let Some(entry) = fields.get(field)
        {
            return Err(PosError::new(
                entry.key.pos,
                format!("`{field}` only applies to {owner} windows, not `{kind_name}` ones"),
            ));
        }
    }
    let kind = match kind_name {
        "tumbling" => pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms }),
        "session" => pb::window_spec::Kind::Session(pb::SessionWindow { gap_ms: size_ms }),
        "cumulate" => {
            let step = fields.require(
                "step",
                " (how often a cumulate window fires, e.g. `step: 2s`)",
            )?;
            let step_ms = positive_duration_ms(step.value, &fields.path_of("step"))?;
            if step_ms > size_ms || size_ms % step_ms != 0 {
                return Err(PosError::new(
                    step.value.pos,
                    format!(
                        "the window size ({}) must be a whole number of steps (`step`: {})",
                        kind_entry.value.text(),
                        step.value.text()
                    ),
                ));
            }
            pb::window_spec::Kind::Cumulate(pb::CumulateWindow { size_ms, step_ms })
        }
        _ => {
            let slide = fields.require("slide", " (how often a sliding window starts)")?;
            let slide_ms = positive_duration_ms(slide.value, &fields.path_of("slide"))?;
            if slide_ms > size_ms {
                return Err(PosError::new(
                    slide.value.pos,
                    format!(
                        "`slide` ({}) must not be longer than the window size ({})",
                        slide.value.text(),
                        kind_entry.value.text()
                    ),
                ));
            }
            pb::window_spec::Kind::Sliding(pb::SlidingWindow { size_ms, slide_ms })
        }
    };
    let times = [
        ("event", pb::TimeCharacteristic::TimeEvent),
        ("processing", pb::TimeCharacteristic::TimeProcessing),
    ];
    let time = fields
        .opt("time", |node, path| choice(node, path, &times))?
        .unwrap_or(pb::TimeCharacteristic::TimeEvent);
    let time_column = match fields.opt("column", string)? {
        Some(column) => column,
        None => watermark.map(|w| w.column.clone()).unwrap_or_default(),
    };
    if time == pb::TimeCharacteristic::TimeEvent {
        if watermark.is_none() {
            return Err(PosError::new(
                at,
                format!(
                    "event-time windows need a `watermark:` section (in {}); add one such as \
                     `watermark: {{ column: date_time, max_out_of_orderness: 2s }}`, or set \
                     `time: processing`",
                    item.path
                ),
            ));
        }
        if time_column.is_empty() {
            return Err(PosError::new(
                at,
                format!(
                    "event-time windows need a time column (in {}); set `column:` here or in \
                     `watermark:`",
                    item.path
                ),
            ));
        }
    }
    let lateness = fields.opt("allowed_lateness", duration_ms)?.unwrap_or(0);
    window_stage(item, kind, key_columns, lateness, time, time_column)
}

/// The window item's `aggregate:` and `late:` around its decoded `window:`.
fn window_stage(
    item: &Fields<'_>,
    kind: pb::window_spec::Kind,
    key_columns: Vec<String>,
    allowed_lateness_ms: u64,
    time: pb::TimeCharacteristic,
    time_column: String,
) -> Result<Operator> {
    let aggregate = item.require(
        "aggregate",
        "; a window needs at least one, e.g. `aggregate: [\"count(*) AS n\"]`",
    )?;
    let aggregates = exprs(string_list(
        aggregate.value,
        &item.path_of("aggregate"),
        false,
    )?);
    let (late, late_sink) = match item.get("late") {
        None => (pb::LatePolicy::Drop, None),
        Some(entry) => late(entry.value, &item.path_of("late"))?,
    };
    let spec = pb::WindowSpec {
        kind: Some(kind),
        key_columns,
        aggregates,
        allowed_lateness_ms,
        late: late as i32,
        time: time as i32,
        time_column,
    };
    Ok(Operator::Window(Box::new(WindowStage { spec, late_sink })))
}

/// `window: { cascade: end_column }`: a window per end of the upstream windows whose
/// results this item aggregates (see `CascadeWindow` in job_graph.proto). It runs in
/// event time, on the end column alone.
fn cascade_window(
    item: &Fields<'_>,
    fields: &Fields<'_>,
    column: &Node,
    key_columns: Vec<String>,
    watermark: Option<&pb::WatermarkSpec>,
) -> Result<Operator> {
    for other in ["column", "time", "allowed_lateness"] {
        if let Some(entry) = fields.get(other) {
            return Err(PosError::new(
                entry.key.pos,
                format!(
                    "`{other}` does not apply to a cascade window: it runs in the event time \
                     of the windows upstream, by the end column `cascade:` names"
                ),
            ));
        }
    }
    let time_column = string(column, &fields.path_of("cascade"))?;
    if watermark.is_none() {
        return Err(PosError::new(
            column.pos,
            format!(
                "a cascade window needs the event time of the windows upstream: add a \
                 `watermark:` section (in {})",
                item.path
            ),
        ));
    }
    let kind = pb::window_spec::Kind::Cascade(pb::CascadeWindow {});
    let time = pb::TimeCharacteristic::TimeEvent;
    window_stage(item, kind, key_columns, 0, time, time_column)
}

/// `join: { right: { source, watermark, pipeline }, left_keys: [a], right_keys: [b],
/// left_alias: l, right_alias: r, condition: "...", select: [...], ttl: 1h }`.
/// `union: { source: ..., watermark: ..., pipeline: [...] }`: the other input whose
/// rows join the pipeline's (UNION ALL).
fn union(node: &Node, path: &str) -> Result<Operator> {
    let fields = Fields::new(node, path, &["source", "watermark", "pipeline"])?;
    let (source, source_at, pipeline) = other_input(&fields)?;
    Ok(Operator::Union(Box::new(UnionStage {
        source,
        source_at,
        pipeline,
    })))
}

/// The `source:`, `watermark:` and `pipeline:` of a join's or a union's other input.
fn other_input(fields: &Fields<'_>) -> Result<(pb::SourceSpec, Pos, Vec<Stage>)> {
    let source_entry = fields.require(
        "source",
        "; e.g. `source: { nexmark: { stream: auction } }`",
    )?;
    let mut source = connector::source(source_entry.value, &fields.path_of("source"))?;
    source.watermark = fields.opt("watermark", super::decode::watermark)?;
    let pipeline = match fields.get("pipeline") {
        Some(entry) => pipeline(entry.value, source.watermark.as_ref())?,
        None => Vec::new(),
    };
    Ok((source, source_entry.key.pos, pipeline))
}

fn join(node: &Node, path: &str) -> Result<Operator> {
    let fields = Fields::new(node, path, JOIN_KEYS)?;
    let right = fields.require(
        "right",
        " (the other input: `right: { source: ..., pipeline: [...] }`)",
    )?;
    let right_path = fields.path_of("right");
    let right_fields = Fields::new(
        right.value,
        &right_path,
        &["source", "watermark", "pipeline"],
    )?;
    let (source, source_at, pipeline) = other_input(&right_fields)?;
    let JoinParts {
        left_keys,
        other_keys: right_keys,
        condition,
        exprs,
    } = join_parts(&fields, path, "right")?;
    Ok(Operator::Join(Box::new(JoinStage {
        spec: pb::JoinSpec {
            r#type: fields
                .opt("type", |node, path| {
                    choice(
                        node,
                        path,
                        &[
                            ("inner", pb::JoinType::Inner),
                            ("left", pb::JoinType::Left),
                            ("right", pb::JoinType::Right),
                            ("full", pb::JoinType::Full),
                            ("semi", pb::JoinType::Semi),
                            ("anti", pb::JoinType::Anti),
                            ("not_in", pb::JoinType::NotIn),
                        ],
                    )
                })?
                .unwrap_or(pb::JoinType::Inner) as i32,
            left_alias: fields.opt("left_alias", string)?.unwrap_or_default(),
            right_alias: fields.opt("right_alias", string)?.unwrap_or_default(),
            left_keys,
            right_keys,
            condition,
            exprs,
            ttl_ms: fields.opt("ttl", duration_ms)?.unwrap_or(0),
            interval: fields.opt("interval", interval)?,
            null_safe: fields
                .opt("null_safe", super::fields::bool_value)?
                .unwrap_or(false),
        },
        source,
        source_at,
        pipeline,
    })))
}

/// `interval: { left: date_time, right: date_time, lower: -10s, upper: 0s }`: an interval
/// join's bounds, `left.date_time BETWEEN right.date_time + lower AND right.date_time +
/// upper`.
fn interval(node: &Node, path: &str) -> Result<pb::JoinInterval> {
    let fields = Fields::new(node, path, INTERVAL_KEYS)?;
    let time = |key: &str| -> Result<String> {
        let entry = fields.require(key, " (the side's event-time column)")?;
        string(entry.value, &fields.path_of(key))
    };
    let bound = |key: &str| -> Result<i64> {
        let entry = fields.require(key, " (a duration such as `-10s` or `0s`)")?;
        signed_duration_ms(entry.value, &fields.path_of(key))
    };
    let (lower_ms, upper_ms) = (bound("lower")?, bound("upper")?);
    if lower_ms > upper_ms {
        return Err(PosError::new(
            node.pos,
            format!(
                "`{path}`: lower ({lower_ms} ms) is after upper ({upper_ms} ms), so no pair \
                 can match"
            ),
        ));
    }
    Ok(pb::JoinInterval {
        left_time: time("left")?,
        right_time: time("right")?,
        lower_ms,
        upper_ms,
    })
}

/// What a `join` and a `lookup_join` item both hold.
struct JoinParts {
    left_keys: Vec<String>,
    /// `right_keys`, or a lookup join's `table_keys`.
    other_keys: Vec<String>,
    condition: Option<pb::Expr>,
    exprs: Vec<pb::Expr>,
}

/// The keys (`left_keys` and `<other>_keys`, as many of each), `condition` and `select`
/// of the join item at `path`.
fn join_parts(fields: &Fields, path: &str, other: &str) -> Result<JoinParts> {
    let keys = |name: &str| -> Result<Vec<String>> {
        let entry = fields.require(name, " (the columns the two sides are equal on)")?;
        Ok(string_list(entry.value, &fields.path_of(name), true)?
            .into_iter()
            .map(|(column, _)| column)
            .collect())
    };
    let other_name = format!("{other}_keys");
    let left_keys = keys("left_keys")?;
    let other_keys = keys(&other_name)?;
    if left_keys.len() != other_keys.len() {
        let entry = fields.require(&other_name, "")?;
        return Err(PosError::new(
            entry.value.pos,
            format!(
                "`{path}` has {} left and {} {other} key columns; each left key is equal to \
                 the {other} key at its position",
                left_keys.len(),
                other_keys.len()
            ),
        ));
    }
    let condition = match fields.get("condition") {
        Some(entry) => Some(expr(
            string(entry.value, &fields.path_of("condition"))?,
            entry.value.pos,
        )),
        None => None,
    };
    let exprs = match fields.get("select") {
        Some(entry) => exprs(string_list(entry.value, &fields.path_of("select"), false)?),
        None => Vec::new(),
    };
    Ok(JoinParts {
        left_keys,
        other_keys,
        condition,
        exprs,
    })
}

/// `lookup_join: { table: { file: {...} }, left_keys: [a], table_keys: [k], left_alias: l,
/// table_alias: t, condition: "...", select: [...] }`.
fn lookup_join(node: &Node, path: &str) -> Result<Operator> {
    let fields = Fields::new(node, path, LOOKUP_JOIN_KEYS)?;
    let table = fields.require(
        "table",
        " (the bounded table each row looks up, e.g. `table: { file: { path: side.csv } }`)",
    )?;
    let table = connector::source(table.value, &fields.path_of("table"))?;
    let JoinParts {
        left_keys,
        other_keys: table_keys,
        condition,
        exprs,
    } = join_parts(&fields, path, "table")?;
    Ok(Operator::LookupJoin(Box::new(pb::LookupJoinSpec {
        table: Some(table),
        left_alias: fields.opt("left_alias", string)?.unwrap_or_default(),
        table_alias: fields.opt("table_alias", string)?.unwrap_or_default(),
        left_keys,
        table_keys,
        condition,
        exprs,
    })))
}

/// A `partition_by:` list (absent or `[]`: none, one subtask).
fn partition_by(fields: &Fields<'_>) -> Result<Vec<String>> {
    Ok(match fields.get("partition_by") {
        None => Vec::new(),
        Some(entry) => match &entry.value.value {
            Value::Seq(items) if items.is_empty() => Vec::new(),
            _ => string_list(entry.value, &fields.path_of("partition_by"), true)?
                .into_iter()
                .map(|(column, _)| column)
                .collect(),
        },
    })
}

/// The longest ROWS frame an `over` item takes: a frame is merged entry by entry for
/// each row it writes.
const MAX_OVER_ROWS: u32 = 100_000;

/// `over: { partition_by: [k], order_by: date_time, rows: 10 }` (or `rows: unbounded`,
/// `range: 1h`, `range: unbounded`, the default) with `aggregate: [...]` beside it.
fn over(
    item: &Fields<'_>,
    node: &Node,
    path: &str,
    watermark: Option<&pb::WatermarkSpec>,
) -> Result<Operator> {
    let fields = Fields::new(node, path, &["partition_by", "order_by", "rows", "range"])?;
    let partition_columns = partition_by(&fields)?;
    let time_column = match fields.opt("order_by", string)? {
        Some(column) => column,
        None => watermark.map(|w| w.column.clone()).unwrap_or_default(),
    };
    if watermark.is_none() || time_column.is_empty() {
        return Err(PosError::new(
            node.pos,
            format!(
                "an OVER aggregate orders rows by event time: it needs a `watermark:` section \
                 and `order_by:` naming its column (in {path})"
            ),
        ));
    }
    let (unit, unbounded, preceding) = match (fields.get("rows"), fields.get("range")) {
        (Some(_), Some(range)) => {
            return Err(PosError::new(
                range.value.pos,
                format!("{path} has both `rows` and `range`; a frame is one or the other"),
            ));
        }
        (Some(rows), None) if rows.value.text() == "unbounded" => {
            (pb::OverFrameUnit::Rows, true, 0)
        }
        (Some(rows), None) => {
            let n = super::fields::u32_in(rows.value, &fields.path_of("rows"), 0, MAX_OVER_ROWS)?;
            (pb::OverFrameUnit::Rows, false, u64::from(n))
        }
        (None, Some(range)) if range.value.text() == "unbounded" => {
            (pb::OverFrameUnit::Range, true, 0)
        }
        (None, Some(range)) => (
            pb::OverFrameUnit::Range,
            false,
            duration_ms(range.value, &fields.path_of("range"))?,
        ),
        (None, None) => (pb::OverFrameUnit::Range, true, 0),
    };
    let aggregate = item.require(
        "aggregate",
        "; an over item needs at least one, e.g. `aggregate: [\"avg(price) AS avg_price\"]`",
    )?;
    Ok(Operator::Over(pb::OverSpec {
        partition_columns,
        time_column,
        aggregates: exprs(string_list(
            aggregate.value,
            &item.path_of("aggregate"),
            false,
        )?),
        unit: unit as i32,
        unbounded,
        preceding,
    }))
}

/// `top_n: { partition_by: [k], order_by: ["price DESC"], limit: 10, rank_column: rn }`.
fn top_n(node: &Node, path: &str) -> Result<Operator> {
    let fields = Fields::new(
        node,
        path,
        &["partition_by", "order_by", "limit", "rank_column"],
    )?;
    let partition_columns = partition_by(&fields)?;
    let order = fields.require("order_by", " (e.g. `order_by: [\"price DESC\"]`)")?;
    let order_path = fields.path_of("order_by");
    let order_by = string_list(order.value, &order_path, true)?
        .into_iter()
        .map(|(text, at)| sort_key(&text, at, &order_path))
        .collect::<Result<Vec<_>>>()?;
    let limit = fields.require("limit", " (how many rows per key, e.g. `limit: 10`)")?;
    let limit = super::fields::u32_in(limit.value, &fields.path_of("limit"), 1, 100_000)?;
    Ok(Operator::TopN(pb::TopNSpec {
        partition_columns,
        order_by,
        limit,
        rank_column: fields.opt("rank_column", string)?.unwrap_or_default(),
    }))
}

/// `column [ASC | DESC] [NULLS FIRST | NULLS LAST]`; nulls come first ascending and last
/// descending unless said, as in Flink.
fn sort_key(text: &str, at: Pos, path: &str) -> Result<pb::SortKey> {
    let words: Vec<String> = text
        .split_whitespace()
        .map(str::to_ascii_uppercase)
        .collect();
    let original: Vec<&str> = text.split_whitespace().collect();
    let bad = || {
        PosError::new(
            at,
            format!(
                "expected `column [ASC | DESC] [NULLS FIRST | NULLS LAST]` in `{path}`, found \
                 `{text}`"
            ),
        )
    };
    let (column, rest) = original.split_first().ok_or_else(bad)?;
    let rest = &words[1..1 + rest.len()];
    let (descending, rest) = match rest.first().map(String::as_str) {
        Some("DESC") => (true, &rest[1..]),
        Some("ASC") => (false, &rest[1..]),
        _ => (false, rest),
    };
    let nulls_first = match rest
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => !descending,
        ["NULLS", "FIRST"] => true,
        ["NULLS", "LAST"] => false,
        _ => return Err(bad()),
    };
    Ok(pb::SortKey {
        column: (*column).to_owned(),
        descending,
        nulls_first,
    })
}

/// `late: drop` or `late: { sink: ... }`.
fn late(node: &Node, path: &str) -> Result<(pb::LatePolicy, Option<(pb::SinkSpec, Pos)>)> {
    match &node.value {
        Value::Scalar { text, .. } if text == "drop" => Ok((pb::LatePolicy::Drop, None)),
        Value::Map(_) => {
            let fields = Fields::new(node, path, &["sink"])?;
            let entry = fields.require("sink", "")?;
            let sink = connector::sink(entry.value, &fields.path_of("sink"))?;
            Ok((pb::LatePolicy::SideOutput, Some((sink, entry.key.pos))))
        }
        _ => Err(PosError::new(
            node.pos,
            format!(
                "expected `drop` or a mapping `{{ sink: ... }}` for `{path}`, found {}",
                node.describe()
            ),
        )),
    }
}
