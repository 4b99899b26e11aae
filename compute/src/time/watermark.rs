//! Bounded out-of-orderness watermarks, tracked per source split.
//!
//! For each split the generator remembers the largest event time seen; the split's
//! watermark is that minus the allowed out-of-orderness minus one millisecond (Flink's
//! `BoundedOutOfOrdernessWatermarks`). The source's watermark is the minimum over its
//! active splits: those that produced data, have not finished, and were not silent for
//! longer than the idleness timeout. When every split is idle the source declares itself
//! idle so downstream tasks stop waiting for it.

use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray};
use arrow::compute::{cast, max};
use arrow::datatypes::{DataType, Int64Type, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use sluice_common::pb;

use crate::element::{StreamElement, Timestamp};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy)]
struct SplitState {
    max_ts: Timestamp,
    last_active: Instant,
    finished: bool,
}

/// Generates watermarks for one source subtask.
#[derive(Debug)]
pub struct WatermarkGenerator {
    column: usize,
    out_of_orderness: i64,
    idleness: Option<Duration>,
    splits: Vec<Option<SplitState>>,
    emitted: Timestamp,
    idle: bool,
    /// Splits are read concurrently and this subtask has none (fewer partitions than
    /// subtasks): it is idle from the start, or its silence would hold back every window.
    owns_nothing: bool,
    /// The split whose watermark was the minimum at the last evaluation.
    holder: Option<usize>,
}

impl WatermarkGenerator {
    /// A generator for `spec` over batches of `schema` from `num_splits` splits; with
    /// `hold_unstarted`, a split that has produced nothing holds the watermark at its
    /// minimum until it produces or goes idle (splits read concurrently: a silent Kafka
    /// partition must not let windows close over data it has yet to deliver).
    pub fn new(
        spec: &pb::WatermarkSpec,
        schema: &SchemaRef,
        num_splits: usize,
        hold_unstarted: bool,
    ) -> Result<Self> {
        let column = schema.index_of(&spec.column).map_err(|_| {
            let known: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Error::Plan(format!(
                "watermark column `{}` is not produced by the source; it has {}",
                spec.column,
                known.join(", ")
            ))
        })?;
        match schema.field(column).data_type() {
            DataType::Timestamp(_, _) | DataType::Int64 => {}
            other => {
                return Err(Error::Plan(format!(
                    "watermark column `{}` has type {other}; expected a timestamp",
                    spec.column
                )));
            }
        }
        Ok(Self {
            column,
            out_of_orderness: spec.max_out_of_orderness_ms.min(i64::MAX as u64 / 4) as i64,
            idleness: (spec.idleness_ms > 0).then(|| Duration::from_millis(spec.idleness_ms)),
            splits: vec![
                (hold_unstarted && num_splits > 0).then(|| SplitState {
                    max_ts: Timestamp::MIN,
                    last_active: Instant::now(),
                    finished: false,
                });
                num_splits.max(1)
            ],
            emitted: Timestamp::MIN,
            idle: false,
            owns_nothing: hold_unstarted && num_splits == 0,
            holder: None,
        })
    }

    /// Takes note of a batch from `split`; returns a watermark when it advanced.
    pub fn on_batch(&mut self, split: usize, batch: &RecordBatch) -> Result<Option<StreamElement>> {
        self.on_batch_at(split, batch, Instant::now())
    }

