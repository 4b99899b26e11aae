//! `window` + `aggregate`: keyed (or global) tumbling, sliding, cumulate and session
//! windows.
//!
//! Tumbling, sliding and cumulate windows are [`FixedWindows`] (`window/fixed.rs`): per
//! *pane* (a `gcd(size, slide)`-long slice of time, a cumulate window's step; a tumbling
//! window is one pane) a hash
//! aggregation of decoded accumulators, held in a memory-bounded write-back cache over
//! keyed state, folded a batch at a time and fired from the watermark without per-key
//! timers. Sessions keep one state row per key (its open sessions), read and written
//! once per key and batch, and a timer per key in the runtime's timer service.
//!
//! A cascade (`CascadeWindow`) is a 1 ms tumbling window over an upstream window's
//! results, its time column their end `e` taken as `e - 1`: it fires each end when the
//! watermark reaches `e - 1`, as the upstream did, and emits keys (the end among them)
//! and aggregates without bounds of its own.
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
//! Fixed windows keep tables `panes` (accumulators per key group, pane and key) and
//! `pane_index` (which panes have rows, per key group); sessions keep `sessions` (a
//! key's sessions) and `timers`. Both record `watermark` (the event-time watermark at
//! the last barrier, per key group). At a barrier the window finishes what is in
//! flight, writes what changed since the last one and records its watermark; the
//! runtime seals the epoch after that.
//!
//! # Restore
//!
//! At `open`, fixed windows read the pane index of the subtask's key groups (the panes
//! come back from state when they fire) and session timers come back from the `timers`
//! table, as the checkpoint the state was restored to left them. The window's watermark
//! is the smallest one recorded for its key groups, so records late then are late now;
//! a key group's windows that fired before the checkpoint are not fired again. A job
//! restarted from a checkpoint, at the same or another parallelism, thereby fires every
//! window once, as an uninterrupted run would.

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
use crate::keyed::hot_keys::{HotKeys, key_format};
use crate::keyed::{CacheCounters, KeyedTimers};
use crate::keys::{EncodedKeys, KeyEncoder, decode_keys};
use crate::window::accumulator::{self, Acc, evaluate_args};
use crate::window::assigner::WindowAssigner;
use crate::window::fixed::{Fired, FixedConfig, FixedWindows};
use crate::window::session::{self, Session};

/// Per-batch maps hash short keys millions of times a second: a fast, non-DoS-resistant
/// hasher is right for them (keys come from the job's own data, bounded per batch).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

const PANE_STATE: &str = "panes";
const PANE_INDEX_STATE: &str = "pane_index";
const SESSION_STATE: &str = "sessions";
/// The operator's event-time watermark at the last barrier, one entry per key group it
/// owned (empty key and namespace), so that a restore at any parallelism knows how far
/// each key group had got.
const WATERMARK_STATE: &str = "watermark";
/// The session timers.
const TIMER_STATE: &str = "timers";

/// Where a record's time comes from.
#[derive(Debug, Clone, Copy)]
enum TimeSource {
    /// The column at this index (timestamp or integer milliseconds).
    Event(usize),
    /// The column at this index holds the ends of upstream windows (a cascade): a row's
    /// time is its end - 1 ms, the last instant of its window.
    EventEnd(usize),
    /// The wall clock when the batch arrives.
    Processing,
}

/// Counters the window shares with the job's metrics.
#[derive(Debug, Default)]
pub struct WindowCounters {
    /// Records that arrived after their windows were closed.
    pub late_records: AtomicU64,
    /// The fixed windows' caches.
    pub cache: Arc<CacheCounters>,
}

/// The sessions of a window operator: one state row and timers per key.
struct Sessions {
    gap: i64,
    table: StateTable,
    timers: KeyedTimers,
}

/// What the operator keeps, once open.
enum WindowState {
    Fixed(Box<FixedWindows>),
    Sessions(Sessions),
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
    counters: Arc<WindowCounters>,
    /// The keys this subtask sees most (keyed windows).
    hot_keys: Option<Arc<HotKeys>>,
    max_parallelism: u32,
    watermark: Timestamp,
    /// The key groups this subtask owns (set at `open`).
    key_groups: Range<u32>,
    /// The watermark last recorded in state at a barrier.
    recorded_watermark: Option<Timestamp>,
    watermarks: Option<StateTable>,
    state: Option<WindowState>,
    keys: EncodedKeys,
    /// Windows due at this time are still to fire, in parts (see [`Operator::has_more`]);
    /// with the watermark to forward once they have.
    firing: Option<Firing>,
}

