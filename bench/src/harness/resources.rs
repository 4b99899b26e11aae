//! Sampling a process's resident memory while a benchmark runs. Reading it (and CPU
//! time) is `sluice_common::process`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sluice_common::process::rss_bytes;

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
    fn the_sampler_sees_this_process() {
        let s = RssSampler::start(std::process::id(), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(20));
        assert!(s.take_phase_max() > 0);
    }
}
