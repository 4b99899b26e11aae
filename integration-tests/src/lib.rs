//! End-to-end tests live in `tests/`; they run the real `sluice` binary.
//!
//! This crate's library is the harness they share:
//!
//! - [`sluice_bin`] finds the binary (`SLUICE_BIN`, else `$CARGO_TARGET_DIR/debug/sluice`,
//!   else `<workspace>/target/debug/sluice`); run `cargo build -p sluice-cli` first.
//! - [`run_sluice`] / [`run_sluice_env`] run it with a timeout and capture its output.
//! - [`write_job`] writes a job file; [`read_jsonl_dir`] reads a file sink's output.
//! - [`assert_same_rows`] compares rows as multisets, with timestamps normalised to epoch
//!   milliseconds and floats compared with a tolerance, and prints a readable diff.
//! - [`read_bids_csv`] parses `sluice nexmark gen --format csv` output with plain Rust, so
//!   expected results never depend on the engine's own readers.
//!
//! - [`service::ServiceProcess`] runs a long-lived role (`sluice state-service`) and kills
//!   it on drop.
//!
//! Nothing here uses a sluice crate: the expected side of every test is computed
//! independently of the engine.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Map, Number, Value};

pub mod cluster;
pub mod etcd;
pub mod http;
pub mod procs;
pub mod service;

/// One output record: column name to JSON value.
pub type Row = Map<String, Value>;

/// How long one `sluice` invocation may take before it is killed.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// This crate's directory: as `cargo test` says when it runs the test (a test binary
/// built from another copy of the tree, with the same sources, is fresh to cargo and
/// would otherwise look in that copy), else as it was when compiled.
pub fn crate_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    crate_dir()
        .parent()
        .expect("integration-tests has a parent directory")
        .to_path_buf()
}

/// The binary of `cli/examples/NAME.rs`, built beside the `sluice` binary
/// (`cargo build -p sluice-cli --examples`).
///
/// # Panics
/// When it was not built.
pub fn example_bin(name: &str) -> PathBuf {
    let bin = sluice_bin()
        .parent()
        .map(|dir| dir.join("examples").join(name))
        .unwrap_or_default();
    assert!(
        bin.is_file(),
        "{} was not found; run `cargo build -p sluice-cli --examples` first",
        bin.display()
    );
    bin
}

/// The `sluice` binary to test.
///
/// # Panics
/// When none is found, with a message saying to build it.
pub fn sluice_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("SLUICE_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "SLUICE_BIN={} does not name a file; unset it or run `cargo build -p sluice-cli`",
            bin.display()
        );
        return bin;
    }
    let mut tried = Vec::new();
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        let target = PathBuf::from(target);
        let target = if target.is_absolute() {
            target
        } else {
            workspace_root().join(target)
        };
        tried.push(target.join("debug").join("sluice"));
    }
    tried.push(workspace_root().join("target").join("debug").join("sluice"));
    if let Some(bin) = tried.iter().find(|p| p.is_file()) {
        return bin.clone();
    }
    panic!(
        "the sluice binary was not found (tried {}); run `cargo build -p sluice-cli` first \
         (with the same CARGO_TARGET_DIR), or set SLUICE_BIN",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// What a finished `sluice` invocation did.
#[derive(Debug)]
pub struct Outcome {
    /// The exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The command line, for messages.
    pub command: String,
}

impl Outcome {
    /// Panics with the full output unless the exit code is `code`.
    #[track_caller]
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "`{}` exited with {:?}, expected {code}\n--- stdout\n{}\n--- stderr\n{}",
            self.command,
            self.code,
            truncate(&self.stdout, 4000),
            truncate(&self.stderr, 4000)
        );
        self
    }

    /// Panics unless the run succeeded.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        self.assert_code(0)
    }

    /// Panics unless stderr contains `needle`.
    #[track_caller]
    pub fn assert_stderr_contains(&self, needle: &str) -> &Self {
        assert!(
            self.stderr.contains(needle),
            "stderr of `{}` does not contain {needle:?}:\n{}",
            self.command,
            self.stderr
        );
        self
    }

    /// Panics when stderr shows a panic.
    #[track_caller]
    pub fn assert_no_panic(&self) -> &Self {
        assert!(
            !self.stderr.contains("panicked"),
            "`{}` panicked:\n{}",
            self.command,
            self.stderr
        );
        self
    }

    /// The numbers of the `finished NAME: ...` summary line `sluice run` prints.
    ///
    /// # Panics
    /// When there is no summary line.
    #[track_caller]
    pub fn summary(&self) -> Summary {
        let line = summary_line(&self.stderr)
            .unwrap_or_else(|| panic!("no `finished` summary in stderr:\n{}", self.stderr));
        let counts = line.rsplit_once(": ").map_or(line, |(_, counts)| counts);
        let number_before = |suffix: &str| -> u64 {
            let at = counts
                .find(suffix)
                .unwrap_or_else(|| panic!("summary {line:?} has no {suffix:?}"));
            let digits: String = counts[..at]
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            digits
                .parse()
                .unwrap_or_else(|_| panic!("no number before {suffix:?} in {line:?}"))
        };
        Summary {
            records_in: number_before(" records in"),
            records_out: number_before(" out,"),
            late: number_before(" late"),
            skipped: number_before(" skipped"),
        }
    }
}

