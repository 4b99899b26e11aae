//! Jobs written in SQL, run by the `sluice` command as a user runs them: each SQL example
//! gives the rows its YAML twin gives, on one process and across two worker processes,
//! and a mistake in the SQL is a usage error at its line and column.

use std::path::Path;

use sluice_integration_tests::cluster::MiniCluster;
use sluice_integration_tests::http::http_request;
use sluice_integration_tests::{
    assert_same_rows, fold_changelog, parse_jsonl, read_jsonl_dir, run_program_input, run_sluice,
    run_sluice_input, sluice_bin, tempdir, workspace_root, write_job, yaml_path,
};

/// The example's text with a smaller source and its file sink writing to `out`.
fn adapt(text: &str, sql: bool, out: &Path) -> String {
    let mut adapted = String::new();
    for line in text.lines() {
        let t = line.trim();
        if sql && t.starts_with("'events'") {
            adapted.push_str("  'events' = '100000',\n");
        } else if sql && t.starts_with("'seed'") {
            adapted.push_str("  'seed' = '3',\n");
        } else if sql && t.starts_with("'path'") {
            adapted.push_str(&format!("  'path' = '{}',\n", out.display()));
        } else if !sql && t.starts_with("nexmark:") {
            adapted.push_str(
                "  nexmark: { stream: bid, events: 100000, seed: 3, max_out_of_orderness: 2s }\n",
            );
        } else if !sql && t.starts_with("file:") {
            adapted.push_str(&format!(
                "  file: {{ path: {}, format: jsonl }}\n",
                yaml_path(out)
            ));
        } else {
            adapted.push_str(line);
            adapted.push('\n');
        }
    }
    assert!(
        adapted.contains(&out.display().to_string()) || adapted.contains(&yaml_path(out)),
        "the example's sink was not redirected:\n{adapted}"
    );
    adapted
}

#[test]
fn sql_examples_give_the_rows_of_their_yaml_twins() {
    let examples = workspace_root().join("examples");
    for (sql, name) in [
        ("nexmark/q0", "q0-passthrough"),
        ("nexmark/q1", "q1-currency"),
        ("nexmark/q2", "q2-filter"),
        ("sql/q5-hot-items", "q5-hot-items"),
    ] {
        let dir = tempdir();
        let sql_text =
            std::fs::read_to_string(examples.join(format!("{sql}.sql"))).expect("the SQL example");
        let yaml_text = std::fs::read_to_string(examples.join(format!("{name}.yaml")))
            .expect("the YAML example");
        let (from_sql, from_yaml) = (dir.path().join("sql"), dir.path().join("yaml"));
        let sql_job = write_job(dir.path(), "job.sql", &adapt(&sql_text, true, &from_sql));
        let yaml_job = write_job(
            dir.path(),
            "job.yaml",
            &adapt(&yaml_text, false, &from_yaml),
        );
        let workers = if name == "q5-hot-items" { "2" } else { "1" };
        let a = run_sluice(
            &["run", sql_job.to_str().unwrap(), "--workers", workers],
            dir.path(),
        );
        a.assert_success().assert_no_panic();
        let b = run_sluice(&["run", yaml_job.to_str().unwrap()], dir.path());
        b.assert_success();
        let (got, want) = (read_jsonl_dir(&from_sql), read_jsonl_dir(&from_yaml));
        assert!(!want.is_empty(), "{name}: the YAML twin wrote nothing");
        assert_same_rows(name, &got, &want);
    }
}

#[test]
fn a_mistake_in_sql_is_a_usage_error_at_its_line_and_column() {
    let dir = tempdir();
    let table = "CREATE TABLE bid WITH ('connector' = 'nexmark', 'events' = '100');\n\
                 CREATE TABLE out WITH ('connector' = 'blackhole');\n";
    // Found by the SQL front end.
    write_job(
        dir.path(),
        "join.sql",
        &format!("{table}INSERT INTO out SELECT * FROM bid JOIN bid b ON true;\n"),
    );
    let outcome = run_sluice(&["run", "join.sql"], dir.path());
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains("join.sql:3:")
        .assert_stderr_contains("a join needs an equality between a column of each side");
    // Found when DataFusion compiles the expression, still at its place in the file.
    write_job(
        dir.path(),
        "column.sql",
        &format!("{table}INSERT INTO out\nSELECT auction, pricee FROM bid;\n"),
    );
    let outcome = run_sluice(&["run", "column.sql"], dir.path());
    outcome
        .assert_code(2)
        .assert_no_panic()
        .assert_stderr_contains("column.sql:4:")
        .assert_stderr_contains("pricee");
}

