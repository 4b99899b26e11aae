//! `over`: OVER aggregates (Flink's over aggregation) on an append-only input. Per
//! partition key, in event-time order, each row is written once the watermark passes its
//! time, with aggregates over a frame of the key's rows that ends at it:
//! `ROWS BETWEEN n PRECEDING AND CURRENT ROW` (the row and the n before it),
//! `RANGE BETWEEN INTERVAL 'd' PRECEDING AND CURRENT ROW` (the rows of the last d of
//! event time, the row's peers of the same time included), or either from
//! `UNBOUNDED PRECEDING`.
//!
//! # Order and lateness
//! Rows wait until the watermark passes their time, so that the frame of each
//! holds exactly the rows before it in event time. Rows of one time go in the order they
//! arrived (a ROWS frame counts them one by one; a RANGE frame takes them together). A
//! row at or before the watermark when it arrives is late: it is dropped and counted, as
//! Flink drops it. The output is append-only: the input's columns, then the aggregates.
//!
//! # State
//! Between barriers the operator works in memory: arriving rows wait in `buffered`, and
//! the frames it read or wrote stay in its cache. A barrier moves both to state, so that
//! rows written before the next barrier never touch it (as timers that fire before one
//! never do); more rows, or frames, than half the cache budget each go to state at once.
//! - `pending`: rows waiting for the watermark, under their key and time, each framed
//!   with its own accumulators, appended with `Merge` (a write reads nothing).
//! - `frame`: per key, the time of the last row written and the frame's entries (a time
//!   and accumulators: one per row for ROWS, per time for RANGE, one running total from
//!   UNBOUNDED PRECEDING). In memory a frame also keeps a running total per call: an
//!   entry leaving is taken out of a count or an integer sum or average, and a MIN or MAX
//!   is merged again from the entries only when the entry holding it leaves.
//! - `timers`: one per key and pending time, and for a bounded RANGE frame one at which
//!   its oldest entry leaves it, so a key that goes quiet leaves no frame behind. ROWS and
//!   unbounded frames stay, as Flink's do without a state TTL.
//! - `watermark`: the watermark per key group at each barrier, so that a row late before
//!   a restore is late after it.
//!
//! The operator knows nothing of SQL: the planner gives it columns, calls and a frame.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::Int64Array;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow_row::{RowConverter, SortField};
use async_trait::async_trait;
use bytes::{BufMut, Bytes};
use sluice_common::key_group::key_group_of;
use sluice_common::pb;
use sluice_common::state::{StateTable, WriteOp};

use super::window::{WindowCounters, event_times};
use super::{Operator, OperatorContext, Output};
use crate::element::{Barrier, Timestamp};
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::expr::aggregate::{AggFunc, AggregateCall, ArgKind};
use crate::keyed::KeyedTimers;
use crate::keyed::timers::time_key;
use crate::keys::{EncodedKeys, KeyEncoder};
use crate::window::accumulator::{self, ACC_BYTES, Acc};

const PENDING_STATE: &str = "pending";
const FRAME_STATE: &str = "frame";
const TIMER_STATE: &str = "timers";
const WATERMARK_STATE: &str = "watermark";

/// Hashes short keys of one batch: keys come from the job's own data.
type Hasher = foldhash::fast::RandomState;

/// Which rows before the current one its aggregates cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// `ROWS BETWEEN n PRECEDING AND CURRENT ROW`.
    Rows(usize),
    /// `RANGE BETWEEN INTERVAL ms PRECEDING AND CURRENT ROW`.
    Range(i64),
    /// `ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW`.
    AllRows,
    /// `RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW`, SQL's default.
    AllRange,
}

impl Frame {
    /// Whether rows of one time are peers, each in the others' frames.
    fn by_range(self) -> bool {
        matches!(self, Frame::Range(_) | Frame::AllRange)
    }
}

/// The OVER aggregate of one subtask.
pub struct OverOperator {
    key_encoder: KeyEncoder,
    keys: EncodedKeys,
    time_index: usize,
    calls: Vec<AggregateCall>,
    frame: Frame,
    rows: RowConverter,
    schema: SchemaRef,
    counters: Arc<WindowCounters>,
    max_parallelism: u32,
    watermark: Timestamp,
    state: Option<OverState>,
    /// Rows that arrived since the last barrier, waiting for the watermark; a barrier
    /// moves them to `pending` (rows written before the next never touch state).
    buffered: Buffered,
    buffered_bytes: usize,
    /// Frames read or written since they were last evicted; changed ones go to state at
    /// a barrier, or all at once when they outgrow `cache_budget`.
    frames: HashMap<Bytes, CachedFrame, Hasher>,
    frame_bytes: usize,
    cache_budget: usize,
}

/// What the operator keeps, once open.
struct OverState {
    pending: StateTable,
    frames: StateTable,
    watermarks: StateTable,
    timers: KeyedTimers,
    key_groups: Range<u32>,
}

/// Rows waiting for the watermark in memory: per time, per key its group and rows
/// (framed as in `pending`).
type Buffered = BTreeMap<Timestamp, HashMap<Bytes, (u16, Vec<u8>), Hasher>>;

/// A key with rows due at a firing.
struct DueKey {
    group: u16,
    key: Bytes,
    times: BTreeMap<Timestamp, DueRows>,
}

impl DueKey {
    /// The index of `key` in `keys`, added when new.
    fn slot(
        index: &mut HashMap<Bytes, usize, Hasher>,
        keys: &mut Vec<DueKey>,
        group: u16,
        key: Bytes,
    ) -> usize {
        *index.entry(key.clone()).or_insert_with(|| {
            keys.push(DueKey {
                group,
                key,
                times: BTreeMap::new(),
            });
            keys.len() - 1
        })
    }
}

/// Where a due key's rows of one time are: in `pending` (they came before the last
/// barrier), in memory, or both (state's first).
#[derive(Default)]
struct DueRows {
    in_state: bool,
    in_memory: Vec<u8>,
}

