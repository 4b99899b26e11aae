//! `join`: an equi-join of two inputs (Flink SQL's `a JOIN b ON a.k = b.k`, and its
//! `LEFT`, `RIGHT` and `FULL` forms), kept in keyed state so that a row joins every row
//! of the other side that arrived before it or arrives after it.
//!
//! Both inputs are hash-partitioned on their key columns, so a key's rows of both sides
//! meet in one subtask. A batch of one side is stored, then probed against the other
//! side's rows of each of its keys; each matching pair passes the join's condition (the
//! rest of `ON` and the `WHERE`) and becomes a row of the output projection. Rows whose
//! key has a null never match (SQL's `NULL = NULL` is not true) and are not kept. The
//! output of an inner join of append-only inputs is append-only.
//!
//! Expressions see the pair's columns qualified by each side's alias (`a.price`), and
//! unqualified where only one side has the name, as in SQL.
//!
//! # State
//! Two tables, `left` and `right`: per key, one entry per distinct row (the namespace is
//! the row in Arrow's row format), whose value lists an expiry time per arrival of the
//! row (the state TTL; never without one), appended by a merge so that storing a row
//! reads nothing. A probe scans the other side's rows of the key, several keys at once;
//! expired arrivals are skipped and removed as they are met (Flink's TTL also counts
//! processing time from a row's write). While a side has few keys, and the operator
//! started from empty state, it also remembers the hashes of the keys that side has, so
//! that a probe of a key the other side never had costs no scan.
//!
//! # Interval joins
//! With an interval (`l.t BETWEEN r.t + lower AND r.t + upper` on the inputs' event-time
//! columns, Flink's interval join), each arrival's expiry is not a processing time but
//! the event time after which no row of the other side can match it: `t - lower` for a
//! left row, `t + upper` for a right one. Each side's expiry column may be another of
//! its timestamps where the condition bounds the other side's event time by it (`b.t
//! BETWEEN a.t AND a.expires` keeps an auction until `expires`): future rows of the other
//! side come after the watermark. Rows expire as the watermark (the lower of the
//! two inputs') passes that time; a row already expired when it arrives joins what is
//! kept but is not stored.
//!
//! A side's rows are kept in partitions of its table, one per bucket of expiry times,
//! named by the bucket's end ([`StateTable::partition`]); a probe scans the key in each
//! live partition whose remembered keys may hold it. When the watermark reaches a
//! bucket's end, every row of its partition has expired, and the partition goes with
//! one range deletion per key group the subtask owns, whatever its keys: no row is
//! timed, scanned or deleted on its own (per-key cleanup timers, before, took half of
//! an interval join's time). A restored subtask finds the partitions of its key groups
//! in state, so nothing beyond the rows needs to be checkpointed.
//!
//! An outer interval join (`LEFT`, `RIGHT`, `FULL`) appends a [`MATCHED`] header to a
//! preserved row's entry once a pair of it passes the condition; when its partition
//! goes, a row without one is padded with nulls. A padded row is final, so the result
//! is append-only, as Flink's.
//!
//! A semi join (`JoinType::Semi`, SQL's `k IN (SELECT ...)`) finds its left rows' first
//! pairs as a LEFT join does, and then writes the left row (its own columns) instead of
//! taking a padded copy back: each left row once, append-only. A left row written leaves
//! state (the right side only grows, so it can never be written again), so the left
//! side keeps only the rows still waiting for a match. Of an updating input, a semi or
//! anti join counts each left row's matches as an outer join does: a semi join takes a
//! row back (`-D`) when its last match goes, an anti join writes it again.
//!
//! An anti join (`JoinType::Anti`, SQL's `NOT EXISTS (...)`) is a LEFT join that
//! writes its padded rows as the left rows alone and no pairs: each left row while
//! nothing passes ON with it, an updating result.
//!
//! A regular outer join pads a preserved row that matches nothing at once, and takes it
//! back (`-D`) when its first match comes: an updating result. With only keys in ON a
//! row matches once its key has a row on the other side, known by one read of the key.
//! With more in ON it is marked with [`MATCHED`] as an interval join's rows are, and a
//! batch that marks a row of the other side takes back that row's padded copies, one per
//! arrival. Of an updating input (a GROUP BY's or a Top-N's changelog), whose rows are
//! taken back, a preserved row keeps instead a count of the other side's arrivals it
//! passes ON with ([`count_header`], Flink's "associations"): a retraction that takes
//! the count to 0 takes back the row's last pair and writes it padded again.
//!
//! The operator never sees which store holds its state or how inputs are scheduled: the
//! task tells it which input a batch came from.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, UInt32Array};
use arrow::compute::{filter_record_batch, take};
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use arrow_row::{RowConverter, SortField};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sluice_common::key_group::key_group_of;
use sluice_common::pb;
use sluice_common::state::{StateTable, WriteOp, ttl};

use super::{Operator, OperatorContext, Output};
use crate::changelog::{self, RowKind, data_schema};
use crate::element::{Timestamp, unix_ms};
use crate::error::{Error, Result};
use crate::expr::{CompiledExpr, ExprCompiler};
use crate::keyed::timers::{time_from_key, time_key};
use crate::keys::{EncodedKeys, KeyEncoder};

const STATES: [&str; 2] = ["left", "right"];

/// The table where interval joins kept cleanup timers before they kept partitions.
const OLD_TIMER_STATE: &str = "timers";

/// Bytes of an interval join's partition name after its table's: the bucket's end.
const PART_NAME_LEN: usize = 8;

/// Rows of the other side read per scan call.
const SCAN_PAGE: usize = 1024;

/// Scans of the other side in flight per batch of reads the backend asks to overlap
/// (many more, 128 at once to the state service, broke its HTTP/2 connection under load).
const PROBES_PER_READ: usize = 4;

/// Hashes short keys of one batch: keys come from the job's own data.
type Hasher = foldhash::fast::RandomState;

/// How often a distinct row arrived in a batch, and when its arrivals expire.
type Arrived = (u64, i64);

/// A row's key and its bytes in the row format, borrowed from one batch.
type KeyRow<'a> = (&'a [u8], &'a [u8]);

/// One side of the join.
struct Side {
    keys: KeyEncoder,
    rows: RowConverter,
}

/// A preserved row of the other side that a batch's probe met (a marking join's).
struct Met {
    /// Its entry's state key.
    key: Bytes,
    /// Whether the entry was marked matched already.
    marked: bool,
    /// The row, in the row format.
    row: Bytes,
    /// Its live arrivals: how often a regular join wrote it padded.
    arrivals: u64,
    /// Its entry as read (a counting join rewrites it with a new count).
    value: Bytes,
    /// Its count of matches (a counting join's).
    count: u64,
}

impl Met {
    /// The entry at `key` of `row`, as read (`value`), with its `arrivals` still live.
    fn read(key: Bytes, row: Bytes, value: Bytes, arrivals: u64) -> Self {
        Met {
            key,
            marked: is_matched(&value),
            row,
            arrivals,
            count: count_of(&value),
            value,
        }
    }
}

/// The pairs of one batch of a marking outer join, with what marking them needs.
struct MarkedPairs {
    /// Per pair, the batch's row.
    this_rows: Vec<u32>,
    /// Per pair, the other side's stored row.
    other_rows: Vec<Bytes>,
    /// The other side's entries met (a preserved side's).
    met: Vec<Met>,
    /// Per pair, which of `met` its other row is (empty unless the other side is
    /// preserved).
    met_of: Vec<usize>,
    /// Per batch row, its entry's state key where it was stored (empty unless this side
    /// is preserved).
    stored: Vec<Option<Bytes>>,
}

/// What an outer interval join appends to a preserved row's entry once a pair of it
/// passed the condition: an expiry header no arrival has (it reads as long expired), so
/// a row padded when its partition goes is one without it.
const MATCHED: [u8; ttl::HEADER_LEN] = i64::MIN.to_be_bytes();

/// The time a [`count_header`] of 0 holds: counts sit just above [`MATCHED`], where no
/// arrival's expiry is (they read as long expired too).
const COUNT_BASE: i64 = i64::MIN + 1;

/// The most matches a count header holds.
const MAX_COUNT: u64 = 1 << 48;

/// What a regular outer join of an updating input keeps in a preserved row's entry:
/// how many arrivals of the other side pass ON with it, so that it is padded again
/// when the last of them is taken back. An entry's count is its last such header.
fn count_header(n: u64) -> [u8; ttl::HEADER_LEN] {
    COUNT_BASE
        .saturating_add(i64::try_from(n.min(MAX_COUNT)).unwrap_or(0))
        .to_be_bytes()
}

/// The time an expiry header holds.
fn time_of_header(header: &[u8]) -> i64 {
    i64::from_be_bytes(header.try_into().unwrap_or([0; ttl::HEADER_LEN]))
}

/// The count a header holds, if it is a [`count_header`].
fn count_of_header(header: &[u8]) -> Option<u64> {
    let t = time_of_header(header);
    (COUNT_BASE..=COUNT_BASE.saturating_add(MAX_COUNT as i64))
        .contains(&t)
        .then(|| t.abs_diff(COUNT_BASE))
}

/// Whether a header is a mark ([`MATCHED`] or a count) rather than an arrival.
fn is_mark(header: &[u8]) -> bool {
    header == MATCHED || count_of_header(header).is_some()
}

/// A stored row's count of matches: its last [`count_header`]'s (0 without one).
fn count_of(stored: &[u8]) -> u64 {
    stored
        .chunks_exact(ttl::HEADER_LEN)
        .filter_map(count_of_header)
        .next_back()
        .unwrap_or(0)
}

/// Whether a stored row's entry carries the [`MATCHED`] mark or a count above 0.
fn is_matched(stored: &[u8]) -> bool {
    stored.chunks_exact(ttl::HEADER_LEN).any(|h| h == MATCHED) || count_of(stored) > 0
}

/// A stored row's entry with its first `keep` arrivals and a count of `count` matches
/// (none written for 0).
fn with_count(stored: &[u8], keep: usize, count: u64) -> Bytes {
    let mut v = Vec::with_capacity(stored.len() + ttl::HEADER_LEN);
    for h in stored
        .chunks_exact(ttl::HEADER_LEN)
        .filter(|h| !is_mark(h))
        .take(keep)
    {
        v.extend_from_slice(h);
    }
    if count > 0 {
        v.extend_from_slice(&count_header(count));
    }
    Bytes::from(v)
}

/// Where one side's rows are kept: a regular join's in the side's table, an interval
/// join's in one partition of it per bucket of expiry times.
struct Kept {
    table: StateTable,
    /// The partitions that may have rows, by the time when all their rows have expired
    /// (a regular join's one, the table itself: never).
    parts: BTreeMap<Timestamp, Part>,
}

/// A table, or partition, of one side's rows.
struct Part {
    table: StateTable,
    /// The hash of every key that may have rows here, while the operator knows them all
    /// (it wrote every row here, and they have few keys): a probe of a key not in it
    /// needs no scan. `None`: not known, every probe scans.
    known: Option<HashSet<u64, Hasher>>,
}

impl Part {
    /// Whether `key` (of hash `hash`) may have rows here.
    fn may_hold(&self, hash: u64) -> bool {
        self.known.as_ref().is_none_or(|k| k.contains(&hash))
    }
}

/// The join operator of one subtask.
pub struct JoinOperator {
    /// Per side, whether its rows are kept when nothing matches them (padded with nulls):
    /// the left of a LEFT join, the right of a RIGHT join, both of a FULL join.
    preserve: [bool; 2],
    /// A semi join: each left row once, when a pair of it first passes ON.
    semi: bool,
    /// An anti join: each left row while no pair of it passes ON.
    anti: bool,
    /// A null key meets a null key (`JoinSpec.null_safe`).
    null_safe: bool,
    /// Per input, whether it is a changelog (its first column the change kind).
    updating_input: [bool; 2],
    /// Columns of the left side (the pair's first).
    left_width: usize,
    sides: [Side; 2],
    encoded: EncodedKeys,
    /// The pair's columns: the left side's, then the right side's.
    pair_schema: SchemaRef,
    condition: Option<CompiledExpr>,
    /// The output columns; `None`: the pair as it is.
    exprs: Option<Vec<CompiledExpr>>,
    schema: SchemaRef,
    ttl_ms: u64,
    /// Per side, where its rows are kept (from `open`).
    kept: Option<[Kept; 2]>,
    max_parallelism: u32,
    /// The key groups this subtask owns.
    key_groups: Range<u32>,
    /// Hashes keys for the partitions' remembered keys.
    key_hash: foldhash::fast::FixedState,
    /// An interval join's bounds; `None`: a regular join.
    interval: Option<Interval>,
    /// The event-time watermark seen last (an interval join's clock).
    watermark: Timestamp,
}

