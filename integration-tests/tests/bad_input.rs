//! Bad input: mistakes in job files, malformed records, and misuse of the command line.
//!
//! A mistake in the job is exit code 2 with `file:line:column: message` on stderr, at the
//! spot of the mistake; a malformed record is handled by the source's `on_error`; nothing
//! may panic.

use std::path::Path;

use sluice_integration_tests::{
    Outcome, Row, assert_same_rows, read_jsonl_dir, row, run_sluice, tempdir, write_job, yaml_path,
};

/// A bounded source whose schema (auction, bidder, price, channel, url, date_time, extra)
/// needs no files.
const NEXMARK: &str = "  nexmark: { stream: bid, events: 100, seed: 1 }";

/// Runs `sluice run job.yaml` on `yaml` in a fresh directory.
fn run_job(yaml: &str) -> Outcome {
    let dir = tempdir();
    write_job(dir.path(), "job.yaml", yaml);
    run_sluice(&["run", "job.yaml"], dir.path())
}

/// Asserts a usage error (exit 2, no panic) at `job.yaml:line:` and returns the column
/// and the message after the position.
#[track_caller]
fn assert_job_error(outcome: &Outcome, line: u32) -> (u32, String) {
    outcome.assert_code(2).assert_no_panic();
    let prefix = format!("error: job.yaml:{line}:");
    let at = outcome.stderr.find(&prefix).unwrap_or_else(|| {
        panic!(
            "stderr does not point at job.yaml line {line}:\n{}",
            outcome.stderr
        )
    });
    let rest = &outcome.stderr[at + prefix.len()..];
    let (column, message) = rest
        .split_once(": ")
        .unwrap_or_else(|| panic!("no `:column: ` after {prefix}: {rest}"));
    let column = column
        .parse()
        .unwrap_or_else(|_| panic!("no column number after {prefix}: {rest}"));
    (column, message.trim_end().to_owned())
}

#[track_caller]
fn assert_contains(message: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            message.contains(needle),
            "message does not contain {needle:?}: {message}"
        );
    }
}

#[test]
fn malformed_yaml_names_the_unclosed_bracket() {
    let outcome = run_job(&format!(
        "name: t\nsource:\n{NEXMARK}\nsink:\n  blackhole: {{}}\npipeline:\n  - filter: [price > 1\n"
    ));
    // The parser notices at the end of the input (line 8); the message points back at
    // the bracket opened on line 7, column 13.
    let (_, message) = assert_job_error(&outcome, 8);
    assert_contains(
        &message,
        &["invalid YAML", "`[` opened at 7:13", "`]` missing"],
    );

    let outcome = run_job("name: t\nsource:\n  nexmark: { events: 10\nsink:\n  blackhole: {}\n");
    let (_, message) = assert_job_error(&outcome, 4);
    assert_contains(&message, &["`{` opened at 3:12", "`}` missing"]);
}

#[test]
fn unknown_operator_suggests_the_right_one() {
    let outcome = run_job(&format!(
        "name: t\nsource:\n{NEXMARK}\npipeline:\n  - select: [auction]\n  - flter: \"price > 1\"\nsink:\n  blackhole: {{}}\n"
    ));
    let (column, message) = assert_job_error(&outcome, 6);
    assert_eq!(column, 5, "{message}");
    assert_contains(
        &message,
        &[
            "unknown operator `flter`",
            "pipeline[1]",
            "did you mean `filter`?",
        ],
    );
}

#[test]
fn unknown_connector_is_named() {
    let outcome = run_job("name: t\nsource:\n  kafak: {}\nsink:\n  blackhole: {}\n");
    let (column, message) = assert_job_error(&outcome, 3);
    assert_eq!(column, 3, "{message}");
    assert_contains(&message, &["`kafak`", "nexmark", "file"]);

    let outcome = run_job(&format!(
        "name: t\nsource:\n{NEXMARK}\nsink:\n  kafak: {{}}\n"
    ));
    let (column, message) = assert_job_error(&outcome, 5);
    assert_eq!(column, 3, "{message}");
    assert_contains(&message, &["`kafak`", "stdout", "blackhole", "file"]);
}

#[test]
fn filter_on_an_unknown_column_points_at_the_filter() {
    let outcome = run_job(&format!(
        "name: t\nsource:\n{NEXMARK}\npipeline:\n  - select: [auction, price]\n  - filter: \"pricee > 1\"\nsink:\n  blackhole: {{}}\n"
    ));
    let (column, message) = assert_job_error(&outcome, 6);
    // The start of the quoted expression.
    assert_eq!(column, 13, "{message}");
    assert_contains(&message, &["pricee"]);
}

