//! Processes a test started indirectly (the workers of a `sluice run --workers N`), and
//! killing them while a job runs.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Pids of the live children of `pid` (from `/proc`).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            && let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r)
            && rest.split_whitespace().nth(1) == Some(&pid.to_string())
            && rest.split_whitespace().next() != Some("Z")
        {
            out.push(p);
        }
    }
    out
}

/// Runs the job file `job` with `sluice run --workers 2` in `dir`, SIGKILLs a worker
/// `kills` times, and checks that the run succeeded after restarting. `below(n)` draws a
/// number in `0..n` (a seeded generator, so a failing run can be replayed): it picks
/// each wait (1.2 to 2.7 s) and each victim.
pub fn run_with_kills(dir: &Path, job: &Path, kills: usize, below: &mut dyn FnMut(u64) -> u64) {
    let mut child = Command::new(crate::sluice_bin())
        .args(["run", job.to_str().expect("UTF-8 path"), "--workers", "2"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice");
    let pid = child.id();
    let mut killed = Vec::new();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(1200 + below(1500)));
        let workers = children_of(pid);
        if workers.is_empty() || child.try_wait().expect("wait").is_some() {
            break;
        }
        let victim = workers[below(workers.len() as u64) as usize];
        let _ = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status();
        killed.push(victim);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the job did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        killed.len(),
        kills,
        "the job ended before every kill:\n{stderr}"
    );
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("finished "))
        .unwrap_or_else(|| panic!("no summary:\n{stderr}"));
    // A kill while the job is already restarting joins that restart.
    let restarts: usize = summary
        .rsplit_once(", ")
        .and_then(|(_, r)| r.strip_suffix(" restarts"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the job must have restarted: {summary}"));
    assert!((1..=kills).contains(&restarts), "{summary}");
}