/// A key's frame as the operator holds it between barriers.
#[derive(Default)]
struct CachedFrame {
    group: u16,
    /// `None`: the frame is gone (a RANGE frame whose entries all left it).
    frame: Option<KeyFrame>,
    /// Changed since state last had it.
    dirty: bool,
    /// Bytes it holds, roughly.
    size: usize,
}

impl CachedFrame {
    /// A frame read from state (clean).
    fn new(group: u16, frame: Option<KeyFrame>, key_len: usize) -> Self {
        Self {
            group,
            size: Self::size_of(frame.as_ref(), key_len),
            frame,
            dirty: false,
        }
    }

    /// Roughly the bytes a cached frame holds.
    fn size_of(frame: Option<&KeyFrame>, key_len: usize) -> usize {
        let entries = frame.map_or(0, |f| {
            f.entries.len() * 8 + f.entries.accs.len() * ACC_BYTES
        });
        96 + key_len + entries
    }
}

/// One key's frame as state holds it between firings.
#[derive(Debug, Default)]
struct KeyFrame {
    /// Time of the last row written; rows at or before it are late.
    last: Option<Timestamp>,
    /// Entries, oldest first: a time and one accumulator per call.
    entries: Entries,
}

fn not_open() -> Error {
    Error::Internal("an OVER aggregate used before `open`".into())
}

fn corrupt(what: &str) -> Error {
    Error::Internal(format!("corrupt OVER aggregate state: {what}"))
}