#[test]
fn explain_shows_the_tasks_partitioning_and_state_of_a_sql_job() {
    let dir = tempdir();
    let example = workspace_root().join("examples/sql/q5-hot-items.sql");
    let outcome = run_sluice(&["explain", example.to_str().unwrap()], dir.path());
    outcome.assert_success().assert_no_panic();
    let out = &outcome.stdout;
    for expected in [
        "job q5-hot-items:",
        "(2 subtasks)",
        "source: nexmark bid, 1000000 events",
        "input: hash on [auction] from task 0",
        "window: sliding 10000 ms every 2000 ms: COUNT(*) AS bids",
        "keyed state: an accumulator per [auction] and open window",
        "emits: auction Int64, window_start Timestamp(ms), window_end Timestamp(ms), bids Int64",
    ] {
        assert!(out.contains(expected), "`{expected}` missing from\n{out}");
    }
}

#[test]
fn a_sql_job_submitted_to_a_cluster_runs_with_remote_state_and_checkpoints() {
    let dir = tempdir();
    let examples = workspace_root().join("examples");
    let sql_text = std::fs::read_to_string(examples.join("sql/q5-hot-items.sql")).unwrap();
    let yaml_text = std::fs::read_to_string(examples.join("q5-hot-items.yaml")).unwrap();
    let (from_sql, from_yaml) = (dir.path().join("sql"), dir.path().join("yaml"));
    let sql_text = format!(
        "SET 'state.backend' = 'remote';\nSET 'execution.checkpointing.interval' = '1s';\n{}",
        adapt(&sql_text, true, &from_sql)
    );
    let sql_job = write_job(dir.path(), "q5.sql", &sql_text);
    let yaml_job = write_job(dir.path(), "q5.yaml", &adapt(&yaml_text, false, &from_yaml));
    let cluster = MiniCluster::start(dir.path(), 2, |_| Vec::new(), &[]);
    let id = cluster.submit(dir.path(), &sql_job, 2);
    let status = cluster.wait_finished(&id);
    assert_eq!(status["name"], "q5-hot-items", "{status}");
    run_sluice(&["run", yaml_job.to_str().unwrap()], dir.path()).assert_success();
    assert_same_rows(
        "q5 via the coordinator",
        &read_jsonl_dir(&from_sql),
        &read_jsonl_dir(&from_yaml),
    );
}

const SHELL_SOURCE: &str = "CREATE TABLE bid WITH ('connector' = 'nexmark', 'stream' = 'bid', \
                            'events' = '3000', 'seed' = '7');";
const SHELL_QUERY: &str = "SELECT auction, bidder, price FROM bid WHERE price > 5000";

/// `SHELL_QUERY` over `SHELL_SOURCE` into a JSON-lines file sink at `out`.
fn shell_job(out: &Path) -> String {
    format!(
        "{SHELL_SOURCE}\nCREATE TABLE out WITH ('connector' = 'file', 'path' = '{}', \
         'format' = 'jsonl');\nINSERT INTO out\n{SHELL_QUERY};\n",
        out.display()
    )
}

/// The rows of the shell query, run as a job file: the shell's reference.
fn shell_reference(dir: &Path) -> Vec<sluice_integration_tests::Row> {
    let out = dir.join("reference");
    write_job(dir, "reference.sql", &shell_job(&out));
    run_sluice(&["run", "reference.sql"], dir).assert_success();
    let rows = read_jsonl_dir(&out);
    assert!(!rows.is_empty(), "the reference query wrote nothing");
    rows
}

