//! `window` + `aggregate`: keyed (or global) tumbling, sliding and session windows.
//!
//! Per batch, rows are first folded into partial accumulators per distinct key and
//! *pane* in operator memory (a pane is a `gcd(size, slide)`-long slice of time; a tumbling window
//! is its own single pane); then each touched pane's accumulators in keyed state are
//! read in one `get_many`, merged, and written back in one `write`. State is thereby
//! touched once per key and pane per batch however many windows a record belongs to,
//! which is what keeps a remote backend affordable. A firing window merges its panes.
//!
//! Firing: an event-time window fires when the watermark reaches `end - 1`; results
//! carry `window_start` and `window_end`. With allowed lateness a fired window is kept
//! until `end - 1 + lateness`, and a late record inside that bound re-emits the updated
//! result at once. Records later than that are counted and dropped or sent to the `late`
//! side output. Processing-time windows take the wall clock at arrival and fire on
//! processing-time ticks. At the end of a bounded input every open window fires.
//!
//! # State
//!
//! The window keeps three tables of keyed state: `window` (a pane's accumulators per
//! key and pane) or `sessions` (a key's sessions), `watermark` (its event-time watermark
//! at the last barrier, per key group), and `timers` (the runtime's timer service:
//! firings and cleanups of panes, checks of sessions). At a barrier it finishes the
//! batches whose reads are in flight, records its watermark and persists what changed in
//! its timers; the runtime seals the epoch after that.
//!
//! # Restore
//!
//! At `open` the timers of the subtask's key groups come back from the `timers` table,
//! exactly as they were pending at the checkpoint, and the window's watermark is the
//! smallest one recorded for those key groups, so records late then are late now. A job
//! restarted from a checkpoint, at the same or another parallelism, thereby fires every
//! window once, as an uninterrupted run would. Fresh state has no timers.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef, AsArray, TimestampMillisecondArray, UInt32Array};
use arrow::compute::{cast, take_record_batch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::key_group::key_group_of;
use sluice_common::pb;
use sluice_common::state::{StateTable, WriteOp};

use super::{Operator, OperatorContext, Output};
use crate::element::{Barrier, Timestamp};
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::expr::aggregate::AggregateCall;
use crate::keyed::KeyedTimers;
use crate::keys::{EncodedKeys, KeyEncoder, decode_keys};
use crate::window::accumulator::{self, Acc, evaluate_args};
use crate::window::assigner::WindowAssigner;
use crate::window::session::{self, Session};

/// Per-batch maps hash short keys millions of times a second: a fast, non-DoS-resistant
/// hasher is right for them (keys come from the job's own data, bounded per batch).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

const SLOT_STATE: &str = "window";
const SESSION_STATE: &str = "sessions";
/// The operator's event-time watermark at the last barrier, one entry per key group it
/// owned (empty key and namespace), so that a restore at any parallelism knows how far
/// each key group had got.
const WATERMARK_STATE: &str = "watermark";
/// The operator's timers.
const TIMER_STATE: &str = "timers";

/// Where a record's time comes from.
#[derive(Debug, Clone, Copy)]
enum TimeSource {
    /// The column at this index (timestamp or integer milliseconds).
    Event(usize),
    /// The wall clock when the batch arrives.
    Processing,
}

/// A timer: a fixed window to fire or clean up, or a key whose sessions to check. It
/// is kept in the timer service as `[tag][start][end][key]` (sessions: `[tag][key]`).
#[derive(Debug, PartialEq, Eq)]
enum Timer {
    Fire {
        key_group: u16,
        key: Bytes,
        start: Timestamp,
        end: Timestamp,
    },
    Cleanup {
        key_group: u16,
        key: Bytes,
        start: Timestamp,
        end: Timestamp,
    },
    Sessions {
        key_group: u16,
        key: Bytes,
    },
}

impl Timer {
    const FIRE: u8 = 0;
    const CLEANUP: u8 = 1;
    const SESSIONS: u8 = 2;

    /// The key group it belongs to and its payload in the timer service.
    fn encode(&self) -> (u16, Bytes) {
        let (tag, key_group, key, window) = match self {
            Timer::Fire {
                key_group,
                key,
                start,
                end,
            } => (Self::FIRE, *key_group, key, Some((*start, *end))),
            Timer::Cleanup {
                key_group,
                key,
                start,
                end,
            } => (Self::CLEANUP, *key_group, key, Some((*start, *end))),
            Timer::Sessions { key_group, key } => (Self::SESSIONS, *key_group, key, None),
        };
        let mut out = Vec::with_capacity(17 + key.len());
        out.push(tag);
        if let Some((start, end)) = window {
            out.extend_from_slice(&start.to_be_bytes());
            out.extend_from_slice(&end.to_be_bytes());
        }
        out.extend_from_slice(key);
        (key_group, Bytes::from(out))
    }

    fn decode(key_group: u16, payload: &Bytes) -> Result<Self> {
        let corrupt = || Error::Internal(format!("corrupt window timer ({payload:?})"));
        let window = |p: &Bytes| -> Result<(Timestamp, Timestamp, Bytes)> {
            let start = p.get(1..9).ok_or_else(corrupt)?;
            let end = p.get(9..17).ok_or_else(corrupt)?;
            Ok((
                i64::from_be_bytes(start.try_into().map_err(|_| corrupt())?),
                i64::from_be_bytes(end.try_into().map_err(|_| corrupt())?),
                p.slice(17..),
            ))
        };
        match payload.first() {
            Some(&Self::FIRE) => {
                let (start, end, key) = window(payload)?;
                Ok(Timer::Fire {
                    key_group,
                    key,
                    start,
                    end,
                })
            }
            Some(&Self::CLEANUP) => {
                let (start, end, key) = window(payload)?;
                Ok(Timer::Cleanup {
                    key_group,
                    key,
                    start,
                    end,
                })
            }
            Some(&Self::SESSIONS) => Ok(Timer::Sessions {
                key_group,
                key: payload.slice(1..),
            }),
            _ => Err(corrupt()),
        }
    }
}

/// One window result awaiting emission.
struct Fired {
    key: Bytes,
    start: Timestamp,
    end: Timestamp,
    accs: Vec<Acc>,
}

/// Counters the window shares with the job's metrics.
#[derive(Debug, Default)]
pub struct WindowCounters {
    /// Records that arrived after their windows were closed.
    pub late_records: AtomicU64,
}

/// The window operator of one subtask.
pub struct WindowOperator {
    assigner: WindowAssigner,
    time: TimeSource,
    key_encoder: KeyEncoder,
    calls: Vec<AggregateCall>,
    lateness: i64,
    late_to_side: bool,
    schema: SchemaRef,
    /// Panes or sessions (set at `open`).
    slots: Option<StateTable>,
    /// The watermark per key group at the last barrier (set at `open`).
    watermarks: Option<StateTable>,
    /// Timers, restored at `open`.
    timers: Option<KeyedTimers>,
    /// Batches whose state reads may be in flight at once (0: reads answer at once).
    pipelined: usize,
    counters: Arc<WindowCounters>,
    max_parallelism: u32,
    watermark: Timestamp,
    /// The key groups this subtask owns (set at `open`).
    key_groups: Range<u32>,
    /// The watermark last recorded in state at a barrier.
    recorded_watermark: Option<Timestamp>,
    keys: EncodedKeys,
    /// Batches whose state reads are in flight, oldest first.
    inflight: VecDeque<InFlight>,
}

/// A batch folded into partial accumulators, waiting for its state values.
struct FixedBatch {
    /// Distinct keys of the batch (canonical bytes).
    keys: Vec<Bytes>,
    /// Key group of each key.
    groups: Vec<u16>,
    /// (key index, pane start) of each state entry the batch updates.
    slots: Vec<(u32, Timestamp)>,
    /// The batch's accumulators, `calls.len()` per slot.
    partial: Vec<Acc>,
    /// The state key of each slot.
    state_keys: Vec<Bytes>,
}

/// A prepared batch and its state read.
struct InFlight {
    keys: std::collections::HashSet<Bytes, foldhash::fast::RandomState>,
    prepared: FixedBatch,
    read: AbortOnDrop<sluice_common::state::StateResult<Vec<Option<Bytes>>>>,
}

/// A spawned task that is aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn overlaps<S: std::hash::BuildHasher>(
    a: &std::collections::HashSet<Bytes, S>,
    b: &std::collections::HashSet<Bytes, S>,
) -> bool {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    small.iter().any(|k| large.contains(k))
}

