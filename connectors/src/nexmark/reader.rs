//! The Nexmark source reader: one subtask's splits of the generated stream.
//!
//! # Splits
//!
//! The chosen stream's index space 0, 1, 2 ... is cut into `S` interleaved splits: split
//! `s` produces indices `s, s + S, s + 2S ...`. Interleaving keeps the splits' event
//! times close to each other, so a per-split watermark holds nothing back for long.
//! Subtask `i` of `p` reads the splits `j` with `j % p == i`, round-robin, one batch at a
//! time. Since each row depends only on (seed, index), the union of all subtasks' rows
//! is the same for every parallelism and split count.
//!
//! # Positions
//!
//! Split `j` of `S` is named `nexmark/{S}/{j}`; its position is its next stream index
//! (8 bytes, big-endian) or [`FINISHED`]. A reader of any parallelism resumes from the
//! positions of all readers of the same source, as long as `S` is the same: with
//! `splits: 0` (one split per subtask) a rescale changes `S`, and restoring says so.
//!
//! # Rate
//!
//! `max_events_per_second` throttles the wall-clock rate of the whole source, shared
//! evenly by its subtasks: the asynchronous [`SourceReader::next_batch`] waits so that a
//! subtask's rows never exceed its share times the time since its first batch, in
//! batches of at most a tenth of a second's share so that a step stays short.
//! [`NexmarkReader::next_batch_sync`] is never throttled.

use std::collections::HashMap;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::pb;
use tokio::time::{Duration, Instant};

use super::config::NexmarkConfig;
use super::generator::Generator;
use sluice_compute::connector::{SourceBatch, SourceCounters, SourceReader, SubtaskInfo};
use sluice_compute::error::{Error, Result};

/// The position of a split that has produced all its rows.
pub const FINISHED: &[u8] = b"finished";

/// Prefix of every Nexmark split name.
const SPLIT_PREFIX: &str = "nexmark/";

/// Reads the Nexmark splits assigned to one subtask.
#[derive(Debug)]
pub struct NexmarkReader {
    generator: Generator,
    /// Events of the stream; `None` when unbounded.
    events: Option<u64>,
    /// Total number of splits `S` (the stride between a split's indices).
    stride: u64,
    /// This reader's subtask: local split `l` is global split `index + l * parallelism`.
    subtask: SubtaskInfo,
    /// Next stream index of each local split; `None` once finished.
    next: Vec<Option<u64>>,
    batch_size: usize,
    /// Local split to read from next.
    cursor: usize,
    /// Finished splits not yet taken by [`SourceReader::take_finished_splits`].
    finished: Vec<usize>,
    /// Local splits already reported finished (each is reported once).
    reported: Vec<bool>,
    counters: SourceCounters,
    /// The wall-clock throttle; `None` when reading as fast as possible.
    throttle: Option<Throttle>,
    /// `repeat_batches` (0: generate every batch), and the full batches generated so
    /// far, which are emitted again once there are that many.
    repeat: usize,
    repeated: Vec<RecordBatch>,
}

/// A subtask's share of the source's wall-clock rate.
#[derive(Debug)]
struct Throttle {
    /// Rows per second this subtask may produce.
    rows_per_second: f64,
    /// Largest batch: a tenth of a second's share, at least one row.
    max_rows: usize,
    /// When the first batch was asked for.
    started: Option<Instant>,
    /// Rows produced since then.
    rows: u64,
}

impl Throttle {
    /// How long to wait, at `now`, before `more` rows may follow.
    fn wait(&mut self, now: Instant, more: u64) -> Duration {
        let started = *self.started.get_or_insert(now);
        let due = (self.rows + more) as f64 / self.rows_per_second;
        Duration::try_from_secs_f64(due)
            .ok()
            .and_then(|due| started.checked_add(due))
            .map_or(Duration::MAX, |at| at.saturating_duration_since(now))
    }
}

