//! Command output on stdout, and what a closed stdout means: shared by the `sluice`
//! binary's commands and its benchmarks.
//!
//! A reader that stops early (`sluice checkpoints JOB | head -1`) closes the pipe: that
//! is its choice, not the command's failure. Rust ignores `SIGPIPE`, so `println!` would
//! panic on the closed pipe (exit 101); [`outln!`] writes instead, and once stdout is
//! closed it drops the rest of the output quietly, so the command ends with the status
//! it would have had. Another write error (a full disk behind a redirect) is reported
//! once on stderr and the output dropped the same way.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Stdout refused a write: nothing more is written to it.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` and a newline to stdout, unless stdout is closed.
pub fn line(args: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        CLOSED.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: writing to stdout: {e}; the rest of the output is dropped");
        }
    }
}

/// `println!` for command output: see the module docs.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_like_println() {
        // Under the test harness stdout is captured, never closed: this only checks that
        // the macro accepts what println! does.
        let x = 3;
        crate::outln!("{x} {} {:>4}", "y", 5);
        crate::outln!("plain");
    }
}