#[test]
fn select_type_error_points_at_the_expression() {
    let outcome = run_job(&format!(
        "name: t\nsource:\n{NEXMARK}\npipeline:\n  - select:\n      - auction\n      - \"price + 'abc'\"\nsink:\n  blackhole: {{}}\n"
    ));
    let (column, message) = assert_job_error(&outcome, 7);
    assert_eq!(column, 9, "{message}");
    assert_contains(&message, &["Int64", "Utf8"]);
}

#[test]
fn aggregate_of_the_wrong_type_points_at_the_aggregate() {
    let outcome = run_job(&format!(
        "name: t\nsource:\n{NEXMARK}\nwatermark: {{ column: date_time, max_out_of_orderness: 1s }}\npipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    aggregate:\n      - count(*) AS n\n      - sum(channel) AS s\nsink:\n  blackhole: {{}}\n"
    ));
    let (column, message) = assert_job_error(&outcome, 10);
    assert_eq!(column, 9, "{message}");
    assert_contains(&message, &["sum(channel)", "Utf8"]);
}

#[test]
fn missing_files_are_usage_errors() {
    let dir = tempdir();
    let outcome = run_sluice(&["run", "no-such-job.yaml"], dir.path());
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains("cannot read job file no-such-job.yaml");

    let outcome = run_job(
        "name: t\nsource:\n  file: { path: no/such/dir, format: csv }\nsink:\n  blackhole: {}\n",
    );
    // The `source:` section (line 2) or its connector (line 3).
    outcome.assert_code(2).assert_no_panic();
    assert!(
        outcome.stderr.contains("job.yaml:2:") || outcome.stderr.contains("job.yaml:3:"),
        "stderr does not point at the source: {}",
        outcome.stderr
    );
    assert_contains(&outcome.stderr, &["no files found", "no/such/dir"]);
}

/// `bids.csv`: a header, two good rows and, on line 3, `abc` in the int64 `price`.
const BAD_CSV: &str = "auction,price,date_time\n1,10,2015-07-15T00:00:01\n2,abc,2015-07-15T00:00:02\n3,30,2015-07-15T00:00:03\n";
const BAD_LINE: &str = "2,abc,2015-07-15T00:00:02";

fn good_rows() -> Vec<Row> {
    vec![
        row([
            ("auction", 1.into()),
            ("price", 10.into()),
            ("date_time", "2015-07-15T00:00:01".into()),
        ]),
        row([
            ("auction", 3.into()),
            ("price", 30.into()),
            ("date_time", "2015-07-15T00:00:03".into()),
        ]),
    ]
}

/// Runs a pass-through job over `BAD_CSV` with `on_error` settings `policy`.
fn run_bad_csv(dir: &Path, policy: &str) -> Outcome {
    let input = dir.join("bids.csv");
    std::fs::write(&input, BAD_CSV).expect("writing bids.csv");
    let yaml = format!(
        "name: t\nsource:\n  file:\n    path: {}\n    format: csv\n    schema: {{ auction: int64, price: int64, date_time: timestamp }}\n    {policy}\nsink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(&input),
        yaml_path(&dir.join("out"))
    );
    write_job(dir, "job.yaml", &yaml);
    run_sluice(&["run", "job.yaml"], dir)
}

#[test]
fn bad_record_fails_the_job_naming_file_and_line() {
    let dir = tempdir();
    let outcome = run_bad_csv(dir.path(), "on_error: fail");
    outcome.assert_code(1).assert_no_panic();
    let input = dir.path().join("bids.csv");
    outcome.assert_stderr_contains(&format!("{}:3", input.display()));
    outcome.assert_stderr_contains("abc");
}

#[test]
fn bad_record_is_skipped_and_counted() {
    let dir = tempdir();
    let outcome = run_bad_csv(dir.path(), "on_error: skip");
    outcome.assert_success().assert_no_panic();
    outcome.assert_stderr_contains(", 1 skipped");
    let summary = outcome.summary();
    assert_eq!((summary.records_in, summary.skipped), (2, 1));
    assert_same_rows(
        "rows after skipping",
        &read_jsonl_dir(&dir.path().join("out")),
        &good_rows(),
    );
}