/// A firing of fixed windows that goes on in parts.
#[derive(Clone, Copy)]
struct Firing {
    to: Timestamp,
    then_watermark: bool,
}

/// Rows of window results one part of a firing holds before the chain passes it on.
const PART_ROWS: usize = 64 * 1024;

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
        let cascade = matches!(spec.kind, Some(pb::window_spec::Kind::Cascade(_)));
        let time = match spec.time() {
            pb::TimeCharacteristic::TimeProcessing if cascade => {
                return Err(Error::Plan(
                    "a cascade window follows the event time of the windows upstream; it \
                     cannot run in processing time"
                        .into(),
                ));
            }
            pb::TimeCharacteristic::TimeProcessing => TimeSource::Processing,
            pb::TimeCharacteristic::TimeEvent => {
                let col = &spec.time_column;
                let idx = input.index_of(col).map_err(|_| {
                    Error::Plan(format!(
                        "the window's time column `{col}` is not in its input"
                    ))
                })?;
                match input.field(idx).data_type() {
                    DataType::Timestamp(_, _) | DataType::Int64 if cascade => {
                        TimeSource::EventEnd(idx)
                    }
                    DataType::Timestamp(_, _) | DataType::Int64 => TimeSource::Event(idx),
                    other => {
                        return Err(Error::Plan(format!(
                            "the window's time column `{col}` has type {other}; expected a timestamp"
                        )));
                    }
                }
            }
        };
        if cascade && !spec.key_columns.contains(&spec.time_column) {
            // Rows of one key but different ends belong to different upstream windows.
            return Err(Error::Plan(format!(
                "a cascade window's end column `{}` must be one of its key columns",
                spec.time_column
            )));
        }
        let key_encoder = KeyEncoder::new(input, &spec.key_columns)?;
        let hot_keys = (!spec.key_columns.is_empty()).then(|| {
            counters
                .cache
                .hot_keys
                .get_or_init(|| Arc::new(HotKeys::new(key_format(key_encoder.fields().to_vec()))))
                .clone()
        });
        if spec.aggregates.is_empty() {
            return Err(Error::Plan("a window needs at least one aggregate".into()));
        }
        let calls = spec
            .aggregates
            .iter()
            .map(|e| AggregateCall::compile(compiler, &e.sql, input))
            .collect::<Result<Vec<_>>>()?;
        if let Some(call) = calls.iter().find(|c| c.distinct) {
            return Err(Error::Plan(format!(
                "`{}`: COUNT(DISTINCT ...) is not kept by one window (SQL plans a window's \
                 as a window per value and a cascade; a GROUP BY without a window keeps it)",
                call.name
            )));
        }
        let ts_type = DataType::Timestamp(TimeUnit::Millisecond, None);
        let mut fields: Vec<Field> = key_encoder.fields().to_vec();
        if !cascade {
            // A cascade's window is its end column, already a key.
            fields.push(Field::new("window_start", ts_type.clone(), false));
            fields.push(Field::new("window_end", ts_type, false));
        }
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
            counters,
            hot_keys,
            max_parallelism: sluice_common::DEFAULT_MAX_PARALLELISM,
            watermark: Timestamp::MIN,
            firing: None,
            key_groups: 0..0,
            recorded_watermark: None,
            watermarks: None,
            state: None,
            keys: EncodedKeys::default(),
        })
    }

    /// The schema of the window results.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn is_event_time(&self) -> bool {
        matches!(self.time, TimeSource::Event(_) | TimeSource::EventEnd(_))
    }

    /// Each row's time in milliseconds (event time: the column, without a copy when it
    /// already is milliseconds).
    fn times(&self, batch: &RecordBatch) -> Result<arrow::array::Int64Array> {
        match self.time {
            TimeSource::Processing => Ok(arrow::array::Int64Array::from_value(
                now_ms(),
                batch.num_rows(),
            )),
            TimeSource::Event(idx) | TimeSource::EventEnd(idx) => {
                let ms = event_times(batch.column(idx), "window input")?;
                Ok(match self.time {
                    TimeSource::EventEnd(_) => ms.unary(|end| end.saturating_sub(1)),
                    _ => ms,
                })
            }
        }
    }

    /// True when a window ending at `end` can no longer be updated.
    fn window_closed(&self, end: Timestamp) -> bool {
        self.is_event_time() && end - 1 + self.lateness <= self.watermark
    }

    fn state(&mut self) -> Result<&mut WindowState> {
        self.state.as_mut().ok_or_else(not_open)
    }

    /// Opens the window's state at `open`: its tables and, per key group, the watermark
    /// recorded at the checkpoint the state was restored to (the smallest becomes the
    /// operator's, so records late then are late now).
    async fn open_state(&mut self, ctx: &OperatorContext) -> Result<()> {
        let state = ctx.keyed_state()?;
        if !matches!(self.assigner, WindowAssigner::Session { .. }) {
            // Fixed windows hold their panes decoded (`window/fixed.rs`).
            state.open_for_cached_operator();
        }
        let watermarks = state.table(WATERMARK_STATE);
        self.key_groups = state.key_groups();
        let mut recorded = Vec::new();
        if self.is_event_time() {
            let keys: Vec<Bytes> = self
                .key_groups
                .clone()
                .map(|g| watermarks.key(g as u16, &[], &[]))
                .collect();
            for value in watermarks.get_many(&keys).await? {
                recorded.push(match value {
                    Some(bytes) => i64::from_be_bytes(bytes[..].try_into().map_err(|_| {
                        Error::Internal(format!("corrupt window watermark state ({bytes:?})"))
                    })?),
                    None => Timestamp::MIN,
                });
            }
            self.watermark = recorded.iter().copied().min().unwrap_or(Timestamp::MIN);
            self.recorded_watermark = None;
        }
        self.watermarks = Some(watermarks);
        self.state = Some(match self.assigner {
            WindowAssigner::Session { gap } => WindowState::Sessions(Sessions {
                gap,
                table: state.table(SESSION_STATE),
                timers: KeyedTimers::restore(
                    state.table(TIMER_STATE),
                    self.key_groups.clone(),
                    state.checkpointed(),
                )
                .await?,
            }),
            assigner => {
                let config = FixedConfig {
                    assigner,
                    funcs: self.calls.iter().map(|c| (c.func, c.arg_kind)).collect(),
                    lateness: self.lateness,
                    event_time: self.is_event_time(),
                    max_parallelism: self.max_parallelism,
                    budget: state.cache_bytes(),
                    tracking: state.checkpointed(),
                };
                WindowState::Fixed(Box::new(
                    FixedWindows::restore(
                        config,
                        state.table(PANE_STATE),
                        state.table(PANE_INDEX_STATE),
                        self.key_groups.clone(),
                        recorded,
                        self.counters.cache.clone(),
                    )
                    .await?,
                ))
            }
        });
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

    /// Folds a batch into session state; returns the rows that are late.
    async fn process_sessions(
        &mut self,
        batch: &RecordBatch,
        times: &[Timestamp],
        out: &mut Output,
    ) -> Result<Vec<u32>> {
        let naggs = self.calls.len();
        let args = evaluate_args(&self.calls, batch)?;
        let Some(WindowState::Sessions(sessions)) = &self.state else {
            return Err(Error::Internal("session path on a fixed window".into()));
        };
        let gap = sessions.gap;
        let table = sessions.table.clone();
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
        let state_keys: Vec<Bytes> = rows_by_key
            .iter()
            .zip(&groups)
            .map(|((k, _), &kg)| table.key(kg, k, &[]))
            .collect();
        let stored = table.get_many(&state_keys).await?;
        let mut ops = Vec::with_capacity(rows_by_key.len());
        let mut refire = Fired::default();
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
            let mut ends: Vec<Timestamp> = Vec::new();
            for s in sessions.iter_mut().filter(|s| !s.fired) {
                if self.is_event_time() && s.end - 1 <= self.watermark {
                    s.fired = true;
                    refire.push(key, s.start, s.end, &s.accs);
                    ends.push(s.end - 1 + self.lateness);
                } else {
                    ends.push(s.end - 1);
                }
            }
            ends.sort_unstable();
            ends.dedup();
            for at in ends {
                timers.push((at, key_group, Bytes::copy_from_slice(key)));
            }
            let mut buf = Vec::new();
            session::encode(&sessions, &mut buf);
            ops.push(WriteOp::Put {
                key: state_key,
                value: Bytes::from(buf),
            });
        }
        table.write(ops).await?;
        if let Some(WindowState::Sessions(s)) = &mut self.state {
            for (at, key_group, key) in timers {
                s.timers.register(at, key_group, key);
            }
        }
        if !refire.is_empty() {
            out.batch(self.results(refire)?);
        }
        Ok(late)
    }

    /// Fires and cleans up everything due at `now` (a watermark or processing time).
    /// Fires what is due at `now`; fixed windows fire in parts of about [`PART_ROWS`]
    /// rows, the rest left to [`Operator::resume`] (`then_watermark`: forward the
    /// watermark `now` once everything fired).
    async fn fire(&mut self, now: Timestamp, then_watermark: bool, out: &mut Output) -> Result<()> {
        if let Some(WindowState::Fixed(fixed)) = &mut self.state {
            // Batches built as the windows fire: the decoded rows of one part at a
            // time, not of everything a watermark closes.
            let (calls, keys, schema) = (&self.calls, &self.key_encoder, &self.schema);
            let mut emit = |fired: Fired| -> Result<()> {
                out.batch(results(calls, keys, schema, fired)?);
                Ok(())
            };
            let done = fixed.fire(now, PART_ROWS, &mut emit).await?;
            self.firing = (!done).then_some(Firing {
                to: now,
                then_watermark,
            });
            if done && then_watermark {
                out.watermark(now);
            }
            return Ok(());
        }
        let mut fired = Fired::default();
        self.fire_sessions(now, &mut fired).await?;
        if !fired.is_empty() {
            out.batch(self.results(fired)?);
        }
        if then_watermark {
            out.watermark(now);
        }
        Ok(())
    }

    /// Fires the sessions due at `now` and drops those past their allowed lateness.
    async fn fire_sessions(&mut self, now: Timestamp, fired: &mut Fired) -> Result<()> {
        let naggs = self.calls.len();
        let lateness = if self.is_event_time() {
            self.lateness
        } else {
            0
        };
        let Some(WindowState::Sessions(s)) = &mut self.state else {
            return Ok(());
        };
        let mut session_keys: Vec<(u16, Bytes)> = s
            .timers
            .pop_due(now)
            .into_iter()
            .map(|(_, key_group, key)| (key_group, key))
            .collect();
        if session_keys.is_empty() {
            return Ok(());
        }
        session_keys.sort();
        session_keys.dedup();
        let table = s.table.clone();
        let keys: Vec<Bytes> = session_keys
            .iter()
            .map(|(kg, k)| table.key(*kg, k, &[]))
            .collect();
        let values = table.get_many(&keys).await?;
        let mut ops = Vec::new();
        let mut cleanups = Vec::new();
        for ((value, state_key), (key_group, key)) in values.into_iter().zip(keys).zip(session_keys)
        {
            let Some(bytes) = value else { continue };
            let mut sessions = session::decode(&bytes, naggs)?;
            let before = sessions.len();
            let mut changed = false;
            for s in sessions.iter_mut().filter(|s| !s.fired && s.end - 1 <= now) {
                s.fired = true;
                changed = true;
                fired.push(&key, s.start, s.end, &s.accs);
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
            s.timers.register(at, key_group, key);
        }
        table.write(ops).await?;
        Ok(())
    }

    /// One batch of window results.
    fn results(&self, fired: Fired) -> Result<RecordBatch> {
        results(&self.calls, &self.key_encoder, &self.schema, fired)
    }
}