/// The `finished NAME: N records in, ...` summary `sluice run` printed in `stderr`, from
/// `finished` on. Workers share the run's stderr, and a worker's last message (written in
/// pieces: stderr is unbuffered) can land in front of the summary on its line, so it is
/// found at a word start anywhere in a line, not only at the line's start.
pub fn summary_line(stderr: &str) -> Option<&str> {
    stderr.lines().find_map(|l| {
        l.match_indices("finished ")
            .filter(|(at, _)| l[..*at].chars().last().is_none_or(|c| !c.is_alphanumeric()))
            .map(|(at, _)| &l[at..])
            .find(|rest| rest.contains(" records in, "))
    })
}

/// The counts of a `sluice run` summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub records_in: u64,
    pub records_out: u64,
    pub late: u64,
    pub skipped: u64,
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Runs `sluice args...` in `cwd`, killing it after [`TIMEOUT`].
pub fn run_sluice(args: &[&str], cwd: &Path) -> Outcome {
    run_sluice_env(args, cwd, &[])
}

/// Like [`run_sluice`], with extra environment variables.
///
/// # Panics
/// When the binary cannot be started or does not finish within [`TIMEOUT`].
pub fn run_sluice_env(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Outcome {
    run_sluice_input(args, cwd, env, None)
}

/// Like [`run_sluice_env`], with `input` (when given) written to its standard input,
/// which is then closed.
///
/// # Panics
/// When the binary cannot be started or does not finish within [`TIMEOUT`].
pub fn run_sluice_input(
    args: &[&str],
    cwd: &Path,
    env: &[(&str, &str)],
    input: Option<&str>,
) -> Outcome {
    run_program_input(&sluice_bin(), "sluice", args, cwd, env, input)
}

/// Runs `program` (called `name` in messages) as [`run_sluice_input`] runs `sluice`.
///
/// # Panics
/// When the program cannot be started or does not finish within [`TIMEOUT`].
pub fn run_program_input(
    bin: &Path,
    name: &str,
    args: &[&str],
    cwd: &Path,
    env: &[(&str, &str)],
    input: Option<&str>,
) -> Outcome {
    let command = format!("{name} {}", args.join(" "));
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .current_dir(cwd)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        let text = text.to_owned();
        // A writer of its own: the child may fill its output pipes before it reads all.
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut stdin, text.as_bytes());
        });
    }
    let mut out_pipe = child.stdout.take().expect("piped stdout");
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                let stderr =
                    String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
                panic!(
                    "`{command}` (in {}) did not finish within {TIMEOUT:?} and was killed\n\
                     --- stderr\n{}",
                    cwd.display(),
                    truncate(&stderr, 4000)
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for `{command}`: {e}"),
        }
    };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    Outcome {
        code: status.code(),
        stdout,
        stderr,
        command,
    }
}

/// Writes `yaml` to `dir/name` and returns the path.
pub fn write_job(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, yaml).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// `s` as a YAML double-quoted scalar (a JSON string is one).
pub fn yaml_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `path` as a YAML double-quoted scalar.
pub fn yaml_path(path: &Path) -> String {
    yaml_str(path.to_str().expect("test paths are UTF-8"))
}

/// The files named `part-*.<ext>` directly in `dir`, by subtask and then in the order written.
pub fn part_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("part-") && n.ends_with(&format!(".{ext}")))
        })
        .collect();
    // By subtask, then in the order written: `part-0-9` before `part-0-10`.
    files.sort_by_key(|p| natural_key(p.file_name().and_then(|n| n.to_str()).unwrap_or("")));
    files
}

/// A file name cut into text and numbers, so that numbers compare by value.
fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut rest = name;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits > 0 {
            key.push((String::new(), rest[..digits].parse().unwrap_or(u64::MAX)));
            rest = &rest[digits..];
        } else {
            let text = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            key.push((rest[..text].to_owned(), 0));
            rest = &rest[text..];
        }
    }
    key
}

