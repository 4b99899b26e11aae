//! How the shell shows an updating query on a terminal: the changelog the query prints
//! (JSON lines whose `op` is `+I`, `-U`, `+U` or `-D`) folded into the rows it stands
//! for, and redrawn in place as changes arrive, as Flink's SQL client does in its table
//! mode. Owns capturing standard output while the query runs (a pipe behind fd 1, so
//! that worker processes started for the query write into it too) and drawing the
//! table; knows nothing of planning or running the query.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

/// How often the table is redrawn while changes arrive.
const REDRAW: Duration = Duration::from_millis(100);
/// How long the end of a query waits for output still in the pipe (from worker
/// processes that have not exited yet).
const DRAIN: Duration = Duration::from_secs(3);
/// Terminal height when the terminal does not say.
const DEFAULT_HEIGHT: usize = 24;

/// The rows a changelog stands for so far.
#[derive(Debug)]
pub struct LiveTable {
    columns: Vec<String>,
    /// Each row's cells, and how many times it is in the result.
    rows: BTreeMap<Vec<String>, i64>,
    changes: u64,
    /// Lines that were not a change (shown as a count, never dropped silently).
    unreadable: u64,
}

impl LiveTable {
    /// An empty result with `columns` (without `op`).
    pub fn new(columns: Vec<String>) -> Self {
        LiveTable {
            columns,
            rows: BTreeMap::new(),
            changes: 0,
            unreadable: 0,
        }
    }

    /// Applies one printed line: inserts and update-afters add their row, update-befores
    /// and deletes take one away.
    pub fn apply(&mut self, line: &str) {
        let Ok(Value::Object(mut row)) = serde_json::from_str::<Value>(line) else {
            self.unreadable += 1;
            return;
        };
        let sign = match row.remove("op") {
            Some(Value::String(op)) if op == "+I" || op == "+U" => 1,
            Some(Value::String(op)) if op == "-U" || op == "-D" => -1,
            _ => {
                self.unreadable += 1;
                return;
            }
        };
        let cells: Vec<String> = self
            .columns
            .iter()
            .map(|c| match row.get(c) {
                // The JSON writer leaves nulls out.
                None | Some(Value::Null) => "NULL".to_owned(),
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
            })
            .collect();
        self.changes += 1;
        match self.rows.entry(cells) {
            Entry::Occupied(mut e) => {
                *e.get_mut() += sign;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            Entry::Vacant(e) => {
                e.insert(sign);
            }
        }
    }

    /// The table as lines: a header, at most `max_rows` rows (numbers in numeric order),
    /// and a line counting rows and changes.
    pub fn render(&self, max_rows: usize) -> Vec<String> {
        let mut rows: Vec<&Vec<String>> = Vec::new();
        for (cells, &n) in &self.rows {
            for _ in 0..n.max(0) {
                rows.push(cells);
            }
        }
        rows.sort_by(|a, b| compare_rows(a, b));
        let total = rows.len();
        rows.truncate(max_rows);
        let mut widths: Vec<usize> = self.columns.iter().map(|c| c.chars().count()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row.iter()) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &String>| {
            let padded: Vec<String> = cells
                .zip(&widths)
                .map(|(c, &w)| format!("{c:<w$}"))
                .collect();
            padded.join(" | ").trim_end().to_owned()
        };
        let mut lines = vec![line(&mut self.columns.iter())];
        lines.push(
            widths
                .iter()
                .map(|&w| "-".repeat(w))
                .collect::<Vec<_>>()
                .join("-+-"),
        );
        for row in &rows {
            lines.push(line(&mut row.iter()));
        }
        let mut footer = format!(
            "({total} row{}, {} change{})",
            if total == 1 { "" } else { "s" },
            self.changes,
            if self.changes == 1 { "" } else { "s" }
        );
        if total > rows.len() {
            footer = format!("... {} more rows not shown {footer}", total - rows.len());
        }
        if self.unreadable > 0 {
            footer.push_str(&format!(
                " ({} line(s) not a change were left out)",
                self.unreadable
            ));
        }
        lines.push(footer);
        lines
    }
}

/// Rows cell by cell; cells that both read as numbers compare as numbers.
fn compare_rows(a: &[String], b: &[String]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let order = match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(x), Ok(y)) => x.total_cmp(&y),
            _ => x.cmp(y),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

/// What the reader, the drawer and the end of the query share.
struct Shared {
    table: Mutex<LiveTable>,
    changed: AtomicBool,
    /// The terminal (the shell's standard output before the capture) and how many lines
    /// of the table are on it.
    screen: Mutex<(File, usize)>,
    max_rows: usize,
}

impl Shared {
    /// Draws the table over the one drawn before.
    fn draw(&self) {
        let lines = self
            .table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .render(self.max_rows);
        let mut screen = self.screen.lock().unwrap_or_else(|p| p.into_inner());
        let mut text = String::new();
        if screen.1 > 0 {
            // To the start of the table's first line, then clear below.
            text.push_str(&format!("\x1b[{}F\x1b[J", screen.1));
        }
        for l in &lines {
            text.push_str(l);
            text.push('\n');
        }
        // The terminal going away ends the shell's output anyway.
        let _ = screen.0.write_all(text.as_bytes());
        let _ = screen.0.flush();
        screen.1 = lines.len();
    }
}

/// Standard output captured into a [`LiveTable`] drawn on the terminal, until
/// [`Capture::finish`] (or drop) gives fd 1 back.
pub struct Capture {
    /// The terminal, to put back on fd 1.
    saved: Option<OwnedFd>,
    shared: Arc<Shared>,
    done: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    drawer: Option<JoinHandle<()>>,
    eof: mpsc::Receiver<()>,
}

impl Capture {
    /// Puts a pipe behind fd 1 and starts reading it into a table of `columns`.
    pub fn start(columns: Vec<String>) -> std::io::Result<Capture> {
        std::io::stdout().flush()?;
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
        #[allow(unsafe_code)]
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let saved = dup_cloexec(1)?;
        let height = terminal_height(saved.as_raw_fd());
        let screen = File::from(saved.try_clone()?);
        // SAFETY: dup2 onto fd 1 of a descriptor this function owns; fd 1 stays open
        // throughout (it is replaced atomically).
        #[allow(unsafe_code)]
        if unsafe { libc::dup2(write.as_raw_fd(), 1) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        drop(write);
        let shared = Arc::new(Shared {
            table: Mutex::new(LiveTable::new(columns)),
            changed: AtomicBool::new(true),
            screen: Mutex::new((screen, 0)),
            // The header, its rule, the footer and the prompt below stay on screen.
            max_rows: height.saturating_sub(4).max(1),
        });
        let (eof_tx, eof) = mpsc::channel();
        let reader = {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(File::from(read)).lines() {
                    let Ok(line) = line else { break };
                    shared
                        .table
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .apply(&line);
                    shared.changed.store(true, AtomicOrdering::Release);
                }
                let _ = eof_tx.send(());
            })
        };
        let done = Arc::new(AtomicBool::new(false));
        let drawer = {
            let (shared, done) = (shared.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(AtomicOrdering::Acquire) {
                    if shared.changed.swap(false, AtomicOrdering::AcqRel) {
                        shared.draw();
                    }
                    std::thread::sleep(REDRAW);
                }
            })
        };
        Ok(Capture {
            saved: Some(saved),
            shared,
            done,
            reader: Some(reader),
            drawer: Some(drawer),
            eof,
        })
    }

    /// Gives fd 1 back, reads what is left in the pipe and draws the final table.
    pub fn finish(mut self) {
        self.restore();
    }

    fn restore(&mut self) {
        let Some(saved) = self.saved.take() else {
            return;
        };
        let _ = std::io::stdout().flush();
        // SAFETY: dup2 of the descriptor saved at the start back onto fd 1.
        #[allow(unsafe_code)]
        unsafe {
            libc::dup2(saved.as_raw_fd(), 1);
        }
        drop(saved);
        // The pipe ends when the last writer (this process's fd 1 was one; a worker
        // process still exiting may be another) has closed it.
        if self.eof.recv_timeout(DRAIN).is_ok()
            && let Some(reader) = self.reader.take()
        {
            let _ = reader.join();
        }
        self.done.store(true, AtomicOrdering::Release);
        if let Some(drawer) = self.drawer.take() {
            let _ = drawer.join();
        }
        self.shared.draw();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.restore();
    }
}

