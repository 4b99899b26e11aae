//! Child processes of this binary, started through its public commands (`sluice
//! state-service`, `sluice worker --coordinator URL`), so that a benchmark measures
//! what users run. Each child's stderr goes to a log file whose last lines end up in
//! error messages; each child is killed (SIGKILL) and reaped when its owner is dropped,
//! so nothing outlives a benchmark.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, bail};
use sluice_coordinator::job::master::WorkerLauncher;

use crate::harness::resources::RssSampler;

/// How long a state-service node may take to print its address.
const NODE_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a node's resident memory is sampled.
const NODE_RSS_PERIOD: Duration = Duration::from_millis(100);

/// This binary, to start children of.
pub fn sluice_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("cannot find the sluice binary to start child processes")
}

/// The last `lines` lines of the log at `path`, for error messages: `; its log (PATH)
/// ends:` and the lines, or nothing when the log is empty or unreadable.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => {
            let all: Vec<&str> = text.lines().collect();
            let tail = all[all.len().saturating_sub(lines)..].join("\n");
            format!("; its log ({}) ends:\n{tail}", path.display())
        }
        _ => String::new(),
    }
}

fn create_log(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

/// Kills `child` (SIGKILL) and reaps it.
fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A `sluice state-service` child process on a free loopback port, its resident memory
/// sampled every 100 ms.
pub struct StateServiceNode {
    child: Child,
    /// Its gRPC address (`host:port`).
    pub addr: String,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its resident memory.
    pub rss: RssSampler,
}

impl StateServiceNode {
    /// Starts a node with data directory `dir/name` (its stderr in `dir/name.log`), the
    /// durable tier at `store_url` and a budget of `memory` bytes, and waits for the
    /// address it prints.
    pub fn start(dir: &Path, name: &str, store_url: &str, memory: u64) -> anyhow::Result<Self> {
        Self::start_with(dir, name, store_url, memory, &[], &[])
    }

    /// [`StateServiceNode::start`] registering with the coordinator at `coordinator`
    /// (`http://host:port` of its gRPC API) as `--node-id name`, with `env` besides this
    /// process's environment (`SLUICE_TLS_*`).
    pub fn start_registered(
        dir: &Path,
        name: &str,
        store_url: &str,
        memory: u64,
        coordinator: &str,
        env: &[(String, PathBuf)],
    ) -> anyhow::Result<Self> {
        Self::start_with(
            dir,
            name,
            store_url,
            memory,
            &["--coordinator", coordinator, "--node-id", name],
            env,
        )
    }

    fn start_with(
        dir: &Path,
        name: &str,
        store_url: &str,
        memory: u64,
        extra: &[&str],
        env: &[(String, PathBuf)],
    ) -> anyhow::Result<Self> {
        let exe = sluice_exe()?;
        let data_dir = dir.join(name);
        let log_path = dir.join(format!("{name}.log"));
        let log = create_log(&log_path)?;
        let mut child = Command::new(&exe)
            .arg("state-service")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data_dir)
            .args(["--object-store", store_url, "--memory", &memory.to_string()])
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {} state-service", exe.display()))?;
        let pid = child.id();
        let Some(stdout) = child.stdout.take() else {
            kill(&mut child);
            bail!("state-service {name} has no stdout pipe");
        };
        // From here on the guard kills the child on every exit path.
        let mut node = Self {
            child,
            addr: String::new(),
            data_dir,
            rss: RssSampler::start(pid, NODE_RSS_PERIOD),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut first = String::new();
            let got = reader.read_line(&mut first).map(|_| first);
            let _ = tx.send(got);
            // Keep draining so the node never blocks on a full pipe; ends with the node.
            let mut sink = [0u8; 4096];
            while let Ok(n) = reader.read(&mut sink) {
                if n == 0 {
                    break;
                }
            }
        });
        let line = match rx.recv_timeout(NODE_START_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => bail!(
                "reading state-service {name}'s stdout: {e}{}",
                log_tail(&log_path, 20)
            ),
            Err(_) => bail!(
                "state-service {name} printed no address within {}s{}",
                NODE_START_TIMEOUT.as_secs(),
                log_tail(&log_path, 20)
            ),
        };
        let Some(addr) = line.trim().strip_prefix("state-service listening on ") else {
            bail!(
                "state-service {name} exited or printed {:?} instead of its address{}",
                line.trim(),
                log_tail(&log_path, 20)
            );
        };
        node.addr = addr.to_owned();
        Ok(node)
    }

    /// Kills the node now (SIGKILL) and waits for it.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for StateServiceNode {
    fn drop(&mut self) {
        kill(&mut self.child);
        self.rss.stop();
    }
}