/// Every row of every `part-*.jsonl` file in `dir`.
///
/// # Panics
/// When the directory has no part file or a line is not a JSON object.
pub fn read_jsonl_dir(dir: &Path) -> Vec<Row> {
    let files = part_files(dir, "jsonl");
    assert!(
        !files.is_empty(),
        "no part-*.jsonl files in {}",
        dir.display()
    );
    let mut rows = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        rows.extend(parse_jsonl(&text, &file.display().to_string()));
    }
    rows
}

/// The rows of JSON-lines `text`; `origin` names it in messages.
pub fn parse_jsonl(text: &str, origin: &str) -> Vec<Row> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(row)) => row,
            Ok(other) => panic!("{origin}:{}: not a JSON object: {other}", i + 1),
            Err(e) => panic!("{origin}:{}: {e}: {line}", i + 1),
        })
        .collect()
}

/// Builds a row from `(column, value)` pairs.
pub fn row<const N: usize>(fields: [(&str, Value); N]) -> Row {
    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// Epoch milliseconds of `YYYY-MM-DDTHH:MM:SS[.fff]` (also with a space for `T`, an
/// optional trailing `Z`, and 1 to 9 fraction digits), read as UTC; `None` for anything
/// else, including dates that do not exist.
pub fn parse_timestamp_ms(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z').unwrap_or(s);
    let b = s.as_bytes();
    // The shape first: other strings of a row are never read as dates.
    let shaped = b.len() >= 19
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && (b[10] == b'T' || b[10] == b' ')
        && b[13] == b':'
        && b[16] == b':';
    if !shaped || (b.len() > 19 && (b[19] != b'.' || b.len() == 20 || b.len() > 29)) {
        return None;
    }
    let format = if b[10] == b'T' {
        "%Y-%m-%dT%H:%M:%S%.f"
    } else {
        "%Y-%m-%d %H:%M:%S%.f"
    };
    let t = chrono::NaiveDateTime::parse_from_str(s, format).ok()?;
    Some(t.and_utc().timestamp_millis())
}

/// `ms` as `YYYY-MM-DDTHH:MM:SS.fff` (UTC), for messages and hand-written inputs.
pub fn format_timestamp_ms(ms: i64) -> String {
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3f").to_string(),
        None => format!("{ms} ms since the epoch"),
    }
}

/// A row with every timestamp-looking string replaced by its epoch milliseconds.
pub fn normalize_row(row: &Row) -> Row {
    row.iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => match parse_timestamp_ms(s) {
                    Some(ms) => Value::Number(ms.into()),
                    None => v.clone(),
                },
                other => other.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// Appends a sortable text form of `row` to `out`: columns sorted by name, timestamps as
/// epoch milliseconds, floats rounded (so rows differing only in float noise usually, not
/// always, share it).
fn canonical(row: &Row, out: &mut String) {
    use std::fmt::Write;
    let mut fields: Vec<(&String, &Value)> = row.iter().collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (i, (k, v)) in fields.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(k);
        out.push_str(": ");
        let _ = match v {
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => write!(out, "{i}"),
                (None, Some(f)) if n.is_f64() => write!(out, "{f:.6}"),
                _ => write!(out, "{n}"),
            },
            Value::String(s) => match parse_timestamp_ms(s) {
                Some(ms) => write!(out, "{ms}"),
                None if s.bytes().all(|c| c >= b' ' && c != b'"' && c != b'\\') => {
                    out.push('"');
                    out.push_str(s);
                    out.push('"');
                    Ok(())
                }
                None => write!(out, "{v}"),
            },
            other => write!(out, "{other}"),
        };
    }
    out.push('}');
}

fn numbers_close(a: &Number, b: &Number) -> bool {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x == y;
    }
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-6_f64.max(1e-9 * x.abs().max(y.abs())),
        _ => a == b,
    }
}

fn rows_close(a: &Row, b: &Row) -> bool {
    a.len() == b.len()
        && a.iter().all(|(k, va)| match (va, b.get(k)) {
            (Value::Number(x), Some(Value::Number(y))) => numbers_close(x, y),
            (x, Some(y)) => x == y,
            (_, None) => false,
        })
}

/// Asserts that `actual` and `expected` hold the same rows, in any order.
///
/// Both sides are normalised first: strings that are timestamps become epoch milliseconds
/// (so `"2015-07-15T00:00:10"`, `"2015-07-15T00:00:10.000"` and `1436918410000` are
/// equal), and floats are compared with a small tolerance. On a mismatch the message
/// gives both counts and the first few missing and unexpected rows.
#[track_caller]
pub fn assert_same_rows(what: &str, actual: &[Row], expected: &[Row]) {
    if let Err(message) = compare_rows(actual, expected) {
        panic!("{what}: {message}");
    }
}