impl NexmarkReader {
    /// The reader of `subtask`, producing batches of up to `batch_size` rows.
    pub fn new(spec: &pb::NexmarkSource, subtask: SubtaskInfo, batch_size: usize) -> Result<Self> {
        if subtask.parallelism == 0 || subtask.index >= subtask.parallelism {
            return Err(Error::Internal(format!("invalid subtask {subtask:?}")));
        }
        if batch_size == 0 {
            return Err(Error::Plan(
                "the Nexmark source needs a batch size above 0".into(),
            ));
        }
        let cfg = NexmarkConfig::from_spec(spec);
        let stride = match spec.splits {
            0 => subtask.parallelism as u64,
            n => n as u64,
        };
        let throttle = (spec.max_events_per_second > 0).then(|| {
            let rows_per_second = spec.max_events_per_second as f64 / subtask.parallelism as f64;
            Throttle {
                rows_per_second,
                max_rows: ((rows_per_second / 10.0) as usize).max(1),
                started: None,
                rows: 0,
            }
        });
        let mut reader = NexmarkReader {
            generator: Generator::new(cfg),
            events: cfg.events,
            stride,
            subtask,
            next: Vec::new(),
            batch_size,
            cursor: 0,
            finished: Vec::new(),
            reported: Vec::new(),
            counters: SourceCounters::default(),
            throttle,
            repeat: spec.repeat_batches as usize,
            repeated: Vec::new(),
        };
        let starts: Vec<u64> = reader.global_splits().collect();
        reader.start_at(starts.into_iter().map(Some));
        Ok(reader)
    }

    /// The global index of each local split, in local order.
    fn global_splits(&self) -> impl Iterator<Item = u64> + use<> {
        (self.subtask.index as u64..self.stride).step_by(self.subtask.parallelism)
    }

    /// Sets each local split's next index (`None`: finished), queueing the splits that are
    /// finished and not reported yet.
    fn start_at(&mut self, next: impl Iterator<Item = Option<u64>>) {
        self.next = next.map(|n| n.filter(|&n| self.remaining(n) > 0)).collect();
        self.reported.resize(self.next.len(), false);
        self.finished = (0..self.next.len())
            .filter(|&l| self.next[l].is_none() && !self.reported[l])
            .collect();
        self.cursor = 0;
    }

    /// Rows left in a split whose next index is `next`.
    fn remaining(&self, next: u64) -> u64 {
        match self.events {
            Some(events) if next >= events => 0,
            Some(events) => (events - next).div_ceil(self.stride),
            None => u64::MAX,
        }
    }

    /// The local split the next batch comes from and its row count, at most `max_rows`.
    fn peek(&self, max_rows: usize) -> Option<(usize, u64)> {
        let splits = self.next.len();
        (0..splits)
            .map(|step| (self.cursor + step) % splits)
            .find_map(|local| {
                let next = self.next[local]?;
                Some((local, self.remaining(next).min(max_rows as u64)))
            })
    }

    /// The next batch, synchronously: the generator never waits.
    pub fn next_batch_sync(&mut self) -> Option<SourceBatch> {
        self.next_batch_of(self.batch_size)
    }

    /// The next batch of at most `max_rows` rows.
    fn next_batch_of(&mut self, max_rows: usize) -> Option<SourceBatch> {
        let (local, count) = self.peek(max_rows)?;
        let next = self.next[local]?;
        let batch = self.generate(next, count as usize);
        let after = next + count * self.stride;
        if self.remaining(after) == 0 {
            self.next[local] = None;
            self.finished.push(local);
        } else {
            self.next[local] = Some(after);
        }
        self.cursor = (local + 1) % self.next.len();
        self.counters.records += count;
        Some(SourceBatch {
            split: local,
            batch,
        })
    }

    /// Rows `next`, `next + stride`, ... (`count` of them): generated, or with
    /// `repeat_batches` a full batch generated earlier, emitted again.
    fn generate(&mut self, next: u64, count: usize) -> RecordBatch {
        if self.repeat == 0 || count != self.batch_size {
            return self.generator.batch(next, self.stride, count);
        }
        let full = (self.counters.records / self.batch_size as u64) as usize;
        if self.repeated.len() < self.repeat {
            let batch = self.generator.batch(next, self.stride, count);
            self.repeated.push(batch.clone());
            return batch;
        }
        self.repeated[full % self.repeat].clone()
    }

    /// The name of global split `split`.
    fn split_name(&self, split: u64) -> String {
        format!("{SPLIT_PREFIX}{}/{split}", self.stride)
    }
}

/// `(stride, split)` of a Nexmark split name, `None` if `name` is not one.
fn parse_split_name(name: &str) -> Option<(u64, u64)> {
    let (stride, split) = name.strip_prefix(SPLIT_PREFIX)?.split_once('/')?;
    Some((stride.parse().ok()?, split.parse().ok()?))
}

#[async_trait]
impl SourceReader for NexmarkReader {
    fn schema(&self) -> SchemaRef {
        self.generator.schema()
    }

