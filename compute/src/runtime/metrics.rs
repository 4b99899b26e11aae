//! Job-wide counters the progress line and `sluice bench` read while a job runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::element::Timestamp;
use crate::operator::window::WindowCounters;

/// Counters shared by every task of one job.
#[derive(Debug, Default)]
pub struct JobMetrics {
    /// Records read by all sources.
    pub records_in: Arc<AtomicU64>,
    /// Records written by all sinks (late side outputs included).
    pub records_out: Arc<AtomicU64>,
    /// Malformed input records skipped or sent to a dead-letter output.
    pub skipped_records: Arc<AtomicU64>,
    /// Watermark of each source subtask (`i64::MIN` before the first).
    pub source_watermarks: std::sync::Mutex<Vec<Arc<AtomicI64>>>,
    /// Late-record counters of every window subtask.
    pub windows: std::sync::Mutex<Vec<Arc<WindowCounters>>>,
}

impl JobMetrics {
    /// Registers a source subtask's watermark cell.
    pub fn source_watermark(&self) -> Arc<AtomicI64> {
        let cell = Arc::new(AtomicI64::new(Timestamp::MIN));
        self.source_watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cell.clone());
        cell
    }

    /// Registers a window subtask's counters.
    pub fn window_counters(&self) -> Arc<WindowCounters> {
        let c = Arc::new(WindowCounters::default());
        self.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(c.clone());
        c
    }

    /// The job's event-time progress: the minimum source watermark, if all have one.
    pub fn watermark(&self) -> Option<Timestamp> {
        let cells = self
            .source_watermarks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let min = cells.iter().map(|c| c.load(Ordering::Relaxed)).min()?;
        (min != Timestamp::MIN).then_some(min)
    }

    /// Late records counted by all windows.
    pub fn late_records(&self) -> u64 {
        let w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        w.iter()
            .map(|c| c.late_records.load(Ordering::Relaxed))
            .sum()
    }
}
