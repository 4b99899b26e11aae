//! SQL cases kept as data: each file in `integration-tests/sql/` holds jobs and what the
//! `sluice` binary must answer for them, in the spirit of sqllogictest.
//!
//! ```text
//! # a comment
//! explain a_window_plans_into_two_tasks
//! CREATE TABLE ...;
//! INSERT INTO ...;
//! ----
//! (the output of `sluice explain job.sql`)
//!
//! error an_unknown_column_is_named
//! ...
//! ----
//! (what `sluice explain job.sql` writes to stderr; it must fail)
//!
//! query bids_per_auction
//! ...
//! ----
//! (what `sluice run -q job.sql` prints, its lines sorted: parallel tasks interleave)
//!
//! final an_updating_query_ends_with_these_rows
//! ...
//! ----
//! (the rows `sluice run -q job.sql` leaves: its changelog folded, `op` dropped, sorted)
//! ```
//!
//! `final` is for an updating query whose changes depend on which source comes first
//! (an outer join's padded rows are written and taken back, or not at all).
//!
//! A case's expected text runs to the blank line before the next case or comment. Run
//! with `-- --bless` to rewrite every expectation from what the binary answers now (then
//! read the diff): `cargo test -p sluice-integration-tests --test sql_cases -- --bless`.
//! The job runs as `job.sql` in a directory of its own, so errors say `job.sql:L:C`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sluice_integration_tests::{fold_changelog, parse_jsonl, run_sluice, tempdir, workspace_root};

/// What a case asks of the binary.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Explain,
    Error,
    Query,
    Final,
}

impl Kind {
    fn parse(word: &str) -> Option<Self> {
        match word {
            "explain" => Some(Self::Explain),
            "error" => Some(Self::Error),
            "query" => Some(Self::Query),
            "final" => Some(Self::Final),
            _ => None,
        }
    }
}

/// One case of a file.
struct Case {
    kind: Kind,
    name: String,
    /// Line of the header, for messages.
    line: usize,
    job: String,
    expected: String,
    /// Lines of the file the case's expected text occupies (`----` excluded).
    expected_lines: std::ops::Range<usize>,
}

fn is_header(line: &str) -> bool {
    line.starts_with('#')
        || line
            .split_once(' ')
            .is_some_and(|(w, _)| Kind::parse(w).is_some())
}

/// The cases of `text`, or what is malformed and on which line.
fn parse(text: &str) -> Result<Vec<Case>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut cases = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() || line.starts_with('#') {
            i += 1;
            continue;
        }
        let (word, name) = line.split_once(' ').unwrap_or((line, ""));
        let kind = Kind::parse(word).ok_or_else(|| {
            format!(
                "line {}: expected `explain NAME`, `error NAME`, `query NAME` or `final NAME`, \
                 found `{line}`",
                i + 1
            )
        })?;
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("line {}: the case has no name", i + 1));
        }
        let header = i + 1;
        i += 1;
        let start = i;
        while i < lines.len() && lines[i] != "----" {
            i += 1;
        }
        if i == lines.len() {
            return Err(format!("line {header}: case `{name}` has no `----` line"));
        }
        let job = lines[start..i].join("\n");
        i += 1;
        let from = i;
        // The expected text ends at a blank line followed by the next case or comment.
        while i < lines.len() && !(lines[i].trim().is_empty() && next_is_header(&lines[i..])) {
            i += 1;
        }
        let mut to = i;
        while to > from && lines[to - 1].trim().is_empty() {
            to -= 1;
        }
        cases.push(Case {
            kind,
            name: name.to_owned(),
            line: header,
            job,
            expected: lines[from..to].join("\n"),
            expected_lines: from..to,
        });
    }
    Ok(cases)
}

/// Whether the first non-blank line of `rest` starts a case or a comment (or none is left).
fn next_is_header(rest: &[&str]) -> bool {
    rest.iter()
        .find(|l| !l.trim().is_empty())
        .is_none_or(|l| is_header(l))
}

