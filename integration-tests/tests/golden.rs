//! Golden tests: every example job in `examples/`, run on 200 000 Nexmark bids, against
//! results computed here in plain Rust from the same bids.
//!
//! The bids come from `sluice nexmark gen --format csv` and are parsed by the harness
//! without any sluice crate. Each example runs twice: reading that CSV through a `file`
//! source, and unchanged except for the event count and seed of its `nexmark` source
//! (which must produce the very same events). Both runs must give the expected rows.
//!
//! The examples keep `parallelism: 2` and their watermark (4 s out-of-orderness, twice
//! the generator's 2 s bound), so no record is late and every window is complete.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use sluice_integration_tests::service::{file_store, start_state_node};
use sluice_integration_tests::{
    Bid, Row, Shared, assert_same_rows, read_bids_csv, read_jsonl_dir, row, run_sluice, tempdir,
    write_job, yaml_path,
};
use sluice_test_support::s3::s3_env;

const EVENTS: usize = 200_000;
const SEED: u64 = 7;
/// The source line every example starts from (checked, so a changed example is noticed).
const EXAMPLE_SOURCE: &str =
    "nexmark: { stream: bid, events: 1000000, seed: 42, max_out_of_orderness: 2s }";
const NEXMARK_SOURCE: &str =
    "nexmark: { stream: bid, events: 200000, seed: 7, max_out_of_orderness: 2s }";
const WATERMARK: &str = "watermark: { column: date_time, max_out_of_orderness: 4s }";

/// The generated bids, shared by the tests running at the same time.
struct Fixture {
    _dir: tempfile::TempDir,
    csv_dir: PathBuf,
    bids: Vec<Bid>,
}

static FIXTURE: Shared<Fixture> = Shared::new();