    /// [`Self::on_batch`] at a given instant (tests drive the clock).
    fn on_batch_at(
        &mut self,
        split: usize,
        batch: &RecordBatch,
        now: Instant,
    ) -> Result<Option<StreamElement>> {
        let col = batch.column(self.column);
        let ms = match col.data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, _) | DataType::Int64 => {
                cast(col, &DataType::Int64)?
            }
            _ => cast(
                &cast(col, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
                &DataType::Int64,
            )?,
        };
        let state = self.split_mut(split, now);
        state.last_active = now;
        if let Some(m) = max(ms.as_primitive::<Int64Type>()) {
            state.max_ts = state.max_ts.max(m);
        }
        // Data makes the source active again; the batch itself tells downstream so.
        self.idle = false;
        Ok(self.advance(now))
    }

    /// `split` began to be read alongside others: until it produces (or is idle, or
    /// finishes) it holds the watermark where it is, so that records it resumes with
    /// behind the other splits are not behind the watermark.
    pub fn on_split_opened(&mut self, split: usize) {
        self.split_mut(split, Instant::now());
    }

    /// `split`'s state, tracked from `now` if it was not yet.
    fn split_mut(&mut self, split: usize, now: Instant) -> &mut SplitState {
        if split >= self.splits.len() {
            self.splits.resize(split + 1, None);
        }
        self.splits[split].get_or_insert(SplitState {
            max_ts: Timestamp::MIN,
            last_active: now,
            finished: false,
        })
    }

    /// `split` is exhausted: it no longer holds the watermark back.
    pub fn on_split_finished(&mut self, split: usize) -> Option<StreamElement> {
        if let Some(Some(s)) = self.splits.get_mut(split) {
            s.finished = true;
        }
        self.advance(Instant::now())
    }

    /// Re-evaluates idleness at a processing-time tick.
    pub fn on_tick(&mut self) -> Option<StreamElement> {
        self.on_tick_at(Instant::now())
    }

    fn on_tick_at(&mut self, now: Instant) -> Option<StreamElement> {
        if let Some(wm) = self.advance(now) {
            return Some(wm);
        }
        if self.owns_nothing && self.splits.iter().all(Option::is_none) && !self.idle {
            self.idle = true;
            return Some(StreamElement::Idle);
        }
        let idleness = self.idleness?;
        let all_idle = self
            .splits
            .iter()
            .flatten()
            .filter(|s| !s.finished)
            .all(|s| now.duration_since(s.last_active) >= idleness);
        if all_idle && !self.idle {
            self.idle = true;
            return Some(StreamElement::Idle);
        }
        None
    }

    /// Whether the source declared itself idle (and has not read since).
    pub fn is_idle(&self) -> bool {
        self.idle
    }

    /// The source did not read for `paused` because it chose not to (watermark
    /// alignment): that time is not silence, so no split turns idle for it.
    pub fn exclude_pause(&mut self, paused: Duration) {
        let now = Instant::now();
        for s in self.splits.iter_mut().flatten() {
            s.last_active = (s.last_active + paused).min(now);
        }
    }

    /// The last watermark emitted.
    pub fn current(&self) -> Timestamp {
        self.emitted
    }

    /// The split that holds the watermark: the slowest of those that count (one that
    /// has delivered nothing, when splits are read concurrently); `None` when none does.
    pub fn holder(&self) -> Option<usize> {
        self.holder
    }

    fn advance(&mut self, now: Instant) -> Option<StreamElement> {
        let idleness = self.idleness;
        let out_of_orderness = self.out_of_orderness;
        let bound = |s: &SplitState| s.max_ts.saturating_sub(out_of_orderness).saturating_sub(1);
        let open = || {
            self.splits
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
                .filter(|(_, s)| !s.finished)
        };
        let slowest = |splits: &mut dyn Iterator<Item = (usize, &SplitState)>| {
            splits.map(|(i, s)| (bound(s), i)).min()
        };
        let active = slowest(
            &mut open()
                .filter(|(_, s)| idleness.is_none_or(|d| now.duration_since(s.last_active) < d)),
        );
        // Every split is quiet: the splits that delivered something have said how far
        // they got, and a split that never spoke (a silent partition) must not stall
        // the windows the others filled; that is what idleness allows.
        let found = match active {
            Some(found) => Some(found),
            None if idleness.is_some() => {
                slowest(&mut open().filter(|(_, s)| s.max_ts > Timestamp::MIN))
            }
            None => None,
        };
        self.holder = found.map(|(_, i)| i);
        let (min, _) = found?;
        if min > self.emitted {
            self.emitted = min;
            Some(StreamElement::Watermark(min))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn batch(ts: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("t", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(ts.to_vec()))]).unwrap()
    }

    fn spec(ooo: u64) -> pb::WatermarkSpec {
        pb::WatermarkSpec {
            column: "t".into(),
            max_out_of_orderness_ms: ooo,
            idleness_ms: 0,
            alignment: None,
        }
    }

    #[test]
    fn slowest_split_holds_the_watermark() {
        let b = batch(&[0]);
        let mut g = WatermarkGenerator::new(&spec(10), &b.schema(), 2, false).unwrap();
        assert!(matches!(
            g.on_batch(0, &batch(&[100, 50])).unwrap(),
            Some(StreamElement::Watermark(89))
        ));
        // Split 1 is behind: the watermark may not move forward.
        assert!(g.on_batch(1, &batch(&[60])).unwrap().is_none());
        assert_eq!(g.current(), 89);
        assert!(g.on_batch(0, &batch(&[200])).unwrap().is_none());
        // Split 1 finishing releases split 0's watermark.
        assert!(matches!(
            g.on_split_finished(1),
            Some(StreamElement::Watermark(189))
        ));
    }

    #[test]
    fn a_split_opened_beside_others_holds_the_watermark_until_it_produces() {
        // Files read in turn, restored at different times: the one far ahead speaks first.
        let b = batch(&[0]);
        let mut g = WatermarkGenerator::new(&spec(0), &b.schema(), 2, false).unwrap();
        g.on_split_opened(0);
        g.on_split_opened(1);
        assert!(g.on_batch(0, &batch(&[5_000])).unwrap().is_none());
        assert!(matches!(
            g.on_batch(1, &batch(&[100])).unwrap(),
            Some(StreamElement::Watermark(99))
        ));
        // Opening a split that already spoke changes nothing.
        g.on_split_opened(1);
        assert_eq!(g.holder(), Some(1));
        // A split never opened holds nothing back (it waits for a place).
        let mut g = WatermarkGenerator::new(&spec(0), &b.schema(), 2, false).unwrap();
        assert!(matches!(
            g.on_batch(0, &batch(&[5_000])).unwrap(),
            Some(StreamElement::Watermark(4_999))
        ));
    }

    #[test]
    fn unknown_column_is_a_plan_error() {
        let b = batch(&[0]);
        let mut s = spec(0);
        s.column = "nope".into();
        assert!(
            WatermarkGenerator::new(&s, &b.schema(), 1, false)
                .unwrap_err()
                .is_user_error()
        );
    }
}