/// The final rows of a changelog (rows with an `op` column: `+I`, `-U`, `+U`, `-D`), in
/// the order they were written: inserts and update-afters add a row, update-befores and
/// deletes take one away. Panics when a retraction takes away a row not there at that
/// point (a `-U` ahead of its `+I`, or a change lost), naming the row.
pub fn fold_changelog(changes: &[Row]) -> Vec<Row> {
    fold(changes, true)
}

/// [`fold_changelog`] for changes whose order across files is not known (after a rescale
/// a key's changes continue in another subtask's files): the net count of every row,
/// which must not end below zero.
pub fn net_changelog(changes: &[Row]) -> Vec<Row> {
    fold(changes, false)
}

fn fold(changes: &[Row], ordered: bool) -> Vec<Row> {
    let mut live: HashMap<String, (i64, Row)> = HashMap::new();
    let mut key = String::new();
    for (i, change) in changes.iter().enumerate() {
        let mut row = change.clone();
        let op = match row.remove("op") {
            Some(Value::String(op)) => op,
            other => panic!("change {i} has no op column (found {other:?}): {change:?}"),
        };
        key.clear();
        canonical(&row, &mut key);
        let sign = match op.as_str() {
            "+I" | "+U" => 1,
            "-U" | "-D" => -1,
            other => panic!("change {i} has op `{other}`: {change:?}"),
        };
        let entry = live.entry(key.clone()).or_insert((0, row));
        entry.0 += sign;
        assert!(
            !ordered || entry.0 >= 0,
            "change {i} ({op}) retracts a row that is not there: {change:?}"
        );
    }
    let mut rows = Vec::new();
    for (_, (n, row)) in live {
        assert!(n >= 0, "{} more retractions than inserts of {row:?}", -n);
        for _ in 0..n {
            rows.push(row.clone());
        }
    }
    rows
}

/// The comparison behind [`assert_same_rows`]: `Err` describes the difference.
pub fn compare_rows(actual: &[Row], expected: &[Row]) -> Result<(), String> {
    // Per canonical form: expected count minus actual count, and one row having it.
    let mut counts: HashMap<String, (i64, &Row)> = HashMap::with_capacity(expected.len());
    let mut key = String::new();
    for (rows, sign) in [(expected, 1), (actual, -1)] {
        for r in rows {
            key.clear();
            canonical(r, &mut key);
            match counts.get_mut(key.as_str()) {
                Some(entry) => entry.0 += sign,
                None => {
                    counts.insert(key.clone(), (sign, r));
                }
            }
        }
    }
    // Positive: expected but not produced; negative: produced but not expected.
    let mut missing: Vec<(String, Row)> = Vec::new();
    let mut extra: Vec<(String, Row)> = Vec::new();
    for (key, (n, r)) in counts {
        if n == 0 {
            continue;
        }
        let r = normalize_row(r);
        let side = if n > 0 { &mut missing } else { &mut extra };
        for _ in 0..n.unsigned_abs() {
            side.push((key.clone(), r.clone()));
        }
    }
    missing.sort_by(|a, b| a.0.cmp(&b.0));
    extra.sort_by(|a, b| a.0.cmp(&b.0));
    // Pair what is left when the rows are equal within float tolerance.
    if !missing.is_empty() && !extra.is_empty() && missing.len() * extra.len() <= 1_000_000 {
        let mut still_missing = Vec::new();
        for (key, m) in missing {
            match extra.iter().position(|(_, e)| rows_close(&m, e)) {
                Some(i) => {
                    extra.remove(i);
                }
                None => still_missing.push((key, m)),
            }
        }
        missing = still_missing;
    }
    if missing.is_empty() && extra.is_empty() {
        return Ok(());
    }
    const SHOW: usize = 8;
    let mut msg = format!(
        "rows differ: {} actual, {} expected; {} expected rows missing, {} unexpected rows",
        actual.len(),
        expected.len(),
        missing.len(),
        extra.len()
    );
    let mut list = |title: &str, rows: &[(String, Row)]| {
        if rows.is_empty() {
            return;
        }
        msg.push_str(&format!(
            "\n  {title} (first {} of {}):",
            SHOW.min(rows.len()),
            rows.len()
        ));
        for (key, _) in rows.iter().take(SHOW) {
            msg.push_str("\n    ");
            msg.push_str(key);
        }
    };
    list("missing", &missing);
    list("unexpected", &extra);
    msg.push_str("\n  (timestamps shown as epoch ms; see format_timestamp_ms)");
    Err(msg)
}

