//! Telemetry across real processes: every role exports its metrics over OTLP/gRPC to a
//! real receiver (the collector's `MetricsService`, generated from OpenTelemetry's
//! protos) and serves Prometheus `GET /metrics`, which `promtool` checks and a real
//! Prometheus server scrapes.
//!
//! Tests run one at a time: each starts a cluster of processes on a 2-core machine.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::cluster::{MiniCluster, START_TIMEOUT, free_port};
use sluice_integration_tests::http::{http_request, promtool_check};
use sluice_integration_tests::{
    Outcome, run_sluice, run_sluice_env, tempdir, workspace_root, write_job, yaml_path,
};
use sluice_test_support::otlp::{OtlpReceiver, Point, ReceivedSpan};

/// How long exports, scrapes and checkpoints may take to show up.
const SETTLE: Duration = Duration::from_secs(60);

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A windowed count per auction over `events` generated bids, on remote state with
/// checkpoints every 500 ms; `rate` 0: unthrottled.
fn windowed_job(out: &Path, events: u64, rate: u64) -> String {
    format!(
        "name: watched\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: {events}, seed: 5, splits: 4, \
         max_events_per_second: {rate} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 2s }}\n    \
         aggregate: [\"count(*) AS bids\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// `sluice run JOB --otlp-endpoint ENDPOINT` in `dir` with extra environment `env`.
fn run_exporting(dir: &Path, job: &Path, endpoint: &str, env: &[(&str, &str)]) -> Outcome {
    let job = job.to_str().expect("UTF-8 path");
    run_sluice_env(&["run", job, "--otlp-endpoint", endpoint], dir, env)
}

/// The points of `metric` from processes of `role`.
fn of<'a>(points: &'a [Point], role: &str, metric: &str) -> Vec<&'a Point> {
    points
        .iter()
        .filter(|p| {
            p.metric == metric && p.resource.get("sluice.role").map(String::as_str) == Some(role)
        })
        .collect()
}

