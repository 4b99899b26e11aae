//! Late data: a hand-written CSV with records far out of order through a keyed tumbling
//! window, with late records sent to a side output, without and with allowed lateness.
//!
//! The job reads `golden/late_data.csv` (auction, price, date_time) with `batch_size: 1`
//! and parallelism 1, so a watermark follows every record: the largest event time seen so
//! far minus the 1 s out-of-orderness minus 1 ms. The expected output is computed here by
//! simulating that rule (Flink's semantics):
//!
//! - a record is late when `window_end - 1 + allowed_lateness <= watermark` on arrival;
//!   it goes to the `late` sink and is counted in the summary's "N late";
//! - a window fires once, when the watermark reaches `window_end - 1`;
//! - a record that is not late but whose window end has passed (`window_end - 1 <=
//!   watermark`) updates the window and re-emits its result at once (also when the
//!   window had no record yet: it is then emitted once, not again by a later watermark).
//!
//! The late counts are also asserted as numbers worked out by hand from the file.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;
use sluice_integration_tests::{
    Row, assert_same_rows, parse_timestamp_ms, read_jsonl_dir, row, run_sluice, tempdir, write_job,
    yaml_path,
};

const SIZE: i64 = 10_000;
const OUT_OF_ORDERNESS: i64 = 1_000;

#[derive(Debug, Clone, Copy)]
struct Record {
    auction: i64,
    price: i64,
    time: i64,
}

fn input_path() -> PathBuf {
    sluice_integration_tests::crate_dir().join("golden/late_data.csv")
}

/// The input file's text without the given (1-based) lines.
fn input_without(drop_lines: &[usize]) -> String {
    let text = std::fs::read_to_string(input_path()).expect("reading golden/late_data.csv");
    let mut kept = String::new();
    for (i, line) in text.lines().enumerate() {
        if !drop_lines.contains(&(i + 1)) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

fn parse_input(text: &str) -> Vec<Record> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("auction,price,date_time"));
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            Record {
                auction: f[0].parse().expect("auction"),
                price: f[1].parse().expect("price"),
                time: parse_timestamp_ms(f[2]).expect("date_time"),
            }
        })
        .collect()
}

#[derive(Debug, Default)]
struct Window {
    count: i64,
    sum: i64,
    fired: bool,
}

/// One window result, in emission order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Emitted {
    auction: i64,
    start: i64,
    count: i64,
    sum: i64,
}

impl Emitted {
    fn to_row(self) -> Row {
        row([
            ("auction", self.auction.into()),
            ("window_start", self.start.into()),
            ("window_end", (self.start + SIZE).into()),
            ("bids", self.count.into()),
            ("total", self.sum.into()),
        ])
    }
}

/// The window results and the late records of `records` arriving in this order.
fn simulate(records: &[Record], lateness: i64) -> (Vec<Emitted>, Vec<Record>) {
    let mut watermark = i64::MIN;
    let mut max_time = i64::MIN;
    let mut windows: BTreeMap<(i64, i64), Window> = BTreeMap::new();
    let mut emitted = Vec::new();
    let mut late = Vec::new();
    let emit = |(start, auction): (i64, i64), w: &Window| Emitted {
        auction,
        start,
        count: w.count,
        sum: w.sum,
    };
    for r in records {
        let start = r.time - r.time.rem_euclid(SIZE);
        let end = start + SIZE;
        if end - 1 + lateness <= watermark {
            late.push(*r);
        } else {
            let w = windows.entry((start, r.auction)).or_default();
            w.count += 1;
            w.sum += r.price;
            if end - 1 <= watermark {
                w.fired = true;
                emitted.push(emit((start, r.auction), w));
            }
        }
        max_time = max_time.max(r.time);
        let next = max_time - OUT_OF_ORDERNESS - 1;
        if next > watermark {
            watermark = next;
            for (&key, w) in windows.iter_mut() {
                if !w.fired && key.0 + SIZE - 1 <= watermark {
                    w.fired = true;
                    emitted.push(emit(key, w));
                }
            }
            windows.retain(|&(start, _), _| start + SIZE - 1 + lateness > watermark);
        }
    }
    for (&key, w) in &windows {
        if !w.fired {
            emitted.push(emit(key, w));
        }
    }
    (emitted, late)
}