/// One batch of window results: the key columns, the window's bounds (unless the schema
/// has none: a cascade), the aggregates.
fn results(
    calls: &[AggregateCall],
    keys: &KeyEncoder,
    schema: &SchemaRef,
    fired: Fired,
) -> Result<RecordBatch> {
    let naggs = calls.len();
    let mut columns: Vec<ArrayRef> =
        decode_keys(keys.fields(), (0..fired.len()).map(|i| fired.key(i)))?;
    if schema.fields().len() > columns.len() + naggs {
        columns.push(Arc::new(TimestampMillisecondArray::from(fired.starts)));
        columns.push(Arc::new(TimestampMillisecondArray::from(fired.ends)));
    }
    for (i, call) in calls.iter().enumerate() {
        columns.push(accumulator::finish(
            call,
            fired.accs.iter().skip(i).step_by(naggs),
        )?);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

fn not_open() -> Error {
    Error::Internal("the window operator was used before `open`".into())
}

/// An event-time column (a timestamp or milliseconds) as milliseconds; a null time is a
/// bad record of `location`.
pub(crate) fn event_times(col: &ArrayRef, location: &str) -> Result<arrow::array::Int64Array> {
    let ms = match col.data_type() {
        DataType::Timestamp(TimeUnit::Millisecond, _) | DataType::Int64 => col.clone(),
        _ => cast(col, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
    };
    let ms = cast(&ms, &DataType::Int64)?;
    if ms.null_count() > 0 {
        return Err(Error::BadRecord {
            location: location.into(),
            message: "a record has no event time (null time column)".into(),
        });
    }
    Ok(ms.as_primitive::<Int64Type>().clone())
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
        let times = times.values();
        self.key_encoder.encode(&batch, &mut self.keys)?;
        if let Some(h) = &self.hot_keys {
            h.observe(&self.keys);
        }
        let late = if matches!(self.assigner, WindowAssigner::Session { .. }) {
            self.process_sessions(&batch, times, out).await?
        } else {
            let args = evaluate_args(&self.calls, &batch)?;
            let mut late = Vec::new();
            let mut refired = Fired::default();
            let watermark = if self.is_event_time() {
                self.watermark
            } else {
                Timestamp::MIN
            };
            let Some(WindowState::Fixed(fixed)) = &mut self.state else {
                return Err(not_open());
            };
            fixed
                .add_batch(&self.keys, times, &args, watermark, &mut late, &mut refired)
                .await?;
            if !refired.is_empty() {
                out.batch(self.results(refired)?);
            }
            late
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
            self.watermark = ts;
            return self.fire(ts, true, out).await;
        }
        out.watermark(ts);
        Ok(())
    }

    fn has_more(&self) -> bool {
        self.firing.is_some()
    }

    async fn resume(&mut self, out: &mut Output) -> Result<()> {
        match self.firing.take() {
            Some(f) => self.fire(f.to, f.then_watermark, out).await,
            None => Ok(()),
        }
    }

    fn wants_processing_time(&self) -> bool {
        !self.is_event_time()
    }

    async fn on_processing_time(&mut self, now: Timestamp, out: &mut Output) -> Result<()> {
        if !self.is_event_time() {
            self.fire(now, false, out).await?;
        }
        Ok(())
    }

    async fn on_barrier(&mut self, barrier: Barrier, out: &mut Output) -> Result<()> {
        match self.state()? {
            WindowState::Fixed(fixed) => fixed.persist().await?,
            WindowState::Sessions(s) => s.timers.persist().await?,
        }
        self.record_watermark().await?;
        out.barrier(barrier);
        Ok(())
    }

    async fn close(&mut self, out: &mut Output) -> Result<()> {
        // The end of a bounded input closes every window, whatever the time mode.
        self.fire(Timestamp::MAX, false, out).await?;
        if let WindowState::Sessions(s) = self.state()? {
            // Fired timers leave the state with the epoch the runtime seals now.
            s.timers.persist().await?;
        }
        Ok(())
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
        at: (usize, usize),
        epoch: u64,
    ) -> (WindowOperator, OperatorState) {
        window_cached(kind, time, lateness, store, at, epoch, None).await
    }

    /// [`window_over`] with a cache of `cache` bytes (default when `None`).
    async fn window_cached(
        kind: pb::window_spec::Kind,
        time: pb::TimeCharacteristic,
        lateness: u64,
        store: Arc<dyn StateStore>,
        (subtask, parallelism): (usize, usize),
        epoch: u64,
        cache: Option<usize>,
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
        let mut state = OperatorState::new(store, 1, groups, epoch, true);
        if let Some(bytes) = cache {
            state = state.with_cache_bytes(bytes);
        }
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

    /// Whether the operator has windows open (panes, or session timers).
    fn has_open_windows(op: &WindowOperator) -> bool {
        match &op.state {
            Some(WindowState::Fixed(f)) => !f.is_empty(),
            Some(WindowState::Sessions(s)) => !s.timers.is_empty(),
            None => false,
        }
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
    async fn a_cascade_fires_each_upstream_end_when_the_watermark_reaches_it() {
        // `t` holds the ends of upstream windows, as their results carry them.
        let mut spec = cascade_spec(&["k", "t"]);
        let store = Arc::new(MemoryStateStore::new(false));
        let mut op = WindowOperator::build(
            &spec,
            &input_schema(),
            &ExprCompiler::new(),
            Arc::new(WindowCounters::default()),
        )
        .unwrap();
        let ctx = OperatorContext {
            node_id: 1,
            node_name: "window".into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism: 128,
            state: Some(OperatorState::new(store, 1, 0..128, 1, true)),
        };
        op.open(&ctx).await.unwrap();
        let names: Vec<&str> = op
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(
            names,
            ["k", "t", "n", "s"],
            "a cascade's end is a key, not new bounds"
        );
        let mut out = Output::default();
        let ends = [(1, 5, 10), (1, 2, 10), (2, 7, 20), (1, 1, 20)];
        op.process_batch(batch(&ends), &mut out).await.unwrap();
        op.on_watermark(8, &mut out).await.unwrap();
        assert!(
            out.main
                .iter()
                .all(|e| !matches!(e, StreamElement::Batch(_)))
        );
        op.on_watermark(9, &mut out).await.unwrap();
        let fired = |out: &Output| -> Vec<(i64, i64, i64, i64)> {
            let mut rows = Vec::new();
            for e in &out.main {
                if let StreamElement::Batch(b) = e {
                    let col = |i: usize| cast(b.column(i), &DataType::Int64).unwrap();
                    let col = |i: usize| col(i).as_primitive::<Int64Type>().clone();
                    let (k, t, n, s) = (col(0), col(1), col(2), col(3));
                    rows.extend(
                        (0..b.num_rows()).map(|r| (k.value(r), t.value(r), n.value(r), s.value(r))),
                    );
                }
            }
            rows.sort_unstable();
            rows
        };
        assert_eq!(
            fired(&out),
            vec![(1, 10, 2, 7)],
            "end 10 fires at watermark 9"
        );
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 100, 10)]), &mut out)
            .await
            .unwrap();
        assert_eq!(op.counters.late_records.load(Ordering::Relaxed), 1);
        op.on_watermark(19, &mut out).await.unwrap();
        assert_eq!(fired(&out), vec![(1, 20, 1, 1), (2, 20, 1, 7)]);
        spec.set_time(pb::TimeCharacteristic::TimeProcessing);
        let build = |spec: &pb::WindowSpec| {
            let counters = Arc::new(WindowCounters::default());
            WindowOperator::build(spec, &input_schema(), &ExprCompiler::new(), counters)
                .err()
                .unwrap()
                .to_string()
        };
        assert!(build(&spec).contains("processing time"), "{}", build(&spec));
        let unkeyed = build(&cascade_spec(&["k"]));
        assert!(
            unkeyed.contains("`t`") && unkeyed.contains("key"),
            "{unkeyed}"
        );
    }

    /// A cascade over ends in `t`, keyed by `keys`, counting and summing `v`.
    fn cascade_spec(keys: &[&str]) -> pb::WindowSpec {
        let mut spec = pb::WindowSpec {
            kind: Some(pb::window_spec::Kind::Cascade(pb::CascadeWindow {})),
            key_columns: keys.iter().map(|k| k.to_string()).collect(),
            aggregates: ["count(*) AS n", "sum(v) AS s"]
                .iter()
                .map(|sql| pb::Expr {
                    sql: sql.to_string(),
                    location: None,
                })
                .collect(),
            time_column: "t".into(),
            ..Default::default()
        };
        spec.set_time(pb::TimeCharacteristic::TimeEvent);
        spec
    }

    #[tokio::test]
    async fn sliding_windows_merge_panes_and_refire_within_lateness() {
        let sliding = pb::window_spec::Kind::Sliding(pb::SlidingWindow {
            size_ms: 10,
            slide_ms: 5,
        });
        let store = Arc::new(MemoryStateStore::new(false));
        let event = pb::TimeCharacteristic::TimeEvent;
        let (mut op, _) = window_over(sliding, event, 5, store, (0, 1), 1).await;
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

    /// `(key, window_start, window_end, count, sum)` of every result in `out`, sorted.
    fn results_with_ends(out: &Output) -> Vec<(i64, i64, i64, i64, i64)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let col = |i: usize| cast(b.column(i), &DataType::Int64).unwrap();
                let cols: Vec<ArrayRef> = (0..5).map(col).collect();
                let v = |c: usize, r: usize| cols[c].as_primitive::<Int64Type>().value(r);
                for r in 0..b.num_rows() {
                    rows.push((v(0, r), v(1, r), v(2, r), v(3, r), v(4, r)));
                }
            }
        }
        rows.sort_unstable();
        rows
    }

    #[tokio::test]
    async fn cumulate_windows_fire_every_step_with_everything_since_their_start() {
        // The same answers from the cache and from a cache so small that every pane
        // spills to the backend between batches.
        for cache in [None, Some(1)] {
            let cumulate = pb::window_spec::Kind::Cumulate(pb::CumulateWindow {
                size_ms: 10,
                step_ms: 5,
            });
            let store = Arc::new(MemoryStateStore::new(false));
            let event = pb::TimeCharacteristic::TimeEvent;
            let (mut op, _) = window_cached(cumulate, event, 0, store, (0, 1), 1, cache).await;
            let mut out = Output::default();
            op.process_batch(batch(&[(1, 1, 1), (1, 10, 7), (2, 100, 12)]), &mut out)
                .await
                .unwrap();
            op.on_watermark(4, &mut out).await.unwrap();
            assert_eq!(results_with_ends(&out), vec![(1, 0, 5, 1, 1)], "{cache:?}");
            let mut out = Output::default();
            op.on_watermark(9, &mut out).await.unwrap();
            // [0, 10) holds [0, 5) too.
            assert_eq!(
                results_with_ends(&out),
                vec![(1, 0, 10, 2, 11)],
                "{cache:?}"
            );
            let mut out = Output::default();
            op.on_watermark(14, &mut out).await.unwrap();
            assert_eq!(
                results_with_ends(&out),
                vec![(2, 10, 15, 1, 100)],
                "{cache:?}"
            );
            let mut out = Output::default();
            op.process_batch(batch(&[(2, 5, 17), (3, 7, 19)]), &mut out)
                .await
                .unwrap();
            op.on_watermark(i64::MAX, &mut out).await.unwrap();
            assert_eq!(
                results_with_ends(&out),
                vec![(2, 10, 20, 2, 105), (3, 10, 20, 1, 7)],
                "{cache:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_watermark_closing_many_windows_emits_one_batch_per_window_in_order() {
        let sliding = pb::window_spec::Kind::Sliding(pb::SlidingWindow {
            size_ms: 10,
            slide_ms: 5,
        });
        let store = Arc::new(MemoryStateStore::new(false));
        let event = pb::TimeCharacteristic::TimeEvent;
        let (mut op, _) = window_over(sliding, event, 0, store, (0, 1), 1).await;
        let mut out = Output::default();
        // (key, value, time): windows [-5, 5) [0, 10) [5, 15) [10, 20) [20, 30) [25, 35).
        op.process_batch(
            batch(&[(1, 1, 1), (2, 2, 6), (1, 3, 12), (3, 4, 27)]),
            &mut out,
        )
        .await
        .unwrap();
        op.on_watermark(i64::MAX, &mut out).await.unwrap();
        let mut starts = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let col = cast(b.column(1), &DataType::Int64).unwrap();
                let mut s: Vec<i64> = col.as_primitive::<Int64Type>().values().to_vec();
                s.dedup();
                assert_eq!(s.len(), 1, "one window per batch: {s:?}");
                starts.push(s[0]);
            }
        }
        assert_eq!(starts, vec![-5, 0, 5, 10, 20, 25]);
        assert_eq!(
            results(&out),
            vec![
                (1, -5, 1, 1),
                (1, 0, 1, 1),
                (1, 5, 1, 3),
                (1, 10, 1, 3),
                (2, 0, 1, 2),
                (2, 5, 1, 2),
                (3, 20, 1, 4),
                (3, 25, 1, 4),
            ]
        );
        assert!(
            !has_open_windows(&op),
            "every pane went with its last window"
        );
    }

    #[tokio::test]
    async fn a_large_firing_comes_in_parts_with_the_watermark_after_the_last() {
        let tumbling = pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: 10 });
        let mut op = window(tumbling, pb::TimeCharacteristic::TimeEvent).await;
        let keys = 40_000i64;
        let rows: Vec<(i64, i64, i64)> = (0..3 * keys)
            .map(|i| (i % keys, 1, (i / keys) * 10))
            .collect();
        let mut out = Output::default();
        op.process_batch(batch(&rows), &mut out).await.unwrap();
        op.on_watermark(100, &mut out).await.unwrap();
        let watermarks = |out: &Output| {
            out.main
                .iter()
                .filter(|e| matches!(e, StreamElement::Watermark(_)))
                .count()
        };
        // Two windows of 40 000 rows pass the part's 65 536: the third waits.
        assert!(op.has_more());
        assert_eq!(results(&out).len(), 2 * keys as usize);
        assert_eq!(watermarks(&out), 0, "the watermark follows the last part");
        assert!(
            out.main.iter().all(|e| match e {
                StreamElement::Batch(b) => b.num_rows() <= crate::window::fixed::EMIT_ROWS,
                _ => true,
            }),
            "results come in batches of at most EMIT_ROWS"
        );
        let mut rest = Output::default();
        op.resume(&mut rest).await.unwrap();
        assert!(!op.has_more());
        let third = results(&rest);
        assert_eq!(third.len(), keys as usize);
        assert!(
            third
                .iter()
                .all(|&(_, start, n, s)| start == 20 && n == 1 && s == 1)
        );
        assert!(matches!(
            rest.main.last(),
            Some(StreamElement::Watermark(100))
        ));
        assert!(!has_open_windows(&op));
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
    async fn a_cache_that_spills_every_batch_gives_the_same_output() {
        let kinds = [
            pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: 10 }),
            pb::window_spec::Kind::Sliding(pb::SlidingWindow {
                size_ms: 10,
                slide_ms: 4,
            }),
        ];
        let rows = restore_input();
        let event = pb::TimeCharacteristic::TimeEvent;
        for kind in kinds {
            for lateness in [0, 8] {
                let mut outputs = Vec::new();
                for cache in [None, Some(1)] {
                    let store = Arc::new(MemoryStateStore::new(true));
                    let (mut op, state) =
                        window_cached(kind, event, lateness, store, (0, 1), 1, cache).await;
                    let mut out = Output::default();
                    for (i, chunk) in rows.chunks(13 * 10).enumerate() {
                        feed(std::slice::from_mut(&mut op), chunk, &mut out).await;
                        let barrier = Barrier {
                            checkpoint_id: i as u64 + 1,
                            kind: crate::element::BarrierKind::Aligned,
                            timeout_at_ms: 0,
                        };
                        op.on_barrier(barrier, &mut out).await.unwrap();
                        state.seal(i as u64 + 1).await.unwrap();
                    }
                    op.close(&mut out).await.unwrap();
                    let spills = op.counters.cache.spills.load(Ordering::Relaxed);
                    assert_eq!(spills > 0, cache.is_some(), "{kind:?}: {spills} spills");
                    outputs.push(results(&out));
                }
                assert!(!outputs[0].is_empty());
                assert_eq!(outputs[0], outputs[1], "{kind:?} lateness {lateness}");
            }
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
    async fn windows_restored_with_the_state_fire_every_window_once_after_a_restart() {
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
        for (kind, cache) in kinds.into_iter().flat_map(|k| [(k, None), (k, Some(64))]) {
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
                        window_cached(kind, event, lateness, store.clone(), (0, 1), 1, cache).await;
                    feed(std::slice::from_mut(&mut op), first, &mut out).await;
                    let barrier = Barrier {
                        checkpoint_id: 1,
                        kind: crate::element::BarrierKind::Aligned,
                        timeout_at_ms: 0,
                    };
                    op.on_barrier(barrier, &mut out).await.unwrap();
                    state.seal(1).await.unwrap();
                    store.commit(1, &[1]).await.unwrap();
                    assert!(has_open_windows(&op));
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
                            window_cached(kind, event, lateness, store.clone(), at, 2, cache).await;
                        ops.push(op);
                    }
                    // Every subtask found open windows of its key groups in the state.
                    assert!(ops.iter().all(has_open_windows));
                    feed(&mut ops, rest, &mut out).await;
                    for op in &mut ops {
                        op.close(&mut out).await.unwrap();
                    }
                    assert_eq!(
                        results(&out),
                        expected,
                        "{kind:?} lateness {lateness} cache {cache:?} restored at parallelism {parallelism}"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn a_fresh_state_restores_no_window_and_keeps_the_watermark_at_min() {
        let tumbling = pb::window_spec::Kind::Tumbling(pb::TumblingWindow { size_ms: 10 });
        let op = window(tumbling, pb::TimeCharacteristic::TimeEvent).await;
        assert!(!has_open_windows(&op));
        assert_eq!(op.watermark, Timestamp::MIN);
    }
}
