//! A process's resident memory, threads and CPU time, read from `/proc` (Linux).
//!
//! Every reader answers `None` where the platform does not say (another OS, a process
//! that is gone), never an error: these figures go into reports and benchmark lines,
//! and a missing figure must not fail what reports it. The only I/O is reading one small
//! `/proc` file per call.

/// Resident memory (`VmRSS`) of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_kib(&format!("/proc/{pid}/status"), "VmRSS:").map(|kib| kib * 1024)
}

/// Resident memory (`VmRSS`) of this process, in bytes.
pub fn self_rss_bytes() -> Option<u64> {
    status_kib("/proc/self/status", "VmRSS:").map(|kib| kib * 1024)
}

/// Peak resident memory (`VmHWM`) of this process, in bytes.
pub fn self_peak_rss_bytes() -> Option<u64> {
    status_kib("/proc/self/status", "VmHWM:").map(|kib| kib * 1024)
}

/// Threads of this process.
pub fn self_threads() -> Option<u64> {
    status_field("/proc/self/status", "Threads:")?.parse().ok()
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
    status_field(path, field)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The text after `field` on its line of a `/proc/*/status` file, trimmed.
fn status_field(path: &str, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(path).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_threads_and_cpu_time() {
        let me = std::process::id();
        let rss = rss_bytes(me).expect("VmRSS on Linux");
        assert!(rss > 0);
        assert!(self_rss_bytes().expect("VmRSS on Linux") > 0);
        assert!(self_peak_rss_bytes().expect("VmHWM on Linux") >= rss / 2);
        assert!(self_threads().expect("Threads on Linux") >= 1);
        assert!(cpu_seconds(me).expect("stat on Linux") >= 0.0);
        assert_eq!(rss_bytes(u32::MAX), None);
        assert_eq!(cpu_seconds(u32::MAX), None);
    }
}
