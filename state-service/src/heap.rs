//! The process heap under glibc's allocator, which a state node's load shapes badly.
//!
//! A node frees in bursts (a commit drops a checkpoint interval of uncommitted layers at
//! once; a restore drops its download buffers), from many threads (gRPC handlers,
//! blocking tasks, RocksDB). glibc gives each thread that contends an arena of its own
//! (up to eight per core) and returns freed memory to the system only from the top of
//! each heap, so freed bursts stay resident: measured with `sluice bench checkpoint`
//! (1 GB of state, `--memory 128MiB`), a freshly opened shard's node held 780 MiB with
//! the default arenas and 183 MiB with two. So the `state-service` process caps its
//! arenas at start ([`limit_arenas`]) and hands freed memory back after commits and
//! restores ([`release_freed`], at most once a second).
//!
//! It knows nothing of shards: callers say when a burst was freed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Arenas the `state-service` process allows (glibc's default: eight per core).
pub const ARENAS: i32 = 2;

/// Allocations from this size on are mapped on their own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 256 << 10;

/// Caps glibc's malloc arenas at `arenas` (before the runtime's threads start, so that
/// they share them). Does nothing on other C libraries.
pub fn limit_arenas(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX takes any positive
    // count, and the call is made before other threads allocate.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas.max(1));
        // Fixed, not glibc's sliding threshold (which rises to 32 MiB as big blocks are
        // freed): request buffers, write batches and memtable arena blocks of 256 KiB
        // and more are mapped on their own and go back to the system when freed.
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Returns freed heap memory to the system, on a blocking thread, at most once a second
/// process-wide (a trim walks every arena). Does nothing on other C libraries.
pub fn release_freed() {
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64;
    let last = LAST_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 1000
        || LAST_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn_blocking(|| {
            // SAFETY: malloc_trim takes no pointers; it only releases free pages.
            #[allow(unsafe_code)]
            unsafe {
                libc::malloc_trim(0);
            }
        });
    }
}

/// What the allocator holds: bytes in use by the program, free but kept (not handed
/// back), and in blocks mapped on their own. `None` on other C libraries.
pub fn stats() -> Option<(usize, usize, usize)> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct.
        #[allow(unsafe_code)]
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd, m.fordblks, m.hblkhd))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}
