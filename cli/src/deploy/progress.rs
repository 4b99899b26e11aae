//! What deploy is doing, on stderr: on a terminal a spinner naming the step under way
//! (how long it has taken, which host and role), with each finished step printed above
//! it (indicatif); plain lines, one per finished step, when stderr is not a terminal.
//!
//! This module prints; it must not know what the steps are.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// The spinner of the command running, if stderr is a terminal.
static SPINNER: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn spinner() -> Option<ProgressBar> {
    SPINNER.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The spinner of one deploy command, cleared when dropped (also on an error, so the
/// error is printed on a clean line).
pub struct Progress(());

impl Progress {
    /// Starts the spinner when stderr is a terminal.
    pub fn start() -> Self {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed:>3}] {msg}") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            *SPINNER.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar);
        }
        Self(())
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = SPINNER.lock().unwrap_or_else(|p| p.into_inner()).take() {
            bar.finish_and_clear();
        }
    }
}

/// Prints a finished step.
pub fn say(line: &str) {
    match spinner() {
        Some(bar) => bar.println(line),
        None => eprintln!("{line}"),
    }
}

/// Names the step under way (shown by the spinner only).
pub fn doing(step: impl Into<String>) {
    if let Some(bar) = spinner() {
        bar.set_message(step.into());
    }
}