    fn num_splits(&self) -> usize {
        self.next.len()
    }

    async fn next_batch(&mut self) -> Result<Option<SourceBatch>> {
        let Some(max_rows) = self.throttle.as_ref().map(|t| t.max_rows) else {
            return Ok(self.next_batch_sync());
        };
        let max_rows = self.batch_size.min(max_rows);
        let Some((_, count)) = self.peek(max_rows) else {
            return Ok(None);
        };
        // Wait first and generate after, so that a future dropped while it waits loses
        // nothing.
        if let Some(throttle) = self.throttle.as_mut() {
            let wait = throttle.wait(Instant::now(), count);
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            throttle.rows += count;
        }
        Ok(self.next_batch_of(max_rows))
    }

    /// One batch from each split in turn: a restored split behind the others must hold
    /// the watermark from the start.
    fn splits_read_concurrently(&self) -> bool {
        true
    }

    fn take_finished_splits(&mut self) -> Vec<usize> {
        for &l in &self.finished {
            self.reported[l] = true;
        }
        std::mem::take(&mut self.finished)
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }

    fn positions(&self) -> Result<Vec<(String, Bytes)>> {
        Ok(self
            .global_splits()
            .zip(&self.next)
            .map(|(split, next)| {
                let position = match next {
                    Some(n) => Bytes::copy_from_slice(&n.to_be_bytes()),
                    None => Bytes::from_static(FINISHED),
                };
                (self.split_name(split), position)
            })
            .collect())
    }

