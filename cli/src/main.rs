//! The `sluice` binary: the command line of [`sluice_cli`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

/// The process's allocator: mimalloc for every role but the state service, which keeps
/// glibc's malloc (see [`Allocator`]).
#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// Whether this process allocates with mimalloc; fixed before its first allocation (by
/// [`choose_allocator`]) and never changed after, so every block is freed by the
/// allocator that made it.
static USE_MIMALLOC: AtomicBool = AtomicBool::new(true);

/// mimalloc for jobs: their operators allocate and free many small buffers (keys, rows,
/// state entries) across threads, which glibc's arenas serve slowly; old binary against
/// new, joins and stateful aggregates ran 12% to 64% faster (bench/peers/README.md).
/// The state service keeps glibc's malloc, whose arenas and trimming
/// `state-service/src/heap.rs` tunes to its memory budget (under mimalloc its node held
/// a third more).
struct Allocator;

// SAFETY: each call goes to one allocator, the same for the whole process (the choice is
// made before the first allocation), so blocks are freed and resized where they came
// from.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match USE_MIMALLOC.load(Ordering::Relaxed) {
                true => mimalloc::MiMalloc.alloc(layout),
                false => System.alloc(layout),
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match USE_MIMALLOC.load(Ordering::Relaxed) {
                true => mimalloc::MiMalloc.alloc_zeroed(layout),
                false => System.alloc_zeroed(layout),
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match USE_MIMALLOC.load(Ordering::Relaxed) {
                true => mimalloc::MiMalloc.dealloc(ptr, layout),
                false => System.dealloc(ptr, layout),
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match USE_MIMALLOC.load(Ordering::Relaxed) {
                true => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                false => System.realloc(ptr, layout, new_size),
            }
        }
    }
}

/// Runs before `main` and before Rust's first allocation, from `.init_array`.
#[cfg(target_os = "linux")]
#[used]
// SAFETY: `.init_array` holds plain `extern "C" fn()`s the loader calls before `main`.
#[allow(unsafe_code)]
#[unsafe(link_section = ".init_array")]
static CHOOSE_ALLOCATOR: extern "C" fn() = choose_allocator;

/// Picks the allocator from the command line (`/proc/self/cmdline`, read without
/// allocating) and sets mimalloc's options: its arena is committed as it is used rather
/// than up front, and freed memory goes back to the OS after 100 ms (0 cost pass-through
/// jobs a tenth of their throughput, mimalloc 2's 10 ms a twentieth). With mimalloc's
/// defaults a job's resident memory was 40 to 60 MB more than with glibc's malloc; with
/// these about 10 MB more, and less for jobs with much state. `MIMALLOC_*` variables in
/// the environment still override them.
#[cfg(target_os = "linux")]
extern "C" fn choose_allocator() {
    // Indices of `mi_option_e` in mimalloc 2's mimalloc.h (not exported by the crate).
    const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    let mut buf = [0u8; 4096];
    // SAFETY: a NUL-terminated path and a stack buffer of the length given; the file
    // descriptor is closed before returning.
    #[allow(unsafe_code)]
    let n = unsafe {
        let fd = libc::open(c"/proc/self/cmdline".as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            return;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let args = &buf[..usize::try_from(n).unwrap_or(0)];
    // The subcommand: the first argument after the program that is not an option.
    let command = args
        .split(|&b| b == 0)
        .skip(1)
        .find(|arg| !arg.starts_with(b"-"));
    if command == Some(b"state-service".as_slice()) {
        USE_MIMALLOC.store(false, Ordering::Relaxed);
        return;
    }
    // SAFETY: runs once, before `main` and any other thread; only sets option values.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set_default(ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set_default(PURGE_DELAY, 100);
    }
}

fn main() -> std::process::ExitCode {
    sluice_cli::main()
}