/// Runs the job on the input without `drop_lines` with `allowed_lateness` and checks
/// main output, late output and summary.
fn check(allowed_lateness: &str, lateness_ms: i64, drop_lines: &[usize], hand_counted_late: usize) {
    let text = input_without(drop_lines);
    let records = parse_input(&text);
    let (emitted, late) = simulate(&records, lateness_ms);
    assert_eq!(
        late.len(),
        hand_counted_late,
        "the simulation disagrees with the late records counted by hand"
    );
    let dir = tempdir();
    let input = dir.path().join("input.csv");
    std::fs::write(&input, &text).expect("writing the input");
    let out = dir.path().join("out");
    let late_out = dir.path().join("late");
    let yaml = format!(
        r#"name: late-data
parallelism: 1
source:
  file:
    path: {input}
    format: csv
    schema: {{ auction: int64, price: int64, date_time: timestamp }}
  batch_size: 1
watermark: {{ column: date_time, max_out_of_orderness: 1s }}
pipeline:
  - key_by: [auction]
  - window: {{ tumbling: 10s, allowed_lateness: {allowed_lateness} }}
    aggregate: ["count(*) AS bids", "sum(price) AS total"]
    late: {{ sink: {{ file: {{ path: {late}, format: jsonl }} }} }}
sink:
  file: {{ path: {out}, format: jsonl }}
"#,
        input = yaml_path(&input),
        late = yaml_path(&late_out),
        out = yaml_path(&out),
    );
    let job = write_job(dir.path(), "late.yaml", &yaml);
    let outcome = run_sluice(&["run", job.to_str().expect("UTF-8 path")], dir.path());
    outcome.assert_success().assert_no_panic();
    let summary = outcome.summary();
    assert_eq!(summary.records_in, records.len() as u64);
    assert_eq!(
        summary.late,
        late.len() as u64,
        "late count in the summary: {}",
        outcome.stderr
    );
    outcome.assert_stderr_contains(&format!(", {} late,", late.len()));

    let actual = read_jsonl_dir(&out);
    let expected: Vec<Row> = emitted.iter().map(|e| e.to_row()).collect();
    let what = format!("window results with allowed_lateness {allowed_lateness}");
    assert_same_rows(&what, &actual, &expected);
    // With one subtask the file holds results in emission order: each window's successive
    // results must come in the simulated order (first result, then each update).
    let per_window = |rows: &[Row]| -> BTreeMap<(i64, i64), Vec<(i64, i64)>> {
        let mut map: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for r in rows {
            let int = |k: &str| match &r[k] {
                Value::String(s) => parse_timestamp_ms(s).expect("timestamp"),
                v => v.as_i64().expect("integer"),
            };
            map.entry((int("auction"), int("window_start")))
                .or_default()
                .push((int("bids"), int("total")));
        }
        map
    };
    assert_eq!(
        per_window(&actual),
        per_window(&expected),
        "{what}: order of each window's results"
    );

    let late_rows: Vec<Row> = late
        .iter()
        .map(|r| {
            row([
                ("auction", r.auction.into()),
                ("price", r.price.into()),
                ("date_time", r.time.into()),
            ])
        })
        .collect();
    let actual_late = if late_rows.is_empty() && !late_out.exists() {
        Vec::new()
    } else {
        read_jsonl_dir(&late_out)
    };
    assert_same_rows(
        &format!("late records with allowed_lateness {allowed_lateness}"),
        &actual_late,
        &late_rows,
    );
}

/// Lines of `golden/late_data.csv` whose record is the first of its window and arrives
/// after the window's end but within 5 s of allowed lateness (auction 3 at 8 s, auction 4
/// at 14 s, auction 7 at 39 s).
const OPENS_WINDOW_WITHIN_LATENESS: &[usize] = &[7, 13, 24];

#[test]
fn late_records_go_to_the_side_output() {
    check("0s", 0, &[], 13);
}

/// Fired windows updated by records within the allowed lateness, each update emitted at
/// once (records that open a window within lateness are left out: see the next test).
#[test]
fn allowed_lateness_updates_fired_windows() {
    check("5s", 5_000, OPENS_WINDOW_WITHIN_LATENESS, 4);
}

/// The whole file with 5 s of lateness, including records that open a window after its
/// end: such a window must be emitted once, at once.
///
/// The engine emits it at once and then again at the next watermark (its `Fire` timer
/// at `end - 1` is registered although the window is already past its end), so the
/// output holds each of those three results twice.
#[test]
fn window_opened_within_lateness_is_emitted_once() {
    check("5s", 5_000, &[], 4);
}

/// The simulation on a few records, worked out by hand.
#[test]
fn simulation_by_hand() {
    let all = parse_input(&input_without(&[]));
    assert_eq!(all.len(), 31);
    for line in OPENS_WINDOW_WITHIN_LATENESS {
        let r = all[line - 2];
        assert!([3, 4, 7].contains(&r.auction), "line {line}: {r:?}");
    }
    let t0 = 1_436_918_400_000;
    let r = |auction, price, s: f64| Record {
        auction,
        price,
        time: t0 + (s * 1000.0) as i64,
    };
    // 11.2 s moves the watermark to 10.199 s, firing [0, 10); 4 s is then late without
    // lateness and an update with it.
    let records = [r(1, 10, 0.5), r(1, 7, 11.2), r(1, 100, 4.0)];
    let first = Emitted {
        auction: 1,
        start: t0,
        count: 1,
        sum: 10,
    };
    let second = Emitted {
        auction: 1,
        start: t0 + SIZE,
        count: 1,
        sum: 7,
    };
    let (emitted, late) = simulate(&records, 0);
    assert_eq!(emitted, vec![first, second]);
    assert_eq!(late.len(), 1);
    let (emitted, late) = simulate(&records, 5_000);
    let update = Emitted {
        count: 2,
        sum: 110,
        ..first
    };
    assert_eq!(emitted, vec![first, update, second]);
    assert!(late.is_empty());
}