/// `sluice sql` fed from a pipe, as a script feeds it: the session keeps its tables,
/// answers SHOW TABLES, DESCRIBE and EXPLAIN, a SELECT prints the rows the same query
/// writes as a job file, a mistake points into the statement typed (not the session's
/// hidden text) without ending the session, and the exit code says one failed.
#[test]
fn the_sql_shell_keeps_a_session_and_runs_its_queries_here() {
    let dir = tempdir();
    let expected = shell_reference(dir.path());
    let out = dir.path().join("inserted");
    let script = format!(
        "{SHELL_SOURCE}\nSHOW TABLES;\nDESCRIBE bid;\n{SHELL_QUERY};\n\
         SELECT auction, pricee\n  FROM bid;\nEXPLAIN {SHELL_QUERY};\n{}QUIT;\nSELECT 1;\n",
        shell_job(&out).replacen(SHELL_SOURCE, "", 1)
    );
    let outcome = run_sluice_input(&["sql"], dir.path(), &[], Some(&script));
    outcome
        .assert_code(1)
        .assert_no_panic()
        .assert_stderr_contains("error at line 1, column 17: ")
        .assert_stderr_contains("pricee")
        .assert_stderr_contains("1 statement(s) failed");
    let stdout = &outcome.stdout;
    for expected in [
        "table `bid` created",
        "bid\ttable\tnexmark",
        "auction\tInt64",
        "date_time\tTimestamp(ms)",
        "source: nexmark bid",
        "filter: WHERE price > 5000",
        "table `out` created",
        "3000 records in",
    ] {
        assert!(
            stdout.contains(expected),
            "`{expected}` missing from\n{stdout}"
        );
    }
    let printed: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    let printed = parse_jsonl(&printed.join("\n"), "the shell's SELECT");
    assert_same_rows("the shell's SELECT", &printed, &expected);
    assert_same_rows("the shell's INSERT", &read_jsonl_dir(&out), &expected);
}

/// With its output on a terminal (a pseudo-terminal from util-linux `script`), an
/// updating SELECT in the shell is a table redrawn in place: the last table drawn holds the final rows of the
/// same query run as a job file (its changelog folded), and no raw change is printed.
#[test]
fn the_sql_shell_redraws_an_updating_result_in_place_on_a_terminal() {
    let dir = tempdir();
    let source = "CREATE TABLE bid WITH ('connector' = 'nexmark', 'stream' = 'bid', \
                  'events' = '4000', 'seed' = '7', 'max_events_per_second' = '4000');";
    let view = "CREATE VIEW b AS SELECT auction % 5 AS bucket, price FROM bid;";
    let query = "SELECT bucket, count(*) AS n, max(price) AS top FROM b GROUP BY bucket";
    let out = dir.path().join("reference");
    write_job(
        dir.path(),
        "reference.sql",
        &format!(
            "{source}\n{view}\nCREATE TABLE out WITH ('connector' = 'file', 'path' = '{}', \
             'format' = 'jsonl');\nINSERT INTO out {query};\n",
            out.display()
        ),
    );
    run_sluice(&["run", "reference.sql"], dir.path()).assert_success();
    let cell = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let mut expected: Vec<String> = fold_changelog(&read_jsonl_dir(&out))
        .iter()
        .map(|r| {
            format!(
                "{}|{}|{}",
                cell(&r["bucket"]),
                cell(&r["n"]),
                cell(&r["top"])
            )
        })
        .collect();
    expected.sort();
    assert_eq!(expected.len(), 5, "{expected:?}");

    // Statements from a file and the output on the terminal, as `sluice sql < q.sql`
    // typed in one (typed-ahead input to line editing is the terminal's business).
    write_job(
        dir.path(),
        "statements.sql",
        &format!("{source}\n{view}\n{query};\nQUIT;\n"),
    );
    let shell = format!(
        "stty rows 40 cols 120; exec '{}' sql < statements.sql",
        sluice_bin().display()
    );
    let outcome = run_program_input(
        std::path::Path::new("script"),
        "script",
        &["-q", "-e", "-c", &shell, "/dev/null"],
        dir.path(),
        &[],
        None,
    );
    outcome.assert_success().assert_no_panic();
    let screen = outcome.stdout.replace('\r', "");
    assert!(
        !screen.contains("\"op\""),
        "a raw change was printed:\n{screen}"
    );
    // Each redraw moves up over the table before and clears below it.
    let last = screen
        .rsplit_once("F\x1b[J")
        .unwrap_or_else(|| panic!("the table was never redrawn:\n{screen}"))
        .1;
    let mut lines = last.lines();
    assert_eq!(
        lines
            .next()
            .map(str::split_whitespace)
            .map(Iterator::collect::<Vec<_>>),
        Some(vec!["bucket", "|", "n", "|", "top"]),
        "{last}"
    );
    let mut shown: Vec<String> = lines
        .skip(1)
        .take_while(|l| !l.starts_with('('))
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>().join("|"))
        .collect();
    shown.sort();
    assert_eq!(shown, expected, "the last table drawn:\n{last}");
    assert!(last.contains("(5 rows, "), "{last}");
}

