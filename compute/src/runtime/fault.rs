//! A fault a test can inject into a running job: a kill cannot aim at a worker that runs
//! in the test's own `sluice run` process, so the process fails one of its source tasks
//! on request.
//!
//! `SLUICE_TEST_FAIL_ONCE_AFTER=N` (read once per process): the first source task of
//! the process that has read at least `N` records fails, once; the job then restarts
//! from its last checkpoint as after any task failure. Unset, it costs one load of a
//! cached value per batch.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// The variable that asks for the fault.
pub const FAIL_ONCE_AFTER: &str = "SLUICE_TEST_FAIL_ONCE_AFTER";

static AFTER: OnceLock<Option<u64>> = OnceLock::new();
static FIRED: AtomicBool = AtomicBool::new(false);

/// Fails once in this process when a source task has read `records` and the variable
/// asks for a failure by then.
pub fn check_source(records: u64) -> Result<()> {
    let after = AFTER.get_or_init(|| {
        std::env::var(FAIL_ONCE_AFTER)
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    match after {
        Some(n) if records >= *n && !FIRED.swap(true, Ordering::AcqRel) => Err(Error::Internal(
            format!("a failure injected after {records} records ({FAIL_ONCE_AFTER}={n})"),
        )),
        _ => Ok(()),
    }
}
