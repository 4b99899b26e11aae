//! Processes a test started indirectly (the workers of a `sluice run --workers N`), and
//! killing them while a job runs.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A `sluice` process running in the background: stdout discarded, stderr read by a
/// thread as it comes (a process that logs a lot never blocks on a full pipe), killed
/// when dropped.
pub struct Background {
    child: Child,
    stderr: Option<JoinHandle<String>>,
}

impl Background {
    /// Starts `sluice ARGS` in `cwd`.
    ///
    /// # Panics
    /// When the binary cannot be started.
    pub fn spawn(args: &[&str], cwd: &Path) -> Self {
        let mut child = Command::new(crate::sluice_bin())
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sluice");
        let mut pipe = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        });
        Self {
            child,
            stderr: Some(stderr),
        }
    }

    /// Its pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, when it has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait")
    }

    /// Waits up to `limit` for it to end (killing it then and panicking with `what`);
    /// its status and everything it wrote to stderr.
    pub fn wait(mut self, limit: Duration, what: &str) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.try_wait() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{what} within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status, self.take_stderr())
    }

    /// Kills it; everything it wrote to stderr.
    pub fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.take_stderr()
    }

    fn take_stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let mut run = Background::spawn(
        &["run", job.to_str().expect("UTF-8 path"), "--workers", "2"],
        dir,
    );
    let pid = run.id();
    let mut killed = Vec::new();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(1200 + below(1500)));
        let workers = children_of(pid);
        if workers.is_empty() || run.try_wait().is_some() {
            break;
        }
        let victim = workers[below(workers.len() as u64) as usize];
        let _ = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status();
        killed.push(victim);
    }
    let (status, stderr) = run.wait(Duration::from_secs(180), "the job did not finish");
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