fn dup_cloexec(fd: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one or -1.
    #[allow(unsafe_code)]
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `new` was just created and is owned by nobody else.
    #[allow(unsafe_code)]
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// The terminal's rows, or [`DEFAULT_HEIGHT`] when it does not say.
fn terminal_height(fd: i32) -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize; it is zeroed first and read only on success.
    #[allow(unsafe_code)]
    let rows = unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) == 0 {
            size.ws_row as usize
        } else {
            0
        }
    };
    if rows == 0 { DEFAULT_HEIGHT } else { rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changelog_folds_into_its_rows_in_numeric_order() {
        let mut t = LiveTable::new(vec!["k".into(), "n".into()]);
        for line in [
            r#"{"op":"+I","k":10,"n":1}"#,
            r#"{"op":"+I","k":9,"n":1}"#,
            r#"{"op":"-U","k":10,"n":1}"#,
            r#"{"op":"+U","k":10,"n":2}"#,
            r#"{"op":"+I","k":"x"}"#,
            r#"{"op":"-D","k":"x"}"#,
            "not json",
        ] {
            t.apply(line);
        }
        assert_eq!(
            t.render(10),
            vec![
                "k  | n",
                "---+--",
                "9  | 1",
                "10 | 2",
                "(2 rows, 6 changes) (1 line(s) not a change were left out)",
            ]
        );
        assert_eq!(
            t.render(1),
            vec![
                "k | n",
                "--+--",
                "9 | 1",
                "... 1 more rows not shown (2 rows, 6 changes) (1 line(s) not a change were \
                 left out)",
            ]
        );
    }

    #[test]
    fn a_missing_value_is_null() {
        let mut t = LiveTable::new(vec!["k".into(), "top".into()]);
        t.apply(r#"{"op":"+I","k":1}"#);
        assert_eq!(t.render(5)[2], "1 | NULL");
    }
}
