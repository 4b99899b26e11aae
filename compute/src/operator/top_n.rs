//! `top_n`: per partition key, the first N rows in a given order (Flink's Top-N, and with
//! N = 1 its deduplication), kept up to date as rows arrive.
//!
//! The output is a changelog ([`crate::changelog`]). Without a rank column, a row that
//! enters the top is inserted (`+I`) and a row it pushes out is deleted (`-D`). With a
//! rank column, every rank whose row changed is updated: its old row retracted (`-U`)
//! and the new one added (`+U`), or inserted when the rank was empty. Ties in the order
//! are broken by the rest of the row, ascending column by column, so that a run's answer
//! is deterministic. A batch is merged per key first, so a key's top changes once per
//! batch.
//!
//! Over an updating input (an unbounded GROUP BY's changelog, Flink's retract Top-N) a
//! row that adds (`+I`, `+U`) is a candidate as before, and a row that takes one back
//! (`-U`, `-D`) leaves the ranking: when it was in the top, the next row below takes its
//! place. So every row of the input that is still live is kept, not only the top.
//!
//! # State
//! Table `top`: per key the current top rows, each as its sort key and its whole row in
//! Arrow's row format (which compares as bytes in the requested order), at most N. Over
//! an updating input also table `rows`: per key, every live row with its count, under
//! the namespace sort key then row, so that a scan of the key's first N entries reads
//! its top in order (the row format of one schema is prefix-free, so the concatenation
//! sorts as the pair).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array};
use arrow::compute::SortOptions;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow_row::{RowConverter, SortField};
use async_trait::async_trait;
use bytes::{BufMut, Bytes};
use sluice_common::key_group::key_group_of;
use sluice_common::pb;
use sluice_common::state::{StateTable, WriteOp};

use super::{Operator, OperatorContext, Output};
use crate::changelog::{self, RowKind};
use crate::error::{Error, Result};
use crate::keys::{EncodedKeys, KeyEncoder};

const TOP_STATE: &str = "top";
const ROWS_STATE: &str = "rows";

/// Hashes short keys of one batch: keys come from the job's own data.
type Hasher = foldhash::fast::RandomState;

/// One row of a top: its sort key, then the whole row (both in Arrow's row format).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    sort: Vec<u8>,
    row: Vec<u8>,
}

/// The Top-N operator of one subtask.
pub struct TopNOperator {
    key_encoder: KeyEncoder,
    keys: EncodedKeys,
    /// Input indices of the order-by columns.
    sort_columns: Vec<usize>,
    sort_converter: RowConverter,
    row_converter: RowConverter,
    limit: usize,
    rank: bool,
    /// Whether the input is a changelog (its first column the change kind).
    updating: bool,
    schema: SchemaRef,
    table: Option<StateTable>,
    /// Every live row per key, over an updating input.
    rows_table: Option<StateTable>,
    max_parallelism: u32,
}

