//! One task: an input (a source or an input gate), a chain of operators and an output.
//!
//! The task loop takes one input element at a time and pushes it through the chain; a
//! processing-time tick interleaves when an operator asks for one (or the source tracks
//! idleness). At the end of a bounded input a source emits the final watermark
//! (`i64::MAX`, so every event-time window fires), the chain is closed, and
//! `EndOfPartition` goes downstream.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::connector::SourceReader;
use crate::element::{StreamElement, Timestamp};
use crate::error::{Error, Result};
use crate::operator::OperatorContext;
use crate::runtime::chain::{Chain, TaskOutput};
use crate::runtime::input_gate::InputGate;
use crate::time::watermark::WatermarkGenerator;

/// How often processing-time operators and source idleness are checked.
const TICK: Duration = Duration::from_millis(100);

/// A source subtask's reader with its watermark generator.
pub struct SourceInput {
    /// The connector's reader.
    pub reader: Box<dyn SourceReader>,
    /// Watermarks per split, when the job uses event time.
    pub watermarks: Option<WatermarkGenerator>,
    /// Where the source publishes its watermark for the progress line.
    pub watermark_cell: Arc<AtomicI64>,
    /// Job-wide count of records read.
    pub records_in: Arc<AtomicU64>,
    /// Job-wide count of malformed records skipped.
    pub skipped: Arc<AtomicU64>,
}

/// Where a task's elements come from.
pub enum TaskInput {
    /// The task starts with a source.
    Source(Box<SourceInput>),
    /// The task reads its upstream channels.
    Gate(InputGate),
}

/// One subtask of one chain, ready to run.
pub struct Task {
    /// `node[subtask]` of the chain's first node, for messages.
    pub name: String,
    /// The input.
    pub input: TaskInput,
    /// The operators.
    pub chain: Chain,
    /// Their contexts, one per operator.
    pub contexts: Vec<OperatorContext>,
    /// The output router.
    pub output: TaskOutput,
}

impl Task {
    /// Runs to the end of the input, or until `cancel` turns true.
    pub async fn run(mut self, cancel: watch::Receiver<bool>) -> Result<()> {
        let name = self.name.clone();
        let result = self.run_inner(cancel).await;
        result.map_err(|e| Error::Task {
            task: name,
            source: Box::new(e),
        })
    }

    async fn run_inner(&mut self, mut cancel: watch::Receiver<bool>) -> Result<()> {
        self.chain.open(&self.contexts).await?;
        let ticks = self.chain.wants_processing_time()
            || matches!(&self.input, TaskInput::Source(s) if s.watermarks.is_some());
        let mut last_tick = Instant::now();
        loop {
            if *cancel.borrow() {
                return Err(Error::Cancelled);
            }
            if ticks && last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                self.on_tick().await?;
            }
            // Only the wait for input races the clock and cancellation: receiving is
            // cancel-safe, pushing through the chain is not, so it happens outside.
            let element = match &mut self.input {
                TaskInput::Gate(gate) => tokio::select! {
                    biased;
                    _ = cancel.changed() => continue,
                    _ = tokio::time::sleep(TICK), if ticks => continue,
                    element = gate.next() => element,
                },
                TaskInput::Source(_) => {
                    if self.step_source().await? {
                        continue;
                    }
                    None
                }
            };
            match element {
                Some(element) => self.chain.push(element, &mut self.output).await?,
                None => break,
            }
        }
        self.chain.close(&mut self.output).await?;
        self.output.broadcast(&StreamElement::EndOfPartition).await
    }

    async fn on_tick(&mut self) -> Result<()> {
        if let TaskInput::Source(src) = &mut self.input
            && let Some(element) = src.watermarks.as_mut().and_then(|w| w.on_tick())
        {
            publish(src, &element);
            self.chain.push(element, &mut self.output).await?;
        }
        if self.chain.wants_processing_time() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or_default();
            self.chain.tick(now, &mut self.output).await?;
        }
        Ok(())
    }

    /// Reads one batch from the source and pushes it (and any new watermark) through the
    /// chain; false at the end of the input.
    async fn step_source(&mut self) -> Result<bool> {
        let TaskInput::Source(src) = &mut self.input else {
            return Ok(false);
        };
        let Some(sb) = src.reader.next_batch().await? else {
            src.skipped
                .fetch_add(src.reader.counters().skipped, Ordering::Relaxed);
            if src.watermarks.is_some() {
                // End of a bounded input: the final watermark closes every window.
                src.watermark_cell.store(Timestamp::MAX, Ordering::Relaxed);
                self.chain
                    .push(StreamElement::Watermark(Timestamp::MAX), &mut self.output)
                    .await?;
            }
            return Ok(false);
        };
        src.records_in
            .fetch_add(sb.batch.num_rows() as u64, Ordering::Relaxed);
        let mut wm = match src.watermarks.as_mut() {
            Some(g) => g.on_batch(sb.split, &sb.batch)?,
            None => None,
        };
        for split in src.reader.take_finished_splits() {
            if let Some(w) = src
                .watermarks
                .as_mut()
                .and_then(|g| g.on_split_finished(split))
            {
                wm = Some(w);
            }
        }
        if let Some(w) = &wm {
            publish(src, w);
        }
        self.chain
            .push(StreamElement::Batch(sb.batch), &mut self.output)
            .await?;
        if let Some(w) = wm {
            self.chain.push(w, &mut self.output).await?;
        }
        Ok(true)
    }
}

fn publish(src: &SourceInput, element: &StreamElement) {
    if let StreamElement::Watermark(ts) = element {
        src.watermark_cell.store(*ts, Ordering::Relaxed);
    }
}