/// An interval join's bounds: a left row at `l` matches right rows at `r` with
/// `r + lower <= l <= r + upper`.
struct Interval {
    /// Per side, the index of its event-time column.
    times: [usize; 2],
    lower: i64,
    upper: i64,
    /// The width of a partition's bucket of expiry times (ms).
    bucket: i64,
}

impl Interval {
    /// The event time after which a row of `side` at `t` can match no future row of
    /// the other side (whose times are past the watermark); `None` for a null time,
    /// which matches nothing.
    fn expiry(&self, side: usize, t: Option<i64>) -> i64 {
        match (side, t) {
            (_, None) => i64::MIN,
            (0, Some(t)) => t.saturating_sub(self.lower),
            (_, Some(t)) => t.saturating_add(self.upper),
        }
    }

    /// The end of the bucket holding `expiry`: when a row expiring then leaves state.
    fn bucket_end(&self, expiry: i64) -> i64 {
        expiry
            .div_euclid(self.bucket)
            .saturating_add(1)
            .saturating_mul(self.bucket)
    }
}

/// The most keys of one side a join subtask remembers; past this it scans for every
/// probe of that side.
const MAX_KNOWN_KEYS: usize = 1 << 18;

/// The aliases of the two sides (`l` and `r` when the spec names none).
fn aliases(spec: &pb::JoinSpec) -> [String; 2] {
    let or = |a: &str, d: &str| {
        if a.is_empty() {
            d.to_owned()
        } else {
            a.to_owned()
        }
    };
    [or(&spec.left_alias, "l"), or(&spec.right_alias, "r")]
}

/// The pair's schema, and each of its columns' qualifier.
pub(crate) fn pair_of(
    spec: &pb::JoinSpec,
    left: &SchemaRef,
    right: &SchemaRef,
) -> (SchemaRef, Vec<String>) {
    let [l, r] = aliases(spec);
    let (left, right) = (data_schema(left), data_schema(right));
    let fields: Vec<Field> = left
        .fields()
        .iter()
        .chain(right.fields())
        .map(|f| f.as_ref().clone())
        .collect();
    let qualifiers = std::iter::repeat_n(l, left.fields().len())
        .chain(std::iter::repeat_n(r, right.fields().len()))
        .collect();
    (Arc::new(Schema::new(fields)), qualifiers)
}

/// Which side (0 left, 1 right) an output item `alias.*` names, if it is one.
pub fn side_wildcard(spec: &pb::JoinSpec, sql: &str) -> Option<usize> {
    let table = sql.trim().strip_suffix(".*")?.trim().trim_matches('"');
    aliases(spec)
        .iter()
        .position(|a| a.eq_ignore_ascii_case(table))
}

/// The output items with each `alias.*` written out as that side's columns
/// (`alias.col`), each marked whether it is a bare column (named as the column).
fn output_items(spec: &pb::JoinSpec, left: &SchemaRef, right: &SchemaRef) -> Vec<(String, bool)> {
    let aliases = aliases(spec);
    let mut items = Vec::with_capacity(spec.exprs.len());
    for e in &spec.exprs {
        match side_wildcard(spec, &e.sql) {
            Some(side) => {
                let schema = data_schema([left, right][side]);
                items.extend(schema.fields().iter().map(|f| {
                    let name = f.name().replace('"', "\"\"");
                    (format!("{}.\"{name}\"", aliases[side].to_lowercase()), true)
                }));
            }
            None => items.push((e.sql.clone(), is_bare_column(&e.sql))),
        }
    }
    items
}

impl JoinOperator {
    /// Compiles `sql` over the pair of `left` and `right` rows: how planning checks each
    /// expression of a join at its own position.
    pub fn check_expr(
        spec: &pb::JoinSpec,
        left: &SchemaRef,
        right: &SchemaRef,
        compiler: &ExprCompiler,
        sql: &str,
    ) -> Result<CompiledExpr> {
        let (pair, qualifiers) = pair_of(spec, left, right);
        compiler.compile_qualified(sql, &pair, &qualifiers)
    }

    /// The columns of input `input` (0 left, 1 right) the join reads: its keys and what
    /// its condition and output name; `None` when the output is every column.
    pub fn input_columns(
        spec: &pb::JoinSpec,
        left: &SchemaRef,
        right: &SchemaRef,
        compiler: &ExprCompiler,
        input: usize,
    ) -> Result<Option<std::collections::BTreeSet<String>>> {
        if spec.exprs.is_empty() {
            return Ok(None);
        }
        let (pair, qualifiers) = pair_of(spec, left, right);
        let aliases = aliases(spec).map(|a| a.to_lowercase());
        let sides = [left, right];
        let keys = if input == 0 {
            &spec.left_keys
        } else {
            &spec.right_keys
        };
        let mut columns: std::collections::BTreeSet<String> = keys.iter().cloned().collect();
        let items = output_items(spec, left, right);
        let condition = spec.condition.iter().map(|e| e.sql.clone());
        for sql in condition.chain(items.into_iter().map(|(sql, _)| sql)) {
            let (expr, _) = compiler.parse_qualified(&sql, &pair, &qualifiers)?;
            for c in expr.column_refs() {
                let reads = match &c.relation {
                    Some(r) => r.table().to_lowercase() == aliases[input],
                    None => sides[input].index_of(&c.name).is_ok(),
                };
                if reads {
                    columns.insert(c.name.clone());
                }
            }
        }
        Ok(Some(columns))
    }