impl TopNOperator {
    /// Builds the operator over `input`; errors name a missing or unsortable column or a
    /// limit of 0.
    pub fn build(spec: &pb::TopNSpec, input: &SchemaRef) -> Result<Self> {
        let updating = changelog::is_changelog(input);
        let input = &changelog::data_schema(input);
        if spec.limit == 0 {
            return Err(Error::Plan(
                "Top-N needs a limit of at least 1 (`rn <= 1` keeps the first row)".into(),
            ));
        }
        if spec.order_by.is_empty() {
            return Err(Error::Plan(
                "Top-N needs an ORDER BY: which rows come first".into(),
            ));
        }
        let key_encoder = KeyEncoder::new(input, &spec.partition_columns)?;
        let mut sort_columns = Vec::with_capacity(spec.order_by.len());
        let mut sort_fields = Vec::with_capacity(spec.order_by.len());
        for key in &spec.order_by {
            let idx = input.index_of(&key.column).map_err(|_| {
                let known: Vec<_> = input.fields().iter().map(|f| f.name().as_str()).collect();
                Error::Plan(format!(
                    "ORDER BY column `{}` does not exist; the input has columns {}",
                    key.column,
                    known.join(", ")
                ))
            })?;
            let options = SortOptions {
                descending: key.descending,
                nulls_first: key.nulls_first,
            };
            sort_columns.push(idx);
            sort_fields.push(SortField::new_with_options(
                input.field(idx).data_type().clone(),
                options,
            ));
        }
        let unsortable = |e: arrow::error::ArrowError| {
            Error::Plan(format!("Top-N cannot order or keep these columns: {e}"))
        };
        let sort_converter = RowConverter::new(sort_fields).map_err(unsortable)?;
        let row_converter = RowConverter::new(
            input
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )
        .map_err(unsortable)?;
        let mut fields = vec![changelog::op_field()];
        fields.extend(input.fields().iter().map(|f| f.as_ref().clone()));
        let rank = !spec.rank_column.is_empty();
        if rank {
            fields.push(Field::new(&spec.rank_column, DataType::Int64, false));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = fields.iter().find(|f| !seen.insert(f.name().clone())) {
            return Err(Error::Plan(format!(
                "Top-N output column `{}` appears twice (`op` is the change kind of an \
                 updating result); rename it",
                dup.name()
            )));
        }
        Ok(Self {
            key_encoder,
            keys: EncodedKeys::default(),
            sort_columns,
            sort_converter,
            row_converter,
            limit: spec.limit as usize,
            rank,
            updating,
            schema: Arc::new(Schema::new(fields)),
            table: None,
            rows_table: None,
            max_parallelism: sluice_common::DEFAULT_MAX_PARALLELISM,
        })
    }

    /// The schema of the changelog this operator emits.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The changes from `old` to `new` (both sorted), appended to `changes`.
    fn diff<'a>(&self, old: &'a [Entry], new: &'a [Entry], changes: &mut Vec<Change<'a>>) {
        if self.rank {
            for i in 0..old.len().max(new.len()) {
                let rank = i as i64 + 1;
                match (old.get(i), new.get(i)) {
                    (Some(o), Some(n)) if o == n => {}
                    (Some(o), Some(n)) => {
                        changes.push((RowKind::UpdateBefore, &o.row, rank));
                        changes.push((RowKind::UpdateAfter, &n.row, rank));
                    }
                    (None, Some(n)) => changes.push((RowKind::Insert, &n.row, rank)),
                    (Some(o), None) => changes.push((RowKind::Delete, &o.row, rank)),
                    (None, None) => {}
                }
            }
            return;
        }
        // Both sides are sorted: walk them together.
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < new.len() {
            match (old.get(i), new.get(j)) {
                (Some(o), Some(n)) if o == n => {
                    i += 1;
                    j += 1;
                }
                (Some(o), Some(n)) if o < n => {
                    changes.push((RowKind::Delete, &o.row, 0));
                    i += 1;
                }
                (Some(o), None) => {
                    changes.push((RowKind::Delete, &o.row, 0));
                    i += 1;
                }
                (_, Some(n)) => {
                    changes.push((RowKind::Insert, &n.row, 0));
                    j += 1;
                }
                (None, None) => break,
            }
        }
    }
}

/// A row of one key of a batch: the key's slot, the row's sort key and its bytes.
type SlotEntry<'a> = (usize, &'a [u8], &'a [u8]);

/// One emitted change: its kind, the row's bytes and its rank (when ranks are emitted).
type Change<'a> = (RowKind, &'a [u8], i64);

fn encode(entries: &[Entry]) -> Bytes {
    let size: usize = entries.iter().map(|e| 8 + e.sort.len() + e.row.len()).sum();
    let mut out = Vec::with_capacity(size);
    for e in entries {
        out.put_u32(e.sort.len() as u32);
        out.put_slice(&e.sort);
        out.put_u32(e.row.len() as u32);
        out.put_slice(&e.row);
    }
    Bytes::from(out)
}