/// One Nexmark bid, parsed from CSV with plain Rust.
#[derive(Debug, Clone, PartialEq)]
pub struct Bid {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub channel: String,
    pub url: String,
    /// Event time in epoch milliseconds.
    pub date_time: i64,
    pub extra: String,
}

impl Bid {
    /// The bid as the row a pass-through job writes.
    pub fn to_row(&self) -> Row {
        row([
            ("auction", self.auction.into()),
            ("bidder", self.bidder.into()),
            ("price", self.price.into()),
            ("channel", self.channel.clone().into()),
            ("url", self.url.clone().into()),
            ("date_time", self.date_time.into()),
            ("extra", self.extra.clone().into()),
        ])
    }
}

/// The column order of bid CSV files.
pub const BID_HEADER: &str = "auction,bidder,price,channel,url,date_time,extra";

/// Every bid in the `*.csv` files of `dir` (header checked; fields hold no commas).
///
/// # Panics
/// On a file that does not have the bid layout.
pub fn read_bids_csv(dir: &Path) -> Vec<Bid> {
    let files = part_files(dir, "csv");
    assert!(
        !files.is_empty(),
        "no part-*.csv files in {}",
        dir.display()
    );
    let mut bids = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(BID_HEADER),
            "header of {}",
            file.display()
        );
        for (i, line) in lines.enumerate() {
            let at = || format!("{}:{}", file.display(), i + 2);
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 7, "{}: expected 7 fields: {line}", at());
            let int = |s: &str| -> i64 {
                s.parse()
                    .unwrap_or_else(|e| panic!("{}: bad integer {s:?}: {e}", at()))
            };
            bids.push(Bid {
                auction: int(f[0]),
                bidder: int(f[1]),
                price: int(f[2]),
                channel: f[3].to_owned(),
                url: f[4].to_owned(),
                date_time: parse_timestamp_ms(f[5])
                    .unwrap_or_else(|| panic!("{}: bad timestamp {:?}", at(), f[5])),
                extra: f[6].to_owned(),
            });
        }
    }
    bids
}

/// A value built once and shared by the tests that run at the same time; it is dropped
/// (and its files removed) when the last of them is done, and rebuilt if needed later.
#[derive(Debug)]
pub struct Shared<T> {
    slot: Mutex<Weak<T>>,
}

impl<T> Shared<T> {
    pub const fn new() -> Self {
        Self {
            slot: Mutex::new(Weak::new()),
        }
    }

    /// The live value, or a new one from `init`.
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> Arc<T> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(value) = slot.upgrade() {
            return value;
        }
        let value = Arc::new(init());
        *slot = Arc::downgrade(&value);
        value
    }
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sluice-it-")
        // To read what a failed test left (its jobs, outputs and logs).
        .disable_cleanup(std::env::var_os("SLUICE_TEST_KEEP_DIRS").is_some())
        .tempdir()
        .expect("creating a temporary directory")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip() {
        assert_eq!(parse_timestamp_ms("1970-01-01T00:00:00"), Some(0));
        assert_eq!(
            parse_timestamp_ms("2015-07-15T00:00:10"),
            Some(1_436_918_410_000)
        );
        assert_eq!(
            parse_timestamp_ms("2015-07-15T00:00:10.5"),
            Some(1_436_918_410_500)
        );
        assert_eq!(
            parse_timestamp_ms("2015-07-14T23:59:58.820"),
            Some(1_436_918_398_820)
        );
        assert_eq!(parse_timestamp_ms("2015-07-15"), None);
        assert_eq!(parse_timestamp_ms("https://x"), None);
        for ms in [0, 1_436_918_398_820, 951_782_400_000, -1] {
            assert_eq!(parse_timestamp_ms(&format_timestamp_ms(ms)), Some(ms));
        }
    }

    #[test]
    fn rows_compare_as_multisets_with_tolerance() {
        let a = row([("t", "2015-07-15T00:00:10".into()), ("x", 1.0.into())]);
        let b = row([
            ("t", 1_436_918_410_000_i64.into()),
            ("x", 1.000_000_000_1.into()),
        ]);
        assert!(compare_rows(&[a.clone(), b.clone()], &[b.clone(), a.clone()]).is_ok());
        let err = compare_rows(std::slice::from_ref(&a), &[a.clone(), a.clone()]).unwrap_err();
        assert!(err.contains("1 expected rows missing"), "{err}");
        let c = row([("t", 0.into()), ("x", 1.0.into())]);
        let err = compare_rows(&[c], &[a]).unwrap_err();
        assert!(err.contains("unexpected"), "{err}");
    }
}