    /// Builds the join of `left` and `right` rows; errors name a missing key column, key
    /// types that cannot be equal, a condition that is not a boolean, or a column name
    /// that is ambiguous in the output.
    pub fn build(
        spec: &pb::JoinSpec,
        left: &SchemaRef,
        right: &SchemaRef,
        compiler: &ExprCompiler,
    ) -> Result<Self> {
        // A semi join marks its left rows as a LEFT join does, and writes a row when it
        // is first marked rather than while it is not.
        let semi = spec.r#type() == pb::JoinType::Semi;
        // An anti join is a LEFT join that writes its padded rows' left columns only, and
        // no pairs.
        let anti = matches!(spec.r#type(), pb::JoinType::Anti | pb::JoinType::NotIn);
        let preserve = match spec.r#type() {
            pb::JoinType::Inner => [false, false],
            pb::JoinType::Left | pb::JoinType::Semi | pb::JoinType::Anti | pb::JoinType::NotIn => {
                [true, false]
            }
            pb::JoinType::Right => [false, true],
            pb::JoinType::Full => [true, true],
        };
        let outer = preserve.contains(&true) && !semi;
        if (semi || anti) && (spec.interval.is_some() || spec.ttl_ms > 0) {
            return Err(Error::Plan(
                "a semi or anti join (IN, EXISTS, NOT EXISTS) keeps both sides whole: it \
                 takes no state TTL and no bounds between the sides' event times yet"
                    .into(),
            ));
        }
        if outer && spec.ttl_ms > 0 {
            return Err(Error::Plan(
                "an outer join cannot have a state TTL yet: a row whose match expired would \
                 be padded with nulls again without its join being retracted"
                    .into(),
            ));
        }
        let updating_input = [left, right].map(|s| changelog::is_changelog(s));
        let interval = match &spec.interval {
            Some(i) => Some(interval_of(i, spec.ttl_ms, updating_input, left, right)?),
            None => None,
        };
        let (left_data, right_data) = (data_schema(left), data_schema(right));
        let (left, right) = (&left_data, &right_data);
        if spec.r#type() == pb::JoinType::NotIn {
            // NOT IN of a null, or against one, is unknown: an anti join would keep the
            // row. Only keys that cannot be null make the two the same.
            let nullable = [(left, &spec.left_keys), (right, &spec.right_keys)]
                .into_iter()
                .flat_map(|(schema, keys)| keys.iter().map(move |k| (schema, k)))
                .find(|(schema, k)| schema.field_with_name(k).is_ok_and(|f| f.is_nullable()));
            if let Some((_, k)) = nullable {
                return Err(Error::Plan(format!(
                    "NOT IN compares `{k}`, which may be null (and NOT IN of a null, or \
                     against one, keeps no row); write NOT EXISTS (SELECT ... WHERE x.k = \
                     t.k), which keeps each row no value equals"
                )));
            }
        }
        // A regular outer join's result changes as matches arrive (an outer interval
        // join pads a row only once its interval has passed, for good); a join of an
        // updating input takes back the pairs of each row retracted.
        let updating = (outer && interval.is_none()) || updating_input.contains(&true);
        let side = |schema: &SchemaRef, keys: &[String], which: &str| -> Result<Side> {
            let encoder = KeyEncoder::new(schema, keys).map_err(|e| match e {
                Error::Plan(m) => Error::Plan(format!("the join's {which} side: {m}")),
                other => other,
            })?;
            let rows = RowConverter::new(
                schema
                    .fields()
                    .iter()
                    .map(|f| SortField::new(f.data_type().clone()))
                    .collect(),
            )
            .map_err(|e| Error::Plan(format!("a join cannot keep the {which} side's rows: {e}")))?;
            Ok(Side {
                keys: encoder,
                rows,
            })
        };
        let l = side(left, &spec.left_keys, "left")?;
        let r = side(right, &spec.right_keys, "right")?;
        if !l.keys.comparable(&r.keys) {
            let types = |s: &Side| {
                s.keys
                    .fields()
                    .iter()
                    .map(|f| format!("{} {}", f.name(), f.data_type()))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(Error::Plan(format!(
                "the join's keys cannot be equal: the left side's are ({}), the right side's \
                 ({}); cast one side in a projection before the join",
                types(&l),
                types(&r)
            )));
        }
        let (pair_schema, qualifiers) = pair_of(spec, left, right);
        // The side an outer join pads with nulls may be null in every column.
        let pair_schema = Arc::new(Schema::new(
            pair_schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let side = usize::from(i >= left.fields().len());
                    let padded = preserve[1 - side];
                    f.as_ref().clone().with_nullable(f.is_nullable() || padded)
                })
                .collect::<Vec<_>>(),
        ));
        let condition = match &spec.condition {
            Some(e) => {
                let c = compiler.compile_qualified(&e.sql, &pair_schema, &qualifiers)?;
                if c.data_type != arrow::datatypes::DataType::Boolean {
                    return Err(Error::Plan(format!(
                        "the join condition `{}` is of type {}, not a boolean",
                        e.sql, c.data_type
                    )));
                }
                Some(c)
            }
            None => None,
        };
        let (exprs, schema) = if spec.exprs.is_empty() && (semi || anti) {
            // A semi or anti join's rows are its left rows.
            (None, left.clone())
        } else if spec.exprs.is_empty() {
            let mut seen = std::collections::HashSet::new();
            if let Some(dup) = pair_schema
                .fields()
                .iter()
                .find(|f| !seen.insert(f.name().clone()))
            {
                return Err(Error::Plan(format!(
                    "both sides of the join have a column `{}`; select the output columns \
                     (e.g. `{}.{0}`)",
                    dup.name(),
                    qualifiers[0]
                )));
            }
            (None, pair_schema.clone())
        } else {
            let items = output_items(spec, left, right);
            let mut exprs: Vec<CompiledExpr> = Vec::with_capacity(items.len());
            for (sql, bare) in &items {
                let mut c = compiler.compile_qualified(sql, &pair_schema, &qualifiers)?;
                if *bare && exprs.iter().any(|o| o.name == c.name) {
                    // As Flink names a second `b.x` next to `a.x`: `x0`, then `x1`.
                    c.name = (0..)
                        .map(|n| format!("{}{n}", c.name))
                        .find(|name| exprs.iter().all(|o| &o.name != name))
                        .unwrap_or_default();
                }
                if exprs.iter().any(|o| o.name == c.name) {
                    return Err(Error::Plan(format!(
                        "the join's output column `{}` appears twice; give one of them \
                         another name with AS",
                        c.name
                    )));
                }
                exprs.push(c);
            }
            let schema = Arc::new(Schema::new(
                exprs.iter().map(CompiledExpr::field).collect::<Vec<_>>(),
            ));
            (Some(exprs), schema)
        };
        let schema = if updating {
            let mut fields = vec![changelog::op_field()];
            fields.extend(schema.fields().iter().map(|f| f.as_ref().clone()));
            if let Some(dup) = fields[1..]
                .iter()
                .find(|f| f.name() == changelog::OP_COLUMN)
            {
                return Err(Error::Plan(format!(
                    "the join's output column `{}` is the change kind of the join's \
                     updating result; give it another name with AS",
                    dup.name()
                )));
            }
            Arc::new(Schema::new(fields))
        } else {
            schema
        };
        Ok(Self {
            preserve,
            semi,
            anti,
            null_safe: spec.null_safe,
            updating_input,
            left_width: left.fields().len(),
            sides: [l, r],
            encoded: EncodedKeys::default(),
            pair_schema,
            condition,
            exprs,
            schema,
            ttl_ms: spec.ttl_ms,
            kept: None,
            max_parallelism: sluice_common::DEFAULT_MAX_PARALLELISM,
            key_groups: 0..0,
            key_hash: foldhash::fast::FixedState::default(),
            interval,
            watermark: Timestamp::MIN,
        })
    }

    /// The schema of the rows this operator emits.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Whether this join marks the preserved rows a pair passing ON was found for: an
    /// outer interval join (which pads the others when their interval has passed), and
    /// a regular outer join whose ON holds more than keys or which reads an updating
    /// input (it pads a row at once and takes that back when its first such pair
    /// comes). A regular outer join of append-only inputs with only keys in ON needs no
    /// marks: a row matches once its key has a row on the other side.
    fn marks(&self) -> bool {
        self.semi
            || self.anti
            || self.preserve.contains(&true)
                && (self.interval.is_some()
                    || self.condition.is_some()
                    || self.updating_input.contains(&true))
    }

    /// Whether marks are counts of matches rather than flags: a regular outer join of
    /// an updating input, whose rows taken back can leave a preserved row with none.
    fn counts(&self) -> bool {
        self.preserve.contains(&true) && self.updating_input.contains(&true)
    }

    fn expires_at(&self, now: i64) -> i64 {
        match self.ttl_ms {
            0 => ttl::NEVER_EXPIRES,
            t => now.saturating_add(i64::try_from(t).unwrap_or(i64::MAX)),
        }
    }

    /// Per row of `batch` (from input `input`), when its arrival expires: an interval
    /// join's by the row's event time, a regular join's by the TTL from `now`.
    fn expiries(&self, input: usize, batch: &RecordBatch, now: i64) -> Result<Vec<i64>> {
        let Some(interval) = &self.interval else {
            return Ok(vec![self.expires_at(now); batch.num_rows()]);
        };
        let times = arrow::compute::cast(
            batch.column(interval.times[input]),
            &arrow::datatypes::DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, None),
        )?;
        let times = times.as_primitive::<arrow::datatypes::TimestampMillisecondType>();
        Ok(times.iter().map(|t| interval.expiry(input, t)).collect())
    }

    /// Drops every partition whose rows have all expired at `now`: one range deletion
    /// per side's partition and key group. An outer join first pads with nulls the
    /// preserved side's rows there that never matched: their interval has passed.
    async fn sweep(&mut self, now: Timestamp, out: &mut Output) -> Result<()> {
        let Some(kept) = self.kept.as_mut() else {
            return Ok(());
        };
        let mut drops = Vec::new();
        let mut unmatched: [Vec<Bytes>; 2] = Default::default();
        for (side, kept) in kept.iter_mut().enumerate() {
            let later = kept.parts.split_off(&now.saturating_add(1));
            for part in std::mem::replace(&mut kept.parts, later).into_values() {
                for group in self.key_groups.clone() {
                    let group = group_of(group)?;
                    if self.preserve[side] {
                        for row in part.table.scan_group(group, SCAN_PAGE).await? {
                            if !is_matched(&row.value) {
                                let n = row.value.len() / ttl::HEADER_LEN;
                                unmatched[side].extend(std::iter::repeat_n(row.namespace, n));
                            }
                        }
                    }
                    drops.push(part.table.delete_group(group));
                }
            }
        }
        kept[0].table.write(drops).await?;
        for (side, rows) in unmatched.iter().enumerate() {
            self.emit_others(1 - side, rows, RowKind::Insert, out)?;
        }
        Ok(())
    }

    /// Stores the rows of `batch` (from input `input`) and emits their pairs with the
    /// other side's stored rows.
    async fn process(&mut self, input: usize, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let other = 1 - input;
        let side = &self.sides[input];
        side.keys.encode(&batch, &mut self.encoded)?;
        let rows = side.rows.convert_columns(batch.columns())?;
        let nulls = match self.null_safe {
            true => None,
            false => key_nulls(&batch, &side.keys)?,
        };
        // An interval join's clock is the watermark; a regular join's the wall clock.
        let now = match self.interval {
            Some(_) => self.watermark,
            None => unix_ms() as i64,
        };
        let expiries = self.expiries(input, &batch, now)?;
        let marks = self.marks();
        // The batch's rows per key, and how often each distinct row arrived.
        let mut slot_of: HashMap<&[u8], usize, Hasher> = HashMap::default();
        let mut keys: Vec<usize> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut counts: HashMap<(usize, &[u8]), Arrived, Hasher> = HashMap::default();
        // This side's rows with no match, padded with nulls (a preserved side's).
        let mut padded: Vec<u32> = Vec::new();
        for row in 0..batch.num_rows() {
            if nulls.as_ref().is_some_and(|n| n[row]) {
                if self.preserve[input] {
                    padded.push(row as u32);
                }
                continue;
            }
            let key = self.encoded.row(row);
            let slot = *slot_of.entry(key).or_insert_with(|| {
                keys.push(row);
                members.push(Vec::new());
                keys.len() - 1
            });
            members[slot].push(row);
            let expires = expiries[row];
            if ttl::is_expired(expires, now) {
                // An interval join's row no future row can match: joined, not kept.
                continue;
            }
            counts
                .entry((slot, rows.row(row).data()))
                .or_insert((0, expires))
                .0 += 1;
        }
        let Some(kept) = self.kept.as_mut() else {
            return Err(Error::Internal("join used before `open`".into()));
        };
        let hashes: Vec<u64> = keys
            .iter()
            .map(|&first| self.key_hash.hash_one(self.encoded.row(first)))
            .collect();
        // Keys this side had no rows of before: the other side's padded rows of such a
        // key are retracted when it is joined (a preserved other side only).
        let mut first_of_key = vec![false; keys.len()];
        if self.preserve[other] && !marks {
            for (slot, &first) in keys.iter().enumerate() {
                let key = self.encoded.row(first);
                let group = key_group_of(key, self.max_parallelism);
                let mut seen = false;
                for part in kept[input].parts.values() {
                    if part.may_hold(hashes[slot])
                        && !part.table.first_of_key(group, key, 1).await?.is_empty()
                    {
                        seen = true;
                        break;
                    }
                }
                first_of_key[slot] = !seen;
            }
        }
        // Store this side's rows: each arrival appends its expiry time to its row's
        // entry in its partition, which needs no read.
        let mut distinct: Vec<((usize, &[u8]), Arrived)> = counts.into_iter().collect();
        distinct.sort_unstable();
        let own = &mut kept[input];
        let mut writes: Vec<WriteOp> = Vec::with_capacity(distinct.len());
        // The partition written last, and the last key remembered in it.
        let mut last: Option<(Timestamp, usize)> = None;
        // Where each distinct row was stored (a marking join's preserved side).
        let mut stored_at: HashMap<(usize, &[u8]), Bytes, Hasher> = HashMap::default();
        for ((slot, row), (arrived, expires)) in &distinct {
            let end = match &self.interval {
                Some(interval) => interval.bucket_end(*expires),
                None => ttl::NEVER_EXPIRES,
            };
            let part = match own.parts.entry(end) {
                std::collections::btree_map::Entry::Occupied(p) => p.into_mut(),
                // A partition this attempt opens: no row of the subtask's key groups
                // was in it, or `open` would have found it.
                std::collections::btree_map::Entry::Vacant(v) => v.insert(Part {
                    table: own.table.partition(&time_key(end)),
                    known: Some(HashSet::default()),
                }),
            };
            let key = self.encoded.row(keys[*slot]);
            let state_key = part
                .table
                .key(key_group_of(key, self.max_parallelism), key, row);
            if marks && self.preserve[input] {
                stored_at.insert((*slot, *row), state_key.clone());
            }
            writes.push(WriteOp::Merge {
                key: state_key,
                operand: arrivals(*expires, *arrived),
            });
            if last != Some((end, *slot)) {
                last = Some((end, *slot));
                if let Some(known) = &mut part.known {
                    known.insert(hashes[*slot]);
                    if known.len() > MAX_KNOWN_KEYS {
                        part.known = None;
                    }
                }
            }
        }
        own.table.write(writes).await?;
        // Probe the other side, key by key and partition by partition, keeping several
        // scans in flight (each is a round trip to a remote store).
        let theirs = &kept[other];
        let probes: Vec<(usize, &[u8], u16, &StateTable)> = keys
            .iter()
            .enumerate()
            .flat_map(|(slot, &first)| {
                let key = self.encoded.row(first);
                let group = key_group_of(key, self.max_parallelism);
                let hash = hashes[slot];
                theirs
                    .parts
                    .values()
                    .filter(move |part| part.may_hold(hash))
                    .map(move |part| (slot, key, group, &part.table))
            })
            .collect();
        let in_flight = match theirs.table.pipelined_reads() {
            0 => 1,
            n => n * PROBES_PER_READ,
        };
        let mut scans = futures::stream::FuturesOrdered::new();
        let mut queued = probes.iter();
        let mut this_rows: Vec<u32> = Vec::new();
        let mut other_rows: Vec<Bytes> = Vec::new();
        // The other side's padded rows to retract, and whether each slot met a row.
        let mut retracted: Vec<Bytes> = Vec::new();
        let mut matched = vec![false; keys.len()];
        let mut expired = Vec::new();
        // A marking join's preserved other side: the entries met (state key, marked
        // already), and which one each pair's other row came from.
        let mut met: Vec<Met> = Vec::new();
        let mut met_of: Vec<usize> = Vec::new();
        let mark_theirs = marks && self.preserve[other];
        loop {
            while scans.len() < in_flight {
                let Some(&(slot, key, group, table)) = queued.next() else {
                    break;
                };
                let (table, key) = (table.clone(), key.to_vec());
                scans.push_back(async move {
                    table
                        .scan_key(group, &key, SCAN_PAGE)
                        .await
                        .map(|rows| (slot, group, table, rows))
                });
            }
            let Some(scanned) = scans.next().await else {
                break;
            };
            let (slot, group, table, matches) = scanned?;
            let key = self.encoded.row(keys[slot]);
            if matches.is_empty() {
                continue;
            }
            let mut live: Vec<(Bytes, u64, usize)> = Vec::with_capacity(matches.len());
            for m in matches {
                let (n, rewrite) = live_arrivals(&m.value, now)?;
                // An interval join's expired rows go with their partition.
                if let (Some(kept), None) = (rewrite, &self.interval) {
                    expired.push(keep_arrivals(table.key(group, key, &m.namespace), kept));
                }
                if n > 0 {
                    // Where this entry goes in `met` (read only when marking theirs).
                    let from = met.len();
                    if mark_theirs {
                        let state_key = table.key(group, key, &m.namespace);
                        met.push(Met::read(
                            state_key,
                            m.namespace.clone(),
                            m.value.clone(),
                            n,
                        ));
                    }
                    live.push((m.namespace, n, from));
                }
            }
            matched[slot] |= !live.is_empty();
            if first_of_key[slot] {
                for (other_row, n, _) in &live {
                    for _ in 0..*n {
                        retracted.push(other_row.clone());
                    }
                }
            }
            for &row in &members[slot] {
                for (other_row, n, from) in &live {
                    for _ in 0..*n {
                        this_rows.push(row as u32);
                        other_rows.push(other_row.clone());
                        if mark_theirs {
                            met_of.push(*from);
                        }
                    }
                }
            }
        }
        drop(scans);
        theirs.table.write(expired).await?;
        if marks {
            // Where each row of the batch was stored, if it was (a preserved side's).
            let stored: Vec<Option<Bytes>> = match self.preserve[input] {
                false => Vec::new(),
                true => (0..batch.num_rows())
                    .map(|row| {
                        let key = self.encoded.row(row);
                        let slot = slot_of.get(key)?;
                        stored_at.get(&(*slot, rows.row(row).data())).cloned()
                    })
                    .collect(),
            };
            let pairs = MarkedPairs {
                this_rows,
                other_rows,
                met,
                met_of,
                stored,
            };
            return self.emit_marked(input, &batch, pairs, out).await;
        }
        if self.preserve[input] {
            for (slot, rows) in members.iter().enumerate() {
                if !matched[slot] {
                    padded.extend(rows.iter().map(|&r| r as u32));
                }
            }
        }
        if this_rows.is_empty() && padded.is_empty() && retracted.is_empty() {
            return Ok(());
        }
        // A key's padded rows are retracted before its pairs are added.
        let mut parts: Vec<(RowKind, RecordBatch)> = Vec::with_capacity(3);
        if !retracted.is_empty() {
            let n = retracted.len();
            parts.push((
                RowKind::Delete,
                self.pair_batch(input, None, Some(&retracted), n)?,
            ));
        }
        if !this_rows.is_empty() {
            let pairs = self.matched_pairs(input, &batch, this_rows, &other_rows)?;
            parts.push((RowKind::Insert, pairs));
        }
        if !padded.is_empty() {
            let n = padded.len();
            parts.push((
                RowKind::Insert,
                self.pair_batch(input, Some((&batch, padded)), None, n)?,
            ));
        }
        for (kind, pairs) in parts {
            out.batch(self.output_of(kind, &pairs)?);
        }
        Ok(())
    }

    /// A batch of input `input`. Of an updating input, the rows that add (`+I`, `+U`) are
    /// joined and kept as an append-only input's, then the rows that take one back
    /// (`-U`, `-D`) are [retracted](Self::retract): adding first means a pair is never
    /// taken back before it was emitted.
    async fn process_changes(
        &mut self,
        input: usize,
        batch: RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        if !self.updating_input[input] {
            return self.process(input, batch, out).await;
        }
        let signs = changelog::signs(batch.column(0))
            .ok_or_else(|| Error::Internal("an updating input's `op` is not text".into()))?;
        let data = batch.project(&(1..batch.num_columns()).collect::<Vec<_>>())?;
        let adds =
            arrow::array::BooleanArray::from(signs.iter().map(|&s| s > 0).collect::<Vec<_>>());
        let added = filter_record_batch(&data, &adds)?;
        if added.num_rows() > 0 {
            self.process(input, added, out).await?;
        }
        let removed = filter_record_batch(&data, &arrow::compute::not(&adds)?)?;
        if removed.num_rows() > 0 {
            self.retract(input, removed, out).await?;
        }
        Ok(())
    }

    /// Takes back rows of input `input` (an updating input's): one arrival of each from
    /// its entry in state, and each pair it made with the other side's live rows,
    /// emitted as a deletion (`-D`). A row not in state takes nothing back. Of an outer
    /// join, a preserved row without matches takes back its padded copy, and a preserved
    /// row of the other side left with no match is padded again (`+I`).
    async fn retract(&mut self, input: usize, batch: RecordBatch, out: &mut Output) -> Result<()> {
        // Only a regular join takes an updating input: each side is one table.
        let Some(tables) = self
            .kept
            .as_ref()
            .map(|k| k.each_ref().map(|k| k.table.clone()))
        else {
            return Err(Error::Internal("join used before `open`".into()));
        };
        let other = 1 - input;
        let side = &self.sides[input];
        side.keys.encode(&batch, &mut self.encoded)?;
        let rows = side.rows.convert_columns(batch.columns())?;
        let nulls = match self.null_safe {
            true => None,
            false => key_nulls(&batch, &side.keys)?,
        };
        let now = unix_ms() as i64;
        // This side's rows whose padded copy is taken back (a preserved side's).
        let mut unpadded: Vec<u32> = Vec::new();
        // Each distinct (key, row) retracted, with the batch rows that retract it.
        let mut distinct: HashMap<KeyRow<'_>, Vec<u32>, Hasher> = HashMap::default();
        for row in 0..batch.num_rows() {
            if nulls.as_ref().is_some_and(|n| n[row]) {
                // A null key matches nothing: a preserved row of it was padded.
                if self.preserve[input] {
                    unpadded.push(row as u32);
                }
                continue;
            }
            let key = (self.encoded.row(row), rows.row(row).data());
            distinct.entry(key).or_default().push(row as u32);
        }
        let mut distinct: Vec<(KeyRow<'_>, Vec<u32>)> = distinct.into_iter().collect();
        distinct.sort_unstable();
        let own = &tables[input];
        let state_keys: Vec<Bytes> = distinct
            .iter()
            .map(|((key, row), _)| own.key(key_group_of(key, self.max_parallelism), key, row))
            .collect();
        let stored = own.get_many(&state_keys).await?;
        let mut writes = Vec::with_capacity(state_keys.len());
        // The batch rows whose retraction found their row with a match, by key.
        let mut taken: HashMap<&[u8], Vec<u32>, Hasher> = HashMap::default();
        for (((key, _), members), (state_key, value)) in
            distinct.iter().zip(state_keys.into_iter().zip(stored))
        {
            let Some(value) = value else {
                continue;
            };
            let have = value
                .chunks_exact(ttl::HEADER_LEN)
                .filter(|h| !is_mark(h))
                .count();
            let removed = members.len().min(have);
            let keep = have - removed;
            let count = count_of(&value);
            writes.push(match keep {
                0 => WriteOp::Delete { key: state_key },
                _ => WriteOp::Put {
                    key: state_key,
                    value: with_count(&value, keep, count),
                },
            });
            if (self.semi || self.anti) && self.preserve[input] {
                // A left row. What it wrote: a semi join's row while it had matches, an anti join's
                // while it had none. It made no pairs.
                if (count > 0) == self.semi {
                    unpadded.extend_from_slice(&members[..removed]);
                }
                continue;
            }
            if self.preserve[input] && count == 0 {
                // It matched nothing, so it was written padded and made no pair.
                unpadded.extend_from_slice(&members[..removed]);
                continue;
            }
            taken
                .entry(key)
                .or_default()
                .extend_from_slice(&members[..removed]);
        }
        own.write(writes).await?;
        let theirs = &tables[other];
        let mark_theirs = self.preserve[other];
        let mut this_rows: Vec<u32> = Vec::new();
        let mut other_rows: Vec<Bytes> = Vec::new();
        let mut met: Vec<Met> = Vec::new();
        let mut met_of: Vec<usize> = Vec::new();
        let mut taken: Vec<(&[u8], Vec<u32>)> = taken.into_iter().collect();
        taken.sort_unstable();
        for (key, members) in taken {
            let group = key_group_of(key, self.max_parallelism);
            for m in theirs.scan_key(group, key, SCAN_PAGE).await? {
                let (n, _) = live_arrivals(&m.value, now)?;
                if n == 0 {
                    continue;
                }
                let from = met.len();
                if mark_theirs {
                    let state_key = theirs.key(group, key, &m.namespace);
                    met.push(Met::read(
                        state_key,
                        m.namespace.clone(),
                        m.value.clone(),
                        n,
                    ));
                }
                for &row in &members {
                    for _ in 0..n {
                        this_rows.push(row);
                        other_rows.push(m.namespace.clone());
                        if mark_theirs {
                            met_of.push(from);
                        }
                    }
                }
            }
        }
        let n = this_rows.len();
        let pairs = self.pair_batch(input, Some((&batch, this_rows)), Some(&other_rows), n)?;
        let holds = self.holds(&pairs)?;
        // The other side's entries left with no match, padded again.
        let mut repadded: Vec<Bytes> = Vec::new();
        if mark_theirs {
            let mut met_passes = vec![0u64; met.len()];
            for (i, &from) in met_of.iter().enumerate() {
                if holds.as_ref().is_none_or(|h| h.value(i)) {
                    met_passes[from] += 1;
                }
            }
            let mut their_counts = Vec::new();
            for (met, passed) in met.iter().zip(met_passes) {
                let fewer = passed / met.arrivals.max(1);
                if fewer == 0 {
                    continue;
                }
                let count = met.count.saturating_sub(fewer);
                their_counts.push(WriteOp::Put {
                    key: met.key.clone(),
                    value: with_count(&met.value, usize::MAX, count),
                });
                if count == 0 {
                    repadded.extend(std::iter::repeat_n(met.row.clone(), met.arrivals as usize));
                }
            }
            theirs.write(their_counts).await?;
        }
        let pairs = match &holds {
            Some(h) => filter_record_batch(&pairs, h)?,
            None => pairs,
        };
        if pairs.num_rows() > 0 && !(self.semi || self.anti) {
            out.batch(self.output_of(RowKind::Delete, &pairs)?);
        }
        if !repadded.is_empty() {
            // Left rows left with no match: a semi join takes them back, an anti join
            // and an outer join write them (padded) again.
            let kind = match self.semi {
                true => RowKind::Delete,
                false => RowKind::Insert,
            };
            self.emit_others(input, &repadded, kind, out)?;
        }
        self.emit_own(input, &batch, unpadded, RowKind::Delete, out)
    }

    /// The output rows of `pairs`: the change kind (an outer join's) and the output
    /// columns.
    fn output_of(&self, kind: RowKind, pairs: &RecordBatch) -> Result<RecordBatch> {
        let rows = pairs.num_rows();
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        if changelog::is_changelog(&self.schema) {
            columns.push(changelog::op_array(&vec![kind; rows]));
        }
        match &self.exprs {
            // A semi join writes the left rows of its pairs.
            None if self.semi || self.anti => {
                columns.extend(pairs.columns()[..self.left_width].iter().cloned());
            }
            None => columns.extend(pairs.columns().iter().cloned()),
            Some(exprs) => {
                for e in exprs {
                    columns.push(e.evaluate(pairs)?);
                }
            }
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?)
    }

    /// Side `side`'s key encoder and row format (a lookup join keeps its table's rows
    /// in the right side's).
    pub(crate) fn side_codecs(&self, side: usize) -> (&KeyEncoder, &RowConverter) {
        (&self.sides[side].keys, &self.sides[side].rows)
    }

    /// The output of an inner join's pairs: left rows `this` of `batch` with the right
    /// rows `other` (in the right side's row format), the condition applied.
    pub(crate) fn inner_pairs(
        &self,
        batch: &RecordBatch,
        this: Vec<u32>,
        other: &[Bytes],
    ) -> Result<RecordBatch> {
        let pairs = self.matched_pairs(0, batch, this, other)?;
        self.output_of(RowKind::Insert, &pairs)
    }

    /// This side's rows of `batch` at `this` paired with the other side's stored rows
    /// `other`, one pair each, left side first, kept where the condition holds.
    fn matched_pairs(
        &self,
        input: usize,
        batch: &RecordBatch,
        this: Vec<u32>,
        other: &[Bytes],
    ) -> Result<RecordBatch> {
        let n = this.len();
        let pairs = self.pair_batch(input, Some((batch, this)), Some(other), n)?;
        match self.holds(&pairs)? {
            Some(keep) => Ok(filter_record_batch(&pairs, &keep)?),
            None => Ok(pairs),
        }
    }

    /// Which of `pairs` pass the join's condition (`None`: no condition, all do); a null
    /// is false, as in SQL's ON.
    fn holds(&self, pairs: &RecordBatch) -> Result<Option<BooleanArray>> {
        let Some(c) = &self.condition else {
            return Ok(None);
        };
        let keep = c.evaluate(pairs)?;
        let keep = keep.as_boolean();
        Ok(Some(match keep.null_count() {
            0 => keep.clone(),
            _ => arrow::compute::prep_null_mask_filter(keep),
        }))
    }

    /// A marking outer join's output of one batch of input `input` and its marks: the
    /// pairs that pass the condition; their preserved rows marked matched in state (a
    /// batch row where it was stored, a stored row of the other side once); and this
    /// side's rows that matched nothing padded with nulls: an interval join's now only
    /// where they were not stored (a null key, or expired on arrival; stored ones are
    /// padded when their partition goes, [`sweep`](Self::sweep)), a regular join's all
    /// now. A regular join also takes back (`-D`) the padded rows of the other side's
    /// entries it marks, once per arrival, before adding their pairs.
    async fn emit_marked(
        &self,
        input: usize,
        batch: &RecordBatch,
        m: MarkedPairs,
        out: &mut Output,
    ) -> Result<()> {
        let kept = self
            .kept
            .as_ref()
            .ok_or_else(|| Error::Internal("join used before `open`".into()))?;
        let n = m.this_rows.len();
        let pairs = self.pair_batch(
            input,
            Some((batch, m.this_rows.clone())),
            Some(&m.other_rows),
            n,
        )?;
        let holds = self.holds(&pairs)?;
        let passes = |i: usize| holds.as_ref().is_none_or(|h| h.value(i));
        // Per batch row, the other side's arrivals it passes ON with; per entry met, the
        // pairs that passed (its arrivals times the batch rows it passed with).
        let mut row_passes = vec![0u64; batch.num_rows()];
        let mut met_passes = vec![0u64; m.met.len()];
        for (i, &row) in m.this_rows.iter().enumerate() {
            if passes(i) {
                row_passes[row as usize] += 1;
                if let Some(&from) = m.met_of.get(i) {
                    met_passes[from] += 1;
                }
            }
        }
        let counts = self.counts();
        // A semi join of append-only inputs is done with a left row once it is written
        // (the right side only grows): the row leaves state instead of being marked. Of
        // an updating input it counts the row's matches, as an outer join does.
        let semi = self.semi;
        let mark = |key: &Bytes, count: u64| match (semi, counts) {
            (_, true) => WriteOp::Merge {
                key: key.clone(),
                operand: Bytes::copy_from_slice(&count_header(count)),
            },
            (true, false) => WriteOp::Delete { key: key.clone() },
            (false, false) => WriteOp::Merge {
                key: key.clone(),
                operand: Bytes::from_static(&MATCHED),
            },
        };
        let pads_now = self.interval.is_none();
        let mut own_marks: Vec<WriteOp> = Vec::new();
        let mut padded: Vec<u32> = Vec::new();
        if self.preserve[input] {
            // A row's count is what it passed with: equal rows share an entry and
            // pass with the same rows, so one mark per entry.
            let mut marked: HashSet<&Bytes, Hasher> = HashSet::default();
            for (row, stored) in m.stored.iter().enumerate() {
                match (row_passes[row] > 0, stored) {
                    (true, Some(key)) if marked.insert(key) => {
                        own_marks.push(mark(key, row_passes[row]));
                    }
                    (false, None) if !self.semi => padded.push(row as u32),
                    (false, Some(_)) if pads_now && !self.semi => padded.push(row as u32),
                    _ => {}
                }
            }
        }
        kept[input].table.write(own_marks).await?;
        // The other side's entries that had no match before this batch and have now.
        let mut newly: Vec<&Met> = Vec::new();
        let mut their_marks: Vec<WriteOp> = Vec::new();
        for (met, &passed) in m.met.iter().zip(&met_passes) {
            if passed == 0 {
                continue;
            }
            if counts {
                // Each batch row that passed met each of the entry's arrivals.
                let more = passed / met.arrivals.max(1);
                their_marks.push(WriteOp::Put {
                    key: met.key.clone(),
                    value: with_count(&met.value, usize::MAX, met.count + more),
                });
                if met.count == 0 {
                    newly.push(met);
                }
            } else if !met.marked {
                their_marks.push(mark(&met.key, 0));
                newly.push(met);
            }
        }
        kept[1 - input].table.write(their_marks).await?;
        if pads_now {
            let retracted: Vec<Bytes> = newly
                .iter()
                .flat_map(|met| std::iter::repeat_n(met.row.clone(), met.arrivals as usize))
                .collect();
            // A semi join's left rows first matched now are its output; a padded row's
            // first match takes it back.
            let kind = match self.semi {
                true => RowKind::Insert,
                false => RowKind::Delete,
            };
            self.emit_others(input, &retracted, kind, out)?;
        }
        if self.semi {
            // This batch's left rows with a pair passing ON, each once.
            let matched: Vec<u32> = match self.preserve[input] {
                true => (0..batch.num_rows() as u32)
                    .filter(|&r| row_passes[r as usize] > 0)
                    .collect(),
                false => Vec::new(),
            };
            return self.emit_own(input, batch, matched, RowKind::Insert, out);
        }
        if n > 0 && !self.anti {
            let pairs = match &holds {
                Some(h) => filter_record_batch(&pairs, h)?,
                None => pairs,
            };
            if pairs.num_rows() > 0 {
                out.batch(self.output_of(RowKind::Insert, &pairs)?);
            }
        }
        self.emit_own(input, batch, padded, RowKind::Insert, out)
    }

    /// Emits as `kind` the rows `rows` of a batch of input `input`, the other side's
    /// columns null (a padded row, or a semi or anti join's own).
    fn emit_own(
        &self,
        input: usize,
        batch: &RecordBatch,
        rows: Vec<u32>,
        kind: RowKind,
        out: &mut Output,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len();
        let pairs = self.pair_batch(input, Some((batch, rows)), None, n)?;
        out.batch(self.output_of(kind, &pairs)?);
        Ok(())
    }

    /// Emits as `kind` the other side's stored rows `rows` (of input `1 - input`), input
    /// `input`'s columns null.
    fn emit_others(
        &self,
        input: usize,
        rows: &[Bytes],
        kind: RowKind,
        out: &mut Output,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let pairs = self.pair_batch(input, None, Some(rows), rows.len())?;
        out.batch(self.output_of(kind, &pairs)?);
        Ok(())
    }

    /// `n` pairs: this side's rows of a batch at the given indices (`None`: nulls), with
    /// the other side's stored rows `other` (`None`: nulls), left side first.
    fn pair_batch(
        &self,
        input: usize,
        this: Option<(&RecordBatch, Vec<u32>)>,
        other: Option<&[Bytes]>,
        n: usize,
    ) -> Result<RecordBatch> {
        let fields = self.pair_schema.fields();
        let (left_fields, right_fields) = fields.split_at(self.left_width);
        let (this_fields, other_fields) = if input == 0 {
            (left_fields, right_fields)
        } else {
            (right_fields, left_fields)
        };
        let nulls = |fields: &[arrow::datatypes::FieldRef]| -> Vec<ArrayRef> {
            fields
                .iter()
                .map(|f| arrow::array::new_null_array(f.data_type(), n))
                .collect()
        };
        let this_columns: Vec<ArrayRef> = match this {
            Some((batch, rows)) => {
                let indices = UInt32Array::from(rows);
                batch
                    .columns()
                    .iter()
                    .map(|c| take(c, &indices, None))
                    .collect::<std::result::Result<_, _>>()?
            }
            None => nulls(this_fields),
        };
        let other_columns = match other {
            Some(rows) => {
                let converter = &self.sides[1 - input].rows;
                let parser = converter.parser();
                converter.convert_rows(rows.iter().map(|r| parser.parse(r)))?
            }
            None => nulls(other_fields),
        };
        let (left, right) = if input == 0 {
            (this_columns, other_columns)
        } else {
            (other_columns, this_columns)
        };
        let options = RecordBatchOptions::new().with_row_count(Some(n));
        Ok(RecordBatch::try_new_with_options(
            self.pair_schema.clone(),
            left.into_iter().chain(right).collect(),
            &options,
        )?)
    }
}