fn decode(mut bytes: &[u8], out: &mut Vec<Entry>) -> Result<()> {
    let corrupt = || Error::Internal("Top-N state is truncated".into());
    let take = |bytes: &mut &[u8]| -> Result<Vec<u8>> {
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(corrupt)?;
        let len = u32::from_be_bytes(*len) as usize;
        let value = rest.get(..len).ok_or_else(corrupt)?.to_vec();
        *bytes = &rest[len..];
        Ok(value)
    };
    while !bytes.is_empty() {
        let sort = take(&mut bytes)?;
        let row = take(&mut bytes)?;
        out.push(Entry { sort, row });
    }
    Ok(())
}

#[async_trait]
impl Operator for TopNOperator {
    async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.max_parallelism = ctx.max_parallelism;
        let state = ctx.keyed_state()?;
        self.table = Some(state.table(TOP_STATE));
        if self.updating {
            self.rows_table = Some(state.table(ROWS_STATE));
        }
        Ok(())
    }

    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        if self.updating {
            return self.process_changes(batch, out).await;
        }
        let Some(table) = self.table.as_ref() else {
            return Err(Error::Internal("top_n used before `open`".into()));
        };
        self.key_encoder.encode(&batch, &mut self.keys)?;
        let sort_input: Vec<ArrayRef> = self
            .sort_columns
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        let sorts = self.sort_converter.convert_columns(&sort_input)?;
        let rows = self.row_converter.convert_columns(batch.columns())?;
        // The batch's rows per key.
        let mut slot_of: HashMap<&[u8], usize, Hasher> = HashMap::default();
        let mut first: Vec<usize> = Vec::new();
        let mut candidates: Vec<Vec<Entry>> = Vec::new();
        for row in 0..batch.num_rows() {
            let key = self.keys.row(row);
            let slot = *slot_of.entry(key).or_insert_with(|| {
                first.push(row);
                candidates.push(Vec::new());
                first.len() - 1
            });
            candidates[slot].push(Entry {
                sort: sorts.row(row).as_ref().to_vec(),
                row: rows.row(row).as_ref().to_vec(),
            });
        }
        let state_keys: Vec<Bytes> = first
            .iter()
            .map(|&row| {
                let key = self.keys.row(row);
                table.key(key_group_of(key, self.max_parallelism), key, &[])
            })
            .collect();
        let stored = table.get_many(&state_keys).await?;
        let mut olds: Vec<Vec<Entry>> = Vec::with_capacity(first.len());
        let mut news: Vec<Vec<Entry>> = Vec::with_capacity(first.len());
        let mut writes = Vec::new();
        for ((value, state_key), mut candidates) in
            stored.into_iter().zip(state_keys).zip(candidates)
        {
            let mut old = Vec::new();
            if let Some(bytes) = &value {
                decode(bytes, &mut old)?;
            }
            candidates.extend(old.iter().cloned());
            candidates.sort_unstable();
            candidates.truncate(self.limit);
            if candidates != old {
                writes.push(WriteOp::Put {
                    key: state_key,
                    value: encode(&candidates),
                });
            }
            olds.push(old);
            news.push(candidates);
        }
        if writes.is_empty() {
            return Ok(());
        }
        table.write(writes).await?;
        self.emit(&olds, &news, out)
    }
}