#[test]
fn bad_record_goes_to_the_dead_letter_output() {
    let dir = tempdir();
    let dlq = dir.path().join("dlq");
    let policy = format!(
        "on_error: dead_letter\n    dead_letter: {}",
        yaml_path(&dlq)
    );
    let outcome = run_bad_csv(dir.path(), &policy);
    outcome.assert_success().assert_no_panic();
    assert_eq!(outcome.summary().skipped, 1, "{}", outcome.stderr);
    assert_same_rows(
        "rows besides the dead letter",
        &read_jsonl_dir(&dir.path().join("out")),
        &good_rows(),
    );
    let mut dead = String::new();
    for entry in std::fs::read_dir(&dlq).expect("the dead-letter directory exists") {
        dead.push_str(&std::fs::read_to_string(entry.expect("entry").path()).expect("read"));
    }
    assert!(dead.contains(BAD_LINE), "dead letters: {dead}");
    let input = dir.path().join("bids.csv");
    assert!(
        dead.contains(&format!("{}:3", input.display())),
        "dead letters should name file and line: {dead}"
    );
    assert_eq!(
        dead.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "only the bad record is a dead letter: {dead}"
    );
    assert!(
        !dead.contains("1,10,"),
        "a good record is a dead letter: {dead}"
    );
}

#[test]
fn bad_jsonl_line_is_skipped() {
    let dir = tempdir();
    let input = dir.path().join("bids.jsonl");
    std::fs::write(
        &input,
        "{\"auction\":1,\"price\":2}\n{\"auction\": 2, \"price\":\n{\"auction\":3,\"price\":4}\n",
    )
    .expect("writing bids.jsonl");
    let yaml = format!(
        "name: t\nsource:\n  file: {{ path: {}, format: jsonl, on_error: skip, schema: {{ auction: int64, price: int64 }} }}\nsink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(&input),
        yaml_path(&dir.path().join("out"))
    );
    write_job(dir.path(), "job.yaml", &yaml);
    let outcome = run_sluice(&["run", "job.yaml"], dir.path());
    outcome.assert_success().assert_no_panic();
    assert_eq!(outcome.summary().skipped, 1, "{}", outcome.stderr);
    assert_same_rows(
        "rows after skipping",
        &read_jsonl_dir(&dir.path().join("out")),
        &[
            row([("auction", 1.into()), ("price", 2.into())]),
            row([("auction", 3.into()), ("price", 4.into())]),
        ],
    );
}

#[test]
fn worker_without_a_deployment_says_what_it_needs() {
    let dir = tempdir();
    let outcome = run_sluice(&["worker"], dir.path());
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains("`sluice worker` needs --coordinator");
}

#[test]
fn nexmark_gen_refuses_zero_events() {
    let dir = tempdir();
    let out = dir.path().join("bids");
    let outcome = run_sluice(
        &[
            "nexmark",
            "gen",
            "--events",
            "0",
            "--out",
            out.to_str().expect("UTF-8 path"),
        ],
        dir.path(),
    );
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains("--events");
    assert!(!out.exists(), "nothing should be written");
}

#[test]
fn state_service_refuses_an_unknown_object_store_scheme() {
    let dir = tempdir();
    let outcome = run_sluice(
        &[
            "state-service",
            "--listen",
            "127.0.0.1:0",
            "--object-store",
            "ftp://x/y",
        ],
        dir.path(),
    );
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains(
            "--object-store `ftp://x/y`: use s3://bucket/prefix or file:///dir",
        );
}

#[test]
fn remote_state_job_with_an_unreachable_state_service_fails_clearly() {
    let dir = tempdir();
    let job = write_job(
        dir.path(),
        "remote.yaml",
        "name: remote\nparallelism: 1\nstate: { backend: remote }\nsource:\n  nexmark: { stream: bid, events: 1000, seed: 1 }\nwatermark: { column: date_time, max_out_of_orderness: 4s }\npipeline:\n  - key_by: [auction]\n  - window: { tumbling: 10s }\n    aggregate: [\"count(*) AS bids\"]\nsink:\n  blackhole: {}\n",
    );
    // Port 1 on loopback: nothing listens there.
    let outcome = run_sluice(
        &[
            "run",
            job.to_str().expect("UTF-8 path"),
            "--state-service",
            "http://127.0.0.1:1",
        ],
        dir.path(),
    );
    outcome
        .assert_code(1)
        .assert_no_panic()
        .assert_stderr_contains("cannot connect to the state service at http://127.0.0.1:1");
}

#[test]
fn remote_state_shards_must_be_positive() {
    let dir = tempdir();
    let job = write_job(
        dir.path(),
        "shards.yaml",
        "name: shards\nstate: { backend: remote, shards: 0 }\nsource:\n  nexmark: { stream: bid, events: 10 }\nsink:\n  blackhole: {}\n",
    );
    let outcome = run_sluice(&["run", job.to_str().expect("UTF-8 path")], dir.path());
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains("shards.yaml:2:");
}
