//! `sluice doctor JOB`: reads a running job's figures from the coordinator twice, a few
//! seconds apart, and names each pathology it finds with its evidence and the fix: the
//! back-pressure cascade (the first busy task downstream of back-pressured ones), data
//! skew on `key_by`, watermark starvation, source subtasks drifting apart in event time,
//! checkpoint alignment growing toward the timeout and, given a state node's
//! `/metrics`, state memory near its budget. A table
//! for people, `--json` for scripts; exit code 1 when something is found.
//!
//! The diagnosis ([`diagnose`]) is a pure function of the two samples, so each rule is
//! tested on figures made for it; this module must not change the job.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{Value, json};
use sluice_common::outln;

use crate::cluster::client::{call_any, table};
use crate::{Failure, runtime};

/// Arguments of `sluice doctor`.
#[derive(Args)]
pub struct DoctorArgs {
    /// The job's id.
    job: String,
    /// The coordinator's REST API.
    #[arg(
        long,
        env = "SLUICE_COORDINATOR",
        default_value = "http://127.0.0.1:8081"
    )]
    coordinator: String,
    #[command(flatten)]
    credentials: super::client::Credentials,
    /// Print the findings as JSON.
    #[arg(long)]
    json: bool,
    /// Time between the two samples (ms): rates and progress are judged over it.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(500..=600_000))]
    sample_ms: u64,
    /// A state node's metrics endpoint (`http://host:port/metrics`, its
    /// `--metrics-http`), to check its memory; may be given once per node.
    #[arg(long = "state-metrics", value_name = "URL")]
    state_metrics: Vec<String>,
}

/// One pathology found.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// Its name in the seed's matrix.
    pub pathology: &'static str,
    /// Where: a node, a task, a split, a state node.
    pub subject: String,
    /// The figures that show it.
    pub evidence: String,
    /// What to do.
    pub fix: String,
}

/// What `sluice doctor` checks, in the order it reports.
pub const CHECKED: [&str; 7] = [
    "back-pressure cascade",
    "data skew on key_by",
    "watermark starvation",
    "source drift",
    "checkpoint alignment timeout",
    "state memory growth",
    "failover",
];

/// A failure this recent (ms) is reported.
const RECENT_FAILURE_MS: u64 = 10 * 60_000;

/// Source subtasks this far apart in event time (ms) drift.
const DRIFT_MS: i64 = 60_000;

/// Status samples taken over `--sample-ms`: the first and last give rates and progress,
/// all of them the average shares of time.
const SAMPLES: u64 = 4;

/// A task is busy from this share of its time on.
const BUSY: f64 = 0.6;
/// A task is back-pressured from this share on.
const BACKPRESSURED: f64 = 0.5;

/// Runs `sluice doctor`.
pub fn run(args: DoctorArgs) -> Result<(), Failure> {
    let path = format!("/v1/jobs/{}", args.job);
    let bases = args.coordinator.as_str();
    let credentials = &args.credentials;
    let rt = runtime()?;
    let (samples, elapsed, memory) = rt.block_on(async {
        let mut samples = vec![call_any("GET", bases, &path, None, credentials).await?];
        let start = Instant::now();
        for _ in 0..SAMPLES - 1 {
            tokio::time::sleep(Duration::from_millis(args.sample_ms / (SAMPLES - 1))).await;
            samples.push(call_any("GET", bases, &path, None, credentials).await?);
        }
        let mut memory = Vec::new();
        for m in &args.state_metrics {
            memory.push((m.clone(), scrape(m).await?));
        }
        Ok::<_, Failure>((samples, start.elapsed().as_secs_f64(), memory))
    })?;
    let after = samples.last().cloned().unwrap_or_default();
    let state = after.get("state").and_then(Value::as_str).unwrap_or("?");
    if state != "running" {
        return Err(Failure::usage(format!(
            "job {} is {state}, not running: doctor reads a running job's figures",
            args.job
        )));
    }
    let mut findings = diagnose(&samples, elapsed);
    for (url, text) in &memory {
        findings.extend(state_memory(url, text));
    }
    if args.json {
        let list: Vec<Value> = findings
            .iter()
            .map(|f| {
                json!({ "pathology": f.pathology, "subject": f.subject,
                        "evidence": f.evidence, "fix": f.fix })
            })
            .collect();
        let report = json!({ "job": args.job, "findings": list, "checked": CHECKED });
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else if findings.is_empty() {
        outln!(
            "no pathology found in job {} over {elapsed:.1} s (checked: {})",
            args.job,
            CHECKED.join(", ")
        );
    } else {
        table(
            &["PATHOLOGY", "WHERE", "EVIDENCE", "FIX"],
            findings
                .iter()
                .map(|f| {
                    vec![
                        f.pathology.to_owned(),
                        f.subject.clone(),
                        f.evidence.clone(),
                        f.fix.clone(),
                    ]
                })
                .collect(),
        );
    }
    match findings.len() {
        0 => Ok(()),
        n => Err(Failure {
            code: 1,
            message: format!("{n} pathology(ies) found in job {}", args.job),
        }),
    }
}

async fn scrape(url: &str) -> Result<String, Failure> {
    let failed = |e: String| Failure::usage(format!("--state-metrics {url}: {e}"));
    let response = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| failed(e.to_string()))?
        .get(url)
        .send()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("answered {}", response.status())));
    }
    response.text().await.map_err(|e| failed(e.to_string()))
}