#[cfg(test)]
mod idleness_tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn batch(ts: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("t", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![ts]))]).unwrap()
    }

    #[test]
    fn a_silent_split_stops_holding_the_watermark_then_all_idle_is_reported() {
        let spec = pb::WatermarkSpec {
            column: "t".into(),
            max_out_of_orderness_ms: 0,
            idleness_ms: 30,
            alignment: None,
        };
        let mut g = WatermarkGenerator::new(&spec, &batch(0).schema(), 2, false).unwrap();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        g.on_batch_at(0, &batch(1_000), at(0)).unwrap();
        g.on_batch_at(1, &batch(10), at(0)).unwrap();
        assert_eq!(
            g.current(),
            999,
            "split 1 had not spoken yet when split 0 first did"
        );
        assert!(
            g.on_batch_at(0, &batch(2_000), at(20)).unwrap().is_none(),
            "split 1 holds it"
        );
        // Split 1 has been silent for 40 ms > 30 ms: only split 0 counts now.
        assert!(matches!(
            g.on_tick_at(at(40)),
            Some(StreamElement::Watermark(1_999))
        ));
        assert!(matches!(g.on_tick_at(at(100)), Some(StreamElement::Idle)));
        assert!(g.on_tick_at(at(110)).is_none(), "idleness is reported once");
        // Data wakes the source; the watermark never goes back.
        assert!(g.on_batch_at(1, &batch(50), at(120)).unwrap().is_none());
        assert_eq!(g.current(), 1_999);
    }

    #[test]
    fn a_concurrent_split_that_never_spoke_holds_the_watermark_until_idle() {
        let spec = pb::WatermarkSpec {
            column: "t".into(),
            max_out_of_orderness_ms: 0,
            idleness_ms: 30,
            alignment: None,
        };
        let mut g = WatermarkGenerator::new(&spec, &batch(0).schema(), 2, true).unwrap();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(
            g.on_batch_at(0, &batch(1_000), at(0)).unwrap().is_none(),
            "split 1 has delivered nothing yet, so it holds the watermark"
        );
        assert!(g.on_tick_at(at(10)).is_none());
        // Idleness is counted from when the generator started, not from a first record.
        let later = Instant::now() + Duration::from_millis(40);
        assert!(matches!(
            g.on_batch_at(0, &batch(1_000), later).unwrap(),
            Some(StreamElement::Watermark(999))
        ));
    }

    #[test]
    fn when_every_split_is_quiet_those_that_spoke_set_the_watermark() {
        let spec = pb::WatermarkSpec {
            column: "t".into(),
            max_out_of_orderness_ms: 0,
            idleness_ms: 30,
            alignment: None,
        };
        let mut g = WatermarkGenerator::new(&spec, &batch(0).schema(), 3, true).unwrap();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Splits 0 and 1 deliver everything at once, split 2 never speaks.
        assert!(g.on_batch_at(0, &batch(5_000), at(1)).unwrap().is_none());
        assert!(g.on_batch_at(1, &batch(3_000), at(1)).unwrap().is_none());
        // All three are quiet by now: the two that spoke decide.
        assert!(matches!(
            g.on_tick_at(at(100)),
            Some(StreamElement::Watermark(2_999))
        ));
        assert!(matches!(g.on_tick_at(at(200)), Some(StreamElement::Idle)));
    }

    #[test]
    fn without_idleness_a_silent_concurrent_split_holds_forever() {
        let spec = pb::WatermarkSpec {
            column: "t".into(),
            max_out_of_orderness_ms: 0,
            idleness_ms: 0,
            alignment: None,
        };
        let mut g = WatermarkGenerator::new(&spec, &batch(0).schema(), 2, true).unwrap();
        let later = Instant::now() + Duration::from_secs(3600);
        assert!(g.on_batch_at(0, &batch(1_000), later).unwrap().is_none());
        assert!(g.on_tick_at(later).is_none());
        assert_eq!(g.current(), Timestamp::MIN);
        assert_eq!(
            g.holder(),
            Some(1),
            "the silent split is named as the holder"
        );
    }

    #[test]
    fn a_subtask_that_owns_no_concurrent_split_is_idle_at_once() {
        let mut g =
            WatermarkGenerator::new(&spec_without_idleness(), &batch(0).schema(), 0, true).unwrap();
        assert!(matches!(g.on_tick(), Some(StreamElement::Idle)));
        assert!(g.on_tick().is_none());
    }

    fn spec_without_idleness() -> pb::WatermarkSpec {
        pb::WatermarkSpec {
            column: "t".into(),
            max_out_of_orderness_ms: 0,
            idleness_ms: 0,
            alignment: None,
        }
    }
}
