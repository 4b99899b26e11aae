//! The live progress line of `sluice run` on a terminal.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Formats a count as `1.23M` / `45.6K`.
pub fn human(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2}G", n / 1e9),
        n if n >= 1e6 => format!("{:.2}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}K", n / 1e3),
        n => format!("{n:.0}"),
    }
}

/// Formats an event time (ms since the epoch) as UTC.
pub fn event_time(ms: i64) -> String {
    if ms == i64::MAX {
        return "end".into();
    }
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(t) => t.format("%Y-%m-%d %H:%M:%S").to_string(),
        None => format!("{ms} ms"),
    }
}

/// What the progress line shows.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Records read so far.
    pub records_in: u64,
    /// Records written so far.
    pub records_out: u64,
    /// The sources' smallest watermark, once they have one.
    pub watermark: Option<i64>,
}

/// Prints a progress line to stderr every 250 ms while the job runs, when stderr is a terminal.
pub struct Progress {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts the printer of what `figures` says (a no-op when stderr is not a
    /// terminal or `quiet`).
    pub fn start(figures: impl Fn() -> Option<Figures> + Send + 'static, quiet: bool) -> Self {
        if quiet || !std::io::stderr().is_terminal() {
            return Self {
                stop: None,
                handle: None,
            };
        }
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(250));
                if rx.try_recv().is_ok() {
                    break;
                }
                let Some(f) = figures() else { continue };
                let secs = start.elapsed().as_secs_f64().max(1e-9);
                let (input, output) = (f.records_in as f64, f.records_out as f64);
                let wm = f.watermark.map(event_time).unwrap_or_else(|| "-".into());
                eprint!(
                    "\r\x1b[2Kin {}  out {}  {} events/s  watermark {wm}",
                    human(input),
                    human(output),
                    human(input / secs)
                );
                let _ = std::io::stderr().flush();
            }
            eprint!("\r\x1b[2K");
        });
        Self {
            stop: Some(tx),
            handle: Some(handle),
        }
    }

    /// Stops and clears the line.
    pub fn finish(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_event_time_in_utc() {
        assert_eq!(event_time(1_436_918_400_000), "2015-07-15 00:00:00");
        assert_eq!(event_time(0), "1970-01-01 00:00:00");
        assert_eq!(human(1_234_567.0), "1.23M");
    }
}