    /// Counters keep counting what this reader produced: a restore does not change them.
    fn restore(&mut self, positions: &HashMap<String, Bytes>) -> Result<()> {
        for name in positions.keys() {
            let Some((stride, split)) = parse_split_name(name) else {
                return Err(Error::Plan(format!(
                    "the checkpoint holds a position for `{name}`, which is not a split of a \
                     Nexmark source; was the job's source changed?"
                )));
            };
            if stride != self.stride {
                return Err(Error::Plan(format!(
                    "the Nexmark source's split count changed from {stride} at the checkpoint \
                     to {} now, so its positions cannot be resumed; to rescale a job, set the \
                     source's `splits:` to a fixed number (`splits: 0` means one per subtask, \
                     which changes with the parallelism), or resume at parallelism {stride}",
                    self.stride
                )));
            }
            if split >= stride {
                return Err(Error::Plan(format!(
                    "the checkpoint holds a position for split `{name}`, beyond the source's \
                     {stride} splits"
                )));
            }
        }
        let mut next = Vec::with_capacity(self.next.len());
        for split in self.global_splits() {
            let name = self.split_name(split);
            next.push(match positions.get(&name).map(|p| &p[..]) {
                None => Some(split),
                Some(FINISHED) => None,
                Some(p) => {
                    let bytes: [u8; 8] = p.try_into().map_err(|_| {
                        Error::Plan(format!(
                            "the checkpoint's position of Nexmark split `{name}` is malformed: \
                             {} bytes where 8 (the next index) or `finished` were expected",
                            p.len()
                        ))
                    })?;
                    let index = u64::from_be_bytes(bytes);
                    if index % self.stride != split {
                        return Err(Error::Plan(format!(
                            "the checkpoint's position of Nexmark split `{name}` is malformed: \
                             index {index} is not one of that split's"
                        )));
                    }
                    Some(index)
                }
            });
        }
        self.start_at(next.into_iter());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::TimestampMillisecondType;
    use arrow::util::display::array_value_to_string;

    use super::*;
    use crate::nexmark::generate_all;

    fn spec(stream: pb::NexmarkStream, events: u64, splits: u32) -> pb::NexmarkSource {
        pb::NexmarkSource {
            stream: stream as i32,
            events,
            seed: 7,
            max_out_of_orderness_ms: 500,
            events_per_second: 0,
            splits,
            max_events_per_second: 0,
            repeat_batches: 0,
        }
    }

    fn rows(batches: &[RecordBatch]) -> Vec<String> {
        let mut out = Vec::new();
        for b in batches {
            for r in 0..b.num_rows() {
                let cells: Vec<String> = b
                    .columns()
                    .iter()
                    .map(|c| array_value_to_string(c, r).unwrap())
                    .collect();
                out.push(cells.join("|"));
            }
        }
        out
    }

    fn read_all(spec: &pb::NexmarkSource, p: usize, batch_size: usize) -> Vec<Vec<SourceBatch>> {
        (0..p)
            .map(|index| {
                let subtask = SubtaskInfo {
                    index,
                    parallelism: p,
                    fence: 0,
                };
                let mut r = NexmarkReader::new(spec, subtask, batch_size).unwrap();
                let mut out = Vec::new();
                let mut finished = r.take_finished_splits();
                while let Some(b) = r.next_batch_sync() {
                    assert!(b.batch.num_rows() <= batch_size && b.batch.num_rows() > 0);
                    assert!(!finished.contains(&b.split), "batch after split finished");
                    finished.extend(r.take_finished_splits());
                    out.push(b);
                }
                finished.sort_unstable();
                assert_eq!(finished, (0..r.num_splits()).collect::<Vec<_>>());
                let rows: usize = out.iter().map(|b| b.batch.num_rows()).sum();
                assert_eq!(r.counters().records, rows as u64);
                out
            })
            .collect()
    }

    #[test]
    fn repeat_batches_emits_the_first_full_batches_again_and_counts_every_row() {
        let mut spec = spec(pb::NexmarkStream::Bid, 1000, 1);
        spec.repeat_batches = 2;
        let mut r = NexmarkReader::new(
            &spec,
            SubtaskInfo {
                index: 0,
                parallelism: 1,
                fence: 0,
            },
            300,
        )
        .unwrap();
        let mut batches = Vec::new();
        while let Some(b) = r.next_batch_sync() {
            batches.push(b.batch);
        }
        assert_eq!(
            batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>(),
            [300, 300, 300, 100]
        );
        assert_ne!(batches[0], batches[1], "the first batches are generated");
        assert_eq!(batches[2], batches[0], "then emitted again");
        assert_eq!(r.counters().records, 1000);
        // The short last batch is generated: its rows are the stream's own.
        let mut plain = spec;
        plain.repeat_batches = 0;
        let mut g = NexmarkReader::new(
            &plain,
            SubtaskInfo {
                index: 0,
                parallelism: 1,
                fence: 0,
            },
            300,
        )
        .unwrap();
        let last = std::iter::from_fn(|| g.next_batch_sync()).last().unwrap();
        assert_eq!(last.batch, batches[3]);
    }

    #[test]
    fn every_parallelism_and_split_count_yields_the_same_events() {
        for stream in [
            pb::NexmarkStream::Bid,
            pb::NexmarkStream::Auction,
            pb::NexmarkStream::Person,
        ] {
            let events = 5_003;
            let spec1 = spec(stream, events, 0);
            let mut expected = rows(&generate_all(&spec1, 1000).collect::<Vec<_>>());
            assert_eq!(expected.len(), events as usize);
            expected.sort();
            for (p, splits) in [(1, 0), (2, 0), (3, 0), (2, 5), (3, 2), (4, 1)] {
                let per_subtask = read_all(&spec(stream, events, splits), p, 777);
                let batches: Vec<RecordBatch> =
                    per_subtask.into_iter().flatten().map(|b| b.batch).collect();
                let mut got = rows(&batches);
                got.sort();
                assert_eq!(got, expected, "{stream:?} p={p} splits={splits}");
            }
        }
    }

    #[test]
    fn each_split_respects_the_out_of_orderness_bound() {
        let s = spec(pb::NexmarkStream::Bid, 20_000, 4);
        for subtask in read_all(&s, 2, 500) {
            let mut max = [i64::MIN; 2];
            for b in subtask {
                let t = b.batch.column_by_name("date_time").unwrap();
                for t in t.as_primitive::<TimestampMillisecondType>().values() {
                    assert!(*t >= max[b.split].saturating_sub(500));
                    max[b.split] = max[b.split].max(*t);
                }
            }
        }
    }

    #[test]
    fn splits_are_read_round_robin_and_interleaved() {
        let s = spec(pb::NexmarkStream::Person, 100, 4);
        let out = read_all(&s, 2, 10).remove(1);
        // Subtask 1 of 2 owns global splits 1 and 3: persons 1001, 1005 ... and 1003, 1007 ...
        assert_eq!(
            out.iter().map(|b| b.split).take(4).collect::<Vec<_>>(),
            [0, 1, 0, 1]
        );
        let first = out[0]
            .batch
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(first.values()[..3], [1001, 1005, 1009]);
        let second = out[1]
            .batch
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(second.values()[..3], [1003, 1007, 1011]);
        assert_eq!(out.iter().map(|b| b.batch.num_rows()).sum::<usize>(), 50);
        assert!(out.iter().all(|b| b.batch.column(0).null_count() == 0));
    }

    #[test]
    fn more_splits_than_events_finish_empty_splits_at_once() {
        let s = spec(pb::NexmarkStream::Bid, 2, 4);
        let mut r = NexmarkReader::new(
            &s,
            SubtaskInfo {
                index: 1,
                parallelism: 2,
                fence: 0,
            },
            10,
        )
        .unwrap();
        // Global splits 1 (index 1) and 3 (empty).
        assert_eq!(r.num_splits(), 2);
        assert_eq!(r.take_finished_splits(), vec![1]);
        assert_eq!(r.next_batch_sync().unwrap().batch.num_rows(), 1);
        assert_eq!(r.take_finished_splits(), vec![0]);
        assert!(r.next_batch_sync().is_none());
    }

    fn reader(
        spec: &pb::NexmarkSource,
        index: usize,
        p: usize,
        batch_size: usize,
    ) -> NexmarkReader {
        let subtask = SubtaskInfo {
            index,
            parallelism: p,
            fence: 0,
        };
        NexmarkReader::new(spec, subtask, batch_size).unwrap()
    }

    /// Reads up to `limit` rows (whole batches), checking that every split is reported
    /// finished once and only after its last batch; returns the batches and the splits
    /// reported finished.
    fn read_some(r: &mut NexmarkReader, limit: usize) -> (Vec<RecordBatch>, Vec<usize>) {
        let mut batches = Vec::new();
        let mut finished = r.take_finished_splits();
        let mut rows = 0;
        while rows < limit {
            let Some(b) = r.next_batch_sync() else { break };
            assert!(!finished.contains(&b.split), "batch after split finished");
            rows += b.batch.num_rows();
            batches.push(b.batch);
            finished.extend(r.take_finished_splits());
        }
        (batches, finished)
    }

    #[test]
    fn positions_resume_at_another_parallelism_without_gap_or_duplicate() {
        let events = 5_003;
        let s = spec(pb::NexmarkStream::Bid, events, 6);
        let mut expected = rows(&generate_all(&s, 1000).collect::<Vec<_>>());
        expected.sort();
        // Parallelism 2: subtask 0 reads all its splits to the end, subtask 1 about half.
        let mut before = Vec::new();
        let mut positions = std::collections::HashMap::new();
        for (index, limit) in [(0, usize::MAX), (1, 1_200)] {
            let mut r = reader(&s, index, 2, 100);
            before.extend(read_some(&mut r, limit).0);
            let own = r.positions().unwrap();
            assert_eq!(own.len(), 3);
            positions.extend(own);
        }
        assert_eq!(positions.len(), 6);
        assert_eq!(positions["nexmark/6/0"], Bytes::from_static(FINISHED));
        assert_eq!(positions["nexmark/6/1"].len(), 8);
        for p in [1, 2, 4] {
            let mut got = rows(&before);
            let mut finished_splits = 0;
            for index in 0..p {
                let mut r = reader(&s, index, p, 77);
                r.restore(&positions).unwrap();
                let (after, mut finished) = read_some(&mut r, usize::MAX);
                finished.sort_unstable();
                assert_eq!(finished, (0..r.num_splits()).collect::<Vec<_>>(), "p={p}");
                assert!(r.take_finished_splits().is_empty());
                finished_splits += finished.len();
                let produced: usize = after.iter().map(|b| b.num_rows()).sum();
                assert_eq!(r.counters().records, produced as u64);
                got.extend(rows(&after));
                // Every split ends finished, at any parallelism.
                assert!(
                    r.positions()
                        .unwrap()
                        .iter()
                        .all(|(_, pos)| pos == FINISHED)
                );
            }
            assert_eq!(finished_splits, 6);
            got.sort();
            assert_eq!(got.len(), expected.len(), "p={p}: a gap or a duplicate");
            assert_eq!(got, expected, "p={p}");
        }
    }

    #[test]
    fn a_split_without_a_position_starts_at_its_beginning() {
        let s = spec(pb::NexmarkStream::Person, 100, 2);
        let mut first = reader(&s, 0, 1, 10);
        read_some(&mut first, 30);
        let mut positions: std::collections::HashMap<_, _> =
            first.positions().unwrap().into_iter().collect();
        positions.remove("nexmark/2/1");
        let mut r = reader(&s, 1, 2, 100);
        r.restore(&positions).unwrap();
        let (batches, _) = read_some(&mut r, usize::MAX);
        assert_eq!(rows(&batches).len(), 50);
    }

    #[test]
    fn restoring_at_another_split_count_is_refused_with_advice() {
        let s = spec(pb::NexmarkStream::Bid, 1_000, 0);
        let positions: std::collections::HashMap<_, _> = (0..2)
            .flat_map(|i| reader(&s, i, 2, 10).positions().unwrap())
            .collect();
        let err = reader(&s, 0, 3, 10).restore(&positions).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("split count changed from 2") && msg.contains("to 3"),
            "{msg}"
        );
        assert!(msg.contains("`splits:`"), "{msg}");
        // At the same parallelism the positions are fine.
        reader(&s, 1, 2, 10).restore(&positions).unwrap();
    }