/// `http://ADDR/metrics` printed by a role with `--metrics-http`: its `ADDR`.
fn metrics_addr(output: &str) -> Option<String> {
    output.lines().find_map(|l| {
        l.strip_prefix("metrics on http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .map(str::to_owned)
    })
}

fn scrape(addr: &str) -> String {
    let (code, body) = http_request(addr, "GET", "/metrics", None);
    assert_eq!(code, 200, "GET http://{addr}/metrics: {body}");
    match body {
        Value::String(text) => text,
        other => panic!("/metrics of {addr} answered JSON: {other}"),
    }
}

/// The value of the first sample of `name` (with `{labels}` or none) in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn sluice_run_exports_job_task_and_process_metrics_over_otlp_while_it_runs() {
    let _serial = serial();
    let dir = tempdir();
    let receiver = OtlpReceiver::start();
    let job = write_job(
        dir.path(),
        "job.yaml",
        &windowed_job(&dir.path().join("out"), 100_000, 25_000),
    );
    let endpoint = receiver.endpoint();
    let outcome = run_exporting(
        dir.path(),
        &job,
        &endpoint,
        &[
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=ci,team=streams",
            ),
        ],
    );
    outcome.assert_success().assert_no_panic();
    let summary = outcome.summary();
    let points = receiver.points();
    let names = receiver.names_of_role("run");
    for name in [
        "sluice.job.records_in",
        "sluice.job.state",
        "sluice.job.last_checkpoint",
        "sluice.task.busy",
        "sluice.task.backpressured",
        "sluice.task.records_in",
        "sluice.task.network.received",
        "process.memory.usage",
        "sluice.telemetry.export.failures",
    ] {
        assert!(
            names.contains(name),
            "no {name} from the run; got {names:?}"
        );
    }

    // The job's count as exported: a cumulative sum in records, rising over several
    // exports while the job ran, and ending at what the run read.
    let records: Vec<&Point> = of(&points, "run", "sluice.job.records_in");
    assert!(
        records
            .iter()
            .all(|p| p.kind == "sum" && p.unit == "{record}"),
        "{records:?}"
    );
    assert!(
        records
            .iter()
            .all(|p| p.attributes.get("job_name").map(String::as_str) == Some("watched"))
    );
    let values: Vec<f64> = records.iter().map(|p| p.value).collect();
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]),
        "records_in went down: {values:?}"
    );
    let distinct: std::collections::BTreeSet<u64> = values.iter().map(|v| *v as u64).collect();
    assert!(
        distinct.len() >= 3,
        "fewer than 3 distinct exports while running: {values:?}"
    );
    assert_eq!(
        *values.last().expect("a records_in point"),
        summary.records_in as f64
    );
    assert_eq!(summary.records_in, 100_000);

    // Tasks carry their job and task as attributes; ratios are gauges of unit 1.
    let busy = of(&points, "run", "sluice.task.busy");
    assert!(
        busy.iter().any(|p| p
            .attributes
            .get("task")
            .is_some_and(|t| t.starts_with("window"))),
        "{busy:?}"
    );
    assert!(
        busy.iter()
            .all(|p| p.kind == "gauge" && p.unit == "1" && (0.0..=1.0).contains(&p.value))
    );
    let checkpoints = of(&points, "run", "sluice.job.last_checkpoint");
    assert!(
        checkpoints.iter().any(|p| p.value >= 1.0),
        "no checkpoint exported: {checkpoints:?}"
    );
    let rss = of(&points, "run", "process.memory.usage");
    assert!(
        rss.iter().all(|p| p.value > 1e6 && p.unit == "By"),
        "{rss:?}"
    );

    // The resource names the service and role; the user's attributes are added.
    let resource = &records[0].resource;
    assert_eq!(
        resource.get("service.name").map(String::as_str),
        Some("sluice")
    );
    assert_eq!(
        resource.get("deployment.environment").map(String::as_str),
        Some("ci")
    );
    assert_eq!(resource.get("team").map(String::as_str), Some("streams"));
    assert!(resource.get("host.name").is_some_and(|h| !h.is_empty()));
    assert!(
        resource.contains_key("service.instance.id") && resource.contains_key("service.version")
    );
    let failures = of(&points, "run", "sluice.telemetry.export.failures");
    assert!(failures.iter().all(|p| p.value == 0.0), "{failures:?}");

    // The run's checkpoints are traced too, its in-process worker's tasks inside.
    let spans = receiver.spans();
    let traced = spans
        .iter()
        .filter(|s| {
            s.name == "checkpoint"
                && s.resource.get("sluice.role").map(String::as_str) == Some("run")
        })
        .any(|root| {
            spans
                .iter()
                .any(|s| s.name == "task checkpoint" && s.parent_span_id == root.span_id)
        });
    assert!(
        traced,
        "no checkpoint trace with task spans among {} spans",
        spans.len()
    );
}

#[test]
fn logged_events_reach_the_collector_with_their_role() {
    let _serial = serial();
    let dir = tempdir();
    let receiver = OtlpReceiver::start();
    let job = write_job(
        dir.path(),
        "job.yaml",
        &windowed_job(&dir.path().join("out"), 20_000, 0),
    );
    let endpoint = receiver.endpoint();
    // At info level the job's deployment is logged.
    let outcome = run_exporting(dir.path(), &job, &endpoint, &[("SLUICE_LOG", "info")]);
    outcome.assert_success().assert_stderr_contains("deployed");
    let logs = receiver.logs();
    let event = logs
        .iter()
        .find(|l| l.body == "deployed")
        .unwrap_or_else(|| panic!("the deployment was not exported: {logs:?}"));
    assert_eq!(event.severity, "INFO", "{event:?}");
    assert_eq!(
        event.resource.get("sluice.role").map(String::as_str),
        Some("run")
    );
    assert!(event.attributes.contains_key("job"), "{event:?}");
}