/// One task's figures in a sample.
#[derive(Debug, Clone)]
struct Task {
    name: String,
    node: String,
    busy: f64,
    backpressured: f64,
    idle: f64,
    records_in: u64,
    held_by: String,
    watermark: Option<i64>,
    alignment_paused: f64,
    /// The keys it sees most: `column=value` and percent of its records.
    hot_keys: Vec<(String, u64)>,
}

impl Task {
    /// Its busy share as Flink counts it: the time neither idle nor back-pressured (a
    /// sink sleeping in a slow call is busy), or what it reported, if more.
    fn busy_share(&self) -> f64 {
        self.busy.max(1.0 - self.idle - self.backpressured)
    }
}

fn tasks(sample: &Value) -> Vec<Task> {
    let ratio = |t: &Value, k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0) as f64 / 1000.0;
    sample
        .get("tasks")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    let name = t
                        .get("task")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    Task {
                        node: name.split('[').next().unwrap_or("").to_owned(),
                        busy: ratio(t, "busy_ms_per_s"),
                        backpressured: ratio(t, "backpressured_ms_per_s"),
                        idle: ratio(t, "idle_ms_per_s"),
                        records_in: t.get("records_in").and_then(Value::as_u64).unwrap_or(0),
                        held_by: t
                            .get("watermark_held_by")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        watermark: t.get("watermark").and_then(Value::as_i64),
                        alignment_paused: ratio(t, "alignment_paused_ms_per_s"),
                        hot_keys: t
                            .get("hot_keys")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .filter_map(|h| {
                                Some((
                                    h.get("key")?.as_str()?.to_owned(),
                                    h.get("share_pct")?.as_u64()?,
                                ))
                            })
                            .collect(),
                        name,
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The job's nodes that name tasks, upstream first (the status's `nodes`; else the
/// order the tasks were reported in).
fn node_order(sample: &Value, tasks: &[Task]) -> Vec<String> {
    let mut order: Vec<String> = sample
        .get("nodes")
        .and_then(Value::as_array)
        .map(|n| {
            n.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for t in tasks {
        if !order.contains(&t.node) {
            order.push(t.node.clone());
        }
    }
    order.retain(|n| tasks.iter().any(|t| &t.node == n));
    order
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// The pathologies `samples` (at least one, the first and last `elapsed` seconds apart)
/// show.
pub fn diagnose(samples: &[Value], elapsed: f64) -> Vec<Finding> {
    let (Some(before), Some(after)) = (samples.first(), samples.last()) else {
        return Vec::new();
    };
    let then = tasks(before);
    let mut now = tasks(after);
    // Shares of time averaged over the samples: one second alone is noisy (a task's
    // time moves between busy and back-pressured from one batch to the next).
    let all: Vec<Vec<Task>> = samples.iter().map(tasks).collect();
    for t in &mut now {
        let same: Vec<&Task> = all.iter().flatten().filter(|s| s.name == t.name).collect();
        let n = same.len().max(1) as f64;
        t.busy = same.iter().map(|s| s.busy).sum::<f64>() / n;
        t.backpressured = same.iter().map(|s| s.backpressured).sum::<f64>() / n;
        t.idle = same.iter().map(|s| s.idle).sum::<f64>() / n;
    }
    let mut found = Vec::new();
    found.extend(cascade(after, &now));
    found.extend(skew(after, &then, &now, elapsed));
    found.extend(starvation(before, after, &now, elapsed));
    found.extend(drift(after, &all));
    found.extend(alignment(after));
    found.extend(failover(after, now_ms()));
    found
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A failed attempt in the last minutes (a lost worker, a crash), with its cause.
fn failover(after: &Value, now_ms: u64) -> Option<Finding> {
    let last = after.get("failures")?.as_array()?.last()?;
    let at = last.get("at_ms").and_then(Value::as_u64)?;
    let ago = now_ms.saturating_sub(at);
    if ago > RECENT_FAILURE_MS {
        return None;
    }
    let field = |key: &str| after.get(key).and_then(Value::as_u64).unwrap_or(0);
    let failed = last.get("attempt").and_then(Value::as_u64).unwrap_or(0);
    let reason = last
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let dependency = last.get("unavailable").and_then(Value::as_bool) == Some(true);
    Some(Finding {
        pathology: "failover",
        subject: format!("attempt {failed}"),
        evidence: format!(
            "{:.0} s ago: {reason}; {} restarts so far, now attempt {} ({})",
            ago as f64 / 1000.0,
            field("restarts"),
            field("attempt"),
            after.get("state").and_then(Value::as_str).unwrap_or("?")
        ),
        fix: if dependency {
            "a dependency was out of reach: the job waits for it without spending restarts \
             and resumes from its last checkpoint; bring the dependency back"
                .into()
        } else {
            "the job ran again from its last checkpoint on its own (nothing lost or \
             repeated); if failures repeat, look at the failing worker's host: its log, the \
             kernel's OOM killer (`dmesg`), its network"
                .into()
        },
    })
}

/// Source subtasks far apart in event time while none is held back by alignment.
fn drift(after: &Value, all: &[Vec<Task>]) -> Option<Finding> {
    let now = all.last()?;
    let order = node_order(after, now);
    let source = order.first()?;
    let watermarks: Vec<(&str, i64)> = of(now, source)
        .filter_map(|t| Some((t.name.as_str(), t.watermark?)))
        // A finished subtask's watermark is the end of time.
        .filter(|(_, w)| *w < i64::MAX)
        .collect();
    let (slow, low) = *watermarks.iter().min_by_key(|(_, w)| *w)?;
    let (fast, high) = *watermarks.iter().max_by_key(|(_, w)| *w)?;
    let aligned = all
        .iter()
        .flatten()
        .any(|t| t.node == *source && t.alignment_paused > 0.0);
    if high - low < DRIFT_MS || aligned {
        return None;
    }
    Some(Finding {
        pathology: "source drift",
        subject: format!("{fast} ahead of {slow}"),
        evidence: format!(
            "{fast}'s watermark is {:.0} s of event time ahead of {slow}'s ({} source \
             subtasks): windows downstream keep every pane of that span open, and each \
             checkpoint writes all of it",
            (high - low) as f64 / 1000.0,
            watermarks.len()
        ),
        fix: "align the sources: `watermark: { alignment: { max_drift: 10s } }` pauses a \
              subtask that runs ahead of the slowest, so state holds about max_drift of \
              panes; or balance the splits' data between subtasks"
            .into(),
    })
}

/// The tasks of `node`.
fn of<'a>(tasks: &'a [Task], node: &'a str) -> impl Iterator<Item = &'a Task> {
    tasks.iter().filter(move |t| t.node == node)
}

/// The first node downstream of back-pressured ones that is busy itself.
fn cascade(after: &Value, tasks: &[Task]) -> Option<Finding> {
    let order = node_order(after, tasks);
    let max = |n: &str, f: fn(&Task) -> f64| of(tasks, n).map(f).fold(0.0, f64::max);
    for (i, node) in order.iter().enumerate().skip(1) {
        let upstream = &order[..i];
        let pressed: Vec<String> = upstream
            .iter()
            .filter(|u| max(u, |t| t.backpressured) >= BACKPRESSURED)
            .map(|u| format!("{u} back-pressured {}", pct(max(u, |t| t.backpressured))))
            .collect();
        let busy = max(node, Task::busy_share);
        let own = max(node, |t| t.backpressured);
        if !pressed.is_empty() && busy >= BUSY && own < BACKPRESSURED {
            let hot = of(tasks, node)
                .max_by(|a, b| a.busy_share().total_cmp(&b.busy_share()))
                .map(|t| t.name.clone())
                .unwrap_or_default();
            return Some(Finding {
                pathology: "back-pressure cascade",
                subject: hot,
                evidence: format!("{node} busy {} while {}", pct(busy), pressed.join(", ")),
                fix: format!(
                    "{node} is the bottleneck: give it more parallelism or make it cheaper \
                     (a slow sink: a faster or batching sink); the tasks upstream only wait"
                ),
            });
        }
    }
    None
}

/// A node whose subtasks get very unequal shares of the records: one busy while its
/// siblings wait for input (idle). Siblings that are back-pressured instead get less
/// because the tasks downstream are slow (the cascade), not because of keys; a source's
/// subtasks get what their splits hold, so sources are not judged.
fn skew(after: &Value, then: &[Task], now: &[Task], elapsed: f64) -> Vec<Finding> {
    let mut found = Vec::new();
    let source = after
        .get("nodes")
        .and_then(|n| n.get(0))
        .and_then(Value::as_str);
    for node in node_order(after, now)
        .iter()
        .filter(|n| Some(n.as_str()) != source)
    {
        let siblings: Vec<&Task> = of(now, node).collect();
        let rates: Vec<(String, f64, f64)> = siblings
            .iter()
            .map(|t| {
                let before = then
                    .iter()
                    .find(|b| b.name == t.name)
                    .map_or(0, |b| b.records_in);
                let rate = t.records_in.saturating_sub(before) as f64 / elapsed.max(1e-3);
                (t.name.clone(), rate, t.busy_share())
            })
            .collect();
        if rates.len() < 2 {
            continue;
        }
        let total: f64 = rates.iter().map(|r| r.1).sum();
        let Some(hot) = rates.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
            continue;
        };
        let others = (total - hot.1) / (rates.len() - 1) as f64;
        let cold: Vec<&&Task> = siblings.iter().filter(|t| t.name != hot.0).collect();
        let n = cold.len().max(1) as f64;
        let cold_idle = cold.iter().map(|t| t.idle).sum::<f64>() / n;
        let cold_pressed = cold.iter().map(|t| t.backpressured).sum::<f64>() / n;
        // The cold siblings wait for input, not for output. Their idle share alone is
        // no measure: on a machine short of cores, part of their time is spent waiting
        // for a core, which is counted as neither.
        let starved = cold_idle > 2.0 * cold_pressed && cold_pressed < BACKPRESSURED;
        if total >= 1000.0 && hot.1 >= 3.0 * others.max(1.0) && hot.2 >= BUSY && starved {
            let keys: Vec<String> = siblings
                .iter()
                .find(|t| t.name == hot.0)
                .map(|t| {
                    t.hot_keys
                        .iter()
                        .map(|(k, p)| format!("{k} ({p}%)"))
                        .collect()
                })
                .unwrap_or_default();
            let keys = if keys.is_empty() {
                String::new()
            } else {
                format!("; its hottest keys: {}", keys.join(", "))
            };
            found.push(Finding {
                pathology: "data skew on key_by",
                subject: hot.0.clone(),
                evidence: format!(
                    "{} takes {:.0} records/s ({} of {node}'s), busy {}; its {} siblings average {:.0}/s{keys}",
                    hot.0,
                    hot.1,
                    pct(hot.1 / total),
                    pct(hot.2),
                    rates.len() - 1,
                    others
                ),
                fix: "a few hot keys land on one subtask: pre-aggregate before the key_by, or \
                      salt the hot keys (add a random suffix, then combine) so that they spread"
                    .into(),
            });
        }
    }
    found
}

/// The watermark stuck while records flow, held by a split with no data.
fn starvation(before: &Value, after: &Value, now: &[Task], elapsed: f64) -> Option<Finding> {
    let read = |s: &Value| s.get("records_in").and_then(Value::as_u64).unwrap_or(0);
    let wm = |s: &Value| s.get("watermark").and_then(Value::as_i64);
    let flowing = read(after) > read(before);
    let stuck = wm(after) == wm(before);
    let holders: Vec<String> = now
        .iter()
        .filter(|t| !t.held_by.is_empty())
        .map(|t| format!("{} by {}", t.name, t.held_by))
        .collect();
    if !(flowing && stuck) || holders.is_empty() {
        return None;
    }
    let at = match wm(after) {
        Some(ms) => format!("at {ms} ms"),
        None => "not set".into(),
    };
    Some(Finding {
        pathology: "watermark starvation",
        subject: holders.join(", "),
        evidence: format!(
            "the watermark stayed {at} for {elapsed:.1} s while {} records were read; held: {}",
            read(after) - read(before),
            holders.join(", ")
        ),
        fix: "a split or partition with no data holds every window back: set \
              `watermark: { idleness: 5s }` so that a silent split stops counting, or \
              feed that split"
            .into(),
    })
}

/// Checkpoints taking a growing share of their timeout: barriers waiting for each other
/// (alignment) or behind queued data on their way (the usual cause under back pressure,
/// where every channel is late alike and the alignment itself stays short).
fn alignment(after: &Value) -> Option<Finding> {
    let timeout = after.get("checkpoint_timeout_ms").and_then(Value::as_u64)? as f64;
    let recent: Vec<(f64, f64)> = after
        .get("checkpoints")
        .and_then(Value::as_array)?
        .iter()
        .map(|c| {
            let ms = |key: &str, per_ms: f64| {
                c.get(key).and_then(Value::as_u64).unwrap_or(0) as f64 / per_ms
            };
            let alignment = ms("max_alignment_micros", 1000.0);
            (ms("duration_ms", 1.0).max(alignment), alignment)
        })
        .collect();
    let &(last, aligning) = recent.last()?;
    let growing = recent.len() >= 3 && recent.windows(2).rev().take(2).all(|w| w[1].0 > w[0].0);
    let aborted = after
        .get("checkpoints_aborted")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if last < 0.5 * timeout && !(growing && last >= 0.2 * timeout) {
        return None;
    }
    Some(Finding {
        pathology: "checkpoint alignment timeout",
        subject: format!(
            "checkpoint {}",
            after.get("last_checkpoint").unwrap_or(&Value::Null)
        ),
        evidence: format!(
            "the last checkpoint took {last:.0} ms of a {timeout:.0} ms timeout{}: its \
             barriers aligned in {aligning:.0} ms and waited {:.0} ms behind queued data; \
             {aborted} checkpoints aborted",
            if growing { ", growing" } else { "" },
            (last - aligning).max(0.0)
        ),
        fix: "barriers wait behind queued data at a slow task: take unaligned checkpoints \
              (`checkpoint: { mode: unaligned }`: barriers overtake the queued data, which \
              is stored with the checkpoint), remove the back pressure (see the cascade), \
              or make the queues shorter (smaller --buffer-bytes)"
            .into(),
    })
}

/// A state node whose resident memory is near its budget.
fn state_memory(url: &str, text: &str) -> Option<Finding> {
    let sample = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let rss = sample("process_memory_usage_bytes")?;
    let limit = sample("sluice_state_memory_limit_bytes")?;
    (limit > 0.0 && rss >= 0.9 * limit).then(|| Finding {
        pathology: "state memory growth",
        subject: url.to_owned(),
        evidence: format!(
            "resident {:.0} MiB, {} of its {:.0} MiB budget",
            rss / 1048576.0,
            pct(rss / limit),
            limit / 1048576.0
        ),
        fix: "give the node more --memory, add state nodes, or shorten what state \
              keeps (window size, TTL)"
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str, busy: u64, bp: u64, records: u64, held: &str) -> Value {
        json!({ "task": name, "busy_ms_per_s": busy, "backpressured_ms_per_s": bp,
                "idle_ms_per_s": 1000 - busy - bp, "records_in": records,
                "watermark_held_by": held })
    }

    fn sample(tasks: Vec<Value>, records: u64, watermark: Option<i64>) -> Value {
        json!({ "state": "running", "records_in": records, "watermark": watermark,
                "nodes": ["source", "window", "sink"], "tasks": tasks })
    }

    #[test]
    fn the_busy_task_below_back_pressured_ones_is_the_cascade() {
        let s = sample(
            vec![
                task("source[0]", 50, 900, 10, ""),
                task("source[1]", 40, 920, 10, ""),
                task("window[0]", 100, 850, 10, ""),
                task("window[1]", 90, 860, 10, ""),
                task("sink[0]", 990, 0, 10, ""),
            ],
            100,
            Some(1),
        );
        let found = diagnose(&[s.clone(), s.clone()], 3.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pathology, "back-pressure cascade");
        assert_eq!(found[0].subject, "sink[0]");
        assert!(
            found[0].evidence.contains("window back-pressured 86%"),
            "{found:?}"
        );
        // Everything busy and nothing waiting: no cascade.
        let calm = sample(
            vec![
                task("source[0]", 900, 0, 10, ""),
                task("sink[0]", 900, 0, 10, ""),
            ],
            1,
            Some(1),
        );
        assert!(diagnose(&[calm.clone(), calm.clone()], 3.0).is_empty());
    }

    #[test]
    fn one_subtask_taking_most_records_is_skew() {
        let before = sample(
            vec![
                task("window[0]", 950, 0, 0, ""),
                task("window[1]", 100, 0, 0, ""),
                task("window[2]", 100, 0, 0, ""),
            ],
            0,
            Some(1),
        );
        let mut hot = task("window[0]", 950, 0, 90_000, "");
        hot["hot_keys"] = json!([{ "key": "auction=7", "share_pct": 81 }, { "key": "auction=9", "share_pct": 2 }]);
        let after = sample(
            vec![
                hot,
                task("window[1]", 100, 0, 5_000, ""),
                task("window[2]", 100, 0, 5_000, ""),
            ],
            100_000,
            Some(2),
        );
        let found = diagnose(&[before.clone(), after.clone()], 2.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pathology, "data skew on key_by");
        assert_eq!(found[0].subject, "window[0]");
        assert!(
            found[0]
                .evidence
                .contains("its hottest keys: auction=7 (81%), auction=9 (2%)"),
            "{found:?}"
        );
        // Even shares are not skew.
        let even = sample(
            vec![
                task("window[0]", 950, 0, 50_000, ""),
                task("window[1]", 950, 0, 50_000, ""),
            ],
            100_000,
            Some(2),
        );
        assert!(diagnose(&[before.clone(), even.clone()], 2.0).is_empty());
        // Short of cores, the cold sibling is neither busy nor idle for much of its
        // time (waiting for a core): still skew, as seen on a loaded CI machine.
        let mut cold = task("window[1]", 55, 0, 5_000, "");
        cold["idle_ms_per_s"] = json!(359);
        let mut hot = task("window[0]", 604, 0, 90_000, "");
        hot["idle_ms_per_s"] = json!(83);
        let loaded = sample(vec![hot, cold], 100_000, Some(2));
        let found = diagnose(&[before.clone(), loaded], 2.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].subject, "window[0]");
        // Cold siblings held back by their output are the cascade's, not skew.
        let pressed = sample(
            vec![
                task("window[0]", 950, 0, 90_000, ""),
                task("window[1]", 100, 800, 5_000, ""),
            ],
            100_000,
            Some(2),
        );
        assert!(
            diagnose(&[before.clone(), pressed], 2.0)
                .iter()
                .all(|f| f.pathology != "data skew on key_by")
        );
    }

    #[test]
    fn a_stuck_watermark_with_a_holder_while_records_flow_is_starvation() {
        let before = sample(
            vec![task("source[0]", 300, 0, 10, "bids/3")],
            1_000,
            Some(5_000),
        );
        let after = sample(
            vec![task("source[0]", 300, 0, 2_000, "bids/3")],
            3_000,
            Some(5_000),
        );
        let found = diagnose(&[before.clone(), after.clone()], 3.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pathology, "watermark starvation");
        assert!(found[0].subject.contains("bids/3"));
        // Advancing watermark: fine; nothing read: an idle job, not starvation.
        let moving = sample(
            vec![task("source[0]", 300, 0, 2_000, "bids/3")],
            3_000,
            Some(6_000),
        );
        assert!(diagnose(&[before.clone(), moving.clone()], 3.0).is_empty());
        assert!(diagnose(&[before.clone(), before.clone()], 3.0).is_empty());
    }

    #[test]
    fn source_subtasks_far_apart_in_event_time_drift_unless_aligned() {
        let at = |name: &str, wm: i64, paused: u64| {
            let mut t = task(name, 500, 0, 10, "");
            t["watermark"] = json!(wm);
            t["alignment_paused_ms_per_s"] = json!(paused);
            t
        };
        let s = sample(
            vec![
                at("source[0]", 500_000, 0),
                at("source[1]", 1_000, 0),
                at("window[0]", 1_000, 0),
            ],
            10,
            Some(1_000),
        );
        let found = diagnose(&[s.clone(), s.clone()], 3.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pathology, "source drift");
        assert_eq!(found[0].subject, "source[0] ahead of source[1]");
        assert!(found[0].evidence.contains("499 s"), "{found:?}");
        assert!(found[0].fix.contains("alignment"), "{found:?}");
        // Aligned (a subtask paused for it), close together, or finished: nothing.
        let aligned = sample(
            vec![at("source[0]", 500_000, 300), at("source[1]", 1_000, 0)],
            10,
            Some(1_000),
        );
        assert!(diagnose(&[aligned.clone(), aligned], 3.0).is_empty());
        let close = sample(
            vec![at("source[0]", 50_000, 0), at("source[1]", 1_000, 0)],
            10,
            Some(1_000),
        );
        assert!(diagnose(&[close.clone(), close], 3.0).is_empty());
        let finished = sample(
            vec![at("source[0]", i64::MAX, 0), at("source[1]", 1_000, 0)],
            10,
            Some(1_000),
        );
        assert!(diagnose(&[finished.clone(), finished], 3.0).is_empty());
    }

    #[test]
    fn alignment_near_the_timeout_is_named() {
        let mut s = sample(Vec::new(), 1, Some(1));
        s["checkpoint_timeout_ms"] = json!(10_000);
        s["checkpoints"] = json!([{ "max_alignment_micros": 1_000_000 }, { "max_alignment_micros": 3_000_000 }, { "max_alignment_micros": 6_000_000 }]);
        let found = diagnose(&[s.clone(), s.clone()], 3.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pathology, "checkpoint alignment timeout");
        assert!(
            found[0].evidence.contains(
                "6000 ms of a 10000 ms timeout, growing: its barriers aligned in 6000 ms"
            ),
            "{found:?}"
        );
        // Under back pressure barriers are late on every channel alike: short alignment,
        // long checkpoints.
        s["checkpoints"] = json!([
            { "duration_ms": 1_500, "max_alignment_micros": 300_000 },
            { "duration_ms": 2_500, "max_alignment_micros": 300_000 },
            { "duration_ms": 3_700, "max_alignment_micros": 300_000 },
        ]);
        s["checkpoint_timeout_ms"] = json!(4_000);
        let found = diagnose(&[s.clone(), s.clone()], 3.0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .evidence
                .contains("aligned in 300 ms and waited 3400 ms behind queued data"),
            "{found:?}"
        );
        s["checkpoints"] = json!([{ "duration_ms": 40, "max_alignment_micros": 3_000 }]);
        assert!(diagnose(&[s.clone(), s.clone()], 3.0).is_empty());
    }

    #[test]
    fn a_recent_failure_is_named_with_its_cause() {
        let mut s = sample(Vec::new(), 1, Some(1));
        s["attempt"] = json!(2);
        s["restarts"] = json!(1);
        s["failures"] = json!([{ "attempt": 1, "at_ms": 1_000_000, "reason": "worker w-2 lost: no heartbeat for 3 s", "unavailable": false }]);
        let f = failover(&s, 1_030_000).expect("a finding");
        assert_eq!(f.pathology, "failover");
        assert_eq!(f.subject, "attempt 1");
        assert!(
            f.evidence
                .contains("30 s ago: worker w-2 lost: no heartbeat for 3 s; 1 restarts so far, now attempt 2 (running)"),
            "{f:?}"
        );
        assert!(f.fix.contains("OOM killer"), "{f:?}");
        assert!(failover(&s, 1_000_000 + RECENT_FAILURE_MS + 1).is_none());
        s["failures"] = json!([]);
        assert!(failover(&s, 1_030_000).is_none());
    }

    #[test]
    fn state_memory_near_the_budget_is_named() {
        let text =
            "process_memory_usage_bytes 950000000\nsluice_state_memory_limit_bytes 1000000000\n";
        let f = state_memory("http://n/metrics", text).expect("a finding");
        assert_eq!(f.pathology, "state memory growth");
        assert!(
            state_memory(
                "u",
                "process_memory_usage_bytes 1\nsluice_state_memory_limit_bytes 1000\n"
            )
            .is_none()
        );
        assert!(state_memory("u", "garbage").is_none());
    }
}