    #[test]
    fn a_malformed_position_names_its_split() {
        let s = spec(pb::NexmarkStream::Bid, 1_000, 2);
        let bad = std::collections::HashMap::from([(
            "nexmark/2/1".to_string(),
            Bytes::from_static(b"abc"),
        )]);
        let msg = reader(&s, 0, 1, 10).restore(&bad).unwrap_err().to_string();
        assert!(
            msg.contains("`nexmark/2/1`") && msg.contains("3 bytes"),
            "{msg}"
        );
        let wrong_split = std::collections::HashMap::from([(
            "nexmark/2/1".to_string(),
            Bytes::copy_from_slice(&10u64.to_be_bytes()),
        )]);
        let msg = reader(&s, 0, 1, 10)
            .restore(&wrong_split)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("`nexmark/2/1`") && msg.contains("index 10"),
            "{msg}"
        );
        let foreign = std::collections::HashMap::from([("file/a.csv".to_string(), Bytes::new())]);
        let msg = reader(&s, 0, 1, 10)
            .restore(&foreign)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`file/a.csv`"), "{msg}");
    }

    #[tokio::test]
    async fn a_restored_split_behind_the_others_is_not_behind_the_watermark() {
        // Split 0 read 3 s of event time further than split 1, then both restored into
        // one subtask, which reads split 0 first.
        let s = spec(pb::NexmarkStream::Bid, 40_000, 2);
        let mut positions = HashMap::new();
        for (index, limit) in [(0, 15_000), (1, 200)] {
            let mut r = reader(&s, index, 2, 100);
            read_some(&mut r, limit);
            positions.extend(r.positions().unwrap());
        }
        let mut r = reader(&s, 0, 1, 100);
        r.restore(&positions).unwrap();
        let (batches, watermark) =
            crate::watermark_tests::read_behind_no_watermark(&mut r, "date_time", 1_000).await;
        assert!(
            batches > 200 && watermark > i64::MIN,
            "{batches} {watermark}"
        );
    }

    #[tokio::test]
    async fn the_wall_clock_rate_is_shared_by_the_subtasks() {
        // 2,000 events/s over 2 subtasks: 1,000 rows/s each, in batches of at most 100.
        let mut s = spec(pb::NexmarkStream::Bid, 600, 0);
        s.max_events_per_second = 2_000;
        let mut r = reader(&s, 0, 2, 8192);
        let started = std::time::Instant::now();
        let mut rows = 0;
        while let Some(b) = r.next_batch().await.unwrap() {
            assert!(b.batch.num_rows() <= 100);
            rows += b.batch.num_rows();
        }
        assert_eq!(rows, 300);
        // 300 rows at 1,000 rows/s take 0.3 s; only a lower bound is safe to assert.
        let expected = std::time::Duration::from_millis(300);
        assert!(
            started.elapsed() >= expected.mul_f64(0.8),
            "{:?}",
            started.elapsed()
        );
        // The synchronous path is not throttled.
        let mut r = reader(&s, 1, 2, 8192);
        assert_eq!(r.next_batch_sync().unwrap().batch.num_rows(), 300);
    }

    #[test]
    fn unbounded_streams_do_not_end() {
        let s = spec(pb::NexmarkStream::Bid, 0, 0);
        let mut r = NexmarkReader::new(
            &s,
            SubtaskInfo {
                index: 0,
                parallelism: 1,
                fence: 0,
            },
            100,
        )
        .unwrap();
        for _ in 0..10 {
            assert_eq!(r.next_batch_sync().unwrap().batch.num_rows(), 100);
        }
        assert!(r.take_finished_splits().is_empty());
    }
}