/// A worker child process.
struct WorkerProcess {
    child: Child,
    pid: u32,
    log: PathBuf,
}

impl WorkerProcess {
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// `sluice worker --coordinator URL --exit-with-coordinator` child processes, each
/// logging to `dir/worker-K.log`. Started by the benchmark, or by the coordinator
/// through [`WorkerLauncher`] to replace workers that died.
pub struct Workers {
    exe: PathBuf,
    coordinator: String,
    dir: PathBuf,
    /// Every worker started, oldest first, running or not.
    started: Mutex<Vec<WorkerProcess>>,
    /// Environment variables of each worker besides this process's.
    env: Vec<(String, PathBuf)>,
}

impl Workers {
    /// Workers attaching to `coordinator` (`http://host:port`), logging under `dir`.
    pub fn new(coordinator: String, dir: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            exe: sluice_exe()?,
            coordinator,
            dir: dir.to_path_buf(),
            started: Mutex::new(Vec::new()),
            env: Vec::new(),
        })
    }

    /// Workers started with these environment variables too (`SLUICE_TLS_*`).
    pub fn with_env(mut self, env: Vec<(String, PathBuf)>) -> Self {
        self.env = env;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Vec<WorkerProcess>> {
        self.started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts workers until `n` are running.
    pub fn start(&self, n: usize) -> anyhow::Result<()> {
        let mut started = self.lock();
        let mut running = started
            .iter_mut()
            .map(|w| w.running())
            .filter(|&r| r)
            .count();
        while running < n {
            let log = self.dir.join(format!("worker-{}.log", started.len()));
            let child = Command::new(&self.exe)
                .args([
                    "worker",
                    "--coordinator",
                    &self.coordinator,
                    "--exit-with-coordinator",
                ])
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(create_log(&log)?))
                .spawn()
                .with_context(|| format!("starting {} worker", self.exe.display()))?;
            let pid = child.id();
            started.push(WorkerProcess { child, pid, log });
            running += 1;
        }
        Ok(())
    }

    /// Pids of the running workers, oldest first.
    pub fn pids(&self) -> Vec<u32> {
        let mut started = self.lock();
        let mut pids = Vec::new();
        for w in started.iter_mut() {
            if w.running() {
                pids.push(w.pid);
            }
        }
        pids
    }

    /// Kills the running worker `pid` (SIGKILL); false if there is none.
    pub fn kill(&self, pid: u32) -> bool {
        let mut started = self.lock();
        let Some(w) = started.iter_mut().find(|w| w.pid == pid) else {
            return false;
        };
        w.running() && w.child.kill().is_ok()
    }

    /// Pid and log file of every worker started, oldest first.
    pub fn logs(&self) -> Vec<(u32, PathBuf)> {
        self.lock().iter().map(|w| (w.pid, w.log.clone())).collect()
    }

    /// A worker that exited unsuccessfully, with its status and the end of its log.
    pub fn failed(&self) -> Option<String> {
        self.lock()
            .iter_mut()
            .find_map(|w| match w.child.try_wait() {
                Ok(Some(status)) if !status.success() => Some(format!(
                    "worker (pid {}) exited ({status}){}",
                    w.pid,
                    log_tail(&w.log, 10)
                )),
                _ => None,
            })
    }

    /// The end of every worker's log, for error messages.
    pub fn log_tails(&self) -> String {
        self.lock()
            .iter()
            .map(|w| match log_tail(&w.log, 10) {
                tail if tail.is_empty() => format!("\nworker pid {}: its log is empty", w.pid),
                tail => format!("\nworker pid {}{tail}", w.pid),
            })
            .collect()
    }
}

impl WorkerLauncher for Workers {
    fn ensure(&self, n: usize) {
        if let Err(e) = self.start(n) {
            tracing::error!("cannot start a worker: {e:#}");
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        let mut started = self.lock();
        for w in started.iter_mut() {
            let _ = w.child.kill();
        }
        for w in started.iter_mut() {
            let _ = w.child.wait();
        }
    }
}