/// Whether `sql` is a column reference without an alias (`a.x` or `x`).
fn is_bare_column(sql: &str) -> bool {
    let sql = sql.trim();
    !sql.is_empty()
        && sql
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.' || c == '"')
}

/// Per row, whether any of its key columns is null (`None`: no key column has nulls).
pub(crate) fn key_nulls(batch: &RecordBatch, keys: &KeyEncoder) -> Result<Option<Vec<bool>>> {
    let mut nulls: Option<Vec<bool>> = None;
    for f in keys.fields() {
        let column = batch.column(batch.schema().index_of(f.name())?);
        if column.null_count() == 0 {
            continue;
        }
        let n = nulls.get_or_insert_with(|| vec![false; batch.num_rows()]);
        for (row, null) in n.iter_mut().enumerate() {
            *null |= column.is_null(row);
        }
    }
    Ok(nulls)
}

/// An interval join's bounds over `left` and `right` rows; errors name what an interval
/// join cannot be (with a TTL, of an updating input) and a time column that is missing
/// or not a timestamp.
fn interval_of(
    spec: &pb::JoinInterval,
    ttl_ms: u64,
    updating_input: [bool; 2],
    left: &SchemaRef,
    right: &SchemaRef,
) -> Result<Interval> {
    if ttl_ms > 0 {
        return Err(Error::Plan(
            "an interval join keeps each row until the watermark passes its interval; a \
             state TTL does not apply to it (leave `ttl` out)"
                .into(),
        ));
    }
    if updating_input.contains(&true) {
        return Err(Error::Plan(
            "an interval join needs append-only inputs, but one of its inputs is an \
             updating result; a regular join takes one"
                .into(),
        ));
    }
    if spec.lower_ms > spec.upper_ms {
        return Err(Error::Plan(format!(
            "the join's interval is empty: its lower bound ({} ms) is after its upper ({} ms)",
            spec.lower_ms, spec.upper_ms
        )));
    }
    let time = |schema: &SchemaRef, column: &str, side: &str| -> Result<usize> {
        let i = schema.index_of(column).map_err(|_| {
            let known: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Error::Plan(format!(
                "the interval join's {side} time column `{column}` does not exist; the {side} \
                 side has columns {}",
                known.join(", ")
            ))
        })?;
        match schema.field(i).data_type() {
            arrow::datatypes::DataType::Timestamp(_, _) => Ok(i),
            other => Err(Error::Plan(format!(
                "the interval join's {side} time column `{column}` is of type {other}, not a \
                 timestamp"
            ))),
        }
    };
    Ok(Interval {
        times: [
            time(left, &spec.left_time, "left")?,
            time(right, &spec.right_time, "right")?,
        ],
        lower: spec.lower_ms,
        upper: spec.upper_ms,
        // Rows leave state up to one bucket after they expire, and a probe scans each
        // live partition that may hold its key: a quarter of the interval keeps both
        // to a few (a row lives the interval plus a quarter of it at most, and a side
        // has about five partitions beside those the watermark's delay holds). At
        // least 5 s: a bucket of a few milliseconds would be a partition per row.
        bucket: (spec.upper_ms.saturating_sub(spec.lower_ms) / 4).max(5_000),
    })
}

