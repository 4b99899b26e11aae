//! `aggregate`: an unbounded `GROUP BY`, whose result per key changes with every record.
//!
//! The output is a changelog ([`crate::changelog`]): the first result of a key is an
//! insert (`+I`); each later change is the previous result retracted (`-U`) followed by
//! the new one (`+U`), as Flink's group aggregation emits with update-before enabled.
//! A batch is folded per key first (Flink's mini-batch), so a key touched by many records
//! of one batch changes once; a key whose results did not change (a `max` that was not
//! beaten) emits nothing.
//!
//! # State
//! One table, `acc`: per key the fixed-size accumulators of its aggregates
//! ([`crate::window::accumulator`]). Per batch the batch's distinct keys are read in one
//! call and written back in one. `COUNT(DISTINCT x)` also keeps, in table `seen`, a row
//! per key, value expression and value seen (the value in Arrow's row format), as
//! Flink's distinct aggregation does: calls over the same `x` with different FILTERs
//! share the row, whose value is a bitmask of the calls that counted it. A batch's
//! values are looked up in one read, and each call counts only what its bit lacked.
//!
//! # Updating input
//! Over a changelog (another aggregate's, a Top-N's, an outer join's), `-U` and `-D`
//! rows take their values away: `count`, `sum` and `avg` are sums that go down again,
//! and each key also counts its rows, so a key whose rows are all taken away is deleted
//! (`-D`). A `min` or `max` keeps, in table `vals`, each value's count per key and call
//! (the value encoded so that byte order is value order), as Flink's retracting
//! min/max keep a map of values: when the extreme loses its last copy, the key's kept
//! values are scanned for the next. `COUNT(DISTINCT)` over a changelog keeps in `seen`,
//! instead of a mask, each value's count of rows per call: a call counts the value while
//! its count is above 0.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow_row::{RowConverter, SortField};
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::key_group::key_group_of;
use sluice_common::pb;
use sluice_common::state::{Row, StateTable, WriteOp};

use super::{Operator, OperatorContext, Output};
use crate::changelog::{self, RowKind};
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::expr::aggregate::{AggFunc, AggregateCall, ArgKind};
use crate::keys::{EncodedKeys, KeyEncoder};
use crate::window::accumulator::{self, ACC_BYTES, Acc};

const ACC_STATE: &str = "acc";
const SEEN_STATE: &str = "seen";
const VALS_STATE: &str = "vals";

/// Hashes short keys of one batch: keys come from the job's own data.
type Hasher = foldhash::fast::RandomState;

/// `COUNT(DISTINCT x)` calls over one `x`: they share the values seen.
struct DistinctGroup {
    /// How the values become bytes.
    converter: RowConverter,
    /// The calls' indices; bit `i` of a seen value's mask is `calls[i]`.
    calls: Vec<usize>,
}

/// The most `COUNT(DISTINCT)` calls over one value (the bits of a seen value's mask).
const MAX_CALLS_PER_DISTINCT_VALUE: usize = 64;

/// The group aggregate of one subtask.
pub struct AggregateOperator {
    key_encoder: KeyEncoder,
    /// Input indices of the key columns, in key order.
    key_indices: Vec<usize>,
    calls: Vec<AggregateCall>,
    /// The `COUNT(DISTINCT x)` calls, grouped by `x`.
    distinct: Vec<DistinctGroup>,
    schema: SchemaRef,
    keys: EncodedKeys,
    table: Option<StateTable>,
    seen: Option<StateTable>,
    /// Over an updating input, each `min` and `max` value's count per key.
    vals: Option<StateTable>,
    /// The input is a changelog: `-U` and `-D` rows take their values away again.
    retracting: bool,
    max_parallelism: u32,
}

