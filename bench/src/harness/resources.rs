//! A process's resident memory and CPU time, read from `/proc` (Linux; `None` where
//! the platform does not say).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Resident memory (`VmRSS`) of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_kib(&format!("/proc/{pid}/status"), "VmRSS:").map(|kib| kib * 1024)
}

/// Peak resident memory (`VmHWM`) of this process, in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    status_kib("/proc/self/status", "VmHWM:").map(|kib| kib * 1024)
}

/// User + system CPU time of process `pid` so far, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // Clock ticks: 100 per second on Linux.
    Some((utime + stime) as f64 / 100.0)
}

/// The value in kB of the `field` line of a `/proc/*/status` file.
fn status_kib(path: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples a process's resident memory on its own thread until stopped or until the
/// process is gone, keeping the largest value seen per phase.
#[derive(Debug)]
pub struct RssSampler {
    phase_max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    /// Samples `pid` every `period`.
    pub fn start(pid: u32, period: Duration) -> Self {
        let phase_max = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (max, halt) = (Arc::clone(&phase_max), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match rss_bytes(pid) {
                    Some(bytes) => {
                        max.fetch_max(bytes, Ordering::Relaxed);
                    }
                    None => break,
                }
                std::thread::sleep(period);
            }
        });
        Self {
            phase_max,
            stop,
            thread: Some(thread),
        }
    }

    /// The largest resident memory seen since the last call, in bytes; the next phase
    /// starts now.
    pub fn take_phase_max(&self) -> u64 {
        self.phase_max.swap(0, Ordering::Relaxed)
    }

    /// Stops sampling and waits for the thread.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let me = std::process::id();
        let rss = rss_bytes(me).expect("VmRSS on Linux");
        assert!(rss > 0);
        assert!(peak_rss_bytes().expect("VmHWM on Linux") >= rss / 2);
        assert!(cpu_seconds(me).expect("stat on Linux") >= 0.0);
        assert_eq!(rss_bytes(u32::MAX), None);
    }

    #[test]
    fn the_sampler_sees_this_process() {
        let s = RssSampler::start(std::process::id(), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(20));
        assert!(s.take_phase_max() > 0);
    }
}