impl WindowOperator {
    /// Builds the operator over `input`; errors name the offending column or call. Its
    /// state comes from its context at `open`.
    pub fn build(
        spec: &pb::WindowSpec,
        input: &SchemaRef,
        compiler: &ExprCompiler,
        counters: Arc<WindowCounters>,
    ) -> Result<Self> {
        let assigner = WindowAssigner::from_spec(spec)?;
        let time = match spec.time() {
            pb::TimeCharacteristic::TimeProcessing => TimeSource::Processing,
            pb::TimeCharacteristic::TimeEvent => {
                let col = &spec.time_column;
                let idx = input.index_of(col).map_err(|_| {
                    Error::Plan(format!(
                        "the window's time column `{col}` is not in its input"
                    ))
                })?;
                match input.field(idx).data_type() {
                    DataType::Timestamp(_, _) | DataType::Int64 => TimeSource::Event(idx),
                    other => {
                        return Err(Error::Plan(format!(
                            "the window's time column `{col}` has type {other}; expected a timestamp"
                        )));
                    }
                }
            }
        };
        let key_encoder = KeyEncoder::new(input, &spec.key_columns)?;
        if spec.aggregates.is_empty() {
            return Err(Error::Plan("a window needs at least one aggregate".into()));
        }
        let calls = spec
            .aggregates
            .iter()
            .map(|e| AggregateCall::compile(compiler, &e.sql, input))
            .collect::<Result<Vec<_>>>()?;
        let ts_type = DataType::Timestamp(TimeUnit::Millisecond, None);
        let mut fields: Vec<Field> = key_encoder.fields().to_vec();
        fields.push(Field::new("window_start", ts_type.clone(), false));
        fields.push(Field::new("window_end", ts_type, false));
        for call in &calls {
            let nullable = !matches!(
                call.func,
                crate::expr::aggregate::AggFunc::Count | crate::expr::aggregate::AggFunc::CountStar
            );
            fields.push(Field::new(&call.name, call.output_type.clone(), nullable));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = fields.iter().find(|f| !seen.insert(f.name().clone())) {
            return Err(Error::Plan(format!(
                "window output column `{}` appears twice; rename an aggregate with AS",
                dup.name()
            )));
        }
        Ok(Self {
            assigner,
            time,
            key_encoder,
            calls,
            lateness: spec.allowed_lateness_ms.min(i64::MAX as u64 / 4) as i64,
            late_to_side: spec.late() == pb::LatePolicy::SideOutput,
            schema: Arc::new(Schema::new(fields)),
            slots: None,
            watermarks: None,
            timers: None,
            pipelined: 0,
            inflight: VecDeque::new(),
            counters,
            max_parallelism: sluice_common::DEFAULT_MAX_PARALLELISM,
            watermark: Timestamp::MIN,
            key_groups: 0..0,
            recorded_watermark: None,
            keys: EncodedKeys::default(),
        })
    }

    /// The schema of the window results.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn is_event_time(&self) -> bool {
        matches!(self.time, TimeSource::Event(_))
    }