/// What the binary answers for `case`, or why it answered out of kind.
fn answer(case: &Case, dir: &Path) -> Result<String, String> {
    std::fs::write(dir.join("job.sql"), &case.job).map_err(|e| e.to_string())?;
    let out = match case.kind {
        Kind::Explain | Kind::Error => run_sluice(&["explain", "job.sql"], dir),
        Kind::Query | Kind::Final => run_sluice(&["run", "job.sql", "-q"], dir),
    };
    let succeeded = out.code == Some(0);
    match (case.kind, succeeded) {
        (Kind::Explain, true) => Ok(out.stdout.trim_end().to_owned()),
        (Kind::Query, true) => {
            let mut rows: Vec<&str> = out.stdout.lines().collect();
            rows.sort_unstable();
            Ok(rows.join("\n"))
        }
        (Kind::Final, true) => {
            let changes = parse_jsonl(&out.stdout, "the job's output");
            let mut rows: Vec<String> = fold_changelog(&changes)
                .into_iter()
                .map(|r| serde_json::Value::Object(r).to_string())
                .collect();
            rows.sort_unstable();
            Ok(rows.join("\n"))
        }
        (Kind::Error, false) => Ok(out.stderr.trim_end().to_owned()),
        (Kind::Error, true) => Err(format!("it succeeded:\n{}", out.stdout)),
        (_, false) => Err(format!(
            "`{}` exited with {:?}:\n{}",
            out.command, out.code, out.stderr
        )),
    }
}

/// The file with each case's expected text replaced by `answers` (in case order).
fn blessed(text: &str, cases: &[Case], answers: &[String]) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut at = 0;
    for (case, answer) in cases.iter().zip(answers) {
        for l in &lines[at..case.expected_lines.start] {
            out.push_str(l);
            out.push('\n');
        }
        if !answer.is_empty() {
            out.push_str(answer);
            out.push('\n');
        }
        at = case.expected_lines.end;
    }
    for l in &lines[at..] {
        out.push_str(l);
        out.push('\n');
    }
    out
}

fn case_files() -> Vec<PathBuf> {
    let dir = workspace_root().join("integration-tests/sql");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "test"))
        .collect();
    files.sort();
    files
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bless = args.iter().any(|a| a == "--bless");
    // A name given as libtest takes one: only cases whose name contains it run.
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned();
    let (mut passed, mut failed) = (0usize, 0usize);
    for file in case_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let shown = file
            .strip_prefix(workspace_root())
            .unwrap_or(&file)
            .display();
        let cases = match parse(&text) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{shown}: {e}");
                failed += 1;
                continue;
            }
        };
        // The format round-trips: blessing with what is expected changes nothing.
        let same: Vec<String> = cases.iter().map(|c| c.expected.clone()).collect();
        if blessed(&text, &cases, &same).trim_end() != text.trim_end() {
            eprintln!("{shown}: rewriting its own expectations would change the file");
            failed += 1;
            continue;
        }
        let mut answers = Vec::new();
        for case in &cases {
            if filter
                .as_ref()
                .is_some_and(|f| !case.name.contains(f.as_str()))
            {
                answers.push(case.expected.clone());
                continue;
            }
            let dir = tempdir();
            match answer(case, dir.path()) {
                Ok(actual) if actual == case.expected => {
                    println!("test {shown}::{} ... ok", case.name);
                    passed += 1;
                    answers.push(actual);
                }
                Ok(actual) if bless => {
                    println!("test {shown}::{} ... blessed", case.name);
                    passed += 1;
                    answers.push(actual);
                }
                Ok(actual) => {
                    println!("test {shown}::{} ... FAILED", case.name);
                    eprintln!(
                        "{shown}:{}: case `{}`\n--- expected\n{}\n--- actual\n{actual}\n\
                         (rewrite the expectations with `cargo test -p sluice-integration-tests \
                         --test sql_cases -- --bless`, then read the diff)\n",
                        case.line, case.name, case.expected
                    );
                    failed += 1;
                    answers.push(case.expected.clone());
                }
                Err(why) => {
                    println!("test {shown}::{} ... FAILED", case.name);
                    eprintln!("{shown}:{}: case `{}`: {why}\n", case.line, case.name);
                    failed += 1;
                    answers.push(case.expected.clone());
                }
            }
        }
        if bless {
            let new = blessed(&text, &cases, &answers);
            if new != text {
                std::fs::write(&file, new).unwrap();
                println!("rewrote {shown}");
            }
        }
    }
    // The line scripts/test counts, as libtest prints it.
    let result = if failed == 0 { "ok" } else { "FAILED" };
    println!("\ntest result: {result}. {passed} passed; {failed} failed; 0 ignored");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