impl TopNOperator {
    /// Emits the changes from each key's old top to its new one.
    fn emit(&self, olds: &[Vec<Entry>], news: &[Vec<Entry>], out: &mut Output) -> Result<()> {
        let mut changes = Vec::new();
        for (old, new) in olds.iter().zip(news) {
            self.diff(old, new, &mut changes);
        }
        if changes.is_empty() {
            return Ok(());
        }
        let parser = self.row_converter.parser();
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        let kinds: Vec<RowKind> = changes.iter().map(|c| c.0).collect();
        columns.push(changelog::op_array(&kinds));
        columns.extend(
            self.row_converter
                .convert_rows(changes.iter().map(|c| parser.parse(c.1)))?,
        );
        if self.rank {
            columns.push(Arc::new(Int64Array::from_iter_values(
                changes.iter().map(|c| c.2),
            )));
        }
        out.batch(RecordBatch::try_new(self.schema.clone(), columns)?);
        Ok(())
    }

    /// A batch of an updating input: each row's count in `rows` goes up or down, and
    /// each key's top is read again from its first N live rows.
    async fn process_changes(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let (Some(table), Some(rows_table)) = (self.table.as_ref(), self.rows_table.as_ref())
        else {
            return Err(Error::Internal("top_n used before `open`".into()));
        };
        let signs = changelog::signs(batch.column(0))
            .ok_or_else(|| Error::Internal("an updating input's `op` is not text".into()))?;
        let data = batch.project(&(1..batch.num_columns()).collect::<Vec<_>>())?;
        self.key_encoder.encode(&data, &mut self.keys)?;
        let sort_input: Vec<ArrayRef> = self
            .sort_columns
            .iter()
            .map(|&i| data.column(i).clone())
            .collect();
        let sorts = self.sort_converter.convert_columns(&sort_input)?;
        let rows = self.row_converter.convert_columns(data.columns())?;
        // Per key, the change of each distinct (sort, row)'s count.
        let mut slot_of: HashMap<&[u8], usize, Hasher> = HashMap::default();
        let mut first: Vec<usize> = Vec::new();
        let mut deltas: HashMap<SlotEntry<'_>, i64, Hasher> = HashMap::default();
        for (row, sign) in signs.iter().enumerate() {
            let key = self.keys.row(row);
            let slot = *slot_of.entry(key).or_insert_with(|| {
                first.push(row);
                first.len() - 1
            });
            *deltas
                .entry((slot, sorts.row(row).data(), rows.row(row).data()))
                .or_default() += sign;
        }
        let mut changed: Vec<(SlotEntry<'_>, i64)> =
            deltas.into_iter().filter(|(_, d)| *d != 0).collect();
        if changed.is_empty() {
            return Ok(());
        }
        changed.sort_unstable();
        let group = |slot: usize| {
            let key = self.keys.row(first[slot]);
            (key_group_of(key, self.max_parallelism), key)
        };
        let count_keys: Vec<Bytes> = changed
            .iter()
            .map(|((slot, sort, row), _)| {
                let (kg, key) = group(*slot);
                rows_table.key(kg, key, &[*sort, *row].concat())
            })
            .collect();
        let counts = rows_table.get_many(&count_keys).await?;
        let mut writes = Vec::with_capacity(changed.len());
        for ((((_, sort, _), delta), state_key), stored) in
            changed.iter().zip(count_keys).zip(counts)
        {
            let before = match &stored {
                Some(v) => decode_count(v)?.0,
                None => 0,
            };
            // A retraction of a row never kept (its addition expired or came before a
            // restore from a checkpoint without it) takes nothing back.
            let after = (before as i64).saturating_add(*delta).max(0) as u64;
            if after == before {
                continue;
            }
            writes.push(match after {
                0 => WriteOp::Delete { key: state_key },
                n => WriteOp::Put {
                    key: state_key,
                    value: encode_count(n, sort.len()),
                },
            });
        }
        if writes.is_empty() {
            return Ok(());
        }
        rows_table.write(writes).await?;
        let mut slots: Vec<usize> = changed.iter().map(|((slot, _, _), _)| *slot).collect();
        slots.dedup();
        let top_keys: Vec<Bytes> = slots
            .iter()
            .map(|&slot| {
                let (kg, key) = group(slot);
                table.key(kg, key, &[])
            })
            .collect();
        let stored = table.get_many(&top_keys).await?;
        let mut olds = Vec::with_capacity(slots.len());
        let mut news = Vec::with_capacity(slots.len());
        let mut writes = Vec::new();
        for ((&slot, state_key), value) in slots.iter().zip(top_keys).zip(stored) {
            let mut old = Vec::new();
            if let Some(bytes) = &value {
                decode(bytes, &mut old)?;
            }
            let (kg, key) = group(slot);
            let mut new = Vec::with_capacity(self.limit);
            for live in rows_table.first_of_key(kg, key, self.limit).await? {
                let (count, sort_len) = decode_count(&live.value)?;
                let (sort, row) = live
                    .namespace
                    .split_at_checked(sort_len)
                    .ok_or_else(|| Error::Internal("Top-N state is truncated".into()))?;
                let take = (count as usize).min(self.limit - new.len());
                new.extend(std::iter::repeat_n(
                    Entry {
                        sort: sort.to_vec(),
                        row: row.to_vec(),
                    },
                    take,
                ));
                if new.len() == self.limit {
                    break;
                }
            }
            if new != old {
                writes.push(match new.is_empty() {
                    true => WriteOp::Delete { key: state_key },
                    false => WriteOp::Put {
                        key: state_key,
                        value: encode(&new),
                    },
                });
            }
            olds.push(old);
            news.push(new);
        }
        table.write(writes).await?;
        self.emit(&olds, &news, out)
    }
}

/// A live row's value in `rows`: its count, then the length of its sort key.
fn encode_count(count: u64, sort_len: usize) -> Bytes {
    let mut out = Vec::with_capacity(12);
    out.put_u64(count);
    out.put_u32(sort_len as u32);
    Bytes::from(out)
}

fn decode_count(bytes: &[u8]) -> Result<(u64, usize)> {
    let corrupt = || Error::Internal("Top-N state is truncated".into());
    let (count, rest) = bytes.split_first_chunk::<8>().ok_or_else(corrupt)?;
    let (len, _) = rest.split_first_chunk::<4>().ok_or_else(corrupt)?;
    Ok((
        u64::from_be_bytes(*count),
        u32::from_be_bytes(*len) as usize,
    ))
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, StringArray};
    use arrow::datatypes::Int64Type;
    use sluice_common::key_group::key_group_range;
    use sluice_common::state::{MemoryStateStore, StateStore};

