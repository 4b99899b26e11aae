//! Role processes a test starts and watches ([`Proc`]), processes a test started indirectly (the workers of a `sluice run --workers N`), and
//! killing them while a job runs.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
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
    run_with_kills_args(dir, job, &[], kills, below);
}

/// [`run_with_kills`] with `extra` arguments to `sluice run`.
pub fn run_with_kills_args(
    dir: &Path,
    job: &Path,
    extra: &[&str],
    kills: usize,
    below: &mut dyn FnMut(u64) -> u64,
) {
    let mut args = vec!["run", job.to_str().expect("UTF-8 path"), "--workers", "2"];
    args.extend_from_slice(extra);
    let mut run = Background::spawn(&args, dir);
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
    let summary = crate::summary_line(&stderr).unwrap_or_else(|| panic!("no summary:\n{stderr}"));
    // A kill while the job is already restarting joins that restart.
    let restarts: usize = summary
        .rsplit_once(", ")
        .and_then(|(_, r)| r.strip_suffix(" restarts"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the job must have restarted: {summary}"));
    assert!((1..=kills).contains(&restarts), "{summary}");
}

/// A `sluice` process whose stdout and stderr are collected; killed (SIGKILL) on drop.
pub struct Proc {
    child: Option<Child>,
    what: String,
    output: Arc<Mutex<String>>,
}

impl Proc {
    /// Starts `sluice ARGS` in `cwd`.
    ///
    /// # Panics
    /// When the binary cannot be started.
    pub fn start(args: &[&str], cwd: &Path) -> Self {
        Self::start_env(args, cwd, &[])
    }

    /// Starts `sluice ARGS` in `cwd` with extra environment `env`.
    ///
    /// # Panics
    /// When the binary cannot be started.
    pub fn start_env(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Self {
        let what = format!("sluice {}", args.join(" "));
        let mut child = Command::new(crate::sluice_bin())
            .args(args)
            .envs(env.iter().copied())
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let output = Arc::new(Mutex::new(String::new()));
        let pipes: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("piped stdout")),
            Box::new(child.stderr.take().expect("piped stderr")),
        ];
        for mut pipe in pipes {
            let sink = Arc::clone(&output);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                    if s.len() < 4 << 20 {
                        s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        Self {
            child: Some(child),
            what,
            output,
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first line of its output containing `needle`, waiting up to `timeout`.
    #[track_caller]
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let output = self.output();
            // Whole lines only: a line reaches the pipe in pieces (`eprintln!` writes
            // its parts one by one), and a half-read `http=` once gave an empty address.
            let complete = &output[..output.rfind('\n').map_or(0, |i| i + 1)];
            if let Some(line) = complete.lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                // Let the reader threads catch up with the last words.
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "`{}` exited ({status}) without printing {needle:?}\n--- output\n{}",
                    self.what,
                    self.output()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "`{}` did not print {needle:?} within {timeout:?}\n--- output\n{output}",
                    self.what
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills it with SIGKILL and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `check` every 250 ms until it gives `Some`, for at most `timeout`.
///
/// # Panics
/// When it gives nothing in time, with `what` and `logs()`.
#[track_caller]
pub fn poll_until<T>(
    what: &str,
    timeout: Duration,
    logs: impl FnOnce() -> String,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("not within {timeout:?}: {what}\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