/// With `--coordinator`, the shell's INSERT is a job on the cluster (`POST /v1/sql`),
/// whose output equals the job file's; a SELECT there is refused (its rows would print
/// on a worker), and a bad statement posted straight to `/v1/sql` is refused at its line
/// and column.
#[test]
fn the_sql_shell_submits_inserts_to_a_coordinator() {
    let dir = tempdir();
    let expected = shell_reference(dir.path());
    let cluster = MiniCluster::start(dir.path(), 1, |_| Vec::new(), &[]);
    let out = dir.path().join("submitted");
    let script = format!(
        "{SHELL_SOURCE}\n{SHELL_QUERY};\n{}",
        shell_job(&out).replacen(SHELL_SOURCE, "", 1)
    );
    let outcome = run_sluice_input(
        &["sql", "--coordinator", &cluster.url()],
        dir.path(),
        &[],
        Some(&script),
    );
    outcome
        .assert_code(1)
        .assert_no_panic()
        .assert_stderr_contains("a SELECT shows its rows only when run here");
    let id = outcome
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("submitted job "))
        .unwrap_or_else(|| panic!("no job submitted:\n{}", outcome.stdout))
        .trim()
        .to_owned();
    let status = cluster.wait_finished(&id);
    assert_eq!(status["state"], "finished", "{status}");
    assert_same_rows(
        "the shell's INSERT on a cluster",
        &read_jsonl_dir(&out),
        &expected,
    );
    let (code, body) = http_request(
        &cluster.http,
        "POST",
        "/v1/sql",
        Some(&serde_json::json!({ "sql": format!("{SHELL_SOURCE}\nINSERT INTO nowhere\nSELECT 1;") }).to_string()),
    );
    assert_eq!(code, 400, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("query.sql:2:"), "{body}");
}

/// The shell on a terminal, as a user meets it: Python's `pty` plays the terminal (a
/// real pseudo-terminal, so rustyline edits lines and the kernel turns Ctrl-C into
/// SIGINT). An endless query prints rows until Ctrl-C cancels it; the session (its
/// table) is still there afterwards, QUIT ends the shell with success, and the history
/// is kept under `$HOME`.
#[test]
fn on_a_terminal_ctrl_c_cancels_the_query_and_keeps_the_session() {
    const DRIVER: &str = r#"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], ["sluice", "sql"])
def read(seconds, until=None):
    out, end = b"", time.time() + seconds
    while time.time() < end and not (until and until in out):
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                out += os.read(fd, 1 << 16)
            except OSError:
                break
    return out.decode(errors="replace")
print("BANNER", "Sluice SQL shell" in read(20, b"sluice> "))
os.write(fd, b"CREATE TABLE bid WITH ('connector' = 'nexmark', 'stream' = 'bid');\r")
print("CREATED", "table `bid` created" in read(20, b"created"))
os.write(fd, b"SELECT auction FROM bid;\r")
print("ROWS", read(4).count('"auction"') > 0)
os.write(fd, b"\x03")
read(10, b"query cancelled")
os.write(fd, b"SHOW TABLES;\r")
print("SESSION", "bid\ttable\tnexmark" in read(20, b"nexmark"))
os.write(fd, b"QUIT;\r")
read(10)
_, status = os.waitpid(pid, 0)
print("EXIT", os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1)
"#;
    let dir = tempdir();
    let out = std::process::Command::new("timeout")
        .args(["120", "python3", "-c", DRIVER])
        .arg(sluice_integration_tests::sluice_bin())
        .env("HOME", dir.path())
        .current_dir(dir.path())
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "BANNER True",
        "CREATED True",
        "ROWS True",
        "SESSION True",
        "EXIT 0",
    ] {
        assert!(
            stdout.contains(expected),
            "`{expected}` missing:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        dir.path().join(".cache/sluice/sql_history").exists(),
        "the history is kept"
    );
}