    use super::*;
    use crate::element::StreamElement;
    use crate::keyed::OperatorState;

    fn input() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]))
    }

    fn batch(rows: &[(i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            input(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| format!("s{}", r.1)),
                )),
            ],
        )
        .unwrap()
    }

    fn spec(limit: u32, rank: &str) -> pb::TopNSpec {
        pb::TopNSpec {
            partition_columns: vec!["k".into()],
            order_by: vec![pb::SortKey {
                column: "v".into(),
                descending: true,
                nulls_first: false,
            }],
            limit,
            rank_column: rank.into(),
        }
    }

    async fn top_n(
        spec: &pb::TopNSpec,
        store: Arc<dyn StateStore>,
        subtask: u32,
        parallelism: u32,
    ) -> (TopNOperator, OperatorState) {
        top_n_over(spec, &input(), store, subtask, parallelism).await
    }

    /// The Top-N of `spec` over `input` rows, open on `store`.
    async fn top_n_over(
        spec: &pb::TopNSpec,
        input: &SchemaRef,
        store: Arc<dyn StateStore>,
        subtask: u32,
        parallelism: u32,
    ) -> (TopNOperator, OperatorState) {
        let mut op = TopNOperator::build(spec, input).unwrap();
        let state = OperatorState::new(
            store,
            5,
            key_group_range(128, parallelism, subtask),
            1,
            true,
        );
        let ctx = OperatorContext {
            node_id: 5,
            node_name: "top_n".into(),
            subtask: subtask as usize,
            parallelism: parallelism as usize,
            max_parallelism: 128,
            state: Some(state.clone()),
        };
        op.open(&ctx).await.unwrap();
        (op, state)
    }

    /// `(op, k, v, rank or 0)` of everything emitted, in order.
    fn changes(out: &Output) -> Vec<(String, i64, i64, i64)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let op = b.column(0).as_string::<i32>();
                let k = b.column(1).as_primitive::<Int64Type>();
                let v = b.column(2).as_primitive::<Int64Type>();
                let s = b.column(3).as_string::<i32>();
                let rank = (b.num_columns() == 5).then(|| b.column(4).as_primitive::<Int64Type>());
                for r in 0..b.num_rows() {
                    assert_eq!(
                        s.value(r),
                        format!("s{}", v.value(r)),
                        "whole rows come back"
                    );
                    let rank = rank.map_or(0, |a| a.value(r));
                    rows.push((op.value(r).to_owned(), k.value(r), v.value(r), rank));
                }
            }
        }
        rows
    }

    fn c(op: &str, k: i64, v: i64, rank: i64) -> (String, i64, i64, i64) {
        (op.to_owned(), k, v, rank)
    }

    #[tokio::test]
    async fn rows_enter_and_leave_the_top_as_inserts_and_deletes() {
        let store = Arc::new(MemoryStateStore::new(false));
        let (mut op, _) = top_n(&spec(2, ""), store, 0, 1).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 10), (1, 5), (2, 7), (1, 1)]), &mut out)
            .await
            .unwrap();
        op.process_batch(batch(&[(1, 8), (1, 2)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            vec![
                c("+I", 1, 10, 0),
                c("+I", 1, 5, 0),
                c("+I", 2, 7, 0),
                c("+I", 1, 8, 0),
                c("-D", 1, 5, 0),
            ]
        );
    }

    #[tokio::test]
    async fn with_ranks_every_shifted_rank_is_updated() {
        let store = Arc::new(MemoryStateStore::new(false));
        let (mut op, _) = top_n(&spec(2, "rn"), store, 0, 1).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 5)]), &mut out).await.unwrap();
        op.process_batch(batch(&[(1, 9)]), &mut out).await.unwrap();
        op.process_batch(batch(&[(1, 1)]), &mut out).await.unwrap();
        assert_eq!(
            changes(&out),
            vec![
                c("+I", 1, 5, 1),
                c("-U", 1, 5, 1),
                c("+U", 1, 9, 1),
                c("+I", 1, 5, 2),
            ],
            "a 1 below the top two changes nothing"
        );
    }

    #[tokio::test]
    async fn the_top_continues_from_a_checkpoint_at_another_parallelism() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(true));
        let spec = spec(1, "");
        let (mut op, state) = top_n(&spec, store.clone(), 0, 1).await;
        op.process_batch(batch(&[(1, 10), (2, 20)]), &mut Output::default())
            .await
            .unwrap();
        state.seal(1).await.unwrap();
        store.commit(1, &[1]).await.unwrap();
        op.process_batch(batch(&[(1, 99)]), &mut Output::default())
            .await
            .unwrap();
        drop(op);
        store.restore(1, 2).await.unwrap();
        let mut out = Output::default();
        for subtask in 0..2 {
            let (mut op, _) = top_n(&spec, store.clone(), subtask, 2).await;
            let mine: Vec<_> = [(1, 11), (2, 15)]
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
        // 99 was lost with the failure: 11 beats the 10 kept; 15 does not beat 20.
        assert_eq!(got, vec![c("+I", 1, 11, 0), c("-D", 1, 10, 0)]);
    }

    fn changelog_input() -> SchemaRef {
        let mut fields = vec![changelog::op_field()];
        fields.extend(input().fields().iter().map(|f| f.as_ref().clone()));
        Arc::new(Schema::new(fields))
    }

    /// A batch of changes `(op, k, v)`.
    fn changes_batch(rows: &[(&str, i64, i64)]) -> RecordBatch {
        let plain = batch(&rows.iter().map(|r| (r.1, r.2)).collect::<Vec<_>>());
        let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0),
        ))];
        columns.extend(plain.columns().iter().cloned());
        RecordBatch::try_new(changelog_input(), columns).unwrap()
    }

    async fn updating_top_n(spec: &pb::TopNSpec) -> TopNOperator {
        let store = Arc::new(MemoryStateStore::new(false));
        top_n_over(spec, &changelog_input(), store, 0, 1).await.0
    }

    #[tokio::test]
    async fn over_a_changelog_a_retracted_row_gives_its_place_to_the_next() {
        let mut op = updating_top_n(&spec(2, "")).await;
        assert_eq!(
            op.schema().fields().len(),
            4,
            "op, k, v, s: the input's op is not a column twice"
        );
        let mut out = Output::default();
        op.process_batch(
            changes_batch(&[("+I", 1, 10), ("+I", 1, 5), ("+I", 1, 3), ("+I", 2, 7)]),
            &mut out,
        )
        .await
        .unwrap();
        // 10 is updated to 4: 5 and 4 are the top two.
        op.process_batch(changes_batch(&[("-U", 1, 10), ("+U", 1, 4)]), &mut out)
            .await
            .unwrap();
        // 5 is deleted: 3 comes back into the top from below it.
        op.process_batch(changes_batch(&[("-D", 1, 5)]), &mut out)
            .await
            .unwrap();
        // A row never added takes nothing back; an add and its retraction in one batch
        // say nothing.
        op.process_batch(
            changes_batch(&[("-D", 1, 99), ("+I", 1, 50), ("-D", 1, 50)]),
            &mut out,
        )
        .await
        .unwrap();
        // Key 2 loses its only row.
        op.process_batch(changes_batch(&[("-D", 2, 7)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            vec![
                c("+I", 1, 10, 0),
                c("+I", 1, 5, 0),
                c("+I", 2, 7, 0),
                c("-D", 1, 10, 0),
                c("+I", 1, 4, 0),
                c("-D", 1, 5, 0),
                c("+I", 1, 3, 0),
                c("-D", 2, 7, 0),
            ]
        );
    }

    #[tokio::test]
    async fn over_a_changelog_duplicates_count_and_ranks_move_up() {
        let mut op = updating_top_n(&spec(3, "rn")).await;
        let mut out = Output::default();
        op.process_batch(
            changes_batch(&[("+I", 1, 9), ("+I", 1, 9), ("+I", 1, 2), ("+I", 1, 1)]),
            &mut out,
        )
        .await
        .unwrap();
        // One of the two 9s goes: 2 and 1 move up a rank.
        op.process_batch(changes_batch(&[("-D", 1, 9)]), &mut out)
            .await
            .unwrap();
        assert_eq!(
            changes(&out),
            vec![
                c("+I", 1, 9, 1),
                c("+I", 1, 9, 2),
                c("+I", 1, 2, 3),
                c("-U", 1, 9, 2),
                c("+U", 1, 2, 2),
                c("-U", 1, 2, 3),
                c("+U", 1, 1, 3),
            ]
        );
    }

    #[test]
    fn state_that_does_not_decode_is_an_error_not_a_panic() {
        let entries = vec![Entry {
            sort: vec![1, 2],
            row: vec![3],
        }];
        let bytes = encode(&entries);
        let mut back = Vec::new();
        decode(&bytes, &mut back).unwrap();
        assert_eq!(back, entries);
        for cut in 1..bytes.len() {
            assert!(
                decode(&bytes[..cut], &mut Vec::new()).is_err(),
                "cut at {cut}"
            );
        }
        let count = encode_count(7, 3);
        assert_eq!(decode_count(&count).unwrap(), (7, 3));
        assert!(decode_count(&count[..11]).is_err());
    }
}
