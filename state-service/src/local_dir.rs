//! Removing a shard's local directories (its database, spool and RocksDB checkpoints)
//! once nothing needs them. Best effort: a failure is logged, never returned, because
//! the next opening of the shard starts by removing its directory again.

use std::path::Path;

/// Removes `dir` and everything in it; a missing directory is fine (blocking).
pub fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("removing {}: {e}", dir.display());
    }
}