#[test]
fn a_run_finishes_when_its_collector_is_down_and_a_bad_endpoint_is_named() {
    let _serial = serial();
    let dir = tempdir();
    // A port nobody listens on.
    let port = free_port();
    let job = write_job(
        dir.path(),
        "job.yaml",
        &windowed_job(&dir.path().join("out"), 100_000, 0),
    );
    let endpoint = format!("http://127.0.0.1:{port}");
    let outcome = run_exporting(
        dir.path(),
        &job,
        &endpoint,
        &[
            ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
        ],
    );
    outcome.assert_success().assert_no_panic();
    assert_eq!(outcome.summary().records_in, 100_000);

    // A malformed endpoint is the user's mistake, named.
    let bad = run_exporting(dir.path(), &job, "not a url", &[]);
    bad.assert_code(2)
        .assert_stderr_contains("--otlp-endpoint")
        .assert_no_panic();
}

/// A real Prometheus server scraping `targets` every second; killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn start(dir: &Path, targets: &[(&str, &str)]) -> Self {
        let binary = std::env::var("SLUICE_TEST_PROMETHEUS").unwrap_or_else(|_| {
            panic!(
                "SLUICE_TEST_PROMETHEUS is not set: run the tests through scripts/test, \
                 which installs Debian's prometheus package and exports it"
            )
        });
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for (role, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {role}\n    static_configs: [{{ targets: [\"{addr}\"] }}]\n"
            ));
        }
        let config_path = dir.join("prometheus.yml");
        std::fs::File::create(&config_path)
            .and_then(|mut f| f.write_all(config.as_bytes()))
            .expect("writing prometheus.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prometheus-data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus");
        Self { child, addr }
    }

    /// The result of an instant query, as `(labels, value)` pairs; empty while Prometheus
    /// is not up yet.
    fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        if std::net::TcpStream::connect(&self.addr).is_err() {
            return Vec::new();
        }
        let (code, body) = self.query_raw(promql);
        if code != 200 {
            return Vec::new();
        }
        body["data"]["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .map(|s| {
                        let v = s["value"][1]
                            .as_str()
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(f64::NAN);
                        (s["metric"].clone(), v)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Prometheus {
    /// The HTTP status and JSON answer of an instant query (an invalid query is a 400
    /// with `error`).
    fn query_raw(&self, promql: &str) -> (u16, Value) {
        let path = format!("/api/v1/query?query={}", urlencode(promql));
        http_request(&self.addr, "GET", &path, None)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn every_role_of_a_cluster_exports_over_otlp_and_is_scraped_by_prometheus() {
    let _serial = serial();
    let dir = tempdir();
    let dir = dir.path();
    let receiver = OtlpReceiver::start();
    let endpoint = receiver.endpoint();
    let env = [
        ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
        ("OTEL_BSP_SCHEDULE_DELAY", "500"),
    ];
    // Three workers: the job runs on two, and fails over to the third.
    let mut cluster = MiniCluster::start(
        dir,
        3,
        |role| {
            let mut args = vec!["--otlp-endpoint".to_owned(), endpoint.clone()];
            if role != "coordinator" {
                args.extend(["--metrics-http".to_owned(), "127.0.0.1:0".to_owned()]);
            }
            args
        },
        &env,
    );
    let state_metrics =
        cluster.wait_until("the state node's metrics address", START_TIMEOUT, || {
            metrics_addr(&cluster.state.stderr())
        });
    let worker_metrics: Vec<String> = cluster
        .workers
        .iter()
        .map(|w| metrics_addr(&w.output()).expect("a worker's metrics address"))
        .collect();
    let http = cluster.http.clone();

    // Long enough (200 s) to be running throughout; cancelled at the end.
    let job = write_job(
        dir,
        "job.yaml",
        &windowed_job(&dir.join("out"), 1_000_000, 5_000),
    );
    let id = cluster.submit(dir, &job, 2);
    cluster.wait_until("two completed checkpoints", SETTLE, || {
        let (code, body) = http_request(&http, "GET", &format!("/v1/jobs/{id}"), None);
        (code == 200 && body["last_checkpoint"].as_u64().is_some_and(|c| c >= 2)).then_some(())
    });

    // Each role's own endpoint, through Prometheus's linter.
    let state_text = cluster.wait_until("a commit in the state node's /metrics", SETTLE, || {
        let text = scrape(&state_metrics);
        (sample(&text, "sluice_state_commits_total").is_some_and(|c| c > 0.0)).then_some(text)
    });
    assert!(
        sample(&state_text, "sluice_state_keys_read_total").is_some(),
        "{state_text}"
    );
    assert!(
        sample(&state_text, "sluice_state_shards").is_some_and(|s| s >= 1.0),
        "{state_text}"
    );
    assert!(sample(&state_text, "process_memory_usage_bytes").is_some_and(|m| m > 1e6));
    promtool_check(&state_text);
    for i in job_workers(&cluster, &id) {
        let addr = &worker_metrics[i];
        let text = cluster.wait_until("the worker's tasks in its /metrics", SETTLE, || {
            let text = scrape(addr);
            text.contains(&format!(
                "sluice_task_network_sent_bytes_total{{job_id=\"{id}\""
            ))
            .then_some(text)
        });
        promtool_check(&text);
    }
    let coordinator_text = scrape(&http);
    assert!(
        sample(&coordinator_text, "sluice_job_records_in_total").is_some(),
        "{coordinator_text}"
    );
    promtool_check(&coordinator_text);

    // A real Prometheus scrapes all four and can query across them.
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("prometheus dir");
    let prometheus = Prometheus::start(
        &prom_dir,
        &[
            ("coordinator", &http),
            ("state", &state_metrics),
            ("worker0", &worker_metrics[0]),
            ("worker1", &worker_metrics[1]),
        ],
    );
    cluster.wait_until("Prometheus to see every role up", SETTLE, || {
        let up = prometheus.query("up");
        (up.len() == 4 && up.iter().all(|(_, v)| *v == 1.0)).then_some(())
    });
    cluster.wait_until("the job's figures in Prometheus", SETTLE, || {
        let sent = prometheus.query(&format!(
            "sum(sluice_task_network_sent_bytes_total{{job_id=\"{id}\"}})"
        ));
        let commits = prometheus.query("sluice_state_commits_total");
        let records = prometheus.query(&format!("sluice_job_records_in_total{{job_id=\"{id}\"}}"));
        (sent.first().is_some_and(|(_, v)| *v > 0.0)
            && commits.first().is_some_and(|(_, v)| *v > 0.0)
            && records.first().is_some_and(|(_, v)| *v > 0.0))
        .then_some(())
    });
    // Every dashboard query is valid PromQL to a real Prometheus holding the cluster's
    // figures, and the main panels of each dashboard show data.
    let must_show = [
        "Records per second",
        "Back pressure per task",
        "Checkpoint duration and alignment",
        "Shard size",
        "Keys read and operations written per second",
        "Bytes sent and received per second",
    ];
    for file in [
        "sluice-job.json",
        "sluice-state.json",
        "sluice-exchange.json",
    ] {
        let path = workspace_root().join("infra/grafana").join(file);
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("a dashboard"))
                .expect("dashboard JSON");
        for panel in dashboard["panels"].as_array().expect("panels") {
            let title = panel["title"].as_str().unwrap_or_default();
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"]
                    .as_str()
                    .expect("an expr")
                    .replace("$job", &id);
                let (code, body) = prometheus.query_raw(&expr);
                assert_eq!(code, 200, "{file}: {title}: `{expr}`: {body}");
                if must_show.contains(&title) && target["refId"] == "A" {
                    cluster.wait_until(&format!("{file}: {title} to show data"), SETTLE, || {
                        prometheus.query(&expr).first().map(|_| ())
                    });
                }
            }
        }
    }
    drop(prometheus);

    // And every role exported over OTLP, named by its resource.
    let names_ok = |role: &str, name: &str| receiver.names_of_role(role).contains(name);
    cluster.wait_until("every role's metrics at the OTLP receiver", SETTLE, || {
        (names_ok("coordinator", "sluice.job.records_in")
            && names_ok("coordinator", "sluice.task.busy")
            && names_ok("worker", "sluice.task.network.sent")
            && names_ok("state-service", "sluice.state.commits")
            && names_ok("state-service", "process.memory.usage"))
        .then_some(())
    });
    let points = receiver.points();
    let worker_instances: std::collections::BTreeSet<&String> =
        of(&points, "worker", "process.memory.usage")
            .iter()
            .filter_map(|p| p.resource.get("service.instance.id"))
            .collect();
    assert_eq!(
        worker_instances.len(),
        cluster.workers.len(),
        "{worker_instances:?}"
    );
    let node = of(&points, "state-service", "sluice.state.commits");
    assert!(
        node.iter()
            .all(|p| p.resource.get("service.instance.id").map(String::as_str) == Some("node-a"))
    );
    assert!(node.iter().any(|p| p.value > 0.0), "{node:?}");
    let sizes = of(&points, "state-service", "sluice.state.shard.size");
    assert!(
        sizes
            .iter()
            .any(|p| p.attributes.get("job_id") == Some(&id)),
        "{sizes:?}"
    );

    // One trace per checkpoint across the roles: the coordinator's root with its
    // `_metadata` write and shard commit, each task's span from the workers (alignment and
    // snapshot inside), each shard's flush of the epoch (called by the workers) and
    // commit (under the coordinator's) from the state node.
    let trace = cluster.wait_until("a checkpoint traced across every role", SETTLE, || {
        let spans = receiver.spans();
        spans
            .iter()
            .filter(|s| s.name == "checkpoint" && s.parent_span_id.is_empty())
            .find_map(|root| {
                let in_trace: Vec<&ReceivedSpan> = spans
                    .iter()
                    .filter(|s| s.trace_id == root.trace_id)
                    .collect();
                let named = |name: &str| in_trace.iter().filter(|s| s.name == name).count();
                (named("task checkpoint") >= 4
                    && named("shard commit") == 4
                    && named("shard flush") >= 1
                    && named("write _metadata") == 1
                    && named("commit shards") == 1)
                    .then(|| {
                        (
                            root.clone(),
                            in_trace.into_iter().cloned().collect::<Vec<_>>(),
                        )
                    })
            })
    });
    let (root, spans) = trace;
    let role = |s: &ReceivedSpan| s.resource.get("sluice.role").cloned().unwrap_or_default();
    assert_eq!(role(&root), "coordinator");
    assert_eq!(root.attributes.get("sluice.job_id"), Some(&id));
    let commit = spans
        .iter()
        .find(|s| s.name == "commit shards")
        .expect("commit span");
    for s in &spans {
        match s.name.as_str() {
            "task checkpoint" => {
                assert_eq!(role(s), "worker", "{s:?}");
                assert_eq!(s.parent_span_id, root.span_id, "{s:?}");
                let children: Vec<&str> = spans
                    .iter()
                    .filter(|c| c.parent_span_id == s.span_id)
                    .map(|c| c.name.as_str())
                    .collect();
                assert!(
                    children.contains(&"barrier alignment") && children.contains(&"snapshot"),
                    "{children:?}"
                );
            }
            "shard flush" => {
                // A worker's flush of the checkpoint's epoch, on the state node.
                assert_eq!(role(s), "state-service", "{s:?}");
                assert_eq!(s.parent_span_id, root.span_id, "{s:?}");
                assert_eq!(
                    s.attributes.get("sluice.checkpoint_id"),
                    root.attributes.get("sluice.checkpoint_id")
                );
            }
            "shard commit" => {
                assert_eq!(role(s), "state-service", "{s:?}");
                assert_eq!(s.parent_span_id, commit.span_id, "{s:?}");
                assert_eq!(
                    s.attributes.get("sluice.node_id").map(String::as_str),
                    Some("node-a")
                );
            }
            "write _metadata" | "commit shards" => {
                assert_eq!(role(s), "coordinator", "{s:?}");
                assert_eq!(s.parent_span_id, root.span_id, "{s:?}");
            }
            _ => {}
        }
        assert!(s.start_ns <= s.end_ns, "{s:?}");
    }

    // One trace per deploy, rescale and failover: a root from the coordinator with a
    // span per lifecycle phase and the state calls made in it.
    let deploy = lifecycle(
        &cluster,
        &receiver,
        &id,
        "deploy",
        &["scheduling"],
        &["open state"],
    );
    assert_eq!(role(&deploy), "coordinator");

    let url = cluster.url();
    let out = run_sluice(
        &["rescale", &id, "--parallelism", "1", "--coordinator", &url],
        dir,
    );
    out.assert_success();
    let rescale = lifecycle(
        &cluster,
        &receiver,
        &id,
        "rescale",
        &["rescaling"],
        &["roll back state"],
    );
    assert_eq!(
        rescale
            .attributes
            .get("sluice.running_parallelism")
            .map(String::as_str),
        Some("1"),
        "{rescale:?}"
    );

    // Kill a worker the job runs on: it fails over to the idle third one.
    cluster.wait_until("the job running again", SETTLE, || {
        (cluster.status(&id)["state"] == "running").then_some(())
    });
    let victim = job_workers(&cluster, &id)[0];
    let victim = &mut cluster.workers[victim];
    victim.kill();
    let failover = lifecycle(
        &cluster,
        &receiver,
        &id,
        "failover",
        &["scheduling"],
        &["roll back state"],
    );
    assert!(
        failover.attributes.contains_key("sluice.failure"),
        "{failover:?}"
    );

    cluster.cancel(dir, &id);
}

/// Indexes in `cluster.workers` of the worker processes job `id` runs on.
fn job_workers(cluster: &MiniCluster, id: &str) -> Vec<usize> {
    let status = cluster.status(id);
    let (_, listed) = http_request(&cluster.http, "GET", "/v1/workers", None);
    let pids: Vec<u64> = status["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            listed
                .as_array()?
                .iter()
                .find(|l| l["id"] == *w)
                .and_then(|l| l["pid"].as_u64())
        })
        .collect();
    let found: Vec<usize> = cluster
        .workers
        .iter()
        .enumerate()
        .filter(|(_, w)| w.pid().is_some_and(|p| pids.contains(&u64::from(p))))
        .map(|(i, _)| i)
        .collect();
    assert!(
        !found.is_empty(),
        "no worker process of {status} in {listed}"
    );
    found
}

/// Job `id`'s root span `kind` (a deploy, rescale or failover from the coordinator)
/// with the lifecycle `phases` under it and the state `calls` under those.
fn lifecycle(
    cluster: &MiniCluster,
    receiver: &OtlpReceiver,
    id: &str,
    kind: &str,
    phases: &[&str],
    calls: &[&str],
) -> ReceivedSpan {
    let what = format!("a {kind} trace with {phases:?} and {calls:?}");
    cluster.wait_until(&what, SETTLE, || {
        let spans = receiver.spans();
        spans
            .iter()
            .filter(|s| {
                s.name == kind
                    && s.parent_span_id.is_empty()
                    && s.attributes.get("sluice.job_id").map(String::as_str) == Some(id)
            })
            .find_map(|root| {
                let under = |parent: &str| -> Vec<ReceivedSpan> {
                    spans
                        .iter()
                        .filter(|s| s.trace_id == root.trace_id && s.parent_span_id == parent)
                        .cloned()
                        .collect()
                };
                let phase_spans = under(&root.span_id);
                let named: Vec<&str> = phase_spans.iter().map(|s| s.name.as_str()).collect();
                let inner: Vec<String> = phase_spans
                    .iter()
                    .flat_map(|p| under(&p.span_id))
                    .map(|s| s.name)
                    .collect();
                (phases.iter().all(|p| named.contains(p))
                    && calls.iter().all(|c| inner.iter().any(|i| i == c)))
                .then(|| root.clone())
            })
    })
}

#[test]
fn the_shipped_prometheus_config_is_valid() {
    let promtool = std::env::var("SLUICE_TEST_PROMTOOL").unwrap_or_else(|_| {
        panic!("SLUICE_TEST_PROMTOOL is not set: run the tests through scripts/test")
    });
    let config = workspace_root().join("infra/prometheus.yml");
    let out = Command::new(&promtool)
        .args(["check", "config"])
        .arg(&config)
        .output()
        .expect("promtool ran");
    assert!(
        out.status.success(),
        "promtool check config {}: {}{}",
        config.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