impl AggregateOperator {
    /// Builds the operator over `input`; errors name a missing key column, an
    /// unsupported aggregate, or an input that is itself updating.
    pub fn build(
        spec: &pb::AggregateSpec,
        input: &SchemaRef,
        compiler: &ExprCompiler,
    ) -> Result<Self> {
        let retracting = changelog::is_changelog(input);
        if spec.aggregates.is_empty() {
            return Err(Error::Plan(
                "an aggregate needs at least one aggregate call, e.g. `count(*) AS n`".into(),
            ));
        }
        let key_encoder = KeyEncoder::new(input, &spec.key_columns)?;
        let key_indices = spec
            .key_columns
            .iter()
            .map(|k| input.index_of(k))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let calls = spec
            .aggregates
            .iter()
            .map(|e| AggregateCall::compile(compiler, &e.sql, input))
            .collect::<Result<Vec<_>>>()?;
        let mut distinct: Vec<DistinctGroup> = Vec::new();
        let mut group_of: HashMap<&str, usize> = HashMap::new();
        for (i, call) in calls.iter().enumerate() {
            if let (true, AggFunc::Udf(udf)) = (retracting, call.func)
                && !udf.function.retracts()
            {
                return Err(Error::Plan(format!(
                    "`{}`: {} is registered in Rust and cannot take rows back (its \
                     `retracts` says so); it reads an updating result (another GROUP BY's, a \
                     Top-N's or an outer join's changelog), which only count, sum, avg, min, \
                     max and registered functions that retract can",
                    call.name, udf.name
                )));
            }
            let Some(parts) = &call.distinct_parts else {
                continue;
            };
            match group_of.get(parts.value_sql.as_str()) {
                Some(&g) if distinct[g].calls.len() >= MAX_CALLS_PER_DISTINCT_VALUE => {
                    return Err(Error::Plan(format!(
                        "`{}`: an aggregate keeps at most {MAX_CALLS_PER_DISTINCT_VALUE} \
                         COUNT(DISTINCT {}) calls",
                        call.name, parts.value_sql
                    )));
                }
                Some(&g) => distinct[g].calls.push(i),
                None => {
                    let converter =
                        RowConverter::new(vec![SortField::new(parts.value.data_type.clone())])
                            .map_err(|e| {
                                Error::Plan(format!("`{}`: cannot keep its values: {e}", call.name))
                            })?;
                    group_of.insert(&parts.value_sql, distinct.len());
                    distinct.push(DistinctGroup {
                        converter,
                        calls: vec![i],
                    });
                }
            }
        }
        if distinct.len() > usize::from(u8::MAX) {
            return Err(Error::Plan(
                "an aggregate keeps at most 255 distinct COUNT(DISTINCT ...) values".into(),
            ));
        }
        let mut fields = vec![changelog::op_field()];
        fields.extend(key_encoder.fields().iter().cloned());
        for call in &calls {
            let nullable = !matches!(call.func, AggFunc::Count | AggFunc::CountStar);
            fields.push(Field::new(&call.name, call.output_type.clone(), nullable));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = fields.iter().find(|f| !seen.insert(f.name().clone())) {
            let what = if dup.name() == changelog::OP_COLUMN {
                "is the change kind of an updating result (+I, -U, +U, -D)".to_owned()
            } else {
                "appears twice".to_owned()
            };
            return Err(Error::Plan(format!(
                "aggregate output column `{}` {what}; rename it with AS",
                dup.name()
            )));
        }
        Ok(Self {
            key_encoder,
            key_indices,
            calls,
            distinct,
            schema: Arc::new(Schema::new(fields)),
            keys: EncodedKeys::default(),
            table: None,
            seen: None,
            vals: None,
            retracting,
            max_parallelism: sluice_common::DEFAULT_MAX_PARALLELISM,
        })
    }

    /// The schema of the changelog this operator emits.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Adds to `partial` (per slot, `width` accumulators from each call's) each
    /// `COUNT(DISTINCT)` value of the batch that its call had not counted for its key,
    /// and records those values as counted. Over an updating input (`signs`, per row)
    /// each value keeps a count of its rows per call instead: a call counts it while
    /// that is above 0, so a value whose last row is taken back is counted no more.
    async fn count_distinct(
        &self,
        batch: &RecordBatch,
        first: &[u32],
        row_slots: &[u32],
        signs: Option<&[i64]>,
        width: usize,
        partial: &mut [Acc],
    ) -> Result<()> {
        let Some(seen) = self.seen.as_ref() else {
            return Err(Error::Internal("aggregate used before `open`".into()));
        };
        // Per group: the values in bytes, and per row the mask of its calls that count it
        // (a call counts a non-null value its FILTER passes).
        let mut encoded = Vec::with_capacity(self.distinct.len());
        let mut row_masks: Vec<Vec<u64>> = Vec::with_capacity(self.distinct.len());
        for group in &self.distinct {
            let parts = |call: usize| {
                self.calls[call]
                    .distinct_parts
                    .as_ref()
                    .ok_or_else(|| Error::Internal("a COUNT(DISTINCT) call lost its parts".into()))
            };
            let values = parts(group.calls[0])?.value.evaluate(batch)?;
            let mut masks: Vec<u64> = (0..batch.num_rows())
                .map(|row| match values.is_null(row) {
                    true => 0,
                    false => u64::MAX >> (64 - group.calls.len()),
                })
                .collect();
            for (bit, &call) in group.calls.iter().enumerate() {
                let Some(filter) = &parts(call)?.filter else {
                    continue;
                };
                let passed = filter.evaluate(batch)?;
                let passed = passed.as_boolean_opt().ok_or_else(|| {
                    Error::Internal(format!(
                        "`{}`'s FILTER is not a boolean",
                        self.calls[call].name
                    ))
                })?;
                for (row, mask) in masks.iter_mut().enumerate() {
                    if !(passed.is_valid(row) && passed.value(row)) {
                        *mask &= !(1 << bit);
                    }
                }
            }
            encoded.push(
                group
                    .converter
                    .convert_columns(std::slice::from_ref(&values))?,
            );
            row_masks.push(masks);
        }
        // The batch's distinct (slot, group, value)s, with the calls that count each.
        // Over an updating input, also each one's net rows per call.
        let mut index: HashMap<(u32, usize, &[u8]), usize, Hasher> = HashMap::default();
        let mut candidates: Vec<(u32, usize, &[u8], u64)> = Vec::new();
        let mut deltas: Vec<Vec<i64>> = Vec::new();
        for (g, (values, masks)) in encoded.iter().zip(&row_masks).enumerate() {
            for (row, (&slot, &mask)) in row_slots.iter().zip(masks).enumerate() {
                if mask == 0 {
                    continue;
                }
                let value = values.row(row).data();
                let at = match index.entry((slot, g, value)) {
                    std::collections::hash_map::Entry::Occupied(e) => {
                        candidates[*e.get()].3 |= mask;
                        *e.get()
                    }
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(candidates.len());
                        candidates.push((slot, g, value, mask));
                        deltas.push(vec![0; self.distinct[g].calls.len()]);
                        candidates.len() - 1
                    }
                };
                if let Some(signs) = signs {
                    for (bit, delta) in deltas[at].iter_mut().enumerate() {
                        if mask & (1 << bit) != 0 {
                            *delta += signs[row];
                        }
                    }
                }
            }
        }
        let mut namespace = Vec::new();
        let keys: Vec<Bytes> = candidates
            .iter()
            .map(|&(slot, g, value, _)| {
                let key = self.keys.row(first[slot as usize] as usize);
                namespace.clear();
                namespace.push(g as u8);
                namespace.extend_from_slice(value);
                seen.key(key_group_of(key, self.max_parallelism), key, &namespace)
            })
            .collect();
        let stored = seen.get_many(&keys).await?;
        let mut writes = Vec::new();
        if signs.is_some() {
            for (((slot, g, _, _), delta), (key, value)) in candidates
                .into_iter()
                .zip(deltas)
                .zip(keys.into_iter().zip(stored))
            {
                let calls = &self.distinct[g].calls;
                let before: Vec<i64> = match value {
                    Some(bytes) if bytes.len() == calls.len() * 8 => bytes
                        .chunks_exact(8)
                        .map(|c| i64::from_be_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect(),
                    Some(_) => {
                        return Err(Error::Internal(
                            "a COUNT(DISTINCT) value seen is not a count per call (state of \
                             an older version?)"
                                .into(),
                        ));
                    }
                    None => vec![0; calls.len()],
                };
                let mut after = Vec::with_capacity(calls.len() * 8);
                for ((&call, b), d) in calls.iter().zip(&before).zip(&delta) {
                    let a = b + d;
                    let acc = &mut partial[slot as usize * width + call];
                    match (*b > 0, a > 0) {
                        (false, true) => acc.n += 1,
                        (true, false) => acc.n -= 1,
                        _ => {}
                    }
                    after.extend_from_slice(&a.max(0).to_be_bytes());
                }
                writes.push(match after.iter().all(|&b| b == 0) {
                    true => WriteOp::Delete { key },
                    false => WriteOp::Put {
                        key,
                        value: Bytes::from(after),
                    },
                });
            }
            seen.write(writes).await?;
            return Ok(());
        }
        for ((slot, g, _, mask), (key, value)) in
            candidates.into_iter().zip(keys.into_iter().zip(stored))
        {
            let before = match value {
                Some(bytes) => u64::from_be_bytes(bytes.as_ref().try_into().map_err(|_| {
                    Error::Internal(
                        "a COUNT(DISTINCT) value seen is not a mask of calls (state of an \
                         older version?)"
                            .into(),
                    )
                })?),
                None => 0,
            };
            let new = mask & !before;
            if new == 0 {
                continue;
            }
            for (bit, &call) in self.distinct[g].calls.iter().enumerate() {
                if new & (1 << bit) != 0 {
                    partial[slot as usize * width + call].n += 1;
                }
            }
            writes.push(WriteOp::Put {
                key,
                value: Bytes::copy_from_slice(&(before | mask).to_be_bytes()),
            });
        }
        seen.write(writes).await?;
        Ok(())
    }

    /// Over an updating input: applies each min or max value's net count (`deltas`, by
    /// slot, call and [`accumulator::ordered`] value) to table `vals`, and sets each
    /// touched min or max in `news`. A key whose extreme lost its last copy is scanned
    /// for the next one; otherwise the old extreme meets the values added.
    async fn keep_extremes(
        &self,
        first: &[u32],
        width: usize,
        olds: &[Acc],
        news: &mut [Acc],
        deltas: HashMap<(u32, u8, u64), i64, Hasher>,
    ) -> Result<()> {
        let Some(vals) = self.vals.as_ref() else {
            return Err(Error::Internal("aggregate used before `open`".into()));
        };
        let key_of = |slot: u32| self.keys.row(first[slot as usize] as usize);
        let deltas: Vec<((u32, u8, u64), i64)> =
            deltas.into_iter().filter(|(_, d)| *d != 0).collect();
        let keys: Vec<Bytes> = deltas
            .iter()
            .map(|((slot, call, value), _)| {
                let key = key_of(*slot);
                let mut namespace = [0u8; 9];
                namespace[0] = *call;
                namespace[1..].copy_from_slice(&value.to_be_bytes());
                vals.key(key_group_of(key, self.max_parallelism), key, &namespace)
            })
            .collect();
        let stored = vals.get_many(&keys).await?;
        let mut writes = Vec::with_capacity(keys.len());
        // Per (slot, call): whether its extreme lost its last copy, and the best value
        // added.
        let mut touched: HashMap<(u32, u8), (bool, Option<u64>), Hasher> = HashMap::default();
        for (((slot, call, value), delta), (key, count)) in
            deltas.into_iter().zip(keys.into_iter().zip(stored))
        {
            let spec = &self.calls[usize::from(call)];
            let float = spec.arg_kind == ArgKind::Float;
            let old = &olds[slot as usize * width + usize::from(call)];
            let before = match count {
                Some(bytes) => i64::from_be_bytes(bytes.as_ref().try_into().map_err(|_| {
                    Error::Internal(format!("a kept value of `{}` is not a count", spec.name))
                })?),
                None => 0,
            };
            let after = before + delta;
            writes.push(match after > 0 {
                true => WriteOp::Put {
                    key,
                    value: Bytes::copy_from_slice(&after.to_be_bytes()),
                },
                false => WriteOp::Delete { key },
            });
            let (lost, added) = touched.entry((slot, call)).or_default();
            if before > 0
                && after <= 0
                && old.n > 0
                && accumulator::ordered_value(old, float) == value
            {
                *lost = true;
            }
            if delta > 0 && after > 0 {
                *added = Some(match *added {
                    Some(b) if spec.func == AggFunc::Max => b.max(value),
                    Some(b) => b.min(value),
                    None => value,
                });
            }
        }
        vals.write(writes).await?;
        // A key's kept values, scanned once for all its calls that lost their extreme.
        let mut scanned: HashMap<u32, Vec<Row>, Hasher> = HashMap::default();
        for ((slot, call), (lost, added)) in touched {
            let c = usize::from(call);
            let spec = &self.calls[c];
            let float = spec.arg_kind == ArgKind::Float;
            let i = slot as usize * width + c;
            if news[i].n <= 0 {
                continue;
            }
            let best = if lost {
                // The next extreme is the first (min) or last (max) value still kept.
                if let std::collections::hash_map::Entry::Vacant(entry) = scanned.entry(slot) {
                    let key = key_of(slot);
                    let group = key_group_of(key, self.max_parallelism);
                    entry.insert(vals.scan_key(group, key, 4096).await?);
                }
                let mut values = scanned[&slot]
                    .iter()
                    .filter(|r| r.namespace.len() == 9 && r.namespace[0] == call)
                    .map(|r| u64::from_be_bytes(r.namespace[1..].try_into().unwrap_or_default()));
                match spec.func {
                    AggFunc::Max => values.next_back(),
                    _ => values.next(),
                }
            } else {
                let old = &olds[i];
                let kept = (old.n > 0).then(|| accumulator::ordered_value(old, float));
                match (kept, added) {
                    (Some(a), Some(b)) if spec.func == AggFunc::Max => Some(a.max(b)),
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            match best {
                Some(v) => accumulator::set_ordered(&mut news[i], v, float),
                None => {
                    return Err(Error::Internal(format!(
                        "`{}` has {} values but none is kept",
                        spec.name, news[i].n
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether `a` and `b` give every aggregate the same result.
    fn same_results(&self, a: &[Acc], b: &[Acc]) -> bool {
        self.calls
            .iter()
            .zip(a.iter().zip(b))
            .all(|(call, (a, b))| {
                let float = call.arg_kind == ArgKind::Float;
                match call.func {
                    AggFunc::CountStar | AggFunc::Count => a.n == b.n,
                    AggFunc::Avg => a.n == b.n && a.f == b.f,
                    // Its result may read any part of its state.
                    AggFunc::Udf(_) => a == b,
                    _ if (a.n > 0) != (b.n > 0) => false,
                    _ if float => a.f == b.f,
                    _ => a.i == b.i,
                }
            })
    }
}

#[async_trait]
impl Operator for AggregateOperator {
    async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.max_parallelism = ctx.max_parallelism;
        self.table = Some(ctx.keyed_state()?.table(ACC_STATE));
        if !self.distinct.is_empty() {
            self.seen = Some(ctx.keyed_state()?.table(SEEN_STATE));
        }
        if self.retracting && self.calls.iter().any(|c| is_extreme(c.func)) {
            self.vals = Some(ctx.keyed_state()?.table(VALS_STATE));
        }
        Ok(())
    }

    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let Some(table) = self.table.as_ref() else {
            return Err(Error::Internal("aggregate used before `open`".into()));
        };
        let n_calls = self.calls.len();
        // Per key, one accumulator per call, then over an updating input its row count.
        let width = n_calls + usize::from(self.retracting);
        self.key_encoder.encode(&batch, &mut self.keys)?;
        let args = accumulator::evaluate_args(&self.calls, &batch)?;
        let signs = match self.retracting {
            true => Some(changelog::signs(batch.column(0)).ok_or_else(|| {
                Error::Internal("an updating input's `op` column is not text".into())
            })?),
            false => None,
        };
        // Fold the batch per key: `first` is each key's first row, `partial` its
        // accumulators over this batch, `extremes` the net count of each min or max
        // value per key and call (over an updating input).
        let mut slot_of: HashMap<&[u8], usize, Hasher> = HashMap::default();
        let mut first: Vec<u32> = Vec::new();
        let mut partial: Vec<Acc> = Vec::new();
        let mut row_slots: Vec<u32> = Vec::with_capacity(batch.num_rows());
        let mut extremes: HashMap<(u32, u8, u64), i64, Hasher> = HashMap::default();
        for row in 0..batch.num_rows() {
            let key = self.keys.row(row);
            let slot = *slot_of.entry(key).or_insert_with(|| {
                first.push(row as u32);
                partial.resize(partial.len() + width, Acc::default());
                first.len() - 1
            });
            row_slots.push(slot as u32);
            let (accs, rows) = partial[slot * width..(slot + 1) * width].split_at_mut(n_calls);
            let calls = self.calls.iter().zip(accs).zip(&args);
            match &signs {
                None => {
                    for ((call, acc), arg) in calls {
                        if !call.distinct {
                            accumulator::update(call.func, acc, arg, row);
                        }
                    }
                }
                Some(signs) => {
                    let sign = signs[row];
                    rows[0].n += sign;
                    for (c, ((call, acc), arg)) in calls.enumerate() {
                        if call.distinct {
                            // Counted by `count_distinct`.
                        } else if !is_extreme(call.func) {
                            accumulator::update_signed(call.func, acc, arg, row, sign);
                        } else if let Some(v) = accumulator::ordered(arg, row) {
                            acc.n += sign;
                            *extremes.entry((slot as u32, c as u8, v)).or_default() += sign;
                        }
                    }
                }
            }
        }
        if !self.distinct.is_empty() {
            self.count_distinct(
                &batch,
                &first,
                &row_slots,
                signs.as_deref(),
                width,
                &mut partial,
            )
            .await?;
        }
        let state_keys: Vec<Bytes> = first
            .iter()
            .map(|&row| {
                let key = self.keys.row(row as usize);
                table.key(key_group_of(key, self.max_parallelism), key, &[])
            })
            .collect();
        let stored = table.get_many(&state_keys).await?;
        let mut olds: Vec<Acc> = Vec::with_capacity(first.len() * width);
        let mut existed = Vec::with_capacity(first.len());
        for value in &stored {
            match value {
                Some(bytes) => accumulator::decode(bytes, width, &mut olds)?,
                None => olds.resize(olds.len() + width, Acc::default()),
            }
            existed.push(value.is_some());
        }
        let mut news = olds.clone();
        for (slot, news) in news.chunks_exact_mut(width).enumerate() {
            let adds = &partial[slot * width..(slot + 1) * width];
            for ((call, acc), add) in self.calls.iter().zip(news.iter_mut()).zip(adds) {
                match self.retracting {
                    false => accumulator::merge(call.func, call.arg_kind, acc, add),
                    true if is_extreme(call.func) => acc.n += add.n,
                    true => accumulator::merge_signed(acc, add),
                }
            }
            if self.retracting {
                news[n_calls].n += adds[n_calls].n;
            }
        }
        if !extremes.is_empty() {
            self.keep_extremes(&first, width, &olds, &mut news, extremes)
                .await?;
        }
        let mut kinds = Vec::new();
        let mut rows = Vec::new();
        let mut results: Vec<Acc> = Vec::new();
        let mut writes = Vec::with_capacity(first.len());
        let mut encoded = Vec::with_capacity(width * ACC_BYTES);
        for (slot, state_key) in state_keys.into_iter().enumerate() {
            let old = &olds[slot * width..(slot + 1) * width];
            let new = &news[slot * width..(slot + 1) * width];
            // Over an updating input a key lives while it has rows.
            let (before, after) = match self.retracting {
                true => (old[n_calls].n > 0, new[n_calls].n > 0),
                false => (existed[slot], true),
            };
            let row = first[slot];
            if after {
                encoded.clear();
                accumulator::encode(new, &mut encoded);
                writes.push(WriteOp::Put {
                    key: state_key,
                    value: Bytes::copy_from_slice(&encoded),
                });
            } else if existed[slot] {
                writes.push(WriteOp::Delete { key: state_key });
            }
            let old = &old[..n_calls];
            let new = &new[..n_calls];
            match (before, after) {
                (false, true) => {
                    kinds.push(RowKind::Insert);
                    rows.push(row);
                    results.extend_from_slice(new);
                }
                (true, true) if !self.same_results(old, new) => {
                    kinds.extend([RowKind::UpdateBefore, RowKind::UpdateAfter]);
                    rows.extend([row, row]);
                    results.extend_from_slice(old);
                    results.extend_from_slice(new);
                }
                (true, false) => {
                    kinds.push(RowKind::Delete);
                    rows.push(row);
                    results.extend_from_slice(old);
                }
                _ => {}
            }
        }
        table.write(writes).await?;
        if kinds.is_empty() {
            return Ok(());
        }
        let indices = UInt32Array::from(rows);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        columns.push(changelog::op_array(&kinds));
        for &k in &self.key_indices {
            columns.push(take(batch.column(k), &indices, None)?);
        }
        for (c, call) in self.calls.iter().enumerate() {
            let accs = results.iter().skip(c).step_by(n_calls);
            columns.push(accumulator::finish(call, accs)?);
        }
        out.batch(RecordBatch::try_new(self.schema.clone(), columns)?);
        Ok(())
    }
}

/// Whether `func` needs every value kept to be taken back (`min`, `max`).
fn is_extreme(func: AggFunc) -> bool {
    matches!(func, AggFunc::Min | AggFunc::Max)
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Int64Type};
    use sluice_common::key_group::key_group_range;
    use sluice_common::state::{MemoryStateStore, StateStore};

    use super::*;
    use crate::element::StreamElement;
    use crate::keyed::OperatorState;

    fn input() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    fn batch(rows: &[(i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            input(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    async fn aggregate(
        store: Arc<dyn StateStore>,
        subtask: u32,
        parallelism: u32,
    ) -> (AggregateOperator, OperatorState) {
        let spec = pb::AggregateSpec {
            key_columns: vec!["k".into()],
            aggregates: ["count(*) AS n", "max(v) AS top"]
                .map(|sql| pb::Expr {
                    sql: sql.into(),
                    location: None,
                })
                .into(),
        };
        let mut op = AggregateOperator::build(&spec, &input(), &ExprCompiler::new()).unwrap();
        let groups = key_group_range(128, parallelism, subtask);
        let state = OperatorState::new(store, 4, groups, 1, true);
        let ctx = OperatorContext {
            node_id: 4,
            node_name: "aggregate".into(),
            subtask: subtask as usize,
            parallelism: parallelism as usize,
            max_parallelism: 128,
            state: Some(state.clone()),
        };
        op.open(&ctx).await.unwrap();
        (op, state)
    }

    /// `(op, k, n, top)` rows of everything emitted.
    fn changes(out: &Output) -> Vec<(String, i64, i64, i64)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                assert!(changelog::is_changelog(&b.schema()));
                let op = b.column(0).as_string::<i32>();
                let [k, n, top] = [1, 2, 3].map(|c| b.column(c).as_primitive::<Int64Type>());
                rows.extend(
                    (0..b.num_rows())
                        .map(|r| (op.value(r).to_owned(), k.value(r), n.value(r), top.value(r))),
                );
            }
        }
        rows
    }

    fn row(op: &str, k: i64, n: i64, top: i64) -> (String, i64, i64, i64) {
        (op.to_owned(), k, n, top)
    }

    #[tokio::test]
    async fn a_key_is_inserted_once_then_retracted_and_updated() {
        let (mut op, _) = aggregate(Arc::new(MemoryStateStore::new(false)), 0, 1).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 10), (2, 5), (1, 30)]), &mut out)
            .await
            .unwrap();
        op.process_batch(batch(&[(1, 20), (3, 7)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            vec![
                row("+I", 1, 2, 30),
                row("+I", 2, 1, 5),
                row("-U", 1, 2, 30),
                row("+U", 1, 3, 30),
                row("+I", 3, 1, 7),
            ]
        );
    }

    #[tokio::test]
    async fn an_unchanged_result_emits_nothing() {
        let spec = pb::AggregateSpec {
            key_columns: vec!["k".into()],
            aggregates: vec![pb::Expr {
                sql: "max(v) AS top".into(),
                location: None,
            }],
        };
        let mut op = opened(&spec, &input()).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 10)]), &mut out).await.unwrap();
        op.process_batch(batch(&[(1, 3)]), &mut out).await.unwrap();
        let emitted: usize = out
            .main
            .iter()
            .map(|e| match e {
                StreamElement::Batch(b) => b.num_rows(),
                _ => 0,
            })
            .sum();
        assert_eq!(emitted, 1, "max stayed 10: no update");
    }

    #[tokio::test]
    async fn results_continue_from_a_checkpoint_at_another_parallelism() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(true));
        let (mut op, state) = aggregate(store.clone(), 0, 1).await;
        op.process_batch(batch(&[(1, 10), (2, 20)]), &mut Output::default())
            .await
            .unwrap();
        state.seal(1).await.unwrap();
        store.commit(1, &[1]).await.unwrap();
        // After the checkpoint, then lost.
        op.process_batch(batch(&[(1, 99)]), &mut Output::default())
            .await
            .unwrap();
        drop(op);
        store.restore(1, 2).await.unwrap();
        let mut out = Output::default();
        for subtask in 0..2 {
            let (mut op, _) = aggregate(store.clone(), subtask, 2).await;
            let mine: Vec<_> = [(1, 11), (2, 25), (3, 1)]
                .into_iter()
                .filter(|(k, _)| {
                    let mut key = Vec::new();
                    sluice_common::key_group::push_i64(&mut key, Some(*k));
                    key_group_range(128, 2, subtask).contains(&u32::from(key_group_of(&key, 128)))
                })
                .collect();
            if !mine.is_empty() {
                op.process_batch(batch(&mine), &mut out).await.unwrap();
            }
        }
        let mut got = changes(&out);
        got.sort();
        assert_eq!(
            got,
            vec![
                row("+I", 3, 1, 1),
                row("+U", 1, 2, 11),
                row("+U", 2, 2, 25),
                row("-U", 1, 1, 10),
                row("-U", 2, 1, 20),
            ]
        );
    }

