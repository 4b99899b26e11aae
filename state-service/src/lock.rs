//! Locking a std mutex without giving up on poisoning.
//!
//! A panicked holder leaves consistent data here: every critical section in this crate
//! only does I/O through RocksDB or files, or updates plain maps, so the data a poisoned
//! lock guards is still usable.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, recovering from poisoning.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