/// Key group `group` as the state layout names it.
fn group_of(group: u32) -> Result<u16> {
    u16::try_from(group).map_err(|_| Error::Internal(format!("key group {group} out of range")))
}

/// What `n` arrivals of a row expiring at `expires_at` append to its entry: one expiry
/// header each.
fn arrivals(expires_at: i64, n: u64) -> Bytes {
    // The most common entry of all, a row of a join without TTL that arrived once:
    // shared, so that an in-memory store keeps no allocation per such row for it.
    static NEVER_ONCE: [u8; ttl::HEADER_LEN] = ttl::NEVER_EXPIRES.to_be_bytes();
    if n == 1 && expires_at == ttl::NEVER_EXPIRES {
        return Bytes::from_static(&NEVER_ONCE);
    }
    let mut v = Vec::with_capacity(ttl::HEADER_LEN * n as usize);
    for _ in 0..n {
        ttl::write_header(&mut v, expires_at);
    }
    Bytes::from(v)
}

/// The write that leaves a row's entry at `state_key` with the arrivals `kept` (as
/// [`live_arrivals`] gives them): an entry with none left is deleted.
fn keep_arrivals(state_key: Bytes, kept: Bytes) -> WriteOp {
    match kept.is_empty() {
        true => WriteOp::Delete { key: state_key },
        false => WriteOp::Put {
            key: state_key,
            value: kept,
        },
    }
}

/// How many arrivals of a stored row are still alive at `now`, and when some expired,
/// the entry to write back (empty: delete it). A mark ([`MATCHED`] or a count) is no
/// arrival; it stays while any arrival does.
fn live_arrivals(stored: &[u8], now: i64) -> Result<(u64, Option<Bytes>)> {
    if !stored.len().is_multiple_of(ttl::HEADER_LEN) {
        return Err(Error::Internal(format!(
            "join state: a row's entry of {} bytes is not a list of expiry times",
            stored.len()
        )));
    }
    let headers = stored.chunks_exact(ttl::HEADER_LEN);
    let marks = headers.clone().filter(|h| is_mark(h)).count() as u64;
    let times = headers.filter(|h| !is_mark(h)).map(time_of_header);
    let live = times.clone().filter(|&t| !ttl::is_expired(t, now)).count() as u64;
    let all = (stored.len() / ttl::HEADER_LEN) as u64;
    if live + marks == all {
        return Ok((live, None));
    }
    let mut kept = Vec::with_capacity((live as usize + 1) * ttl::HEADER_LEN);
    for t in times.filter(|&t| !ttl::is_expired(t, now)) {
        ttl::write_header(&mut kept, t);
    }
    if live > 0 {
        if stored.chunks_exact(ttl::HEADER_LEN).any(|h| h == MATCHED) {
            kept.extend_from_slice(&MATCHED);
        }
        match count_of(stored) {
            0 => {}
            count => kept.extend_from_slice(&count_header(count)),
        }
    }
    Ok((live, Some(Bytes::from(kept))))
}