    /// Each row's time in milliseconds.
    fn times(&self, batch: &RecordBatch) -> Result<Vec<Timestamp>> {
        match self.time {
            TimeSource::Processing => Ok(vec![now_ms(); batch.num_rows()]),
            TimeSource::Event(idx) => {
                let col = batch.column(idx);
                let ms = match col.data_type() {
                    DataType::Timestamp(TimeUnit::Millisecond, _) | DataType::Int64 => col.clone(),
                    _ => cast(col, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
                };
                let ms = cast(&ms, &DataType::Int64)?;
                let ms = ms.as_primitive::<Int64Type>();
                if ms.null_count() > 0 {
                    return Err(Error::BadRecord {
                        location: "window input".into(),
                        message: "a record has no event time (null time column)".into(),
                    });
                }
                Ok(ms.values().to_vec())
            }
        }
    }

    /// True when a window ending at `end` can no longer be updated.
    fn window_closed(&self, end: Timestamp) -> bool {
        self.is_event_time() && end - 1 + self.lateness <= self.watermark
    }

    /// The panes or sessions table.
    fn slots(&self) -> Result<&StateTable> {
        self.slots.as_ref().ok_or_else(not_open)
    }

    fn timers(&mut self) -> Result<&mut KeyedTimers> {
        self.timers.as_mut().ok_or_else(not_open)
    }

    /// Registers `timer` to fire at `at`.
    fn register(&mut self, at: Timestamp, timer: Timer) -> Result<()> {
        let (key_group, payload) = timer.encode();
        self.timers()?.register(at, key_group, payload);
        Ok(())
    }

    /// Tumbling and sliding windows. State holds one accumulator set per key and *pane*
    /// (a `gcd(size, slide)`-long slice; for tumbling windows the window itself), so a record
    /// updates one entry however many windows it belongs to; a window's result merges
    /// its panes when it fires. A pane is dropped when the last window holding it (the
    /// one starting with it) fires, or after allowed lateness.
    async fn process_fixed(
        &mut self,
        batch: &RecordBatch,
        times: &[Timestamp],
        out: &mut Output,
    ) -> Result<Vec<u32>> {
        let (prepared, late) = self.prepare_fixed(batch, times)?;
        let Some(prepared) = prepared else {
            return Ok(late);
        };
        if self.pipelined == 0 {
            let stored = self.slots()?.get_many(&prepared.state_keys).await?;
            self.apply_fixed(prepared, stored, out).await?;
            return Ok(late);
        }
        // Reads that take a round trip: the read goes out now and the batch is applied
        // later, in order, so the reads of the next batches overlap with this one's round
        // trip. A batch touching a key an earlier batch still waits on applies that one
        // first (per-key order).
        let keys: std::collections::HashSet<Bytes, foldhash::fast::RandomState> =
            prepared.state_keys.iter().cloned().collect();
        if let Some(last) = self
            .inflight
            .iter()
            .rposition(|f| f.keys.len().min(keys.len()) > 0 && overlaps(&f.keys, &keys))
        {
            for _ in 0..=last {
                self.apply_oldest(out).await?;
            }
        }
        let slots = self.slots()?.clone();
        let read_keys = prepared.state_keys.clone();
        let read = AbortOnDrop(tokio::spawn(
            async move { slots.get_many(&read_keys).await },
        ));
        self.inflight.push_back(InFlight {
            keys,
            prepared,
            read,
        });
        while self.inflight.len() > self.pipelined {
            self.apply_oldest(out).await?;
        }
        Ok(late)
    }

    /// Applies the oldest batch whose read is in flight.
    async fn apply_oldest(&mut self, out: &mut Output) -> Result<()> {
        let Some(mut f) = self.inflight.pop_front() else {
            return Ok(());
        };
        let stored = (&mut f.read.0)
            .await
            .map_err(|e| Error::Internal(format!("a state read task failed: {e}")))??;
        self.apply_fixed(f.prepared, stored, out).await
    }

    /// Applies every batch whose read is in flight: before time advances, a barrier
    /// passes or the input ends, the state must hold every record seen.
    async fn drain(&mut self, out: &mut Output) -> Result<()> {
        while !self.inflight.is_empty() {
            self.apply_oldest(out).await?;
        }
        Ok(())
    }

    /// Folds a batch into partial accumulators per key and pane, and names the state
    /// entries it updates; returns the rows that are late.
    fn prepare_fixed(
        &mut self,
        batch: &RecordBatch,
        times: &[Timestamp],
    ) -> Result<(Option<FixedBatch>, Vec<u32>)> {
        let (pane, _, _) = self.assigner.panes();
        let naggs = self.calls.len();
        let args = evaluate_args(&self.calls, batch)?;
        let mut key_ids: HashMap<&[u8], u32> = HashMap::default();
        let mut key_list: Vec<&[u8]> = Vec::new();
        let mut slot_ids: HashMap<(u32, Timestamp), u32> = HashMap::default();
        let mut slots: Vec<(u32, Timestamp)> = Vec::new();
        let mut partial: Vec<Acc> = Vec::new();
        let mut late = Vec::new();
        for (row, &ts) in times.iter().enumerate() {
            let start = ts - ts.rem_euclid(pane);
            if self.window_closed(self.assigner.last_window_end(start)) {
                late.push(row as u32);
                continue;
            }
            let key = self.keys.row(row);
            let kid = *key_ids.entry(key).or_insert_with(|| {
                key_list.push(key);
                (key_list.len() - 1) as u32
            });
            let sid = *slot_ids.entry((kid, start)).or_insert_with(|| {
                slots.push((kid, start));
                partial.resize(partial.len() + naggs, Acc::default());
                (slots.len() - 1) as u32
            }) as usize;
            let accs = &mut partial[sid * naggs..(sid + 1) * naggs];
            for ((acc, call), arg) in accs.iter_mut().zip(&self.calls).zip(&args) {
                accumulator::update(call.func, acc, arg, row);
            }
        }
        if slots.is_empty() {
            return Ok((None, late));
        }
        let groups: Vec<u16> = key_list
            .iter()
            .map(|k| key_group_of(k, self.max_parallelism))
            .collect();
        let table = self.slots()?;
        let state_keys: Vec<Bytes> = slots
            .iter()
            .map(|&(kid, start)| {
                let (kg, key) = (groups[kid as usize], key_list[kid as usize]);
                table.key(kg, key, &pane_namespace(start, start + pane))
            })
            .collect();
        let keys = key_list.iter().map(|k| Bytes::copy_from_slice(k)).collect();
        Ok((
            Some(FixedBatch {
                keys,
                groups,
                slots,
                partial,
                state_keys,
            }),
            late,
        ))
    }

    /// Merges a prepared batch into the state values read for it, registers timers of
    /// new windows, and re-emits fired windows it updated (allowed lateness).
    async fn apply_fixed(
        &mut self,
        prepared: FixedBatch,
        stored: Vec<Option<Bytes>>,
        out: &mut Output,
    ) -> Result<()> {
        let FixedBatch {
            keys: key_list,
            groups,
            slots,
            partial,
            state_keys,
        } = prepared;
        if stored.len() != state_keys.len() {
            return Err(Error::Internal(format!(
                "state returned {} values for {} keys",
                stored.len(),
                state_keys.len()
            )));
        }
        let naggs = self.calls.len();
        let mut ops = Vec::with_capacity(slots.len());
        let mut refire: Vec<(u16, Bytes, Timestamp)> = Vec::new();
        let mut merged = Vec::with_capacity(naggs);
        let mut buf = Vec::with_capacity(naggs * accumulator::ACC_BYTES);
        for (sid, (value, state_key)) in stored.into_iter().zip(state_keys).enumerate() {
            let (kid, start) = slots[sid];
            let key_group = groups[kid as usize];
            let part = &partial[sid * naggs..(sid + 1) * naggs];
            merged.clear();
            let is_new = value.is_none();
            match value {
                Some(bytes) => {
                    accumulator::decode(&bytes, naggs, &mut merged)?;
                    for ((acc, p), call) in merged.iter_mut().zip(part).zip(&self.calls) {
                        accumulator::merge(call.func, call.arg_kind, acc, p);
                    }
                }
                None => merged.extend_from_slice(part),
            }
            // Panes align with window boundaries: the windows holding a pane are those
            // holding its start.
            for (w, end) in self.assigner.windows(start) {
                let fired = self.is_event_time() && end - 1 <= self.watermark;
                if fired && !self.window_closed(end) {
                    // Already fired, within allowed lateness: emit the update now.
                    refire.push((key_group, key_list[kid as usize].clone(), w));
                }
            }
            if is_new {
                let key = &key_list[kid as usize];
                self.register_pane_timers(key_group, key, start, self.watermark)?;
            }
            buf.clear();
            accumulator::encode(&merged, &mut buf);
            ops.push(WriteOp::Put {
                key: state_key,
                value: Bytes::copy_from_slice(&buf),
            });
        }
        self.slots()?.write(ops).await?;
        if !refire.is_empty() {
            refire.sort();
            refire.dedup();
            let fired = self.read_windows(&refire).await?;
            if !fired.is_empty() {
                out.batch(self.results(fired)?);
            }
        }
        Ok(())
    }

    /// Registers the timers of a pane that enters state while the watermark is
    /// `watermark`: a firing for each of its windows that has not fired yet, and its
    /// cleanup if the last of them has (nothing else will schedule it).
    fn register_pane_timers(
        &mut self,
        key_group: u16,
        key: &Bytes,
        start: Timestamp,
        watermark: Timestamp,
    ) -> Result<()> {
        let (pane, _, _) = self.assigner.panes();
        let event_time = self.is_event_time();
        for (w, end) in self.assigner.windows(start) {
            if !(event_time && end - 1 <= watermark) {
                let fire = Timer::Fire {
                    key_group,
                    key: key.clone(),
                    start: w,
                    end,
                };
                self.register(end - 1, fire)?;
            }
        }
        let last_end = self.assigner.last_window_end(start);
        if event_time && last_end - 1 <= watermark {
            let cleanup = Timer::Cleanup {
                key_group,
                key: key.clone(),
                start,
                end: start + pane,
            };
            self.register(last_end - 1 + self.lateness, cleanup)?;
        }
        Ok(())
    }

    /// Opens the window's state: its tables, its timers as the checkpoint the state was
    /// restored to left them, and (event time) the smallest watermark recorded for the
    /// subtask's key groups, so that records late then are late now.
    async fn open_state(&mut self, ctx: &OperatorContext) -> Result<()> {
        let state = ctx.keyed_state()?;
        let name = if matches!(self.assigner, WindowAssigner::Session { .. }) {
            SESSION_STATE
        } else {
            SLOT_STATE
        };
        let slots = state.table(name);
        let watermarks = state.table(WATERMARK_STATE);
        self.key_groups = state.key_groups();
        self.pipelined = slots.pipelined_reads();
        self.timers = Some(
            KeyedTimers::restore(
                state.table(TIMER_STATE),
                self.key_groups.clone(),
                state.checkpointed(),
            )
            .await?,
        );
        if self.is_event_time() {
            let keys: Vec<Bytes> = self
                .key_groups
                .clone()
                .map(|g| watermarks.key(g as u16, &[], &[]))
                .collect();
            let mut lowest = None::<Timestamp>;
            for value in watermarks.get_many(&keys).await? {
                let w = match value {
                    Some(bytes) => i64::from_be_bytes(bytes[..].try_into().map_err(|_| {
                        Error::Internal(format!("corrupt window watermark state ({bytes:?})"))
                    })?),
                    None => Timestamp::MIN,
                };
                lowest = Some(lowest.map_or(w, |l| l.min(w)));
            }
            self.watermark = lowest.unwrap_or(Timestamp::MIN);
            self.recorded_watermark = None;
        }
        self.slots = Some(slots);
        self.watermarks = Some(watermarks);
        Ok(())
    }

    /// Records the watermark under every key group of this subtask, for a restore.
    async fn record_watermark(&mut self) -> Result<()> {
        if !self.is_event_time()
            || self.watermark == Timestamp::MIN
            || self.recorded_watermark == Some(self.watermark)
        {
            return Ok(());
        }
        let value = Bytes::copy_from_slice(&self.watermark.to_be_bytes());
        let table = self.watermarks.as_ref().ok_or_else(not_open)?;
        let ops = self
            .key_groups
            .clone()
            .map(|g| WriteOp::Put {
                key: table.key(g as u16, &[], &[]),
                value: value.clone(),
            })
            .collect();
        table.write(ops).await?;
        self.recorded_watermark = Some(self.watermark);
        Ok(())
    }

    /// The current results of fixed windows `(key group, key, start)`, merged from their
    /// panes; windows with no pane left are skipped.
    async fn read_windows(&self, windows: &[(u16, Bytes, Timestamp)]) -> Result<Vec<Fired>> {
        let (pane, size, _) = self.assigner.panes();
        let naggs = self.calls.len();
        let per_window = (size / pane) as usize;
        let table = self.slots()?;
        let mut keys = Vec::with_capacity(windows.len() * per_window);
        for (kg, key, start) in windows {
            for p in 0..per_window as i64 {
                let s = start + p * pane;
                keys.push(table.key(*kg, key, &pane_namespace(s, s + pane)));
            }
        }
        let values = table.get_many(&keys).await?;
        let mut fired = Vec::with_capacity(windows.len());
        let mut pane_accs = Vec::with_capacity(naggs);
        for ((_, key, start), panes) in windows.iter().zip(values.chunks(per_window)) {
            let mut accs: Option<Vec<Acc>> = None;
            for bytes in panes.iter().flatten() {
                pane_accs.clear();
                accumulator::decode(bytes, naggs, &mut pane_accs)?;
                match accs.as_mut() {
                    None => accs = Some(pane_accs.clone()),
                    Some(accs) => {
                        for ((a, p), call) in accs.iter_mut().zip(&pane_accs).zip(&self.calls) {
                            accumulator::merge(call.func, call.arg_kind, a, p);
                        }
                    }
                }
            }
            if let Some(accs) = accs {
                fired.push(Fired {
                    key: key.clone(),
                    start: *start,
                    end: start + size,
                    accs,
                });
            }
        }
        Ok(fired)
    }

    async fn process_sessions(
        &mut self,
        batch: &RecordBatch,
        times: &[Timestamp],
        out: &mut Output,
    ) -> Result<Vec<u32>> {
        let WindowAssigner::Session { gap } = self.assigner else {
            return Err(Error::Internal("session path on a fixed window".into()));
        };
        let naggs = self.calls.len();
        let args = evaluate_args(&self.calls, batch)?;
        let mut key_ids: HashMap<&[u8], u32> = HashMap::default();
        let mut rows_by_key: Vec<(&[u8], Vec<u32>)> = Vec::new();
        let mut late = Vec::new();
        for (row, &ts) in times.iter().enumerate() {
            if self.window_closed(ts.saturating_add(gap)) {
                late.push(row as u32);
                continue;
            }
            let key = self.keys.row(row);
            let kid = *key_ids.entry(key).or_insert_with(|| {
                rows_by_key.push((key, Vec::new()));
                (rows_by_key.len() - 1) as u32
            });
            rows_by_key[kid as usize].1.push(row as u32);
        }
        if rows_by_key.is_empty() {
            return Ok(late);
        }
        let groups: Vec<u16> = rows_by_key
            .iter()
            .map(|(k, _)| key_group_of(k, self.max_parallelism))
            .collect();
        let table = self.slots()?.clone();
        let state_keys: Vec<Bytes> = rows_by_key
            .iter()
            .zip(&groups)
            .map(|((k, _), &kg)| table.key(kg, k, &[]))
            .collect();
        let stored = table.get_many(&state_keys).await?;
        let mut ops = Vec::with_capacity(rows_by_key.len());
        let mut refire = Vec::new();
        let mut timers = Vec::new();
        for (((key, rows), value), (state_key, &key_group)) in rows_by_key
            .iter()
            .zip(stored)
            .zip(state_keys.into_iter().zip(&groups))
        {
            let mut sessions = match value {
                Some(bytes) => session::decode(&bytes, naggs)?,
                None => Vec::new(),
            };
            for &row in rows {
                let ts = times[row as usize];
                let mut accs = vec![Acc::default(); naggs];
                for ((acc, call), arg) in accs.iter_mut().zip(&self.calls).zip(&args) {
                    accumulator::update(call.func, acc, arg, row as usize);
                }
                let s = Session {
                    start: ts,
                    end: ts.saturating_add(gap),
                    fired: false,
                    accs,
                };
                session::insert(&mut sessions, s, &self.calls);
            }
            let key = Bytes::copy_from_slice(key);
            let mut ends: Vec<Timestamp> = Vec::new();
            for s in sessions.iter_mut().filter(|s| !s.fired) {
                if self.is_event_time() && s.end - 1 <= self.watermark {
                    s.fired = true;
                    refire.push(Fired {
                        key: key.clone(),
                        start: s.start,
                        end: s.end,
                        accs: s.accs.clone(),
                    });
                    ends.push(s.end - 1 + self.lateness);
                } else {
                    ends.push(s.end - 1);
                }
            }
            ends.sort_unstable();
            ends.dedup();
            for at in ends {
                let timer = Timer::Sessions {
                    key_group,
                    key: key.clone(),
                };
                timers.push((at, timer));
            }
            let mut buf = Vec::new();
            session::encode(&sessions, &mut buf);
            ops.push(WriteOp::Put {
                key: state_key,
                value: Bytes::from(buf),
            });
        }
        table.write(ops).await?;
        for (at, timer) in timers {
            self.register(at, timer)?;
        }
        if !refire.is_empty() {
            out.batch(self.results(refire)?);
        }
        Ok(late)
    }

    /// Fires and cleans up everything due at `now` (a watermark or processing time).
    async fn fire(&mut self, now: Timestamp, out: &mut Output) -> Result<()> {
        let due = self.timers()?.pop_due(now);
        if due.is_empty() {
            return Ok(());
        }
        let table = self.slots()?.clone();
        let naggs = self.calls.len();
        let (pane, _, slide) = self.assigner.panes();
        let mut windows = Vec::new();
        let mut ops = Vec::new();
        let mut session_keys: Vec<(u16, Bytes)> = Vec::new();
        for (_, key_group, payload) in due {
            match Timer::decode(key_group, &payload)? {
                Timer::Fire {
                    key_group,
                    key,
                    start,
                    end,
                } => {
                    // This is the last window holding the panes of its first slide: drop
                    // them now, or once allowed lateness has passed.
                    let keep =
                        self.lateness > 0 && self.is_event_time() && end - 1 + self.lateness > now;
                    let mut p = start;
                    while p < start + slide {
                        if keep {
                            let at = end - 1 + self.lateness;
                            let cleanup = Timer::Cleanup {
                                key_group,
                                key: key.clone(),
                                start: p,
                                end: p + pane,
                            };
                            self.register(at, cleanup)?;
                        } else {
                            let pane_key = table.key(key_group, &key, &pane_namespace(p, p + pane));
                            ops.push(WriteOp::Delete { key: pane_key });
                        }
                        p += pane;
                    }
                    windows.push((key_group, key, start));
                }
                Timer::Cleanup {
                    key_group,
                    key,
                    start,
                    end,
                } => {
                    ops.push(WriteOp::Delete {
                        key: table.key(key_group, &key, &pane_namespace(start, end)),
                    });
                }
                Timer::Sessions { key_group, key } => session_keys.push((key_group, key)),
            }
        }
        // Several panes of one key register the same window: fire it once.
        windows.sort();
        windows.dedup();
        let mut fired = if windows.is_empty() {
            Vec::new()
        } else {
            self.read_windows(&windows).await?
        };
        if !session_keys.is_empty() {
            session_keys.sort();
            session_keys.dedup();
            let keys: Vec<Bytes> = session_keys
                .iter()
                .map(|(kg, k)| table.key(*kg, k, &[]))
                .collect();
            let values = table.get_many(&keys).await?;
            let lateness = if self.is_event_time() {
                self.lateness
            } else {
                0
            };
            let mut cleanups = Vec::new();
            for ((value, state_key), (key_group, key)) in
                values.into_iter().zip(keys).zip(session_keys)
            {
                let Some(bytes) = value else { continue };
                let mut sessions = session::decode(&bytes, naggs)?;
                let before = sessions.len();
                let mut changed = false;
                for s in sessions.iter_mut().filter(|s| !s.fired && s.end - 1 <= now) {
                    s.fired = true;
                    changed = true;
                    fired.push(Fired {
                        key: key.clone(),
                        start: s.start,
                        end: s.end,
                        accs: s.accs.clone(),
                    });
                    if s.end - 1 + lateness > now {
                        // Kept for allowed lateness: check the key again when it has passed.
                        cleanups.push((s.end - 1 + lateness, key_group, key.clone()));
                    }
                }
                sessions.retain(|s| !(s.fired && s.end - 1 + lateness <= now));
                if sessions.is_empty() {
                    ops.push(WriteOp::Delete { key: state_key });
                } else if changed || sessions.len() != before {
                    let mut buf = Vec::new();
                    session::encode(&sessions, &mut buf);
                    ops.push(WriteOp::Put {
                        key: state_key,
                        value: Bytes::from(buf),
                    });
                }
            }
            cleanups.sort();
            cleanups.dedup();
            for (at, key_group, key) in cleanups {
                self.register(at, Timer::Sessions { key_group, key })?;
            }
        }
        table.write(ops).await?;
        if !fired.is_empty() {
            out.batch(self.results(fired)?);
        }
        Ok(())
    }

    /// One batch of window results.
    fn results(&self, fired: Vec<Fired>) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = decode_keys(
            self.key_encoder.fields(),
            fired.iter().map(|f| f.key.as_ref()),
        )?;
        columns.push(Arc::new(TimestampMillisecondArray::from_iter_values(
            fired.iter().map(|f| f.start),
        )));
        columns.push(Arc::new(TimestampMillisecondArray::from_iter_values(
            fired.iter().map(|f| f.end),
        )));
        for (i, call) in self.calls.iter().enumerate() {
            columns.push(accumulator::finish(call, fired.iter().map(|f| &f.accs[i]))?);
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

/// The namespace of the pane `[start, end)`.
fn pane_namespace(start: Timestamp, end: Timestamp) -> [u8; 16] {
    let mut ns = [0u8; 16];
    ns[..8].copy_from_slice(&start.to_be_bytes());
    ns[8..].copy_from_slice(&end.to_be_bytes());
    ns
}

fn not_open() -> Error {
    Error::Internal("the window operator was used before `open`".into())
}

fn now_ms() -> Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

#[async_trait]
impl Operator for WindowOperator {
    async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.max_parallelism = ctx.max_parallelism;
        self.open_state(ctx).await
    }

    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let times = self.times(&batch)?;
        self.key_encoder.encode(&batch, &mut self.keys)?;
        let late = if matches!(self.assigner, WindowAssigner::Session { .. }) {
            self.process_sessions(&batch, &times, out).await?
        } else {
            self.process_fixed(&batch, &times, out).await?
        };
        if !late.is_empty() {
            self.counters
                .late_records
                .fetch_add(late.len() as u64, Ordering::Relaxed);
            if self.late_to_side {
                out.side("late", take_record_batch(&batch, &UInt32Array::from(late))?);
            }
        }
        Ok(())
    }

    async fn on_watermark(&mut self, ts: Timestamp, out: &mut Output) -> Result<()> {
        if self.is_event_time() && ts > self.watermark {
            self.drain(out).await?;
            self.watermark = ts;
            self.fire(ts, out).await?;
        }
        out.watermark(ts);
        Ok(())
    }

    fn wants_processing_time(&self) -> bool {
        !self.is_event_time()
    }

    async fn on_processing_time(&mut self, now: Timestamp, out: &mut Output) -> Result<()> {
        if !self.is_event_time() {
            self.drain(out).await?;
            self.fire(now, out).await?;
        }
        Ok(())
    }

    async fn on_barrier(&mut self, barrier: Barrier, out: &mut Output) -> Result<()> {
        self.drain(out).await?;
        self.record_watermark().await?;
        self.timers()?.persist().await?;
        out.barrier(barrier);
        Ok(())
    }

    async fn close(&mut self, out: &mut Output) -> Result<()> {
        // The end of a bounded input closes every window, whatever the time mode.
        self.drain(out).await?;
        self.fire(Timestamp::MAX, out).await?;
        // Fired timers leave the state with the epoch the runtime seals now.
        self.timers()?.persist().await
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, TimestampMillisecondArray};
    use sluice_common::key_group::key_group_range;
    use sluice_common::state::{MemoryStateStore, StateStore};

    use super::*;
    use crate::element::StreamElement;
    use crate::keyed::OperatorState;

    fn input_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
            Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        ]))
    }

    fn batch(rows: &[(i64, i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            input_schema(),
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

    async fn window(kind: pb::window_spec::Kind, time: pb::TimeCharacteristic) -> WindowOperator {
        let store = Arc::new(MemoryStateStore::new(false));
        window_over(kind, time, 0, store, (0, 1), 1).await.0
    }

    /// A window with `lateness` over `store`, opened as `(subtask, parallelism)` writing
    /// from `epoch`; and the state the runtime would drive.
    async fn window_over(
        kind: pb::window_spec::Kind,
        time: pb::TimeCharacteristic,
        lateness: u64,
        store: Arc<dyn StateStore>,
        (subtask, parallelism): (usize, usize),
        epoch: u64,
    ) -> (WindowOperator, OperatorState) {
        let mut spec = pb::WindowSpec {
            kind: Some(kind),
            key_columns: vec!["k".into()],
            aggregates: ["count(*) AS n", "sum(v) AS s"]
                .iter()
                .map(|sql| pb::Expr {
                    sql: sql.to_string(),
                    location: None,
                })
                .collect(),
            time_column: "t".into(),
            allowed_lateness_ms: lateness,
            ..Default::default()
        };
        spec.set_time(time);
        let mut op = WindowOperator::build(
            &spec,
            &input_schema(),
            &ExprCompiler::new(),
            Arc::new(WindowCounters::default()),
        )
        .unwrap();
        let groups = key_group_range(128, parallelism as u32, subtask as u32);
        let state = OperatorState::new(store, 1, groups, epoch, true);
        let ctx = OperatorContext {
            node_id: 1,
            node_name: "window".into(),
            subtask,
            parallelism,
            max_parallelism: 128,
            state: Some(state.clone()),
        };
        op.open(&ctx).await.unwrap();
        (op, state)
    }

    /// (key, window_start, n, s) of every result batch in `out`.
    fn results(out: &Output) -> Vec<(i64, i64, i64, i64)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let col = |i: usize| cast(b.column(i), &DataType::Int64).unwrap();
                let (k, start, n, s) = (col(0), col(1), col(3), col(4));
                for r in 0..b.num_rows() {
                    rows.push((
                        k.as_primitive::<Int64Type>().value(r),
                        start.as_primitive::<Int64Type>().value(r),
                        n.as_primitive::<Int64Type>().value(r),
                        s.as_primitive::<Int64Type>().value(r),
                    ));
                }
            }
        }
        rows.sort_unstable();
        rows
    }

    #[tokio::test]
    async fn tumbling_windows_fire_at_the_watermark_and_not_before() {
        let tumbling = pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: 10 });
        let mut op = window(tumbling, pb::TimeCharacteristic::TimeEvent).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 5, 1), (2, 7, 3), (1, 1, 12)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(8, &mut out).await.unwrap();
        assert!(
            results(&out).is_empty(),
            "window [0, 10) must wait for watermark 9"
        );
        op.on_watermark(9, &mut out).await.unwrap();
        assert_eq!(results(&out), vec![(1, 0, 1, 5), (2, 0, 1, 7)]);
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 100, 4)]), &mut out)
            .await
            .unwrap();
        assert_eq!(op.counters.late_records.load(Ordering::Relaxed), 1);
        op.on_watermark(i64::MAX, &mut out).await.unwrap();
        assert_eq!(results(&out), vec![(1, 10, 1, 1)]);
    }

    #[tokio::test]
    async fn sliding_windows_merge_panes_and_refire_within_lateness() {
        let sliding = pb::window_spec::Kind::Sliding(pb::SlidingWindow {
            size_ms: 10,
            slide_ms: 5,
        });
        let mut op = window(sliding, pb::TimeCharacteristic::TimeEvent).await;
        op.lateness = 5;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 1, 3), (1, 10, 7), (2, 100, 12)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(4, &mut out).await.unwrap();
        assert_eq!(results(&out), vec![(1, -5, 1, 1)]);
        // Late for [-5, 5), which fired, but within lateness: it is emitted again at once.
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 2, 2)]), &mut out)
            .await
            .unwrap();
        assert_eq!(results(&out), vec![(1, -5, 2, 3)]);
        let mut out = Output::default();
        op.on_watermark(9, &mut out).await.unwrap();
        // [0, 10) holds both panes of key 1: 1 + 2 + 10.
        assert_eq!(results(&out), vec![(1, 0, 3, 13)]);
        let mut out = Output::default();
        op.on_watermark(14, &mut out).await.unwrap();
        assert_eq!(results(&out), vec![(1, 5, 1, 10), (2, 5, 1, 100)]);
        // Pane [0, 5) is past its last window plus lateness: a record for it is late.
        op.process_batch(batch(&[(1, 4, 4)]), &mut out)
            .await
            .unwrap();
        assert_eq!(op.counters.late_records.load(Ordering::Relaxed), 1);
        let mut out = Output::default();
        op.on_watermark(i64::MAX, &mut out).await.unwrap();
        assert_eq!(results(&out), vec![(2, 10, 1, 100)]);
    }

    #[tokio::test]
    async fn pane_results_equal_a_naive_assignment_for_any_slide() {
        for (size, slide) in [(10, 4), (10, 5), (10, 10), (9, 2), (12, 12)] {
            let kind = if size == slide {
                pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: size })
            } else {
                pb::window_spec::Kind::Sliding(pb::SlidingWindow {
                    size_ms: size,
                    slide_ms: slide,
                })
            };
            let mut op = window(kind, pb::TimeCharacteristic::TimeEvent).await;
            // A deterministic, slightly out-of-order stream (at most 3 ms back).
            let mut x: u64 = 7;
            let mut rows = Vec::new();
            for i in 0..400i64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                rows.push((
                    (x >> 33) as i64 % 5,
                    (x >> 40) as i64 % 100,
                    i / 3 - ((x >> 50) as i64 % 4),
                ));
            }
            let mut expected = std::collections::BTreeMap::new();
            for &(k, v, t) in &rows {
                // Independent of the assigner: every slide multiple within `size` before t.
                let starts = (t - size as i64 - slide as i64..=t)
                    .filter(|w| w.rem_euclid(slide as i64) == 0 && *w <= t && t < w + size as i64);
                for start in starts {
                    let e = expected.entry((k, start)).or_insert((0, 0));
                    *e = (e.0 + 1, e.1 + v);
                }
            }
            let expected: Vec<_> = expected
                .into_iter()
                .map(|((k, s), (n, v))| (k, s, n, v))
                .collect();
            let mut all = Output::default();
            let mut max_t = i64::MIN;
            for chunk in rows.chunks(17) {
                op.process_batch(batch(chunk), &mut all).await.unwrap();
                max_t = max_t.max(chunk.iter().map(|r| r.2).max().unwrap());
                op.on_watermark(max_t - 3 - 1, &mut all).await.unwrap();
            }
            op.on_watermark(i64::MAX, &mut all).await.unwrap();
            assert_eq!(op.counters.late_records.load(Ordering::Relaxed), 0);
            assert_eq!(results(&all), expected, "size {size} slide {slide}");
        }
    }

    #[tokio::test]
    async fn processing_time_windows_fire_on_ticks_and_at_close() {
        let tumbling = pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: 3_600_000 });
        let mut op = window(tumbling, pb::TimeCharacteristic::TimeProcessing).await;
        assert!(op.wants_processing_time());
        let mut out = Output::default();
        // Event times are ignored: both rows land in the current hour.
        op.process_batch(batch(&[(1, 2, -5), (1, 3, 99_999_999)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(i64::MAX - 1, &mut out).await.unwrap();
        assert!(
            results(&out).is_empty(),
            "watermarks do not fire processing-time windows"
        );
        let now = now_ms();
        let hour_end = now - now.rem_euclid(3_600_000) + 3_600_000;
        op.on_processing_time(hour_end - 2, &mut out).await.unwrap();
        assert!(results(&out).is_empty());
        op.on_processing_time(hour_end + 5, &mut out).await.unwrap();
        let fired = results(&out);
        // A tick exactly at the hour boundary may split the rows over two windows.
        assert_eq!(fired.iter().map(|r| r.2).sum::<i64>(), 2, "{fired:?}");
        assert_eq!(fired.iter().map(|r| r.3).sum::<i64>(), 5);
        let mut out = Output::default();
        op.process_batch(batch(&[(2, 9, 0)]), &mut out)
            .await
            .unwrap();
        op.close(&mut out).await.unwrap();
        assert_eq!(
            results(&out).iter().map(|r| (r.0, r.3)).collect::<Vec<_>>(),
            vec![(2, 9)]
        );
    }

    #[tokio::test]
    async fn a_bridging_record_merges_two_sessions() {
        let session = pb::window_spec::Kind::Session(pb::SessionWindow { gap_ms: 10 });
        let mut op = window(session, pb::TimeCharacteristic::TimeEvent).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 1, 0), (1, 2, 18), (1, 8, 40)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(8, &mut out).await.unwrap();
        assert!(results(&out).is_empty());
        // [9, 19) overlaps [0, 10) and [18, 28): the three fuse into [0, 28).
        op.process_batch(batch(&[(1, 4, 9)]), &mut out)
            .await
            .unwrap();
        op.on_watermark(i64::MAX, &mut out).await.unwrap();
        assert_eq!(results(&out), vec![(1, 0, 3, 7), (1, 40, 1, 8)]);
    }

    /// A deterministic stream of `(key, value, time)`, out of order by at most 3 ms, with
    /// a few records later than that.
    fn restore_input() -> Vec<(i64, i64, i64)> {
        let mut x: u64 = 11;
        (0..600i64)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let back = if i % 50 == 49 {
                    9
                } else {
                    (x >> 50) as i64 % 4
                };
                ((x >> 33) as i64 % 7, (x >> 40) as i64 % 100, i / 4 - back)
            })
            .collect()
    }

    /// Runs the subtasks `ops` over `rows` in chunks, each subtask getting the rows of its
    /// key groups, and each chunk followed by the watermark a source would send (3 ms of
    /// out-of-orderness).
    async fn feed(ops: &mut [WindowOperator], rows: &[(i64, i64, i64)], out: &mut Output) {
        let mut max_t = i64::MIN;
        for chunk in rows.chunks(13) {
            for op in ops.iter_mut() {
                let mine: Vec<_> = chunk
                    .iter()
                    .copied()
                    .filter(|r| {
                        let mut key = Vec::new();
                        sluice_common::key_group::push_i64(&mut key, Some(r.0));
                        op.key_groups.contains(&u32::from(key_group_of(&key, 128)))
                    })
                    .collect();
                if !mine.is_empty() {
                    op.process_batch(batch(&mine), out).await.unwrap();
                }
            }
            max_t = max_t.max(chunk.iter().map(|r| r.2).max().unwrap());
            for op in ops.iter_mut() {
                op.on_watermark(max_t - 3 - 1, out).await.unwrap();
            }
        }
    }

    #[tokio::test]
    async fn timers_restored_with_the_state_fire_every_window_once_after_a_restart() {
        let kinds = [
            pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: 10 }),
            pb::window_spec::Kind::Sliding(pb::SlidingWindow {
                size_ms: 10,
                slide_ms: 4,
            }),
            pb::window_spec::Kind::Session(pb::SessionWindow { gap_ms: 7 }),
        ];
        let rows = restore_input();
        // At a chunk boundary, so that both runs see the same watermarks at the same rows.
        let (first, rest) = rows.split_at(13 * 23);
        let event = pb::TimeCharacteristic::TimeEvent;
        for kind in kinds {
            for lateness in [0, 8] {
                let fresh = || Arc::new(MemoryStateStore::new(true)) as Arc<dyn StateStore>;
                let mut reference = Output::default();
                let (mut op, _) = window_over(kind, event, lateness, fresh(), (0, 1), 1).await;
                feed(std::slice::from_mut(&mut op), &rows, &mut reference).await;
                op.close(&mut reference).await.unwrap();
                let expected = results(&reference);
                assert!(!expected.is_empty());
                for parallelism in [1, 2] {
                    // One subtask until a checkpoint, then on for a while, then a
                    // failure: the operator is dropped with windows open, and the
                    // state goes back to the checkpoint.
                    let store = fresh();
                    let mut out = Output::default();
                    let (mut op, state) =
                        window_over(kind, event, lateness, store.clone(), (0, 1), 1).await;
                    feed(std::slice::from_mut(&mut op), first, &mut out).await;
                    let barrier = Barrier {
                        checkpoint_id: 1,
                        kind: crate::element::BarrierKind::Aligned,
                    };
                    op.on_barrier(barrier, &mut out).await.unwrap();
                    state.seal(1).await.unwrap();
                    store.commit(1, &[1]).await.unwrap();
                    assert!(!op.timers.as_ref().unwrap().is_empty());
                    // Lost: what the operator does after the checkpoint.
                    feed(
                        std::slice::from_mut(&mut op),
                        &rest[..13 * 5],
                        &mut Output::default(),
                    )
                    .await;
                    drop(op);
                    store.restore(1, 2).await.unwrap();
                    // The restarted job, at `parallelism`, reads on after the checkpoint.
                    let mut ops = Vec::new();
                    for subtask in 0..parallelism {
                        let at = (subtask, parallelism);
                        let (op, _) =
                            window_over(kind, event, lateness, store.clone(), at, 2).await;
                        ops.push(op);
                    }
                    // Every subtask found open windows of its key groups in the state.
                    assert!(ops.iter().all(|op| !op.timers.as_ref().unwrap().is_empty()));
                    feed(&mut ops, rest, &mut out).await;
                    for op in &mut ops {
                        op.close(&mut out).await.unwrap();
                    }
                    assert_eq!(
                        results(&out),
                        expected,
                        "{kind:?} lateness {lateness} restored at parallelism {parallelism}"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn a_fresh_state_restores_no_timer_and_keeps_the_watermark_at_min() {
        let tumbling = pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: 10 });
        let op = window(tumbling, pb::TimeCharacteristic::TimeEvent).await;
        assert!(op.timers.as_ref().unwrap().is_empty());
        assert_eq!(op.watermark, Timestamp::MIN);
    }
}
