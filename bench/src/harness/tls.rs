//! A cluster identity made for one measurement over TLS: the CA, a certificate for
//! 127.0.0.1 and its key as files for child processes (`SLUICE_TLS_*`), and as this
//! process's identity (for the coordinator and clients it runs) until dropped.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use sluice_common::tls::ClusterTls;

const FILES: [&str; 3] = ["ca.pem", "host.pem", "host.key"];
const VARS: [&str; 3] = ["SLUICE_TLS_CA", "SLUICE_TLS_CERT", "SLUICE_TLS_KEY"];

/// Mutual TLS for every role of a measurement; the process's previous identity comes
/// back when this is dropped.
pub struct TlsFiles {
    dir: tempfile::TempDir,
    before: Option<&'static ClusterTls>,
}

impl TlsFiles {
    /// Makes the identity, writes its files and makes it this process's.
    pub fn new() -> anyhow::Result<Self> {
        let pem =
            sluice_common::tls::ephemeral_identity(&["127.0.0.1"]).map_err(|e| anyhow!("{e}"))?;
        let dir = tempfile::Builder::new()
            .prefix("sluice-bench-tls-")
            .tempdir()
            .context("temporary directory")?;
        for (name, text) in FILES.iter().zip(&pem) {
            std::fs::write(dir.path().join(name), text).context("writing a TLS file")?;
        }
        let [ca, cert, key] = pem.map(String::into_bytes);
        let tls = ClusterTls::from_pem(ca, cert, key).map_err(|e| anyhow!("{e}"))?;
        let before = sluice_common::tls::set_cluster_tls(Some(Box::leak(Box::new(tls))));
        Ok(Self { dir, before })
    }

    /// `SLUICE_TLS_*` for a child process.
    pub fn env(&self) -> Vec<(String, PathBuf)> {
        VARS.iter()
            .zip(FILES)
            .map(|(var, file)| ((*var).to_owned(), self.dir.path().join(file)))
            .collect()
    }
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        sluice_common::tls::set_cluster_tls(self.before);
    }
}