impl OverOperator {
    /// Builds the operator over `input`; errors name the column or call at fault.
    pub fn build(
        spec: &pb::OverSpec,
        input: &SchemaRef,
        compiler: &ExprCompiler,
        counters: Arc<WindowCounters>,
    ) -> Result<Self> {
        let col = &spec.time_column;
        let time_index = input.index_of(col).map_err(|_| {
            Error::Plan(format!(
                "the OVER aggregate's time column `{col}` is not in its input"
            ))
        })?;
        match input.field(time_index).data_type() {
            DataType::Timestamp(_, _) | DataType::Int64 => {}
            other => {
                return Err(Error::Plan(format!(
                    "the OVER aggregate orders by `{col}`, of type {other}; it needs an event \
                     time (a timestamp)"
                )));
            }
        }
        if spec.aggregates.is_empty() {
            return Err(Error::Plan(
                "an OVER aggregate needs at least one aggregate call".into(),
            ));
        }
        let calls = spec
            .aggregates
            .iter()
            .map(|e| AggregateCall::compile(compiler, &e.sql, input))
            .collect::<Result<Vec<_>>>()?;
        if let Some(call) = calls.iter().find(|c| c.distinct) {
            return Err(Error::Plan(format!(
                "`{}`: COUNT(DISTINCT ...) OVER (...) is not supported by Sluice's OVER \
                 aggregates",
                call.name
            )));
        }
        let range = spec.unit() == pb::OverFrameUnit::Range;
        let frame = match (range, spec.unbounded) {
            (false, true) => Frame::AllRows,
            (true, true) => Frame::AllRange,
            (false, false) => Frame::Rows(usize::try_from(spec.preceding).map_err(|_| {
                Error::Plan(format!("{} PRECEDING rows is too many", spec.preceding))
            })?),
            (true, false) => Frame::Range(spec.preceding.min(i64::MAX as u64 / 4) as i64),
        };
        let key_encoder = KeyEncoder::new(input, &spec.partition_columns)?;
        let rows = RowConverter::new(
            input
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?;
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        for call in &calls {
            let nullable = !matches!(call.func, AggFunc::Count | AggFunc::CountStar);
            fields.push(Field::new(&call.name, call.output_type.clone(), nullable));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = fields.iter().find(|f| !seen.insert(f.name().clone())) {
            return Err(Error::Plan(format!(
                "OVER aggregate output column `{}` appears twice; rename the aggregate with AS",
                dup.name()
            )));
        }
        Ok(Self {
            key_encoder,
            keys: EncodedKeys::default(),
            time_index,
            calls,
            frame,
            rows,
            schema: Arc::new(Schema::new(fields)),
            counters,
            max_parallelism: sluice_common::DEFAULT_MAX_PARALLELISM,
            watermark: Timestamp::MIN,
            state: None,
            buffered: BTreeMap::new(),
            buffered_bytes: 0,
            frames: HashMap::default(),
            frame_bytes: 0,
            cache_budget: usize::MAX,
        })
    }

    /// The output schema: the input's columns, then one per aggregate.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The event times of `batch`, in milliseconds.
    fn times(&self, batch: &RecordBatch) -> Result<Int64Array> {
        event_times(batch.column(self.time_index), "OVER aggregate input")
    }

    /// Writes every waiting row of a time up to `to`, per key in time order.
    async fn fire(&mut self, to: Timestamp, out: &mut Output) -> Result<()> {
        let state = self.state.as_mut().ok_or_else(not_open)?;
        let due_in_state = state.timers.pop_due(to);
        let due_in_memory = match to.checked_add(1) {
            Some(next) => {
                let later = self.buffered.split_off(&next);
                std::mem::replace(&mut self.buffered, later)
            }
            None => std::mem::take(&mut self.buffered),
        };
        if due_in_state.is_empty() && due_in_memory.is_empty() {
            return Ok(());
        }
        // Each key once, with its due times in order and where each time's rows are.
        let mut index: HashMap<Bytes, usize, Hasher> = HashMap::default();
        let mut keys: Vec<DueKey> = Vec::new();
        for (at, group, key) in due_in_state {
            let i = DueKey::slot(&mut index, &mut keys, group, key);
            keys[i].times.entry(at).or_default().in_state = true;
        }
        for (at, rows) in due_in_memory {
            self.buffered_bytes = self
                .buffered_bytes
                .saturating_sub(rows.values().map(|(_, r)| r.len()).sum());
            for (key, (group, rows)) in rows {
                let i = DueKey::slot(&mut index, &mut keys, group, key);
                keys[i].times.entry(at).or_default().in_memory = rows;
            }
        }
        let mut pending_keys = Vec::new();
        for k in &keys {
            for (at, _) in k.times.iter().filter(|(_, t)| t.in_state) {
                pending_keys.push(state.pending.key(k.group, &k.key, &time_key(*at)));
            }
        }
        let uncached: Vec<usize> = (0..keys.len())
            .filter(|i| !self.frames.contains_key(&keys[*i].key))
            .collect();
        let frame_keys: Vec<Bytes> = uncached
            .iter()
            .map(|i| state.frames.key(keys[*i].group, &keys[*i].key, &[]))
            .collect();
        let pending = state.pending.get_many(&pending_keys).await?;
        let stored_frames = state.frames.get_many(&frame_keys).await?;
        let ncalls = self.calls.len();
        for (i, value) in uncached.into_iter().zip(stored_frames) {
            let k = &keys[i];
            let frame = decode_frame(value.as_deref(), ncalls)?;
            let cached = CachedFrame::new(k.group, Some(frame), k.key.len());
            self.frame_bytes += cached.size;
            self.frames.insert(k.key.clone(), cached);
        }
        let mut written: Vec<&[u8]> = Vec::new();
        let mut results: Vec<Vec<Acc>> = vec![Vec::new(); ncalls];
        let mut scratch = (Vec::with_capacity(ncalls), Vec::with_capacity(ncalls));
        let mut late = 0u64;
        let mut next = pending.iter();
        for k in &keys {
            let cached = self
                .frames
                .get_mut(&k.key)
                .ok_or_else(|| Error::Internal("an OVER frame left its cache".into()))?;
            let mut frame = cached.frame.take().unwrap_or_default();
            for (at, where_) in &k.times {
                let from_state = match where_.in_state {
                    true => next.next().and_then(|v| v.as_deref()),
                    false => None,
                };
                let mut rows = match from_state {
                    Some(value) => decode_rows(value, ncalls)?,
                    None => Vec::new(),
                };
                rows.extend(decode_rows(&where_.in_memory, ncalls)?);
                if rows.is_empty() {
                    continue; // a frame's cleanup timer: no rows of this time
                }
                if frame.last.is_some_and(|last| *at <= last) {
                    late += rows.len() as u64; // before a restore, written already
                    continue;
                }
                advance(
                    &self.calls,
                    self.frame,
                    &mut frame,
                    *at,
                    &rows,
                    &mut scratch,
                    &mut written,
                    &mut results,
                )?;
            }
            if let Frame::Range(preceding) = self.frame {
                // Later rows are after `to`: an entry at `to - preceding` or before is out
                // of every frame to come.
                let oldest_kept = to.saturating_sub(preceding);
                while frame.entries.front_time().is_some_and(|t| t <= oldest_kept) {
                    frame.entries.pop_front(&self.calls);
                }
                if let Some(t) = frame.entries.front_time() {
                    let at = t.saturating_add(preceding);
                    state.timers.register(at, k.group, k.key.clone());
                }
            }
            let gone = matches!(self.frame, Frame::Range(_)) && frame.entries.is_empty();
            let size = CachedFrame::size_of((!gone).then_some(&frame), k.key.len());
            self.frame_bytes = (self.frame_bytes + size).saturating_sub(cached.size);
            cached.size = size;
            cached.dirty = true;
            cached.frame = (!gone).then_some(frame);
        }
        let deletes: Vec<WriteOp> = pending_keys
            .into_iter()
            .zip(&pending)
            .filter(|(_, v)| v.is_some())
            .map(|(key, _)| WriteOp::Delete { key })
            .collect();
        if late > 0 {
            self.counters
                .late_records
                .fetch_add(late, Ordering::Relaxed);
        }
        if !written.is_empty() {
            let parser = self.rows.parser();
            let mut columns = self
                .rows
                .convert_rows(written.iter().map(|r| parser.parse(r)))?;
            for (call, accs) in self.calls.iter().zip(&results) {
                columns.push(accumulator::finish(call, accs.iter())?);
            }
            out.batch(RecordBatch::try_new(self.schema.clone(), columns)?);
        }
        state.pending.write(deletes).await?;
        if self.frame_bytes > self.cache_budget {
            self.flush_frames(true).await?;
        }
        Ok(())
    }

    /// Writes the frames changed since they were read to state; `evict` empties the
    /// cache too (it outgrew its budget).
    async fn flush_frames(&mut self, evict: bool) -> Result<()> {
        let state = self.state.as_mut().ok_or_else(not_open)?;
        let mut ops = Vec::new();
        for (key, cached) in self.frames.iter_mut().filter(|(_, c)| c.dirty) {
            let key = state.frames.key(cached.group, key, &[]);
            ops.push(match &cached.frame {
                Some(frame) => WriteOp::Put {
                    key,
                    value: encode_frame(frame, self.calls.len()),
                },
                None => WriteOp::Delete { key },
            });
            cached.dirty = false;
        }
        state.frames.write(ops).await?;
        if evict {
            self.frames.clear();
            self.frame_bytes = 0;
        } else {
            // A deleted frame stays deleted in state: nothing to keep for it.
            self.frames.retain(|_, c| c.frame.is_some());
        }
        Ok(())
    }

    /// Moves the rows waiting in memory to the `pending` table, each time and key with a
    /// timer, so that the state as of a barrier holds them.
    async fn persist_buffered(&mut self) -> Result<()> {
        let state = self.state.as_mut().ok_or_else(not_open)?;
        let mut ops = Vec::new();
        for (at, rows) in std::mem::take(&mut self.buffered) {
            for (key, (group, rows)) in rows {
                ops.push(WriteOp::Merge {
                    key: state.pending.key(group, &key, &time_key(at)),
                    operand: Bytes::from(rows),
                });
                state.timers.register(at, group, key);
            }
        }
        self.buffered_bytes = 0;
        state.pending.write(ops).await?;
        Ok(())
    }
}

/// Moves `frame` on by the rows of time `at` (in arrival order: each a row and its
/// accumulators' bytes), recording each row and its aggregates. `scratch` holds two
/// rows of accumulators for the duration.
#[allow(clippy::too_many_arguments)]
fn advance<'a>(
    calls: &[AggregateCall],
    kind: Frame,
    frame: &mut KeyFrame,
    at: Timestamp,
    rows: &[(&'a [u8], &[u8])],
    scratch: &mut (Vec<Acc>, Vec<Acc>),
    written: &mut Vec<&'a [u8]>,
    results: &mut [Vec<Acc>],
) -> Result<()> {
    let n = calls.len();
    let (row_accs, total) = scratch;
    frame.last = Some(at);
    if kind.by_range() {
        // Peers: every row of this time is in each one's frame.
        let mut peers = vec![Acc::default(); n];
        for (_, accs) in rows {
            row_accs.clear();
            accumulator::decode(accs, n, row_accs)?;
            merge(calls, &mut peers, row_accs);
        }
        match kind {
            Frame::AllRange if !frame.entries.is_empty() => {
                frame.entries.merge_into_first(calls, at, &peers);
            }
            _ => {
                if let Frame::Range(preceding) = kind {
                    let first = at.saturating_sub(preceding);
                    while frame.entries.front_time().is_some_and(|t| t < first) {
                        frame.entries.pop_front(calls);
                    }
                }
                frame.entries.push(calls, at, &peers);
            }
        }
        frame.entries.total(calls, total);
        for (row, _) in rows {
            written.push(row);
            for (c, acc) in total.iter().enumerate() {
                results[c].push(*acc);
            }
        }
        return Ok(());
    }
    for (row, accs) in rows {
        row_accs.clear();
        accumulator::decode(accs, n, row_accs)?;
        match kind {
            Frame::AllRows if !frame.entries.is_empty() => {
                frame.entries.merge_into_first(calls, at, row_accs);
            }
            Frame::Rows(preceding) => {
                frame.entries.push(calls, at, row_accs);
                while frame.entries.len() > preceding.saturating_add(1) {
                    frame.entries.pop_front(calls);
                }
            }
            _ => frame.entries.push(calls, at, row_accs),
        }
        written.push(row);
        frame.entries.total(calls, total);
        for (c, acc) in total.iter().enumerate() {
            results[c].push(*acc);
        }
    }
    Ok(())
}

/// Merges one entry's accumulators into `into`.
fn merge(calls: &[AggregateCall], into: &mut [Acc], accs: &[Acc]) {
    for ((call, a), b) in calls.iter().zip(into.iter_mut()).zip(accs) {
        accumulator::merge(call.func, call.arg_kind, a, b);
    }
}

/// A frame's entries, oldest first: a time and one accumulator per call each (the
/// accumulators flat, so that an entry allocates nothing), and the running total over
/// them per call while it is known.
#[derive(Debug, Default)]
struct Entries {
    times: VecDeque<Timestamp>,
    accs: VecDeque<Acc>,
    /// Per call, the merge of every entry's accumulator, where `known` says so.
    total: Vec<Acc>,
    /// Per call, whether `total` holds it (empty: none does). An entry leaving takes its
    /// part out of a count or an integer sum or average; it makes a MIN or MAX unknown
    /// only when it held the extreme, and anything else always (recomputed when asked).
    known: Vec<bool>,
}

/// Whether an entry leaving can be taken out of `call`'s running total exactly.
fn subtracts(call: &AggregateCall) -> bool {
    match call.func {
        AggFunc::CountStar | AggFunc::Count => true,
        AggFunc::Sum | AggFunc::Avg => call.arg_kind != ArgKind::Float,
        AggFunc::Min | AggFunc::Max | AggFunc::Udf(_) => false,
    }
}

impl Entries {
    fn len(&self) -> usize {
        self.times.len()
    }

    fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    fn front_time(&self) -> Option<Timestamp> {
        self.times.front().copied()
    }

    fn push(&mut self, calls: &[AggregateCall], at: Timestamp, accs: &[Acc]) {
        self.times.push_back(at);
        self.accs.extend(accs.iter().copied());
        for (c, acc) in accs.iter().enumerate() {
            if self.known.get(c).copied().unwrap_or(false) {
                accumulator::merge(calls[c].func, calls[c].arg_kind, &mut self.total[c], acc);
            }
        }
    }

    /// Drops the oldest entry, taking it out of the running totals.
    fn pop_front(&mut self, calls: &[AggregateCall]) {
        if self.times.pop_front().is_none() {
            return;
        }
        let n = calls.len().min(self.accs.len());
        for (c, gone) in self.accs.drain(..n).enumerate() {
            if !self.known.get(c).copied().unwrap_or(false) || gone.n == 0 {
                continue;
            }
            let total = &mut self.total[c];
            let call = &calls[c];
            let extreme = matches!(call.func, AggFunc::Min | AggFunc::Max);
            let float = call.arg_kind == ArgKind::Float;
            if subtracts(call) {
                total.i = total.i.wrapping_sub(gone.i);
                total.f -= gone.f;
                total.n -= gone.n;
            } else if extreme
                && accumulator::ordered_value(&gone, float)
                    != accumulator::ordered_value(total, float)
            {
                total.n -= gone.n; // the extreme is elsewhere
            } else {
                self.known[c] = false;
            }
        }
    }

    /// Merges `accs` into the first entry and gives it time `at` (a running total).
    fn merge_into_first(&mut self, calls: &[AggregateCall], at: Timestamp, accs: &[Acc]) {
        if let Some(t) = self.times.front_mut() {
            *t = at;
        }
        for ((call, a), b) in calls.iter().zip(self.accs.iter_mut()).zip(accs) {
            accumulator::merge(call.func, call.arg_kind, a, b);
        }
        for (c, acc) in accs.iter().enumerate() {
            if self.known.get(c).copied().unwrap_or(false) {
                accumulator::merge(calls[c].func, calls[c].arg_kind, &mut self.total[c], acc);
            }
        }
    }

    /// The aggregates over every entry, into `out`: the running totals, each unknown one
    /// merged again from the entries.
    fn total(&mut self, calls: &[AggregateCall], out: &mut Vec<Acc>) {
        let n = calls.len();
        if self.known.len() != n {
            self.known = vec![false; n];
            self.total = vec![Acc::default(); n];
        }
        for (c, call) in calls.iter().enumerate() {
            if self.known[c] {
                continue;
            }
            let mut acc = Acc::default();
            for entry in self.accs.iter().skip(c).step_by(n.max(1)) {
                accumulator::merge(call.func, call.arg_kind, &mut acc, entry);
            }
            self.total[c] = acc;
            self.known[c] = true;
        }
        out.clear();
        out.extend_from_slice(&self.total);
    }

    /// Each entry's time and accumulators.
    fn iter(&self, n: usize) -> impl Iterator<Item = (Timestamp, impl Iterator<Item = &Acc>)> {
        self.times
            .iter()
            .enumerate()
            .map(move |(i, t)| (*t, self.accs.range(i * n..(i + 1) * n)))
    }
}

/// Appends one pending row: its length, its bytes (Arrow's row format) and its own
/// accumulators.
fn push_row(buf: &mut Vec<u8>, row: &[u8], accs: &[Acc]) {
    buf.put_u32(row.len() as u32);
    buf.extend_from_slice(row);
    accumulator::encode(accs, buf);
}

/// The rows of a `pending` value, in arrival order: each row's bytes and its
/// accumulators' bytes.
fn decode_rows(value: &[u8], ncalls: usize) -> Result<Vec<(&[u8], &[u8])>> {
    let mut rows = Vec::new();
    let mut rest = value;
    while !rest.is_empty() {
        let len = rest
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| corrupt("a row's length is cut short"))?;
        let end = 4 + len + ncalls * ACC_BYTES;
        if rest.len() < end {
            return Err(corrupt("a pending row is cut short"));
        }
        rows.push((&rest[4..4 + len], &rest[4 + len..end]));
        rest = &rest[end..];
    }
    Ok(rows)
}

/// A key's frame as `frame` holds it: a flag and the last time, then entries of a time
/// and the accumulators.
fn encode_frame(frame: &KeyFrame, ncalls: usize) -> Bytes {
    let mut buf = Vec::with_capacity(9 + frame.entries.len() * (8 + ncalls * ACC_BYTES));
    match frame.last {
        Some(last) => {
            buf.put_u8(1);
            buf.put_i64(last);
        }
        None => {
            buf.put_u8(0);
            buf.put_i64(0);
        }
    }
    for (t, accs) in frame.entries.iter(ncalls) {
        buf.put_i64(t);
        for acc in accs {
            accumulator::encode(std::slice::from_ref(acc), &mut buf);
        }
    }
    Bytes::from(buf)
}

fn decode_frame(value: Option<&[u8]>, ncalls: usize) -> Result<KeyFrame> {
    let Some(value) = value else {
        return Ok(KeyFrame::default());
    };
    let word = |b: &[u8]| i64::from_be_bytes(b.try_into().unwrap_or_default());
    if value.len() < 9 {
        return Err(corrupt("a frame is cut short"));
    }
    let last = (value[0] == 1).then(|| word(&value[1..9]));
    let stride = 8 + ncalls * ACC_BYTES;
    let rest = &value[9..];
    if rest.len() % stride != 0 {
        return Err(corrupt("a frame's entries are cut short"));
    }
    let mut entries = Entries::default();
    let mut accs = Vec::with_capacity(ncalls);
    for entry in rest.chunks_exact(stride) {
        accs.clear();
        accumulator::decode(&entry[8..], ncalls, &mut accs)?;
        // No running total yet: `push` reads no call.
        entries.push(&[], word(&entry[..8]), &accs);
    }
    Ok(KeyFrame { last, entries })
}

#[async_trait]
impl Operator for OverOperator {
    async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.max_parallelism = ctx.max_parallelism;
        let state = ctx.keyed_state()?;
        let key_groups = state.key_groups();
        let watermarks = state.table(WATERMARK_STATE);
        let keys: Vec<Bytes> = key_groups
            .clone()
            .map(|g| watermarks.key(g as u16, &[], &[]))
            .collect();
        let mut recorded = Timestamp::MAX;
        let mut any = false;
        for value in watermarks.get_many(&keys).await? {
            let at = match value {
                Some(bytes) => i64::from_be_bytes(
                    bytes[..]
                        .try_into()
                        .map_err(|_| corrupt("a recorded watermark is not 8 bytes"))?,
                ),
                None => Timestamp::MIN,
            };
            recorded = recorded.min(at);
            any = true;
        }
        self.watermark = if any { recorded } else { Timestamp::MIN };
        // Half for waiting rows, half for frames.
        self.cache_budget = (state.cache_bytes() / 2).max(1 << 20);
        self.state = Some(OverState {
            pending: state.table(PENDING_STATE),
            frames: state.table(FRAME_STATE),
            timers: KeyedTimers::restore(
                state.table(TIMER_STATE),
                key_groups.clone(),
                state.checkpointed(),
            )
            .await?,
            watermarks,
            key_groups,
        });
        Ok(())
    }

    async fn process_batch(&mut self, batch: RecordBatch, _out: &mut Output) -> Result<()> {
        let times = self.times(&batch)?;
        self.key_encoder.encode(&batch, &mut self.keys)?;
        let args = accumulator::evaluate_args(&self.calls, &batch)?;
        let rows = self.rows.convert_columns(batch.columns())?;
        if self.state.is_none() {
            return Err(not_open());
        }
        // Each key and time's rows, appended in arrival order.
        let mut index: HashMap<(&[u8], Timestamp), usize, Hasher> = HashMap::default();
        let mut appends: Vec<(&[u8], Timestamp, Vec<u8>)> = Vec::new();
        let mut accs = vec![Acc::default(); self.calls.len()];
        let mut late = 0u64;
        for row in 0..batch.num_rows() {
            let at = times.value(row);
            if at <= self.watermark {
                late += 1;
                continue;
            }
            let key = self.keys.row(row);
            let i = *index.entry((key, at)).or_insert_with(|| {
                appends.push((key, at, Vec::new()));
                appends.len() - 1
            });
            for ((call, acc), arg) in self.calls.iter().zip(accs.iter_mut()).zip(&args) {
                *acc = Acc::default();
                accumulator::update(call.func, acc, arg, row);
            }
            push_row(&mut appends[i].2, rows.row(row).as_ref(), &accs);
        }
        if late > 0 {
            self.counters
                .late_records
                .fetch_add(late, Ordering::Relaxed);
        }
        for (key, at, rows) in appends {
            self.buffered_bytes += rows.len();
            let of_time = self.buffered.entry(at).or_default();
            match of_time.get_mut(key) {
                Some((_, buffered)) => buffered.extend_from_slice(&rows),
                None => {
                    let group = key_group_of(key, self.max_parallelism);
                    of_time.insert(Bytes::copy_from_slice(key), (group, rows));
                }
            }
        }
        if self.buffered_bytes > self.cache_budget {
            // More rows wait than memory may hold: state holds them until they are due.
            self.persist_buffered().await?;
        }
        Ok(())
    }

    async fn on_watermark(&mut self, ts: Timestamp, out: &mut Output) -> Result<()> {
        if ts > self.watermark {
            self.watermark = ts;
            self.fire(ts, out).await?;
        }
        out.watermark(ts);
        Ok(())
    }

    async fn on_barrier(&mut self, barrier: Barrier, out: &mut Output) -> Result<()> {
        self.persist_buffered().await?;
        self.flush_frames(false).await?;
        let watermark = self.watermark;
        let state = self.state.as_mut().ok_or_else(not_open)?;
        state.timers.persist().await?;
        let ops = state
            .key_groups
            .clone()
            .map(|g| WriteOp::Put {
                key: state.watermarks.key(g as u16, &[], &[]),
                value: Bytes::copy_from_slice(&watermark.to_be_bytes()),
            })
            .collect();
        state.watermarks.write(ops).await?;
        out.barrier(barrier);
        Ok(())
    }

    async fn close(&mut self, out: &mut Output) -> Result<()> {
        // The end of a bounded input passes every time.
        self.fire(Timestamp::MAX, out).await?;
        self.flush_frames(false).await?;
        // Fired timers leave the state with the epoch the runtime seals now.
        self.state
            .as_mut()
            .ok_or_else(not_open)?
            .timers
            .persist()
            .await
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Float64Array, TimestampMillisecondArray};
    use arrow::compute::cast;
    use arrow::datatypes::{Float64Type, Int64Type, TimeUnit};
    use sluice_common::key_group::key_group_range;
    use sluice_common::state::{MemoryStateStore, StateStore};

    use super::*;
    use crate::element::StreamElement;
    use crate::keyed::OperatorState;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
            Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        ]))
    }

    /// Rows `(k, v, t)`.
    fn batch(rows: &[(i64, i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(TimestampMillisecondArray::from_iter_values(
                    rows.iter().map(|r| r.2),
                )),
            ],
        )
        .unwrap()
    }

    fn spec(unit: pb::OverFrameUnit, unbounded: bool, preceding: u64) -> pb::OverSpec {
        pb::OverSpec {
            partition_columns: vec!["k".into()],
            time_column: "t".into(),
            aggregates: ["count(*) AS n", "sum(v) AS s", "max(v) AS m", "avg(v) AS a"]
                .iter()
                .map(|sql| pb::Expr {
                    sql: sql.to_string(),
                    location: None,
                })
                .collect(),
            unit: unit as i32,
            unbounded,
            preceding,
        }
    }

    async fn over(
        spec: &pb::OverSpec,
        store: Arc<dyn StateStore>,
        (subtask, parallelism): (u32, u32),
        epoch: u64,
    ) -> (OverOperator, OperatorState) {
        let mut op = OverOperator::build(
            spec,
            &schema(),
            &ExprCompiler::new(),
            Arc::new(WindowCounters::default()),
        )
        .unwrap();
        let groups = key_group_range(128, parallelism, subtask);
        let state = OperatorState::new(store, 4, groups, epoch, true);
        let ctx = OperatorContext {
            node_id: 4,
            node_name: "over".into(),
            subtask: subtask as usize,
            parallelism: parallelism as usize,
            max_parallelism: 128,
            state: Some(state.clone()),
        };
        op.open(&ctx).await.unwrap();
        (op, state)
    }

    /// `(k, v, t, n, s, m, a)` of every row written.
    type Written = (i64, i64, i64, i64, i64, i64, f64);

    fn written(out: &Output) -> Vec<Written> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let int = |c: usize| b.column(c).as_primitive::<Int64Type>().clone();
                let (k, v, n, s, m) = (int(0), int(1), int(3), int(4), int(5));
                let t = cast(b.column(2), &DataType::Int64).unwrap();
                let t = t.as_primitive::<Int64Type>();
                let a: &Float64Array = b.column(6).as_primitive::<Float64Type>();
                rows.extend((0..b.num_rows()).map(|r| {
                    (
                        k.value(r),
                        v.value(r),
                        t.value(r),
                        n.value(r),
                        s.value(r),
                        m.value(r),
                        a.value(r),
                    )
                }));
            }
        }
        rows
    }

    /// The rows of key `k`, in the order written.
    fn of_key(rows: &[Written], k: i64) -> Vec<Written> {
        rows.iter().copied().filter(|r| r.0 == k).collect()
    }

    #[tokio::test]
    async fn a_rows_frame_holds_the_row_and_the_ones_before_it_in_event_time() {
        let spec = spec(pb::OverFrameUnit::Rows, false, 1);
        let (mut op, _) = over(&spec, Arc::new(MemoryStateStore::new(false)), (0, 1), 1).await;
        let mut out = Output::default();
        // Out of order within the watermark's delay; key 2 between.
        op.process_batch(batch(&[(1, 10, 30), (2, 7, 5), (1, 20, 10)]), &mut out)
            .await
            .unwrap();
        op.process_batch(batch(&[(1, 5, 20), (1, 1, 20)]), &mut out)
            .await
            .unwrap();
        assert!(written(&out).is_empty(), "nothing before the watermark");
        op.on_watermark(20, &mut out).await.unwrap();
        let rows = written(&out);
        assert_eq!(
            of_key(&rows, 1),
            vec![
                (1, 20, 10, 1, 20, 20, 20.0),
                (1, 5, 20, 2, 25, 20, 12.5),
                // Ties go in arrival order, one row at a time.
                (1, 1, 20, 2, 6, 5, 3.0),
            ]
        );
        assert_eq!(of_key(&rows, 2), vec![(2, 7, 5, 1, 7, 7, 7.0)]);
        // A row at or before the watermark is late; the frame goes on from 20.
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 99, 20), (1, 2, 25)]), &mut out)
            .await
            .unwrap();
        op.close(&mut out).await.unwrap();
        assert_eq!(
            of_key(&written(&out), 1),
            vec![(1, 2, 25, 2, 3, 2, 1.5), (1, 10, 30, 2, 12, 10, 6.0)]
        );
        assert_eq!(op.counters.late_records.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_range_frame_holds_peers_and_the_times_within_its_reach() {
        let spec = spec(pb::OverFrameUnit::Range, false, 10);
        let (mut op, state) = over(&spec, Arc::new(MemoryStateStore::new(false)), (0, 1), 1).await;
        let mut out = Output::default();
        op.process_batch(
            batch(&[(1, 1, 0), (1, 2, 5), (1, 3, 5), (1, 4, 15), (1, 5, 16)]),
            &mut out,
        )
        .await
        .unwrap();
        op.on_watermark(100, &mut out).await.unwrap();
        assert_eq!(
            written(&out),
            vec![
                (1, 1, 0, 1, 1, 1, 1.0),
                // Peers at 5 see each other.
                (1, 2, 5, 3, 6, 3, 2.0),
                (1, 3, 5, 3, 6, 3, 2.0),
                // [5, 15]: 0 is out.
                (1, 4, 15, 3, 9, 4, 3.0),
                // [6, 16]: 5 is out.
                (1, 5, 16, 2, 9, 5, 4.5),
            ]
        );
        // The watermark is past every entry's reach: the key's frame is gone (from state
        // as of the next barrier).
        barrier(&mut op).await;
        let group = key_group_of(&key_bytes(1), 128);
        assert!(
            state
                .table(FRAME_STATE)
                .scan_group(group, 16)
                .await
                .unwrap()
                .is_empty()
        );
        // A frame whose entries are still in reach leaves when a cleanup timer passes.
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 7, 200)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(205, &mut out).await.unwrap();
        assert_eq!(written(&out), vec![(1, 7, 200, 1, 7, 7, 7.0)]);
        barrier(&mut op).await;
        let frames = state.table(FRAME_STATE);
        assert_eq!(frames.scan_group(group, 16).await.unwrap().len(), 1);
        op.on_watermark(210, &mut out).await.unwrap();
        barrier(&mut op).await;
        assert!(frames.scan_group(group, 16).await.unwrap().is_empty());
        assert!(op.frames.is_empty(), "a gone frame is not kept in memory");
    }

    async fn barrier(op: &mut OverOperator) {
        op.on_barrier(
            Barrier::new(1, crate::element::BarrierKind::Aligned),
            &mut Output::default(),
        )
        .await
        .unwrap();
    }

    fn key_bytes(k: i64) -> Vec<u8> {
        let mut key = Vec::new();
        sluice_common::key_group::push_i64(&mut key, Some(k));
        key
    }

    #[tokio::test]
    async fn unbounded_frames_keep_a_running_total() {
        for (unit, tie) in [
            (pb::OverFrameUnit::Rows, (1, 2, 5, 2, 3, 2, 1.5)),
            (pb::OverFrameUnit::Range, (1, 2, 5, 3, 6, 3, 2.0)),
        ] {
            let spec = spec(unit, true, 0);
            let (mut op, _) = over(&spec, Arc::new(MemoryStateStore::new(false)), (0, 1), 1).await;
            let mut out = Output::default();
            op.process_batch(batch(&[(1, 1, 0), (1, 2, 5), (1, 3, 5)]), &mut out)
                .await
                .unwrap();
            op.on_watermark(5, &mut out).await.unwrap();
            op.process_batch(batch(&[(1, 4, 1000)]), &mut out)
                .await
                .unwrap();
            op.close(&mut out).await.unwrap();
            let rows = written(&out);
            assert_eq!(rows[1], tie, "{unit:?}");
            assert_eq!(rows[3], (1, 4, 1000, 4, 10, 4, 2.5), "{unit:?}");
        }
    }

    #[tokio::test]
    async fn rows_and_frames_beyond_the_cache_wait_in_state() {
        for spec in [
            spec(pb::OverFrameUnit::Rows, false, 2),
            spec(pb::OverFrameUnit::Range, false, 25),
        ] {
            let input: Vec<(i64, i64, i64)> = (0..60).map(|i| (i % 4, i, 10 * (i / 2))).collect();
            let mut outputs = Vec::new();
            for budget in [usize::MAX, 1] {
                let (mut op, state) =
                    over(&spec, Arc::new(MemoryStateStore::new(false)), (0, 1), 1).await;
                op.cache_budget = budget;
                let mut out = Output::default();
                for (i, chunk) in input.chunks(7).enumerate() {
                    op.process_batch(batch(chunk), &mut out).await.unwrap();
                    if budget == 1 {
                        assert!(op.buffered.is_empty(), "spilled at once");
                    }
                    op.on_watermark(30 * i as i64, &mut out).await.unwrap();
                    if budget == 1 {
                        assert!(op.frames.is_empty(), "frames evicted at once");
                    }
                }
                op.close(&mut out).await.unwrap();
                if budget == 1 {
                    // Every row was written, so none waits in state.
                    let pending = state.table(PENDING_STATE);
                    for group in 0..128 {
                        assert!(pending.scan_group(group, 4).await.unwrap().is_empty());
                    }
                }
                let mut rows = written(&out);
                rows.sort_by_key(|r| (r.0, r.2, r.1));
                outputs.push(rows);
            }
            assert_eq!(outputs[0].len(), input.len());
            assert_eq!(outputs[0], outputs[1], "{:?}", spec.unit());
        }
    }

    #[tokio::test]
    async fn running_totals_equal_every_frame_merged_again() {
        // Pseudo-random values (maxima leave frames often), 3 keys, times with peers.
        let mut x: i64 = 7;
        let input: Vec<(i64, i64, i64)> = (0..400)
            .map(|i| {
                x = (x * 1_103_515_245 + 12_345) % 2_147_483_648;
                (i % 3, x % 1000, i / 2 * 4)
            })
            .collect();
        for (unit, preceding) in [(pb::OverFrameUnit::Range, 30), (pb::OverFrameUnit::Rows, 4)] {
            let spec = spec(unit, false, preceding);
            let (mut op, _) = over(&spec, Arc::new(MemoryStateStore::new(false)), (0, 1), 1).await;
            let mut out = Output::default();
            for (i, chunk) in input.chunks(25).enumerate() {
                op.process_batch(batch(chunk), &mut out).await.unwrap();
                op.on_watermark(50 * i as i64, &mut out).await.unwrap();
            }
            op.close(&mut out).await.unwrap();
            let mut got = written(&out);
            got.sort_by_key(|r| (r.0, r.2, r.1));
            // Each row's frame, merged from scratch.
            let mut expected: Vec<Written> = Vec::new();
            for k in 0..3 {
                let rows: Vec<(i64, i64)> = input
                    .iter()
                    .filter(|r| r.0 == k)
                    .map(|r| (r.1, r.2))
                    .collect();
                for (j, (v, t)) in rows.iter().enumerate() {
                    let frame: Vec<i64> = match unit {
                        pb::OverFrameUnit::Range => rows
                            .iter()
                            .filter(|(_, u)| *u >= t - preceding as i64 && u <= t)
                            .map(|(w, _)| *w)
                            .collect(),
                        pb::OverFrameUnit::Rows => rows[j.saturating_sub(preceding as usize)..=j]
                            .iter()
                            .map(|(w, _)| *w)
                            .collect(),
                    };
                    let sum: i64 = frame.iter().sum();
                    expected.push((
                        k,
                        *v,
                        *t,
                        frame.len() as i64,
                        sum,
                        *frame.iter().max().unwrap(),
                        sum as f64 / frame.len() as f64,
                    ));
                }
            }
            expected.sort_by_key(|r| (r.0, r.2, r.1));
            assert_eq!(got.len(), input.len(), "{unit:?}");
            assert_eq!(got, expected, "{unit:?}");
        }
    }

    #[tokio::test]
    async fn waiting_rows_and_frames_survive_a_restore_at_another_parallelism() {
        let spec = spec(pb::OverFrameUnit::Rows, false, 2);
        let input: Vec<(i64, i64, i64)> = (0..40).map(|i| (i % 5, i, 10 * i)).collect();
        // Uninterrupted.
        let (mut op, _) = over(&spec, Arc::new(MemoryStateStore::new(false)), (0, 1), 1).await;
        let mut expected = Output::default();
        op.process_batch(batch(&input), &mut expected)
            .await
            .unwrap();
        op.close(&mut expected).await.unwrap();
        let mut expected = written(&expected);
        expected.sort_by_key(|r| (r.0, r.2));
        // Half written, half waiting at the checkpoint; then lost and restored at 3.
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(true));
        let (mut op, state) = over(&spec, store.clone(), (0, 1), 1).await;
        let mut got = Output::default();
        op.process_batch(batch(&input[..30]), &mut got)
            .await
            .unwrap();
        op.on_watermark(150, &mut got).await.unwrap();
        op.on_barrier(
            Barrier::new(1, crate::element::BarrierKind::Aligned),
            &mut Output::default(),
        )
        .await
        .unwrap();
        state.seal(1).await.unwrap();
        store.commit(1, &[1]).await.unwrap();
        op.on_watermark(250, &mut Output::default()).await.unwrap();
        drop(op);
        store.restore(1, 2).await.unwrap();
        for subtask in 0..3 {
            let (mut op, _) = over(&spec, store.clone(), (subtask, 3), 2).await;
            let groups = key_group_range(128, 3, subtask);
            let mine: Vec<_> = input[30..]
                .iter()
                .copied()
                .filter(|r| groups.contains(&u32::from(key_group_of(&key_bytes(r.0), 128))))
                .collect();
            // A row the checkpoint's watermark had passed is late after the restore.
            let mut late = mine.clone();
            late.push((mine.first().map_or(0, |r| r.0), 0, 100));
            op.process_batch(batch(&late), &mut got).await.unwrap();
            op.close(&mut got).await.unwrap();
        }
        let mut got = written(&got);
        got.sort_by_key(|r| (r.0, r.2));
        assert_eq!(got, expected);
    }
}
