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

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use sluice_common::pb;

use super::config::NexmarkConfig;
use super::generator::Generator;
use crate::connector::{SourceBatch, SourceCounters, SourceReader, SubtaskInfo};
use crate::error::{Error, Result};

/// Reads the Nexmark splits assigned to one subtask.
#[derive(Debug)]
pub struct NexmarkReader {
    generator: Generator,
    /// Events of the stream; `None` when unbounded.
    events: Option<u64>,
    /// Total number of splits `S` (the stride between a split's indices).
    stride: u64,
    /// Next stream index of each local split; `None` once finished.
    next: Vec<Option<u64>>,
    batch_size: usize,
    /// Local split to read from next.
    cursor: usize,
    finished: Vec<usize>,
    counters: SourceCounters,
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
        let mut reader = NexmarkReader {
            generator: Generator::new(cfg),
            events: cfg.events,
            stride,
            next: Vec::new(),
            batch_size,
            cursor: 0,
            finished: Vec::new(),
            counters: SourceCounters::default(),
        };
        let p = subtask.parallelism as u64;
        for (local, split) in (subtask.index as u64..stride)
            .step_by(p as usize)
            .enumerate()
        {
            if reader.events.is_some_and(|e| split >= e) {
                reader.next.push(None);
                reader.finished.push(local);
            } else {
                reader.next.push(Some(split));
            }
        }
        Ok(reader)
    }

    /// Rows left in a split whose next index is `next`.
    fn remaining(&self, next: u64) -> u64 {
        match self.events {
            Some(events) if next >= events => 0,
            Some(events) => (events - next).div_ceil(self.stride),
            None => u64::MAX,
        }
    }

    /// The next batch, synchronously: the generator never waits.
    pub fn next_batch_sync(&mut self) -> Option<SourceBatch> {
        let splits = self.next.len();
        for step in 0..splits {
            let local = (self.cursor + step) % splits;
            let Some(next) = self.next[local] else {
                continue;
            };
            let count = self.remaining(next).min(self.batch_size as u64);
            let batch = self.generator.batch(next, self.stride, count as usize);
            let after = next + count * self.stride;
            if self.remaining(after) == 0 {
                self.next[local] = None;
                self.finished.push(local);
            } else {
                self.next[local] = Some(after);
            }
            self.cursor = (local + 1) % splits;
            self.counters.records += count;
            return Some(SourceBatch {
                split: local,
                batch,
            });
        }
        None
    }
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
        Ok(self.next_batch_sync())
    }

    fn take_finished_splits(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.finished)
    }

    fn counters(&self) -> SourceCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray, RecordBatch};
    use arrow::datatypes::TimestampMillisecondType;
    use arrow::util::display::array_value_to_string;

    use super::*;
    use crate::connector::nexmark::generate_all;

    fn spec(stream: pb::NexmarkStream, events: u64, splits: u32) -> pb::NexmarkSource {
        pb::NexmarkSource {
            stream: stream as i32,
            events,
            seed: 7,
            max_out_of_orderness_ms: 500,
            events_per_second: 0,
            splits,
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

    #[test]
    fn unbounded_streams_do_not_end() {
        let s = spec(pb::NexmarkStream::Bid, 0, 0);
        let mut r = NexmarkReader::new(
            &s,
            SubtaskInfo {
                index: 0,
                parallelism: 1,
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
