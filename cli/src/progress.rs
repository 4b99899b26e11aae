//! The live progress line of `sluice run` on a terminal.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice_compute::runtime::metrics::JobMetrics;

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
    chrono_like(ms)
}

fn chrono_like(ms: i64) -> String {
    // Civil-from-days (Howard Hinnant), to avoid a date dependency in the CLI.
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Prints a progress line to stderr every 250 ms while the job runs, when stderr is a terminal.
pub struct Progress {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts the printer (a no-op when stderr is not a terminal or `quiet`).
    pub fn start(metrics: Arc<JobMetrics>, quiet: bool) -> Self {
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
                let secs = start.elapsed().as_secs_f64().max(1e-9);
                let input = metrics.records_in.load(Ordering::Relaxed) as f64;
                let output = metrics.records_out.load(Ordering::Relaxed) as f64;
                let wm = metrics
                    .watermark()
                    .map(event_time)
                    .unwrap_or_else(|| "-".into());
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
