//! A real etcd server of a test's own (Debian's `etcd-server`, which
//! `scripts/test-services.sh start` installs and exports as `SLUICE_TEST_ETCD`), on
//! free ports of 127.0.0.1, stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::free_port;
use crate::http::http_request;

/// An etcd server of the test's own, on free ports of 127.0.0.1.
pub struct Etcd {
    child: Option<Child>,
    data: PathBuf,
    client: u16,
    peer: u16,
}

impl Etcd {
    /// Starts one with its data in `dir`.
    ///
    /// # Panics
    /// When it cannot start or does not become healthy.
    pub fn start(dir: &Path) -> Self {
        let mut etcd = Self {
            child: None,
            data: dir.join("etcd-data"),
            client: free_port(),
            peer: free_port(),
        };
        etcd.resume();
        etcd
    }

    /// Starts (again) on the same ports and data directory.
    ///
    /// # Panics
    /// When it cannot start or does not become healthy.
    pub fn resume(&mut self) {
        let bin = std::env::var("SLUICE_TEST_ETCD").unwrap_or_else(|_| "etcd".into());
        let client = format!("http://127.0.0.1:{}", self.client);
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let log = std::fs::File::create(self.data.with_extension("log")).expect("etcd log");
        let child = Command::new(&bin)
            .args(["--name", "t", "--data-dir"])
            .arg(&self.data)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start etcd ({bin}): {e}; `scripts/test-services.sh start` installs \
                     Debian's etcd-server"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = format!("127.0.0.1:{}", self.client);
        loop {
            if std::net::TcpStream::connect(&addr).is_ok() {
                let (code, body) = http_request(&addr, "GET", "/health", None);
                if code == 200 && body["health"] == "true" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy; its log:\n{}",
                std::fs::read_to_string(self.data.with_extension("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `etcd://127.0.0.1:PORT`, as `--ha` takes it.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client)
    }

    /// Kills it (its data stays).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
