//! Long-running `sluice` role processes (a state-service node, say) that a test starts,
//! talks to, and kills.
//!
//! A role prints `... listening on ADDR` on its first stdout line once it serves; the
//! harness waits for that line (bounded), keeps draining both pipes so the child never
//! blocks on a full pipe, and kills the child when the handle drops.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sluice_bin;

/// How long a role may take to print its address.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `sluice` role process.
pub struct ServiceProcess {
    child: Option<Child>,
    addr: String,
    stderr: Arc<Mutex<String>>,
    what: String,
}

impl ServiceProcess {
    /// Starts `sluice args...` in `cwd` with extra environment, and waits until it prints
    /// its address.
    ///
    /// # Panics
    /// When it cannot start, exits, or prints no address within [`START_TIMEOUT`].
    pub fn start(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Self {
        let what = format!("sluice {}", args.join(" "));
        let mut cmd = Command::new(sluice_bin());
        cmd.args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let mut err_pipe = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                if s.len() < 1 << 20 {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            for _ in lines {}
        });
        let mut process = Self {
            child: Some(child),
            addr: String::new(),
            stderr,
            what,
        };
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(line) => match line.rsplit_once("listening on ") {
                Some((_, addr)) => process.addr = addr.trim().to_owned(),
                None => panic!(
                    "`{}` printed `{line}` instead of its address\n--- stderr\n{}",
                    process.what,
                    process.stderr()
                ),
            },
            Err(_) => panic!(
                "`{}` did not print its address within {START_TIMEOUT:?}\n--- stderr\n{}",
                process.what,
                process.stderr()
            ),
        }
        process
    }

    /// The address it serves on (`host:port`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://` + its address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Kills it with SIGKILL (no chance to clean up) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a `sluice state-service` node on an ephemeral port, with RocksDB under
/// `dir/data`, objects at `store`, 128 MiB of memory and a 64 MiB disk cache.
pub fn start_state_node(
    dir: &Path,
    data: &str,
    store: &str,
    env: &[(&str, &str)],
) -> ServiceProcess {
    let data_dir = dir.join(data);
    ServiceProcess::start(
        &[
            "state-service",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir.to_str().expect("UTF-8 path"),
            "--object-store",
            store,
            "--memory",
            "128MiB",
            "--disk-cache",
            "64MiB",
        ],
        dir,
        env,
    )
}

/// A `file://` object store in `dir/objects` (created).
pub fn file_store(dir: &Path) -> String {
    let objects = dir.join("objects");
    std::fs::create_dir_all(&objects).expect("objects dir");
    format!("file://{}", objects.display())
}