#[async_trait]
impl Operator for JoinOperator {
    async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.max_parallelism = ctx.max_parallelism;
        let state = ctx.keyed_state()?;
        self.key_groups = state.key_groups();
        let fresh = state.starts_empty();
        let mut kept = STATES.map(|name| Kept {
            table: state.table(name),
            parts: BTreeMap::new(),
        });
        let Some(interval) = &self.interval else {
            for side in &mut kept {
                let part = Part {
                    table: side.table.clone(),
                    known: fresh.then(HashSet::default),
                };
                side.parts.insert(ttl::NEVER_EXPIRES, part);
            }
            self.kept = Some(kept);
            return Ok(());
        };
        // A restored interval join's partitions: those of its key groups in state.
        let timers = state.table(OLD_TIMER_STATE);
        let restored = if fresh { 0..0 } else { self.key_groups.clone() };
        for group in restored {
            let group = group_of(group)?;
            // What an interval join wrote before it kept partitions (a savepoint of an
            // older binary): every arrival moves to the partition of its expiry, and
            // the cleanup timers that binary kept go.
            let mut writes = vec![timers.delete_group(group)];
            for side in &kept {
                let old = side.table.scan_group(group, SCAN_PAGE).await?;
                if !old.is_empty() {
                    writes.push(side.table.delete_group(group));
                }
                for row in old {
                    for header in row.value.chunks_exact(ttl::HEADER_LEN) {
                        let end = interval.bucket_end(time_of_header(header));
                        let part = side.table.partition(&time_key(end));
                        writes.push(WriteOp::Merge {
                            key: part.key(group, &row.key, &row.namespace),
                            operand: Bytes::copy_from_slice(header),
                        });
                    }
                }
            }
            timers.write(writes).await?;
            for side in &mut kept {
                for name in side.table.partitions(group, PART_NAME_LEN).await? {
                    let end = time_from_key(&name).ok_or_else(|| {
                        Error::Internal("a join partition's name is not a time".into())
                    })?;
                    side.parts.entry(end).or_insert_with(|| Part {
                        table: side.table.partition(&name),
                        known: None,
                    });
                }
            }
        }
        self.kept = Some(kept);
        Ok(())
    }

    async fn on_watermark(&mut self, ts: Timestamp, out: &mut Output) -> Result<()> {
        if self.interval.is_some() && ts > self.watermark {
            self.watermark = ts;
            self.sweep(ts, out).await?;
        }
        out.watermark(ts);
        Ok(())
    }

    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        self.process_changes(0, batch, out).await
    }

    async fn process_input(
        &mut self,
        input: usize,
        batch: RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        if input > 1 {
            return Err(Error::Internal(format!("a join has no input {input}")));
        }
        self.process_changes(input, batch, out).await
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Int64Type};
    use sluice_common::key_group::key_group_range;
    use sluice_common::state::{MemoryStateStore, StateStore};

    use super::*;
    use crate::element::StreamElement;
    use crate::keyed::OperatorState;

    fn left_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    fn right_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("v", DataType::Utf8, false),
        ]))
    }

    fn left(rows: &[(Option<i64>, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            left_schema(),
            vec![
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn right(rows: &[(i32, &str)]) -> RecordBatch {
        RecordBatch::try_new(
            right_schema(),
            vec![
                Arc::new(arrow::array::Int32Array::from_iter_values(
                    rows.iter().map(|r| r.0),
                )),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn expr(sql: &str) -> pb::Expr {
        pb::Expr {
            sql: sql.into(),
            location: None,
        }
    }

    fn spec(condition: Option<&str>, ttl_ms: u64) -> pb::JoinSpec {
        pb::JoinSpec {
            r#type: pb::JoinType::Inner as i32,
            left_alias: "a".into(),
            right_alias: "B".into(),
            left_keys: vec!["k".into()],
            right_keys: vec!["id".into()],
            condition: condition.map(expr),
            exprs: vec![expr("k"), expr("a.v"), expr("b.v")],
            ttl_ms,
            interval: None,
            null_safe: false,
        }
    }

    /// Rows `(key, event time ms)` of either side of an interval join.
    fn timed_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new(
                "t",
                DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, None),
                true,
            ),
        ]))
    }

    fn timed(rows: &[(i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            timed_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(arrow::array::TimestampMillisecondArray::from_iter_values(
                    rows.iter().map(|r| r.1),
                )),
            ],
        )
        .unwrap()
    }

    /// `a.t BETWEEN b.t - 10 s AND b.t`, emitting `(k, a.t, b.t)`.
    fn interval_spec() -> pb::JoinSpec {
        pb::JoinSpec {
            r#type: pb::JoinType::Inner as i32,
            left_alias: "a".into(),
            right_alias: "b".into(),
            left_keys: vec!["k".into()],
            right_keys: vec!["k".into()],
            condition: Some(expr("a.t BETWEEN b.t - INTERVAL '10' SECOND AND b.t")),
            exprs: vec![expr("a.k"), expr("a.t AS lt"), expr("b.t AS rt")],
            ttl_ms: 0,
            interval: Some(pb::JoinInterval {
                left_time: "t".into(),
                right_time: "t".into(),
                lower_ms: -10_000,
                upper_ms: 0,
            }),
            null_safe: false,
        }
    }

    /// `(k, left t, right t)` of every row emitted (none padded), sorted.
    fn timed_pairs(out: &Output) -> Vec<(i64, i64, i64)> {
        let value = |v: Option<i64>| v.expect("a row padded with nulls");
        padded_pairs(out)
            .into_iter()
            .map(|[k, l, r]| (value(k), value(l), value(r)))
            .collect()
    }

    #[tokio::test]
    async fn an_interval_join_forgets_rows_the_watermark_has_passed() {
        let mut op = join_of(
            &interval_spec(),
            &timed_schema(),
            &timed_schema(),
            Arc::new(MemoryStateStore::new(false)),
            1,
        )
        .await;
        let mut out = Output::default();
        op.process_input(0, timed(&[(1, 1_000), (2, 1_000)]), &mut out)
            .await
            .unwrap();
        op.process_input(1, timed(&[(1, 5_000), (1, 30_000)]), &mut out)
            .await
            .unwrap();
        assert_eq!(timed_pairs(&out), [(1, 1_000, 5_000)]);
        // The left rows can match right rows up to 11 s, the right one at 5 s left rows
        // up to 5 s: past 11 s nothing is live, and past the buckets' ends (5 s wide)
        // nothing is kept.
        let mut out = Output::default();
        op.on_watermark(20_000, &mut out).await.unwrap();
        assert_eq!(stored(&op, 0, 1).await, 0, "left row of key 1 cleaned");
        assert_eq!(
            stored(&op, 0, 2).await,
            0,
            "left row of key 2 cleaned, never probed"
        );
        assert_eq!(stored(&op, 1, 1).await, 1, "the right row at 30 s is live");
        // A late left row at 1 s would have matched the right row at 5 s, which is
        // gone: it joins nothing and, expired on arrival, is not kept. One at 25 s
        // matches the right row at 30 s and is kept (it can match right rows up to 35 s).
        op.process_input(0, timed(&[(1, 1_000), (1, 25_000)]), &mut out)
            .await
            .unwrap();
        assert_eq!(timed_pairs(&out), [(1, 25_000, 30_000)]);
        assert_eq!(stored(&op, 0, 1).await, 1, "the late row is not kept");
    }

    /// How many rows of key `k` side `side` of `op` has in state, in any partition.
    async fn stored(op: &JoinOperator, side: usize, k: i64) -> usize {
        let table = op.kept.as_ref().unwrap()[side].table.clone();
        let mut key = Vec::new();
        sluice_common::key_group::push_i64(&mut key, Some(k));
        let group = key_group_of(&key, 128);
        let mut n = 0;
        for name in table.partitions(group, PART_NAME_LEN).await.unwrap() {
            let part = table.partition(&name);
            n += part.scan_key(group, &key, 16).await.unwrap().len();
        }
        n
    }

    #[tokio::test]
    async fn a_restored_interval_join_finds_and_drops_its_partitions() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(false));
        let (spec, schema) = (interval_spec(), timed_schema());
        let mut first = join_of(&spec, &schema, &schema, store.clone(), 1).await;
        let mut out = Output::default();
        // Left rows can match right rows up to 10 s after them: in buckets of 5 s, the
        // one at 1 s is in the bucket ending at 15 s, the one at 15 s in the bucket
        // ending at 30 s.
        first
            .process_input(0, timed(&[(1, 1_000), (2, 15_000)]), &mut out)
            .await
            .unwrap();
        // A later attempt finds both partitions in state and probes them.
        let mut resumed = join_of(&spec, &schema, &schema, store, 4).await;
        assert_eq!(
            resumed.kept.as_ref().unwrap()[0]
                .parts
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            [15_000, 30_000]
        );
        resumed
            .process_input(1, timed(&[(1, 5_000), (2, 20_000)]), &mut out)
            .await
            .unwrap();
        assert_eq!(timed_pairs(&out), [(1, 1_000, 5_000), (2, 15_000, 20_000)]);
        resumed.on_watermark(20_000, &mut out).await.unwrap();
        assert_eq!(stored(&resumed, 0, 1).await, 0, "its bucket ended");
        assert_eq!(stored(&resumed, 0, 2).await, 1, "its bucket has not");
        resumed.on_watermark(30_000, &mut out).await.unwrap();
        assert_eq!(stored(&resumed, 0, 2).await, 0);
        assert!(resumed.kept.as_ref().unwrap()[0].parts.is_empty());
        // A right row at 20 s was stored (it can match left rows up to 20 s), in the
        // bucket ending at 25 s: gone too.
        assert_eq!(stored(&resumed, 1, 2).await, 0);
    }

    #[tokio::test]
    async fn an_interval_join_restored_from_unpartitioned_state_moves_it_into_partitions() {
        // The layout of an interval join before partitions: rows in the side's table,
        // a cleanup timer per key in `timers`.
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(false));
        let backend = store.subtask(key_group_range(128, 1, 0), 1);
        let (left, timers) = (
            StateTable::new(backend.clone(), 3, "left"),
            StateTable::new(backend, 3, OLD_TIMER_STATE),
        );
        let mut key = Vec::new();
        sluice_common::key_group::push_i64(&mut key, Some(1));
        let group = key_group_of(&key, 128);
        let (spec, schema) = (interval_spec(), timed_schema());
        let old = join_of(&spec, &schema, &schema, store.clone(), 1).await;
        let row = old.sides[0]
            .rows
            .convert_columns(timed(&[(1, 1_000)]).columns())
            .unwrap();
        left.write(vec![WriteOp::Merge {
            key: left.key(group, &key, row.row(0).data()),
            operand: arrivals(11_000, 2),
        }])
        .await
        .unwrap();
        timers
            .write(vec![WriteOp::Put {
                key: timers.key(group, &time_key(20_000), &key),
                value: Bytes::new(),
            }])
            .await
            .unwrap();
        let mut op = join_of(&spec, &schema, &schema, store, 4).await;
        assert!(left.scan_group(group, 16).await.unwrap().is_empty());
        assert!(timers.scan_group(group, 16).await.unwrap().is_empty());
        assert_eq!(stored(&op, 0, 1).await, 1, "the row, in its partition");
        let mut out = Output::default();
        op.process_input(1, timed(&[(1, 5_000)]), &mut out)
            .await
            .unwrap();
        assert_eq!(timed_pairs(&out), [(1, 1_000, 5_000), (1, 1_000, 5_000)]);
        op.on_watermark(15_000, &mut out).await.unwrap();
        assert_eq!(stored(&op, 0, 1).await, 0, "its partition ended");
    }

    /// `(k, left t, right t)` of every row emitted, nulls as `None`, sorted.
    fn padded_pairs(out: &Output) -> Vec<[Option<i64>; 3]> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let k = b.column(0).as_primitive::<Int64Type>();
                let [l, r] = [1, 2].map(|c| {
                    b.column(c)
                        .as_primitive::<arrow::datatypes::TimestampMillisecondType>()
                });
                let at = |a: &dyn Array, i| (!a.is_null(i)).then_some(i);
                rows.extend((0..b.num_rows()).map(|i| {
                    [
                        at(k, i).map(|i| k.value(i)),
                        at(l, i).map(|i| l.value(i)),
                        at(r, i).map(|i| r.value(i)),
                    ]
                }));
            }
        }
        rows.sort();
        rows
    }

    #[tokio::test]
    async fn an_outer_interval_join_pads_a_row_once_its_interval_passed_without_a_pair() {
        let mut spec = interval_spec();
        spec.r#type = pb::JoinType::Full as i32;
        let mut op = join_of(
            &spec,
            &timed_schema(),
            &timed_schema(),
            Arc::new(MemoryStateStore::new(false)),
            1,
        )
        .await;
        assert_eq!(
            op.schema().field(0).name(),
            "k",
            "append-only: no change kind"
        );
        let mut out = Output::default();
        op.process_input(0, timed(&[(1, 1_000), (2, 1_000), (3, 2_000)]), &mut out)
            .await
            .unwrap();
        // Right rows match left rows up to 10 s before them: key 3's pair fails the
        // condition, so neither of its rows is matched; no left row has key 4.
        op.process_input(1, timed(&[(1, 5_000), (3, 30_000), (4, 3_000)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(4_000, &mut out).await.unwrap();
        let (some, none) = (Some, None::<i64>);
        assert_eq!(padded_pairs(&out), [[some(1), some(1_000), some(5_000)]]);
        // Past the left rows' intervals (11 s and 12 s) and their buckets' end (15 s),
        // and the right row at 3 s: the unmatched ones are padded, the matched not.
        let mut out = Output::default();
        op.on_watermark(20_000, &mut out).await.unwrap();
        assert_eq!(
            padded_pairs(&out),
            [
                [none, none, some(3_000)],
                [some(2), some(1_000), none],
                [some(3), some(2_000), none]
            ]
        );
        // A late left row matching nothing is padded at once; one matching the right
        // row at 30 s marks both, and neither is padded at the end.
        let mut out = Output::default();
        op.process_input(0, timed(&[(5, 1_000), (3, 25_000)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(i64::MAX, &mut out).await.unwrap();
        assert_eq!(
            padded_pairs(&out),
            [
                [some(3), some(25_000), some(30_000)],
                [some(5), some(1_000), none]
            ]
        );
        assert!(op.kept.as_ref().unwrap().iter().all(|k| k.parts.is_empty()));
    }

    #[test]
    fn an_interval_join_refuses_what_it_cannot_be() {
        let build = |spec: &pb::JoinSpec, right: &SchemaRef| {
            JoinOperator::build(spec, &timed_schema(), right, &ExprCompiler::new())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let mut ttl = interval_spec();
        ttl.ttl_ms = 1000;
        assert!(build(&ttl, &timed_schema()).contains("TTL"));
        let mut untimed = interval_spec();
        untimed.interval.as_mut().unwrap().right_time = "k".into();
        assert!(build(&untimed, &timed_schema()).contains("not a timestamp"));
        let mut missing = interval_spec();
        missing.interval.as_mut().unwrap().left_time = "ts".into();
        assert!(build(&missing, &timed_schema()).contains("`ts` does not exist"));
        let mut empty = interval_spec();
        empty.interval.as_mut().unwrap().lower_ms = 5;
        assert!(build(&empty, &timed_schema()).contains("empty"));
    }

    async fn join(spec: &pb::JoinSpec, store: Arc<dyn StateStore>) -> JoinOperator {
        join_from(spec, store, 1).await
    }

    async fn join_from(
        spec: &pb::JoinSpec,
        store: Arc<dyn StateStore>,
        first_epoch: u64,
    ) -> JoinOperator {
        join_over(spec, &right_schema(), store, first_epoch).await
    }

    /// The join of `spec` of left rows with `right` rows, open on `store`.
    /// The right side's rows as an updating input: `op`, `id`, `v`.
    fn updating_right_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            changelog::op_field(),
            Field::new("id", DataType::Int32, false),
            Field::new("v", DataType::Utf8, false),
        ]))
    }

    /// Changes `(op, id, v)` of the updating right side.
    fn right_changes(rows: &[(&str, i32, &str)]) -> RecordBatch {
        RecordBatch::try_new(
            updating_right_schema(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(arrow::array::Int32Array::from_iter_values(
                    rows.iter().map(|r| r.1),
                )),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_full_join_of_an_updating_input_pads_a_row_again_when_its_last_match_goes() {
        let mut s = spec(Some("b.v <> 'y'"), 0);
        s.r#type = pb::JoinType::Full as i32;
        s.exprs[0].sql = "a.k".into();
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(false));
        let mut op = join_over(&s, &updating_right_schema(), store.clone(), 1).await;
        let c = |op: &str, k: Option<i64>, l: Option<i64>, r: Option<&str>| {
            (op.to_owned(), k, l, r.map(str::to_owned))
        };
        let (n, a, b, y) = (None::<&str>, Some("a"), Some("b"), Some("y"));
        let mut out = Output::default();
        op.process_input(1, right_changes(&[("+I", 1, "a")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 10), (Some(2), 20)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("+I", None, None, a),
                c("-D", None, None, a),
                c("+I", Some(1), Some(10), a),
                c("+I", Some(2), Some(20), n),
            ]
        );
        // "a" becomes "b": 10 keeps a match throughout, so it is never padded.
        let mut out = Output::default();
        op.process_input(
            1,
            right_changes(&[("-U", 1, "a"), ("+U", 1, "b")]),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            changes(&out),
            [c("+I", Some(1), Some(10), b), c("-D", Some(1), Some(10), a)]
        );
        // "b" goes: 10's last match, so 10 is padded again. "y" fails ON: padded, and
        // its padded copy goes with it; a row never stored takes nothing back.
        let mut out = Output::default();
        op.process_input(
            1,
            right_changes(&[("-D", 1, "b"), ("+I", 1, "y")]),
            &mut out,
        )
        .await
        .unwrap();
        op.process_input(
            1,
            right_changes(&[("-D", 1, "y"), ("-D", 3, "zzz")]),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("+I", None, None, y),
                c("-D", Some(1), Some(10), b),
                c("+I", Some(1), Some(10), n),
                c("-D", None, None, y),
            ]
        );
        // The counts are in state: a later attempt matches 10 again and takes its
        // padded copy back once.
        let mut op = join_over(&s, &updating_right_schema(), store, 4).await;
        let mut out = Output::default();
        op.process_input(
            1,
            right_changes(&[("+I", 1, "c"), ("+I", 1, "c")]),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("-D", Some(1), Some(10), n),
                c("+I", Some(1), Some(10), Some("c")),
                c("+I", Some(1), Some(10), Some("c")),
            ]
        );
        let mut out = Output::default();
        op.process_input(1, right_changes(&[("-D", 1, "c")]), &mut out)
            .await
            .unwrap();
        op.process_input(1, right_changes(&[("-D", 1, "c")]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("-D", Some(1), Some(10), Some("c")),
                c("-D", Some(1), Some(10), Some("c")),
                c("+I", Some(1), Some(10), n),
            ]
        );
    }

    async fn join_over(
        spec: &pb::JoinSpec,
        right: &SchemaRef,
        store: Arc<dyn StateStore>,
        first_epoch: u64,
    ) -> JoinOperator {
        join_of(spec, &left_schema(), right, store, first_epoch).await
    }

    /// The join of `spec` of `left` rows with `right` rows, open on `store`.
    async fn join_of(
        spec: &pb::JoinSpec,
        left: &SchemaRef,
        right: &SchemaRef,
        store: Arc<dyn StateStore>,
        first_epoch: u64,
    ) -> JoinOperator {
        let mut op = JoinOperator::build(spec, left, right, &ExprCompiler::new()).unwrap();
        let state = OperatorState::new(store, 3, key_group_range(128, 1, 0), first_epoch, false);
        let ctx = OperatorContext {
            node_id: 3,
            node_name: "join".into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism: 128,
            state: Some(state),
        };
        op.open(&ctx).await.unwrap();
        op
    }

    /// `(k, left v, right v)` of every row emitted, sorted.
    fn pairs(out: &Output) -> Vec<(i64, i64, String)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                assert_eq!(
                    b.schema()
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>(),
                    ["k", "v", "v0"]
                );
                let k = b.column(0).as_primitive::<Int64Type>();
                let l = b.column(1).as_primitive::<Int64Type>();
                let r = b.column(2).as_string::<i32>();
                for i in 0..b.num_rows() {
                    rows.push((k.value(i), l.value(i), r.value(i).to_owned()));
                }
            }
        }
        rows.sort();
        rows
    }

    fn p(k: i64, l: i64, r: &str) -> (i64, i64, String) {
        (k, l, r.to_owned())
    }

    #[tokio::test]
    async fn rows_meet_whichever_side_arrives_first() {
        let mut op = join(&spec(None, 0), Arc::new(MemoryStateStore::new(false))).await;
        let mut out = Output::default();
        op.process_input(
            0,
            left(&[(Some(1), 10), (Some(2), 20), (None, 30)]),
            &mut out,
        )
        .await
        .unwrap();
        assert!(pairs(&out).is_empty(), "nothing to meet yet");
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "x"), (1, "y"), (3, "z")]), &mut out)
            .await
            .unwrap();
        assert_eq!(pairs(&out), [p(1, 10, "x"), p(1, 10, "y")]);
        // A later left row meets both right rows of its key, and the same row twice
        // meets them twice; a null key meets nothing.
        let mut out = Output::default();
        op.process_input(
            0,
            left(&[(Some(1), 11), (Some(1), 11), (Some(3), 31), (None, 1)]),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            pairs(&out),
            [
                p(1, 11, "x"),
                p(1, 11, "x"),
                p(1, 11, "y"),
                p(1, 11, "y"),
                p(3, 31, "z")
            ]
        );
        // Int32 ids meet Int64 keys; the stored duplicate counts twice.
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "w")]), &mut out)
            .await
            .unwrap();
        assert_eq!(pairs(&out), [p(1, 10, "w"), p(1, 11, "w"), p(1, 11, "w")]);
    }

    #[tokio::test]
    async fn a_join_that_resumes_finds_the_rows_stored_before() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(false));
        let mut first = join(&spec(None, 0), store.clone()).await;
        let mut out = Output::default();
        first
            .process_input(1, right(&[(1, "x"), (2, "y")]), &mut out)
            .await
            .unwrap();
        // A later attempt (writing from epoch 4) knows nothing of the keys in state, so
        // it probes every key.
        let mut resumed = join_from(&spec(None, 0), store, 4).await;
        resumed
            .process_input(0, left(&[(Some(1), 10), (Some(3), 30)]), &mut out)
            .await
            .unwrap();
        assert_eq!(pairs(&out), [p(1, 10, "x")]);
    }

    /// `(op, k, left v, right v)` of one change of an outer join.
    type Change = (String, Option<i64>, Option<i64>, Option<String>);

    /// An outer join's changes, in order.
    fn changes(out: &Output) -> Vec<Change> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let op = b.column(0).as_string::<i32>();
                let k = b.column(1).as_primitive::<Int64Type>();
                let l = b.column(2).as_primitive::<Int64Type>();
                let r = b.column(3).as_string::<i32>();
                for i in 0..b.num_rows() {
                    rows.push((
                        op.value(i).to_owned(),
                        k.is_valid(i).then(|| k.value(i)),
                        l.is_valid(i).then(|| l.value(i)),
                        r.is_valid(i).then(|| r.value(i).to_owned()),
                    ));
                }
            }
        }
        rows
    }

    #[tokio::test]
    async fn an_updating_input_takes_back_the_pairs_of_its_retracted_rows() {
        let updating = updating_right_schema();
        let changes_of = right_changes;
        let store = Arc::new(MemoryStateStore::new(false));
        let mut op = join_over(&spec(None, 0), &updating, store, 1).await;
        let c = |op: &str, k: i64, l: i64, r: &str| {
            (op.to_owned(), Some(k), Some(l), Some(r.to_owned()))
        };
        let mut out = Output::default();
        op.process_input(1, changes_of(&[("+I", 1, "a")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 10), (Some(1), 11)]), &mut out)
            .await
            .unwrap();
        assert_eq!(changes(&out), [c("+I", 1, 10, "a"), c("+I", 1, 11, "a")]);
        // The right row is updated: its old version's pairs are taken back.
        let mut out = Output::default();
        op.process_input(1, changes_of(&[("-U", 1, "a"), ("+U", 1, "b")]), &mut out)
            .await
            .unwrap();
        let mut got = changes(&out);
        got.sort();
        assert_eq!(
            got,
            [
                c("+I", 1, 10, "b"),
                c("+I", 1, 11, "b"),
                c("-D", 1, 10, "a"),
                c("-D", 1, 11, "a")
            ]
        );
        // Only "b" is left to join; a retraction of a row never stored takes nothing.
        let mut out = Output::default();
        op.process_input(1, changes_of(&[("-D", 1, "zzz")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 12)]), &mut out)
            .await
            .unwrap();
        assert_eq!(changes(&out), [c("+I", 1, 12, "b")]);
    }

    #[tokio::test]
    async fn a_left_join_pads_unmatched_rows_until_their_first_match() {
        let mut s = spec(None, 0);
        s.r#type = pb::JoinType::Left as i32;
        s.exprs[0].sql = "a.k".into();
        let mut op = join(&s, Arc::new(MemoryStateStore::new(false))).await;
        let c = |op: &str, k: Option<i64>, l: Option<i64>, r: Option<&str>| {
            (op.to_owned(), k, l, r.map(str::to_owned))
        };
        let mut out = Output::default();
        op.process_input(0, left(&[(Some(1), 10), (None, 20)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("+I", None, Some(20), None),
                c("+I", Some(1), Some(10), None)
            ],
            "unmatched left rows, a null key's included, are padded"
        );
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "x"), (2, "y")]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("-D", Some(1), Some(10), None),
                c("+I", Some(1), Some(10), Some("x"))
            ],
            "the first match retracts the padded row; an unmatched right row is dropped"
        );
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "z")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 11)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("+I", Some(1), Some(10), Some("z")),
                c("+I", Some(1), Some(11), Some("x")),
                c("+I", Some(1), Some(11), Some("z")),
            ]
        );
    }

    #[tokio::test]
    async fn a_full_join_with_a_condition_pads_each_row_until_a_pair_of_it_passes() {
        let mut s = spec(Some("a.v > 15 AND b.v <> 'y'"), 0);
        s.r#type = pb::JoinType::Full as i32;
        s.exprs[0].sql = "a.k".into();
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(false));
        let mut op = join(&s, store.clone()).await;
        let c = |op: &str, k: Option<i64>, l: Option<i64>, r: Option<&str>| {
            (op.to_owned(), k, l, r.map(str::to_owned))
        };
        let (n, x, y) = (None::<&str>, Some("x"), Some("y"));
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "x"), (1, "y"), (1, "x")]), &mut out)
            .await
            .unwrap();
        let mut got = changes(&out);
        got.sort();
        assert_eq!(
            got,
            [
                c("+I", None, None, x),
                c("+I", None, None, x),
                c("+I", None, None, y)
            ]
        );
        // 10 fails `a.v > 15`, "y" fails `b.v <> 'y'`: only (20, x) passes, and takes
        // back both arrivals of "x" padded; 10 and key 2 are padded.
        let mut out = Output::default();
        op.process_input(
            0,
            left(&[(Some(1), 10), (Some(1), 20), (Some(2), 30)]),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("-D", None, None, x),
                c("-D", None, None, x),
                c("+I", Some(1), Some(20), x),
                c("+I", Some(1), Some(20), x),
                c("+I", Some(1), Some(10), n),
                c("+I", Some(2), Some(30), n),
            ]
        );
        // A third "x" joins 20 only, and is not padded; a second "y" passes with no row,
        // so it is padded too; 16 joins the three "x".
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "x"), (1, "y")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 16)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("+I", Some(1), Some(20), x),
                c("+I", None, None, y),
                c("+I", Some(1), Some(16), x),
                c("+I", Some(1), Some(16), x),
                c("+I", Some(1), Some(16), x),
            ]
        );
        // The marks are in state: a later attempt on it retracts no padded row twice.
        let mut op = join_from(&s, store, 4).await;
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "x")]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [c("+I", Some(1), Some(16), x), c("+I", Some(1), Some(20), x)]
        );
    }

    /// `(op, k, v)` of every left row a semi or anti join wrote (`+I` without `op`).
    fn left_rows(out: &Output) -> Vec<(String, Option<i64>, i64)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let at = usize::from(changelog::is_changelog(&b.schema()));
                let k = b.column(at).as_primitive::<Int64Type>();
                let v = b.column(at + 1).as_primitive::<Int64Type>();
                for i in 0..b.num_rows() {
                    let op = match at {
                        0 => "+I".to_owned(),
                        _ => b.column(0).as_string::<i32>().value(i).to_owned(),
                    };
                    rows.push((op, k.is_valid(i).then(|| k.value(i)), v.value(i)));
                }
            }
        }
        rows
    }

    #[tokio::test]
    async fn a_semi_join_writes_each_left_row_once_when_a_pair_of_it_first_passes() {
        let mut s = spec(Some("b.v <> 'y'"), 0);
        s.r#type = pb::JoinType::Semi as i32;
        s.exprs.clear();
        let mut op = join(&s, Arc::new(MemoryStateStore::new(false))).await;
        assert_eq!(op.schema(), left_schema(), "the left rows, append-only");
        let rows = |out: &Output| -> Vec<(Option<i64>, i64)> {
            left_rows(out).into_iter().map(|(_, k, v)| (k, v)).collect()
        };
        let mut out = Output::default();
        op.process_input(
            0,
            left(&[(Some(1), 10), (Some(2), 20), (None, 5)]),
            &mut out,
        )
        .await
        .unwrap();
        assert!(rows(&out).is_empty(), "nothing matches yet");
        // "y" fails ON; "x" matches 10 (once, though it arrives twice).
        op.process_input(1, right(&[(2, "y"), (1, "x"), (1, "x")]), &mut out)
            .await
            .unwrap();
        assert_eq!(rows(&out), [(Some(1), 10)]);
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "z")]), &mut out)
            .await
            .unwrap();
        op.process_input(
            0,
            left(&[(Some(1), 11), (Some(1), 10), (Some(2), 21)]),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            rows(&out),
            [(Some(1), 11), (Some(1), 10)],
            "a left row arriving with a match is written at once, each arrival once"
        );
        // Rows written leave state; those still waiting for a match stay.
        let table = op.kept.as_ref().unwrap()[0].table.clone();
        for (k, waiting) in [(1, 0), (2, 2)] {
            let mut key = Vec::new();
            sluice_common::key_group::push_i64(&mut key, Some(k));
            let group = key_group_of(&key, 128);
            let rows = table.scan_key(group, &key, 16).await.unwrap();
            assert_eq!(rows.len(), waiting, "left rows of key {k} in state");
        }
    }

    #[tokio::test]
    async fn an_anti_join_writes_each_left_row_until_a_pair_of_it_passes() {
        let mut s = spec(Some("b.v <> 'y'"), 0);
        s.r#type = pb::JoinType::Anti as i32;
        s.exprs.clear();
        let mut op = join(&s, Arc::new(MemoryStateStore::new(false))).await;
        assert_eq!(op.schema().field(0).name(), "op", "an updating result");
        let c = |op: &str, k: Option<i64>, v: i64| (op.to_owned(), k, v);
        let rows = left_rows;
        let mut out = Output::default();
        op.process_input(
            0,
            left(&[(Some(1), 10), (Some(2), 20), (None, 5)]),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            rows(&out),
            [c("+I", Some(1), 10), c("+I", Some(2), 20), c("+I", None, 5)],
            "nothing matches yet: every row, a null key's included"
        );
        // "y" fails ON; "x" is 10's first match: 10 is taken back, once.
        let mut out = Output::default();
        op.process_input(1, right(&[(2, "y"), (1, "x"), (1, "x")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 11), (Some(2), 21)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            rows(&out),
            [c("-D", Some(1), 10), c("+I", Some(2), 21)],
            "a row arriving with a match is never written"
        );
    }

    #[tokio::test]
    async fn semi_and_anti_joins_of_an_updating_input_follow_the_count_of_matches() {
        let c = |op: &str, v: i64| (op.to_owned(), v);
        for (kind, first, last) in [
            (pb::JoinType::Semi, "+I", "-D"),
            (pb::JoinType::Anti, "-D", "+I"),
        ] {
            let mut s = spec(None, 0);
            s.r#type = kind as i32;
            s.exprs.clear();
            let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(false));
            let mut op = join_over(&s, &updating_right_schema(), store, 1).await;
            let rows = |out: &Output| -> Vec<(String, i64)> {
                left_rows(out)
                    .into_iter()
                    .map(|(op, _, v)| (op, v))
                    .collect()
            };
            let mut out = Output::default();
            op.process_input(0, left(&[(Some(1), 10)]), &mut out)
                .await
                .unwrap();
            let mut out = Output::default();
            op.process_input(1, right_changes(&[("+I", 1, "x")]), &mut out)
                .await
                .unwrap();
            assert_eq!(rows(&out), [c(first, 10)], "{kind:?}: the first match");
            // A second match, then the first taken back: still one.
            let mut out = Output::default();
            op.process_input(1, right_changes(&[("+I", 1, "z")]), &mut out)
                .await
                .unwrap();
            op.process_input(1, right_changes(&[("-D", 1, "x")]), &mut out)
                .await
                .unwrap();
            assert!(rows(&out).is_empty(), "{kind:?}: {:?}", rows(&out));
            let mut out = Output::default();
            op.process_input(1, right_changes(&[("-D", 1, "z")]), &mut out)
                .await
                .unwrap();
            assert_eq!(rows(&out), [c(last, 10)], "{kind:?}: the last match gone");
        }
    }

    #[tokio::test]
    async fn a_full_join_pads_both_sides() {
        let mut s = spec(None, 0);
        s.r#type = pb::JoinType::Full as i32;
        s.exprs[0].sql = "a.k".into();
        let mut op = join(&s, Arc::new(MemoryStateStore::new(false))).await;
        let c = |op: &str, k: Option<i64>, l: Option<i64>, r: Option<&str>| {
            (op.to_owned(), k, l, r.map(str::to_owned))
        };
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "x"), (1, "x")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 10), (Some(2), 20)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            [
                c("+I", None, None, Some("x")),
                c("+I", None, None, Some("x")),
                c("-D", None, None, Some("x")),
                c("-D", None, None, Some("x")),
                c("+I", Some(1), Some(10), Some("x")),
                c("+I", Some(1), Some(10), Some("x")),
                c("+I", Some(2), Some(20), None),
            ]
        );
    }

    #[tokio::test]
    async fn the_condition_applies_to_each_pair() {
        let spec = spec(Some("a.v > 15 AND b.v <> 'y'"), 0);
        let mut op = join(&spec, Arc::new(MemoryStateStore::new(false))).await;
        let mut out = Output::default();
        op.process_input(1, right(&[(1, "x"), (1, "y")]), &mut out)
            .await
            .unwrap();
        op.process_input(0, left(&[(Some(1), 10), (Some(1), 20)]), &mut out)
            .await
            .unwrap();
        assert_eq!(pairs(&out), [p(1, 20, "x")]);
    }

    #[tokio::test]
    async fn rows_past_their_time_to_live_no_longer_join() {
        let mut op = join(&spec(None, 30), Arc::new(MemoryStateStore::new(false))).await;
        let mut out = Output::default();
        op.process_input(0, left(&[(Some(1), 10)]), &mut out)
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(80)).await;
        op.process_input(0, left(&[(Some(1), 11)]), &mut out)
            .await
            .unwrap();
        op.process_input(1, right(&[(1, "x")]), &mut out)
            .await
            .unwrap();
        assert_eq!(pairs(&out), [p(1, 11, "x")], "the expired row is gone");
    }

    #[tokio::test]
    async fn mistakes_are_named() {
        let compiler = ExprCompiler::new();
        let build = |spec: &pb::JoinSpec| {
            JoinOperator::build(spec, &left_schema(), &right_schema(), &compiler)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let mut s = spec(None, 0);
        s.right_keys = vec!["v".into()];
        assert!(build(&s).contains("cannot be equal"), "{}", build(&s));
        let mut s = spec(Some("a.v + 1"), 0);
        assert!(build(&s).contains("not a boolean"), "{}", build(&s));
        s.condition = None;
        s.exprs = vec![];
        assert!(
            build(&s).contains("both sides of the join have a column `v`"),
            "{}",
            build(&s)
        );
        s.exprs = vec![pb::Expr {
            sql: "v".into(),
            location: None,
        }];
        assert!(
            build(&s).to_lowercase().contains("ambiguous"),
            "{}",
            build(&s)
        );
    }
}