fn fixture() -> Arc<Fixture> {
    FIXTURE.get_or_init(|| {
        let dir = tempdir();
        let csv_dir = dir.path().join("bids");
        run_sluice(
            &[
                "nexmark",
                "gen",
                "--stream",
                "bid",
                "--events",
                &EVENTS.to_string(),
                "--seed",
                &SEED.to_string(),
                "--max-out-of-orderness",
                "2s",
                "--format",
                "csv",
                "--files",
                "2",
                "--out",
                csv_dir.to_str().expect("UTF-8 path"),
            ],
            dir.path(),
        )
        .assert_success()
        .assert_stderr_contains(&format!("wrote {EVENTS} events"));
        let bids = read_bids_csv(&csv_dir);
        assert_eq!(bids.len(), EVENTS, "bids in {}", csv_dir.display());
        Fixture {
            _dir: dir,
            csv_dir,
            bids,
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    /// The generated CSV through a `file` source.
    Csv,
    /// The example's own `nexmark` source with this test's count and seed.
    Nexmark,
    /// The generated CSV (two files covering the same event time) read by one subtask:
    /// both files must advance together, or one would be late behind the other.
    CsvOneReader,
    /// The generated CSV, with window state in the state service (`state: { backend:
    /// remote }`): the embedded node `sluice run` starts, reached over gRPC.
    CsvRemoteState,
    /// The generated CSV with a 1 KiB cache of decoded window state and checkpoints every
    /// 100 ms, on `backend`: windows spill to the backend every batch and are read back
    /// when they fire.
    CsvTinyCache(&'static str),
}

/// The example `name`, with its source replaced per `input` and its sink writing JSON
/// lines to `out`.
fn adapt_example(name: &str, input: Input, csv_dir: &Path, out: &Path) -> String {
    let path = sluice_integration_tests::workspace_root()
        .join("examples")
        .join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading example {}: {e}", path.display()));
    for needed in ["parallelism: 2", WATERMARK] {
        assert!(
            text.lines().any(|l| l.trim() == needed),
            "example {name} no longer has `{needed}`; the expected results assume it"
        );
    }
    let source = match input {
        Input::Csv | Input::CsvOneReader | Input::CsvRemoteState | Input::CsvTinyCache(_) => {
            format!("file: {{ path: {}, format: csv }}", yaml_path(csv_dir))
        }
        Input::Nexmark => NEXMARK_SOURCE.to_owned(),
    };
    let sink = format!("file: {{ path: {}, format: jsonl }}", yaml_path(out));
    let (mut sources, mut sinks) = (0, 0);
    let mut adapted = String::new();
    for line in text.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let trimmed = line.trim();
        if trimmed.starts_with("nexmark:") {
            assert_eq!(
                trimmed, EXAMPLE_SOURCE,
                "example {name} changed its source; update this test"
            );
            sources += 1;
            adapted.push_str(&format!("{indent}{source}\n"));
        } else if trimmed == "parallelism: 2" && input == Input::CsvOneReader {
            adapted.push_str("parallelism: 1\n");
        } else if trimmed == "parallelism: 2" && input == Input::CsvRemoteState {
            adapted.push_str("parallelism: 2\nstate: { backend: remote, shards: 3 }\n");
        } else if let (true, Input::CsvTinyCache(backend)) = (trimmed == "parallelism: 2", input) {
            adapted.push_str(&format!(
                "parallelism: 2\nstate: {{ backend: {backend}, cache: 1KiB }}\n\
                 checkpoint: {{ interval: 100ms }}\n"
            ));
        } else if trimmed.starts_with("file:") && trimmed.contains("path: out/") {
            sinks += 1;
            adapted.push_str(&format!("{indent}{sink}\n"));
        } else {
            adapted.push_str(line);
            adapted.push('\n');
        }
    }
    assert_eq!(
        (sources, sinks),
        (1, 1),
        "example {name}: expected one nexmark source line and one `file: {{ path: out/... }}` \
         sink line"
    );
    adapted
}

/// Runs example `name` on `input` and checks its rows against `expected(bids)`.
fn check_example(name: &str, input: Input, expected: fn(&[Bid]) -> Vec<Row>) {
    check_example_with(name, input, expected, &[]);
}

/// [`check_example`] with extra arguments to `sluice run`.
fn check_example_with(
    name: &str,
    input: Input,
    expected: fn(&[Bid]) -> Vec<Row>,
    extra_args: &[&str],
) {
    let fx = fixture();
    let dir = tempdir();
    let out = dir.path().join("out");
    let yaml = adapt_example(name, input, &fx.csv_dir, &out);
    let job = write_job(dir.path(), &format!("{name}.yaml"), &yaml);
    let mut args = vec!["run", job.to_str().expect("UTF-8 path")];
    args.extend_from_slice(extra_args);
    let outcome = run_sluice(&args, dir.path());
    outcome.assert_success().assert_no_panic();
    let summary = outcome.summary();
    assert_eq!(
        summary.records_in, EVENTS as u64,
        "records in: {}",
        outcome.stderr
    );
    assert_eq!(
        summary.late, 0,
        "no record should be late: {}",
        outcome.stderr
    );
    let expected = expected(&fx.bids);
    assert!(!expected.is_empty(), "{name}: the expected result is empty");
    let actual = read_jsonl_dir(&out);
    assert_eq!(
        summary.records_out,
        actual.len() as u64,
        "the summary's record count should match the output files"
    );
    assert_same_rows(&format!("{name} on {input:?}"), &actual, &expected);
}

const SECOND: i64 = 1000;

fn window_row(key: Option<(&str, i64)>, start: i64, end: i64) -> Row {
    let mut r = Row::new();
    if let Some((column, value)) = key {
        r.insert(column.to_owned(), value.into());
    }
    r.insert("window_start".into(), start.into());
    r.insert("window_end".into(), end.into());
    r
}

fn q0_expected(bids: &[Bid]) -> Vec<Row> {
    bids.iter().map(Bid::to_row).collect()
}

fn q1_expected(bids: &[Bid]) -> Vec<Row> {
    bids.iter()
        .map(|b| {
            row([
                ("auction", b.auction.into()),
                ("bidder", b.bidder.into()),
                ("price_eur", (b.price as f64 * 0.908).into()),
                ("channel", b.channel.clone().into()),
                ("url", b.url.clone().into()),
                ("date_time", b.date_time.into()),
                ("extra", b.extra.clone().into()),
            ])
        })
        .collect()
}

fn q2_expected(bids: &[Bid]) -> Vec<Row> {
    bids.iter()
        .filter(|b| b.auction % 123 == 0)
        .map(|b| row([("auction", b.auction.into()), ("price", b.price.into())]))
        .collect()
}

fn q5_expected(bids: &[Bid]) -> Vec<Row> {
    let (size, slide) = (10 * SECOND, 2 * SECOND);
    let mut counts: HashMap<(i64, i64), i64> = HashMap::new();
    for b in bids {
        let mut start = b.date_time - b.date_time.rem_euclid(slide);
        while start > b.date_time - size {
            *counts.entry((b.auction, start)).or_default() += 1;
            start -= slide;
        }
    }
    counts
        .into_iter()
        .map(|((auction, start), n)| {
            let mut r = window_row(Some(("auction", auction)), start, start + size);
            r.insert("bids".into(), n.into());
            r
        })
        .collect()
}

fn q7_expected(bids: &[Bid]) -> Vec<Row> {
    let size = 10 * SECOND;
    let mut windows: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for b in bids {
        let start = b.date_time - b.date_time.rem_euclid(size);
        let w = windows.entry(start).or_insert((i64::MIN, 0));
        w.0 = w.0.max(b.price);
        w.1 += 1;
    }
    windows
        .into_iter()
        .map(|(start, (top, n))| {
            let mut r = window_row(None, start, start + size);
            r.insert("top_price".into(), top.into());
            r.insert("bids".into(), n.into());
            r
        })
        .collect()
}

fn q11_expected(bids: &[Bid]) -> Vec<Row> {
    let gap = 10 * SECOND;
    let mut by_bidder: HashMap<i64, Vec<i64>> = HashMap::new();
    for b in bids {
        by_bidder.entry(b.bidder).or_default().push(b.date_time);
    }
    let mut rows = Vec::new();
    for (bidder, mut times) in by_bidder {
        times.sort_unstable();
        let mut session: Vec<i64> = Vec::new();
        let mut emit = |session: &[i64]| {
            let (first, last) = (session[0], session[session.len() - 1]);
            let mut r = window_row(Some(("bidder", bidder)), first, last + gap);
            r.insert("bids".into(), Value::from(session.len()));
            r.insert("first_bid".into(), first.into());
            r.insert("last_bid".into(), last.into());
            rows.push(r);
        };
        for t in times {
            if let Some(&last) = session.last()
                && t - last > gap
            {
                emit(&session);
                session.clear();
            }
            session.push(t);
        }
        emit(&session);
    }
    rows
}

#[test]
fn q0_passthrough_csv() {
    check_example("q0-passthrough", Input::Csv, q0_expected);
}

#[test]
fn q0_passthrough_nexmark() {
    check_example("q0-passthrough", Input::Nexmark, q0_expected);
}

#[test]
fn q1_currency_csv() {
    check_example("q1-currency", Input::Csv, q1_expected);
}

#[test]
fn q1_currency_nexmark() {
    check_example("q1-currency", Input::Nexmark, q1_expected);
}

#[test]
fn q2_filter_csv() {
    check_example("q2-filter", Input::Csv, q2_expected);
}

#[test]
fn q2_filter_nexmark() {
    check_example("q2-filter", Input::Nexmark, q2_expected);
}

#[test]
fn q5_hot_items_csv() {
    check_example("q5-hot-items", Input::Csv, q5_expected);
}

#[test]
fn q5_hot_items_nexmark() {
    check_example("q5-hot-items", Input::Nexmark, q5_expected);
}

#[test]
fn q7_highest_bid_csv() {
    check_example("q7-highest-bid", Input::Csv, q7_expected);
}

#[test]
fn q7_highest_bid_nexmark() {
    check_example("q7-highest-bid", Input::Nexmark, q7_expected);
}

#[test]
fn q11_user_sessions_csv() {
    check_example("q11-user-sessions", Input::Csv, q11_expected);
}

#[test]
fn q11_user_sessions_nexmark() {
    check_example("q11-user-sessions", Input::Nexmark, q11_expected);
}

/// The expected-side computations themselves, on a handful of bids worked out by hand.
#[test]
fn expected_side_windows_by_hand() {
    let t0 = 1_436_918_400_000; // 2015-07-15T00:00:00, a multiple of 10 s
    let bid = |auction, bidder, price, offset_ms: i64| Bid {
        auction,
        bidder,
        price,
        channel: "c".into(),
        url: "u".into(),
        date_time: t0 + offset_ms,
        extra: String::new(),
    };
    let bids = [
        bid(1, 7, 5, 0),
        bid(1, 7, 9, 9_999),
        bid(2, 7, 3, 19_999), // gap of exactly 10 s: same session (as in Flink)
        bid(1, 8, 4, 10_000),
    ];
    let q7 = q7_expected(&bids);
    let mut w0 = window_row(None, t0, t0 + 10_000);
    w0.insert("top_price".into(), 9.into());
    w0.insert("bids".into(), 2.into());
    let mut w1 = window_row(None, t0 + 10_000, t0 + 20_000);
    w1.insert("top_price".into(), 4.into());
    w1.insert("bids".into(), 2.into());
    assert_same_rows("q7 by hand", &q7, &[w0, w1]);
    // Auction 1 at 0 s, 9.999 s, 10 s: windows starting -8, -6, ..., 10 s.
    let q5 = q5_expected(&bids);
    let count = |auction: i64, start_s: i64| {
        q5.iter()
            .find(|r| r["auction"] == auction && r["window_start"] == t0 + start_s * 1000)
            .map(|r| r["bids"].as_i64().unwrap())
    };
    assert_eq!(count(1, -8), Some(1));
    assert_eq!(count(1, 0), Some(2));
    assert_eq!(count(1, 2), Some(2));
    assert_eq!(count(1, 8), Some(2));
    assert_eq!(count(1, 10), Some(1));
    assert_eq!(count(1, 12), None);
    assert_eq!(q5.iter().filter(|r| r["auction"] == 1).count(), 10);
    let q11 = q11_expected(&bids);
    let sessions: Vec<(i64, i64, i64)> = {
        let mut s: Vec<_> = q11
            .iter()
            .map(|r| {
                (
                    r["bidder"].as_i64().unwrap(),
                    r["window_start"].as_i64().unwrap() - t0,
                    r["bids"].as_i64().unwrap(),
                )
            })
            .collect();
        s.sort_unstable();
        s
    };
    assert_eq!(sessions, vec![(7, 0, 3), (8, 10_000, 1)]);
}

#[test]
fn q5_hot_items_csv_one_reader_of_two_files() {
    check_example("q5-hot-items", Input::CsvOneReader, q5_expected);
}

#[test]
fn q11_user_sessions_csv_one_reader_of_two_files() {
    check_example("q11-user-sessions", Input::CsvOneReader, q11_expected);
}

#[test]
fn q5_hot_items_csv_remote_state() {
    check_example("q5-hot-items", Input::CsvRemoteState, q5_expected);
}

#[test]
fn q5_hot_items_csv_tiny_cache_memory() {
    check_example("q5-hot-items", Input::CsvTinyCache("memory"), q5_expected);
}

#[test]
fn q5_hot_items_csv_tiny_cache_remote_state() {
    check_example("q5-hot-items", Input::CsvTinyCache("remote"), q5_expected);
}

#[test]
fn q7_highest_bid_csv_tiny_cache_remote_state() {
    check_example("q7-highest-bid", Input::CsvTinyCache("remote"), q7_expected);
}

#[test]
fn q7_highest_bid_csv_remote_state() {
    check_example("q7-highest-bid", Input::CsvRemoteState, q7_expected);
}

#[test]
fn q11_user_sessions_csv_remote_state() {
    check_example("q11-user-sessions", Input::CsvRemoteState, q11_expected);
}

/// The state service as its own process, durable in the S3 server of the test services.
#[test]
fn q5_hot_items_csv_remote_state_on_s3() {
    let Some(s3) = s3_env("golden-q5", "Remote state on S3") else {
        return;
    };
    let (endpoint, store) = (s3.endpoint.clone(), s3.url());
    let dir = tempdir();
    let node = start_state_node(
        dir.path(),
        "node",
        &store,
        &[
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
        ],
    );
    let url = node.url();
    check_example_with(
        "q5-hot-items",
        Input::CsvRemoteState,
        q5_expected,
        &["--state-service", &url],
    );
}

/// Two runs of the same job against one long-lived state-service node: the second
/// starts from empty state under a fresh job id and gives the same output, instead of
/// carrying on with the first run's windows and watermark (which made every record of
/// the second run late). Checkpoints and a tiny cache put the state in the node.
#[test]
fn a_second_run_against_the_same_state_service_starts_afresh() {
    let dir = tempdir();
    let node = start_state_node(dir.path(), "node", &file_store(dir.path()), &[]);
    let url = node.url();
    for _ in 0..2 {
        check_example_with(
            "q5-hot-items",
            Input::CsvTinyCache("remote"),
            q5_expected,
            &["--state-service", &url],
        );
    }
}

/// Remote state with the job spread over two worker processes: both reach the embedded
/// state service the driver starts.
#[test]
fn q5_hot_items_csv_remote_state_two_workers() {
    check_example_with(
        "q5-hot-items",
        Input::CsvRemoteState,
        q5_expected,
        &["--workers", "2"],
    );
}