    #[tokio::test]
    async fn count_distincts_of_one_value_share_what_they_saw_each_counting_its_own() {
        let spec = pb::AggregateSpec {
            key_columns: vec!["k".into()],
            aggregates: [
                "count(DISTINCT v % 10) AS n",
                "count(DISTINCT v % 10) FILTER (WHERE v >= 10) AS big",
            ]
            .map(|sql| pb::Expr {
                sql: sql.into(),
                location: None,
            })
            .into(),
        };
        let mut op = opened(&spec, &input()).await;
        assert_eq!(op.distinct.len(), 1, "one value, so one group");
        let mut out = Output::default();
        // 3 counts for n only; 13 is the same value, which big now counts; 23 and 3
        // again count for neither.
        for rows in [&[(1, 3)][..], &[(1, 13)], &[(1, 23), (1, 3)], &[(1, 14)]] {
            op.process_batch(batch(rows), &mut out).await.unwrap();
        }
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let op = b.column(0).as_string::<i32>();
                let [n, big] = [2, 3].map(|c| b.column(c).as_primitive::<Int64Type>());
                rows.extend(
                    (0..b.num_rows()).map(|r| (op.value(r).to_owned(), n.value(r), big.value(r))),
                );
            }
        }
        let r = |op: &str, n, big| (op.to_owned(), n, big);
        assert_eq!(
            rows,
            vec![
                r("+I", 1, 0),
                r("-U", 1, 0),
                r("+U", 1, 1),
                r("-U", 1, 1),
                r("+U", 2, 2),
            ]
        );
    }

    #[tokio::test]
    async fn count_distinct_counts_each_value_once_per_key_across_batches() {
        let spec = pb::AggregateSpec {
            key_columns: vec!["k".into()],
            aggregates: [
                "count(DISTINCT v) AS n",
                "max(v) AS top",
                "count(DISTINCT v) FILTER (WHERE v > 2) AS big",
            ]
            .map(|sql| pb::Expr {
                sql: sql.into(),
                location: None,
            })
            .into(),
        };
        let mut op = opened(&spec, &input()).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 1), (1, 1), (1, 3), (2, 1)]), &mut out)
            .await
            .unwrap();
        op.process_batch(batch(&[(1, 3), (1, 4), (2, 1)]), &mut out)
            .await
            .unwrap();
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let op = b.column(0).as_string::<i32>();
                let [k, n, top, big] =
                    [1, 2, 3, 4].map(|c| b.column(c).as_primitive::<Int64Type>());
                rows.extend((0..b.num_rows()).map(|r| {
                    (
                        op.value(r).to_owned(),
                        k.value(r),
                        n.value(r),
                        top.value(r),
                        big.value(r),
                    )
                }));
            }
        }
        let r = |op: &str, k, n, top, big| (op.to_owned(), k, n, top, big);
        assert_eq!(
            rows,
            vec![
                r("+I", 1, 2, 3, 1),
                r("+I", 2, 1, 1, 0),
                r("-U", 1, 2, 3, 1),
                r("+U", 1, 3, 4, 2),
            ],
            "key 2 saw 1 again: nothing changed"
        );
    }

    /// The aggregate of `spec` over `input`, open on empty memory state (one subtask).
    async fn opened(spec: &pb::AggregateSpec, input: &SchemaRef) -> AggregateOperator {
        let mut op = AggregateOperator::build(spec, input, &ExprCompiler::new()).unwrap();
        let state = OperatorState::new(
            Arc::new(MemoryStateStore::new(false)),
            4,
            key_group_range(128, 1, 0),
            1,
            true,
        );
        let ctx = OperatorContext {
            node_id: 4,
            node_name: "aggregate".into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism: 128,
            state: Some(state),
        };
        op.open(&ctx).await.unwrap();
        op
    }

    /// An aggregate over changelog rows `(op, k, v)`.
    async fn retracting(aggregates: &[&str]) -> AggregateOperator {
        let spec = pb::AggregateSpec {
            key_columns: vec!["k".into()],
            aggregates: aggregates
                .iter()
                .map(|sql| pb::Expr {
                    sql: (*sql).into(),
                    location: None,
                })
                .collect(),
        };
        opened(&spec, &updating()).await
    }

    fn updating() -> SchemaRef {
        Arc::new(Schema::new(vec![
            changelog::op_field(),
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]))
    }

    fn changes_of(rows: &[(&str, i64, Option<i64>)]) -> RecordBatch {
        RecordBatch::try_new(
            updating(),
            vec![
                Arc::new(arrow::array::StringArray::from_iter_values(
                    rows.iter().map(|r| r.0),
                )),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    /// Every emitted row as text: `op k col...`, nulls as `_`.
    fn emitted(out: &mut Output) -> Vec<String> {
        let mut rows = Vec::new();
        for e in out.main.drain(..) {
            if let StreamElement::Batch(b) = e {
                let op = b.column(0).as_string::<i32>();
                for r in 0..b.num_rows() {
                    let mut text = op.value(r).to_owned();
                    for c in 1..b.num_columns() {
                        let col = arrow::compute::cast(b.column(c), &DataType::Utf8).unwrap();
                        let col = col.as_string::<i32>();
                        text.push(' ');
                        text.push_str(if col.is_null(r) { "_" } else { col.value(r) });
                    }
                    rows.push(text);
                }
            }
        }
        rows
    }

    async fn step(op: &mut AggregateOperator, rows: &[(&str, i64, Option<i64>)]) -> Vec<String> {
        let mut out = Output::default();
        op.process_batch(changes_of(rows), &mut out).await.unwrap();
        emitted(&mut out)
    }

    #[tokio::test]
    async fn retractions_take_values_back_and_a_key_without_rows_is_deleted() {
        let mut op = retracting(&[
            "count(*) AS n",
            "sum(v) AS total",
            "max(v) AS top",
            "min(v) AS low",
            "avg(v) AS mean",
        ])
        .await;
        assert_eq!(
            step(
                &mut op,
                &[("+I", 1, Some(10)), ("+I", 1, Some(30)), ("+I", 2, Some(5))]
            )
            .await,
            ["+I 1 2 40 30 10 20.0", "+I 2 1 5 5 5 5.0"]
        );
        // The max (30) is taken back: the next one comes from the kept values.
        assert_eq!(
            step(
                &mut op,
                &[("-U", 1, Some(30)), ("+U", 1, Some(20)), ("-D", 2, Some(5))]
            )
            .await,
            [
                "-U 1 2 40 30 10 20.0",
                "+U 1 2 30 20 10 15.0",
                "-D 2 1 5 5 5 5.0"
            ]
        );
        assert_eq!(
            step(&mut op, &[("-D", 1, Some(10))]).await,
            ["-U 1 2 30 20 10 15.0", "+U 1 1 20 20 20 20.0"]
        );
        assert_eq!(
            step(&mut op, &[("-D", 1, Some(20))]).await,
            ["-D 1 1 20 20 20 20.0"]
        );
        // Nothing of the deleted key is left over: it starts again from its new row.
        assert_eq!(
            step(&mut op, &[("+I", 1, Some(7)), ("+I", 1, None)]).await,
            ["+I 1 2 7 7 7 7.0"]
        );
        // A copy of the extreme taken back leaves the other copy.
        assert_eq!(
            step(
                &mut op,
                &[("+I", 3, Some(9)), ("+I", 3, Some(9)), ("+I", 3, Some(1))]
            )
            .await,
            ["+I 3 3 19 9 1 6.333333333333333"]
        );
        assert_eq!(
            step(&mut op, &[("-U", 3, Some(9)), ("-U", 3, Some(1))]).await,
            ["-U 3 3 19 9 1 6.333333333333333", "+U 3 1 9 9 9 9.0"]
        );
        // Inserted and taken back within one batch: nothing to say.
        assert_eq!(
            step(&mut op, &[("+I", 4, Some(2)), ("-D", 4, Some(2))]).await,
            Vec::<String>::new()
        );
        // Only null values left: the row count stays, the sum and extremes are null.
        assert_eq!(
            step(&mut op, &[("-U", 1, Some(7))]).await,
            ["-U 1 2 7 7 7 7.0", "+U 1 1 _ _ _ _"]
        );
    }

    #[tokio::test]
    async fn count_distinct_over_an_updating_input_counts_a_value_while_it_has_rows() {
        let mut op = retracting(&[
            "count(DISTINCT v) AS d",
            "count(DISTINCT v) FILTER (WHERE v > 15) AS big",
            "count(*) AS n",
        ])
        .await;
        assert_eq!(
            step(
                &mut op,
                &[
                    ("+I", 1, Some(10)),
                    ("+I", 1, Some(10)),
                    ("+I", 1, Some(20))
                ]
            )
            .await,
            ["+I 1 2 1 3"]
        );
        // One of the two 10s goes: 10 is still there.
        assert_eq!(
            step(&mut op, &[("-D", 1, Some(10))]).await,
            ["-U 1 2 1 3", "+U 1 2 1 2"]
        );
        // The other goes too, and 20 becomes 30 (an update of one row).
        assert_eq!(
            step(
                &mut op,
                &[
                    ("-D", 1, Some(10)),
                    ("-U", 1, Some(20)),
                    ("+U", 1, Some(30))
                ]
            )
            .await,
            ["-U 1 2 1 2", "+U 1 1 1 1"]
        );
        // A value taken back that was never counted counts nothing.
        assert_eq!(
            step(&mut op, &[("-D", 1, Some(30)), ("-D", 1, Some(99))]).await,
            ["-D 1 1 1 1"]
        );
    }

    #[test]
    fn an_output_column_named_op_is_refused() {
        let spec = pb::AggregateSpec {
            key_columns: vec!["k".into()],
            aggregates: vec![pb::Expr {
                sql: "count(*) AS op".into(),
                location: None,
            }],
        };
        let err = AggregateOperator::build(&spec, &input(), &ExprCompiler::new())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("`op` is the change kind"), "{err}");
    }
}
