//! The standalone coordinator across real processes: `sluice state-service`,
//! `sluice coordinator` and `sluice worker` each run as their own process, and jobs are
//! driven with the job commands (`sluice submit | status | rescale | stop`) and the REST
//! API, as a user would.
//!
//! - A coordinator killed with SIGKILL (early, and again once output is committed) is
//!   replaced by a new one on the same store and gRPC port; it resumes the job from its
//!   last checkpoint and the committed output equals a run without failures.
//! - Rescaling 2 → 4 → 1 (the second step after all four subtasks committed output) moves
//!   no state and changes no output; so does rescaling 2 → 3 while reading a 4-partition
//!   Kafka topic (partitions change owners and continue at their checkpointed offsets).
//! - Stopping with a savepoint commits what the savepoint covers, and resubmitting from it
//!   at another parallelism gives the output of one uninterrupted run: no duplicate, no
//!   gap; so does `sluice run --from-savepoint` on the cluster's store and state service.
//! - Bad requests get 400/404/413/415 in one JSON shape naming the field, and exit code 2
//!   with messages naming what was wrong; a job file over 4 MiB is refused before it is
//!   parsed; a corrupt newest checkpoint makes the coordinator resume from the one
//!   before.
//! - A stop with a savepoint after rescaling above the source's split count does not
//!   wait for the source subtasks without splits; a rescale to the current parallelism
//!   changes nothing.
//! - A job that asks for more workers than are attached waits for them, saying so,
//!   without failing; the job commands survive a closed stdout (`| head -1`).
//!
//! Every process a test starts is killed when its guard drops, also on panic, and every
//! wait is bounded. The tests run one at a time (each starts a small cluster and a
//! throttled job; several at once on a small machine would make the waits flaky).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_integration_tests::cluster::free_port;
use sluice_integration_tests::http::{http_request, http_request_as, promtool_check, tail};
use sluice_integration_tests::procs::{Proc, poll_until};
use sluice_integration_tests::service::ServiceProcess;
use sluice_integration_tests::{
    Outcome, Row, assert_same_rows, fold_changelog, net_changelog, read_jsonl_dir, run_sluice,
    sluice_bin, tempdir, write_job, yaml_path,
};

/// How long a throttled job may take to finish once nothing else is in its way.
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a process may take to print what a test waits for.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One test at a time (see the module comment).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------
// Jobs

/// The Nexmark source's throttle option for `rate` events per second (0: unthrottled).
fn throttle(rate: u64) -> String {
    if rate > 0 {
        format!(", max_events_per_second: {rate}")
    } else {
        String::new()
    }
}

/// The windowed count per auction on remote state with the exactly-once file sink.
/// `rate` 0: unthrottled (the reference run).
///
/// The input spans about 11 s of event time, and throttled to 10,000 events/s about as
/// much wall-clock time. With 2 s windows and a 4 s bound on disorder the first window
/// fires at about 60% of the input, so the sink commits output while the job runs (10 s
/// windows would all fire at the end of input).
fn windowed_job(out: &Path, rate: u64) -> String {
    let throttle = throttle(rate);
    format!(
        "name: eo\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 100000, seed: 5, splits: 4{throttle} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 2s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// A stateless filter with the exactly-once file sink. `rate` 0: unthrottled.
fn stateless_job(out: &Path, rate: u64) -> String {
    let throttle = throttle(rate);
    format!(
        "name: filtered\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
         source:\n  nexmark: {{ stream: bid, events: 100000, seed: 5, splits: 4{throttle} }}\n\
         pipeline:\n  - filter: \"price > 100\"\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// Runs the reference job `yaml` with `sluice run extra...` and returns its output
/// directory's visible lines, sorted.
fn reference(dir: &Path, yaml: &str, extra: &[&str]) -> Vec<String> {
    let job = write_job(dir, "reference.yaml", yaml);
    let mut args = vec!["run", job.to_str().expect("UTF-8 path")];
    args.extend_from_slice(extra);
    run_sluice(&args, dir).assert_success().assert_no_panic();
    let lines = visible_lines(&dir.join("reference"));
    assert!(!lines.is_empty(), "the reference run wrote nothing");
    lines
}

// ---------------------------------------------------------------------------------------
// Output

/// `(visible, hidden)` file names in `dir`, sorted.
fn names(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut all: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.expect("entry").file_name().into_string().expect("UTF-8"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("listing {}: {e}", dir.display()),
    };
    all.sort();
    all.into_iter().partition(|n| !n.starts_with('.'))
}

/// Every line of every visible part file in `dir`, sorted.
fn visible_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for name in names(dir).0 {
        let path = dir.join(&name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        lines.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned),
        );
    }
    lines.sort();
    lines
}

/// Asserts that the committed output in `out` equals the reference: the same rows as a
/// multiset (with a readable diff) and the same lines byte for byte; and that nothing
/// is left hidden but in-progress leftovers.
#[track_caller]
fn assert_output_matches(out: &Path, reference_dir: &Path, expected: &[String]) {
    let (visible, hidden) = names(out);
    assert!(
        !visible.is_empty(),
        "no visible part file in {}",
        out.display()
    );
    assert_same_rows(
        "committed output vs. the reference",
        &read_jsonl_dir(out),
        &read_jsonl_dir(reference_dir),
    );
    let actual = visible_lines(out);
    assert_eq!(
        actual.len(),
        expected.len(),
        "line counts differ from the reference"
    );
    assert!(actual == expected, "the lines differ from the reference's");
    let (_, reference_hidden) = names(reference_dir);
    assert!(
        reference_hidden.is_empty(),
        "the reference left hidden files: {reference_hidden:?}"
    );
    // In-progress leftovers (`.inprogress[-<fence>]`) and the fence marks recoveries
    // leave (`.fence-<attempt>-<checkpoint>`) are expected; nothing pending is.
    let not_in_progress: Vec<&String> = hidden
        .iter()
        .filter(|n| !n.contains(".inprogress") && !n.starts_with(".fence-"))
        .collect();
    assert!(
        not_in_progress.is_empty(),
        "hidden files left behind that are not in-progress leftovers or fence marks: \
         {not_in_progress:?} (visible: {visible:?})"
    );
    if !hidden.is_empty() {
        eprintln!("in-progress leftovers in {}: {hidden:?}", out.display());
    }
}

// ---------------------------------------------------------------------------------------
// Processes

/// A running `sluice coordinator`.
struct Coordinator {
    proc: Proc,
    /// The REST API's `host:port`.
    http: String,
}

/// A state service, a coordinator and workers, each its own process, in `dir`.
struct Cluster {
    dir: PathBuf,
    store: PathBuf,
    grpc: String,
    state: ServiceProcess,
    coordinator: Option<Coordinator>,
    /// Arguments every coordinator of the cluster gets besides the usual ones.
    coordinator_args: Vec<String>,
    workers: Vec<Proc>,
}

impl Cluster {
    fn start(dir: &Path, workers: usize) -> Self {
        Self::start_with(dir, workers, &[])
    }

    /// [`Cluster::start`] with `coordinator_args` for its coordinators.
    fn start_with(dir: &Path, workers: usize, coordinator_args: &[&str]) -> Self {
        let data = dir.join("state-data");
        let objects = dir.join("state-objects");
        std::fs::create_dir_all(&objects).expect("objects dir");
        let state = ServiceProcess::start(
            &[
                "state-service",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().expect("UTF-8 path"),
                "--object-store",
                &format!("file://{}", objects.display()),
                "--memory",
                "256MiB",
            ],
            dir,
            &[],
        );
        let mut cluster = Self {
            dir: dir.to_path_buf(),
            store: dir.join("coordinator-store"),
            grpc: format!("127.0.0.1:{}", free_port()),
            state,
            coordinator: None,
            coordinator_args: coordinator_args.iter().map(|a| a.to_string()).collect(),
            workers: Vec::new(),
        };
        cluster.start_coordinator();
        cluster.start_workers(workers);
        cluster.wait_for_workers(workers);
        cluster
    }

    /// Starts a coordinator on the cluster's store and gRPC port; returns its output
    /// once it listens.
    fn start_coordinator(&mut self) -> String {
        assert!(self.coordinator.is_none(), "a coordinator is running");
        let state_url = self.state.url();
        let mut args = vec![
            "coordinator",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            &self.grpc,
            "--store",
            self.store.to_str().expect("UTF-8 path"),
            "--state-service",
            &state_url,
        ];
        args.extend(self.coordinator_args.iter().map(String::as_str));
        let mut proc = Proc::start(&args, &self.dir);
        let line = proc.wait_for_line("coordinator listening:", START_TIMEOUT);
        let http = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .unwrap_or_else(|| panic!("no http= address in {line:?}"))
            .to_owned();
        let output = proc.output();
        self.coordinator = Some(Coordinator { proc, http });
        output
    }

    fn coordinator(&mut self) -> &mut Coordinator {
        self.coordinator.as_mut().expect("a running coordinator")
    }

    /// SIGKILLs the coordinator.
    fn kill_coordinator(&mut self) {
        let mut c = self.coordinator.take().expect("a running coordinator");
        c.proc.kill();
        eprintln!(
            "killed the coordinator; it had printed:\n{}",
            tail(&c.proc.output(), 3000)
        );
    }

    fn start_workers(&mut self, n: usize) {
        let url = format!("http://{}", self.grpc);
        for _ in 0..n {
            self.workers
                .push(Proc::start(&["worker", "--coordinator", &url], &self.dir));
        }
    }

    /// Waits until `n` workers are attached (GET /v1/workers).
    fn wait_for_workers(&mut self, n: usize) {
        let http = self.coordinator().http.clone();
        self.wait_until(&format!("{n} workers attached"), START_TIMEOUT, || {
            let (code, body) = http_request(&http, "GET", "/v1/workers", None);
            (code == 200 && body.as_array().is_some_and(|w| w.len() >= n)).then_some(())
        });
    }

    fn kill_workers(&mut self) {
        for w in &mut self.workers {
            w.kill();
        }
        self.workers.clear();
    }

    /// `sluice args... --coordinator http://HTTP`.
    fn sluice(&mut self, args: &[&str]) -> Outcome {
        let url = format!("http://{}", self.coordinator().http);
        let mut all = args.to_vec();
        all.extend_from_slice(&["--coordinator", &url]);
        run_sluice(&all, &self.dir)
    }

    /// `sluice args... --coordinator http://HTTP` with a stdout nobody reads (a pipe whose
    /// reader is closed, as after `| head -1`): its exit code and stderr.
    fn sluice_closed_stdout(&mut self, args: &[&str]) -> (Option<i32>, String) {
        let url = format!("http://{}", self.coordinator().http);
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let output = Command::new(sluice_bin())
            .args(args)
            .args(["--coordinator", &url])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("running sluice");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// The JSON answer of `sluice args... --json`, which must succeed.
    #[track_caller]
    fn json(&mut self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let outcome = self.sluice(&all);
        if outcome.code != Some(0) {
            panic!(
                "`{}` exited with {:?}\n--- stdout\n{}\n--- stderr\n{}\n{}",
                outcome.command,
                outcome.code,
                outcome.stdout,
                outcome.stderr,
                self.logs()
            );
        }
        serde_json::from_str(&outcome.stdout).unwrap_or_else(|e| {
            panic!(
                "`{}` printed no JSON ({e}):\n{}",
                outcome.command, outcome.stdout
            )
        })
    }

    /// Submits `job` with `extra` arguments; returns the job's id.
    #[track_caller]
    fn submit(&mut self, job: &Path, extra: &[&str]) -> String {
        let mut args = vec!["submit", job.to_str().expect("UTF-8 path")];
        args.extend_from_slice(extra);
        let answer = self.json(&args);
        answer["id"]
            .as_str()
            .unwrap_or_else(|| panic!("submit answered {answer}"))
            .to_owned()
    }

    fn status(&mut self, id: &str) -> Value {
        self.json(&["status", id])
    }

    /// Polls `check` every 250 ms until it gives `Some`, for at most `timeout`.
    #[track_caller]
    fn wait_until<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        poll_until(what, timeout, || self.logs(), check)
    }

    /// Polls the job's status until `done` accepts it; panics early when the job ends
    /// otherwise.
    #[track_caller]
    fn wait_status(
        &mut self,
        id: &str,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status(id);
            if done(&status) {
                return status;
            }
            let state = status["state"].as_str().unwrap_or_default();
            if matches!(state, "finished" | "failed" | "cancelled") {
                panic!(
                    "job {id} ended ({state}) before {what}: {status:#}\n{}",
                    self.logs()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "job {id}: not within {timeout:?}: {what}; last status {status:#}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until the job has completed checkpoint `n` or a later one.
    #[track_caller]
    fn wait_checkpoint(&mut self, id: &str, n: u64) -> Value {
        self.wait_status(id, &format!("checkpoint {n}"), START_TIMEOUT, |s| {
            s["last_checkpoint"].as_u64().is_some_and(|c| c >= n)
        })
    }

    /// Waits until the job is `finished` (panics when it fails or is cancelled).
    #[track_caller]
    fn wait_finished(&mut self, id: &str) -> Value {
        let status = self.wait_status(id, "finished", FINISH_TIMEOUT, |s| s["state"] == "finished");
        eprintln!(
            "job {id} finished: parallelism {}, attempt {}, restarts {}, last checkpoint {}, \
             {} records in, {} out",
            status["parallelism"],
            status["attempt"],
            status["restarts"],
            status["last_checkpoint"],
            status["records_in"],
            status["records_out"]
        );
        status
    }

    /// Starts a new coordinator and checks that it resumes exactly job `id`.
    #[track_caller]
    fn restart_coordinator_expecting(&mut self, id: &str) {
        self.start_coordinator();
        let resumed = self
            .coordinator()
            .proc
            .wait_for_line("resumed jobs:", START_TIMEOUT);
        let ids: Vec<&str> = resumed
            .split_once("resumed jobs:")
            .map(|(_, ids)| ids.split(',').map(str::trim).collect())
            .unwrap_or_default();
        assert_eq!(ids, vec![id], "{resumed}");
    }

    /// Waits until the job has committed some output to `out` (the first windows fire
    /// at about 60% of the input) and returns its status then.
    #[track_caller]
    fn wait_visible_output(&mut self, id: &str, out: &Path) -> Value {
        self.wait_status(id, "visible output", FINISH_TIMEOUT, |_| {
            !visible_lines(out).is_empty()
        })
    }

    /// The last words of every process, for failure messages.
    fn logs(&self) -> String {
        let mut s = String::new();
        if let Some(c) = &self.coordinator {
            s.push_str(&format!(
                "--- coordinator\n{}\n",
                tail(&c.proc.output(), 6000)
            ));
        }
        for (i, w) in self.workers.iter().enumerate() {
            s.push_str(&format!("--- worker {i}\n{}\n", tail(&w.output(), 3000)));
        }
        s.push_str(&format!(
            "--- state service\n{}\n",
            tail(&self.state.stderr(), 3000)
        ));
        s
    }
}

/// A job submitted to a fresh cluster, with what it must produce.
struct Started {
    /// The output of the same job run without interruption.
    expected: Vec<String>,
    cluster: Cluster,
    /// Its output directory.
    out: PathBuf,
    /// Its job file (throttled to 10 000 events/s).
    job: PathBuf,
    id: String,
}

/// Computes the reference output of `job` (`sluice run` with `reference_args`), starts a
/// cluster of `workers` workers and submits the throttled job on all of them.
fn start(
    dir: &Path,
    job: fn(&Path, u64) -> String,
    reference_args: &[&str],
    workers: usize,
) -> Started {
    let expected = reference(dir, &job(&dir.join("reference"), 0), reference_args);
    let mut cluster = Cluster::start(dir, workers);
    let out = dir.join("out");
    let job = write_job(dir, "job.yaml", &job(&out, 10_000));
    let id = cluster.submit(&job, &["--workers", &workers.to_string()]);
    Started {
        expected,
        cluster,
        out,
        job,
        id,
    }
}

/// `GET /metrics` of a running job's coordinator: the text format, with the job, its
/// checkpoints and both workers in it.
fn assert_prometheus_metrics(cluster: &mut Cluster, id: &str) {
    let http = cluster.coordinator().http.clone();
    let scrape = || {
        let (code, body) = http_request(&http, "GET", "/metrics", None);
        assert_eq!(code, 200, "{body}");
        let Value::String(text) = body else {
            panic!("/metrics answered JSON: {body}")
        };
        text
    };
    // Tasks appear with the workers' first progress report after the deploy (each
    // second): a bounded wait for them.
    let has_tasks = |text: &str| {
        text.lines().any(|l| {
            l.starts_with("sluice_task_busy_ratio{")
                && l.contains(&format!("job_id=\"{id}\""))
                && l.contains("task=\"")
        })
    };
    let mut text = scrape();
    for _ in 0..50 {
        if has_tasks(&text) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        text = scrape();
    }
    assert!(has_tasks(&text), "no task figures for {id} in:\n{text}");
    let sample = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("job_id=\"{id}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} sample for {id} in:\n{text}"))
    };
    assert!(sample("sluice_job_last_checkpoint{") >= 2.0, "{text}");
    assert!(sample("sluice_job_last_checkpoint_duration_seconds{") >= 0.0);
    assert_eq!(sample("sluice_job_parallelism{"), 2.0, "{text}");
    let running = text.lines().any(|l| {
        l.starts_with("sluice_job_state{")
            && l.contains(&format!("job_id=\"{id}\""))
            && l.ends_with("state=\"running\"} 1")
    });
    assert!(running, "the job is not running in:\n{text}");
    assert!(text.contains("\nsluice_workers 2\n"), "{text}");
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap_or_default();
        assert!(value.parse::<f64>().is_ok(), "not a sample: {line}");
    }
    promtool_check(&text);
}

// ---------------------------------------------------------------------------------------
// Tests

#[test]
fn coordinator_restart_resumes_the_job_from_its_last_checkpoint() {
    let _serial = serial();
    let dir = tempdir();
    let Started {
        expected,
        mut cluster,
        out,
        id,
        ..
    } = start(dir.path(), windowed_job, &["--workers", "2"], 2);
    let before = cluster.wait_checkpoint(&id, 2);
    assert_prometheus_metrics(&mut cluster, &id);
    eprintln!(
        "killing the coordinator at checkpoint {} (state {})",
        before["last_checkpoint"], before["state"]
    );
    cluster.kill_coordinator();
    cluster.restart_coordinator_expecting(&id);
    // The new coordinator shows the job's history: the checkpoint it resumes from (and
    // any other one still retained) is listed before any new one completes.
    let resumed = cluster.json(&["status", &id]);
    let listed: Vec<u64> = resumed["checkpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_u64())
        .collect();
    let last = before["last_checkpoint"].as_u64().unwrap_or(0);
    assert!(
        listed.first().is_some_and(|&c| c <= last),
        "checkpoints from before the restart (up to {last}) are listed: {listed:?}"
    );

    // Once more, after the first windows' output is committed: the new coordinator must
    // neither lose nor repeat what is already visible.
    let before = cluster.wait_visible_output(&id, &out);
    eprintln!(
        "killing the coordinator again at checkpoint {}, {} lines visible",
        before["last_checkpoint"],
        visible_lines(&out).len()
    );
    cluster.kill_coordinator();
    cluster.restart_coordinator_expecting(&id);

    let status = cluster.wait_finished(&id);
    assert!(
        status["last_checkpoint"].as_u64() >= before["last_checkpoint"].as_u64(),
        "checkpoints went backwards: {} before, {} after",
        before["last_checkpoint"],
        status["last_checkpoint"]
    );
    assert_output_matches(&out, &dir.path().join("reference"), &expected);
    // Counts continue from each restored checkpoint: every event read once, whatever
    // was read again after the restarts.
    assert_eq!(status["records_in"], 100_000, "{status}");
}

#[test]
fn rescale_2_4_1_moves_no_state_and_changes_no_output() {
    let _serial = serial();
    let dir = tempdir();
    let Started {
        expected,
        mut cluster,
        out,
        id,
        ..
    } = start(dir.path(), windowed_job, &["--workers", "2"], 4);
    cluster.wait_checkpoint(&id, 1);

    let mut previous = 0;
    for parallelism in [4u32, 1] {
        let answer = cluster.json(&["rescale", &id, "--parallelism", &parallelism.to_string()]);
        eprintln!(
            "rescale to {parallelism}: {} ms, at checkpoint {}, {} state bytes restored",
            answer["millis"], answer["checkpoint_id"], answer["state_bytes_restored"]
        );
        assert_eq!(
            answer["state_bytes_restored"].as_u64(),
            Some(0),
            "a rescale moves no state: {answer}"
        );
        let checkpoint = answer["checkpoint_id"]
            .as_u64()
            .unwrap_or_else(|| panic!("no checkpoint_id in {answer}"));
        assert!(
            checkpoint > previous,
            "rescale checkpoint ids: {previous} then {checkpoint}"
        );
        previous = checkpoint;
        let status = cluster.status(&id);
        assert_eq!(
            status["parallelism"].as_u64(),
            Some(u64::from(parallelism)),
            "status after the rescale: {status:#}"
        );
        // Another checkpoint at the new parallelism before the next step, and for the
        // step to 1, committed output of all four subtasks (the first windows fire at
        // about 60% of the input), so that subtask 0 inherits the others' parts.
        cluster.wait_checkpoint(&id, checkpoint + 1);
        if parallelism == 4 {
            let status = cluster.wait_visible_output(&id, &out);
            eprintln!(
                "output visible at checkpoint {}: {:?}",
                status["last_checkpoint"],
                names(&out)
            );
        }
    }

    let status = cluster.wait_finished(&id);
    assert_eq!(status["parallelism"].as_u64(), Some(1), "{status:#}");
    assert_output_matches(&out, &dir.path().join("reference"), &expected);
}

/// An updating job on remote state: `operator` (a `top_n` or `group_by` pipeline item)
/// over throttled bids, partitioned by auction.
fn updating_job(operator: &str, out: &Path, rate: u64) -> String {
    let throttle = throttle(rate);
    // A join's right input (auctions) spans the same event time as the bids.
    let operator = operator.replace("THROTTLE", &self::throttle(rate / 15));
    format!(
        "name: updating\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 60000, seed: 5, splits: 4{throttle} }}\n\
         pipeline:\n{operator}\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// Rescales a running keyed job 2 -> 3 -> 1: what it commits is what an unthrottled
/// run at one parallelism writes. An updating job's changelog is folded first: a key's
/// changes continue in another subtask's files after each step, so the fold adds them
/// up in any order.
fn rescale_keeps_an_updating_result(operator: &str) {
    rescale_keeps_its_result(operator, 60_000, true);
}

fn rescale_keeps_its_result(operator: &str, records_in: u64, updating: bool) {
    let _serial = serial();
    let dir = tempdir();
    let reference_out = dir.path().join("reference");
    reference(dir.path(), &updating_job(operator, &reference_out, 0), &[]);
    let result = |rows: Vec<Row>, ordered: bool| match (updating, ordered) {
        (false, _) => rows,
        (true, true) => fold_changelog(&rows),
        (true, false) => net_changelog(&rows),
    };
    let expected = result(read_jsonl_dir(&reference_out), true);
    let mut cluster = Cluster::start(dir.path(), 2);
    let out = dir.path().join("out");
    let job = write_job(dir.path(), "job.yaml", &updating_job(operator, &out, 6_000));
    let id = cluster.submit(&job, &["--workers", "2"]);
    cluster.wait_checkpoint(&id, 1);
    for parallelism in [3u32, 1] {
        let answer = cluster.json(&["rescale", &id, "--parallelism", &parallelism.to_string()]);
        eprintln!("rescale to {parallelism}: {answer}");
        assert_eq!(
            answer["state_bytes_restored"].as_u64(),
            Some(0),
            "a rescale moves no state: {answer}"
        );
        let checkpoint = answer["checkpoint_id"]
            .as_u64()
            .unwrap_or_else(|| panic!("no checkpoint_id in {answer}"));
        cluster.wait_checkpoint(&id, checkpoint + 1);
    }
    let status = cluster.wait_finished(&id);
    assert_eq!(status["parallelism"].as_u64(), Some(1), "{status:#}");
    assert_eq!(status["records_in"], records_in, "{status}");
    assert_same_rows(
        "the result after two rescales vs. the reference",
        &result(read_jsonl_dir(&out), false),
        &expected,
    );
}

#[test]
fn a_top_n_keeps_its_result_across_rescales() {
    rescale_keeps_an_updating_result(
        "  - top_n: { partition_by: [auction], order_by: [\"price DESC\"], limit: 3, rank_column: rn }\n",
    );
}

#[test]
fn a_group_by_keeps_its_result_across_rescales() {
    rescale_keeps_an_updating_result(
        "  - group_by: [auction]\n    aggregate: [\"count(*) AS bids\", \"max(price) AS top\"]\n",
    );
}

/// A join in the middle of its input: each subtask's rows of both sides stay in the
/// state service and are found by key after every step, so every bid still meets its
/// auction, once.
#[test]
fn a_join_keeps_its_result_across_rescales() {
    rescale_keeps_its_result(
        "  - join:\n      right:\n        source:\n          nexmark: { stream: auction, \
         events: 3900, seed: 5, splits: 4THROTTLE }\n      left_keys: [auction]\n      \
         right_keys: [id]\n      left_alias: b\n      right_alias: a\n      \
         select: [b.auction, b.bidder, b.price, a.seller, a.category]\n",
        63_900,
        false,
    );
}

#[test]
fn savepoint_stop_and_resume_at_another_parallelism() {
    stop_with_savepoint_and_resume(stateless_job, &[], 1);
}

#[test]
fn a_stateful_job_resumes_from_its_savepoint_at_another_parallelism() {
    // The new job opens the savepoint's shards at the savepoint's checkpoint: the
    // windows' state and the timers rebuilt from it carry on at parallelism 3.
    stop_with_savepoint_and_resume(windowed_job, &["--workers", "2"], 3);
}

/// `sluice run --from-savepoint` resumes a savepoint a cluster took, on its own embedded
/// coordinator and in-process worker, with the cluster's metadata store and state
/// service: `run` and `submit` share one path.
#[test]
fn sluice_run_resumes_a_clusters_savepoint() {
    let _serial = serial();
    let dir = tempdir();
    let Started {
        expected,
        mut cluster,
        out,
        job,
        id,
    } = start(dir.path(), windowed_job, &["--workers", "2"], 2);
    cluster.wait_checkpoint(&id, 3);
    let answer = cluster.json(&["stop", &id, "--savepoint", "sp1"]);
    let path = answer["savepoint"]
        .as_str()
        .unwrap_or_else(|| panic!("stop answered {answer}"))
        .to_owned();
    cluster.wait_status(&id, "cancelled", START_TIMEOUT, |s| {
        s["state"] == "cancelled"
    });
    assert!(
        visible_lines(&out).len() < expected.len(),
        "stopped too late"
    );
    let store = cluster.store.to_str().expect("UTF-8 path").to_owned();
    let state = cluster.state.url();
    // The savepoint named as a user finds it on disk: absolute, inside the store.
    let absolute = format!("{store}/{path}");
    assert!(absolute.starts_with('/'), "{absolute}");
    let args = [
        "run",
        job.to_str().expect("UTF-8 path"),
        "--store",
        &store,
        "--state-service",
        &state,
        "--from-savepoint",
        &absolute,
    ];
    run_sluice(&args, dir.path())
        .assert_success()
        .assert_no_panic();
    assert_output_matches(&out, &dir.path().join("reference"), &expected);
}

/// Runs `job`, stops it with a savepoint once `checkpoints` checkpoints completed,
/// submits it again from the savepoint at parallelism 3, and compares the output with a
/// run without interruption (`sluice run` with `reference_args`).
fn stop_with_savepoint_and_resume(
    job: fn(&Path, u64) -> String,
    reference_args: &[&str],
    checkpoints: u64,
) {
    let _serial = serial();
    let dir = tempdir();
    let Started {
        expected,
        mut cluster,
        out,
        job,
        id,
    } = start(dir.path(), job, reference_args, 2);
    cluster.wait_checkpoint(&id, checkpoints);

    let answer = cluster.json(&["stop", &id, "--savepoint", "sp1"]);
    let path = answer["savepoint"]
        .as_str()
        .unwrap_or_else(|| panic!("stop answered {answer}"))
        .to_owned();
    assert!(
        path.contains("sp1"),
        "the savepoint's path names it: {path}"
    );
    let stopped = cluster.wait_status(&id, "cancelled", START_TIMEOUT, |s| {
        s["state"] == "cancelled"
    });
    let so_far = visible_lines(&out).len();
    let (_, hidden_after_stop) = names(&out);
    eprintln!(
        "stopped {id} at checkpoint {} with savepoint {path}; {so_far} of {} lines visible; \
         hidden: {hidden_after_stop:?}",
        stopped["last_checkpoint"],
        expected.len()
    );
    // The savepoint is a completed checkpoint: what it covers should be committed when
    // the stop answers, as if the job were never resumed. Checked at the end, so that a
    // failure here does not hide how the resumption went.
    let pending_after_stop: Vec<String> = hidden_after_stop
        .into_iter()
        .filter(|n| n.contains(".pending-"))
        .collect();
    assert!(
        so_far < expected.len(),
        "the job should have been stopped before the end of its input"
    );

    let resumed = cluster.submit(
        &job,
        &[
            "--from-savepoint",
            &path,
            "--parallelism",
            "3",
            "--workers",
            "2",
        ],
    );
    assert_ne!(resumed, id);
    let status = cluster.wait_finished(&resumed);
    assert_eq!(status["parallelism"].as_u64(), Some(3), "{status:#}");
    assert_output_matches(&out, &dir.path().join("reference"), &expected);
    assert!(
        pending_after_stop.is_empty(),
        "`sluice stop --savepoint` answered and the job was cancelled, but the output of \
         the savepoint's checkpoint was left uncommitted (pending parts {pending_after_stop:?}); \
         it became visible only when a resumed job recovered it"
    );
}

#[test]
fn bad_requests_get_clear_errors() {
    let _serial = serial();
    let dir = tempdir();
    let mut cluster = Cluster::start(dir.path(), 1);
    let http = cluster.coordinator().http.clone();

    // Invalid YAML: 400, the field is `job`, the message has the file and a line.
    let bad_yaml = serde_json::json!({
        "job": "name: x\nparallelism: 2\nsource: [\n  nexmark: : :\n",
        "file": "bad.yaml",
    })
    .to_string();
    let (code, body) = http_request(&http, "POST", "/v1/jobs", Some(&bad_yaml));
    eprintln!("invalid YAML: {code} {body}");
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["field"], "job", "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    let line = message
        .split_once("bad.yaml:")
        .map(|(_, after)| {
            after
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .unwrap_or_default();
    assert!(
        !line.is_empty(),
        "the error should name the file and a line (bad.yaml:LINE): {message:?}"
    );

    // No `job` in the body.
    let (code, body) = http_request(&http, "POST", "/v1/jobs", Some(r#"{"workers": 2}"#));
    eprintln!("missing job: {code} {body}");
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["field"], "job", "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("job")),
        "{body}"
    );

    // A field of the wrong type names the field, not its value.
    let (code, body) = http_request(&http, "POST", "/v1/jobs", Some(r#"{"job": 123}"#));
    eprintln!("wrong type: {code} {body}");
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["field"], "job", "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("123")),
        "{body}"
    );

    // No workers is not a number of workers.
    let zero = serde_json::json!({ "job": "name: x\n", "workers": 0 }).to_string();
    let (code, body) = http_request(&http, "POST", "/v1/jobs", Some(&zero));
    eprintln!("workers 0: {code} {body}");
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["field"], "workers", "{body}");

    // A body that says it is text is not parsed as JSON.
    let (code, body) = http_request_as(
        &http,
        "POST",
        "/v1/jobs",
        Some("text/plain"),
        Some(r#"{"job": "name: x"}"#),
    );
    eprintln!("text/plain: {code} {body}");
    assert_eq!(code, 415, "{body}");
    assert_eq!(body["field"], "content-type", "{body}");

    // A 10 MB body: 413 in the same JSON shape.
    let huge = format!(r#"{{"job": "{}"}}"#, "x".repeat(10 << 20));
    let (code, body) = http_request(&http, "POST", "/v1/jobs", Some(&huge));
    eprintln!("10 MB body: {code} {body}");
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["field"], "body", "{body}");
    assert!(body["error"].is_string(), "{body}");

    // A job file over 4 MiB, through REST and through the CLI: refused before parsing,
    // naming the file and the limit.
    let mut big = String::from("name: big\n");
    let mut i = 0u64;
    while big.len() <= 5 << 20 {
        big.push_str(&format!("junk_key_{i}: {i}\n"));
        i += 1;
    }
    let request = serde_json::json!({ "job": big, "file": "big.yaml" }).to_string();
    let (code, body) = http_request(&http, "POST", "/v1/jobs", Some(&request));
    eprintln!("5 MiB job: {code} {body}");
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["field"], "job", "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("big.yaml") && e.contains("4 MiB")),
        "{body}"
    );
    let big_job = write_job(dir.path(), "big.yaml", &big);
    let big_path = big_job.to_str().expect("UTF-8 path");
    for args in [vec!["submit", big_path], vec!["run", big_path]] {
        let outcome = if args[0] == "run" {
            run_sluice(&args, dir.path())
        } else {
            cluster.sluice(&args)
        };
        outcome
            .assert_code(2)
            .assert_no_panic()
            .assert_stderr_contains("big.yaml")
            .assert_stderr_contains("limited to 4 MiB");
        eprintln!("{}: {}", outcome.command, outcome.stderr.trim());
    }

    // Unknown job and unknown endpoint.
    let (code, body) = http_request(&http, "GET", "/v1/jobs/nope", None);
    assert_eq!(code, 404, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("nope")),
        "{body}"
    );
    assert_eq!(body["field"], "id", "{body}");
    let (code, body) = http_request(&http, "GET", "/v1/nothing-here", None);
    assert_eq!(code, 404, "{body}");
    assert!(body["error"].is_string(), "{body}");
    assert_eq!(body["field"], "path", "{body}");

    // The same through the CLI: exit code 2 with a message.
    let outcome = cluster.sluice(&["status", "nope"]);
    outcome.assert_code(2).assert_stderr_contains("nope");

    let out = dir.path().join("out");
    let job = write_job(dir.path(), "filtered.yaml", &stateless_job(&out, 5_000));
    let outcome = cluster.sluice(&[
        "submit",
        job.to_str().expect("UTF-8 path"),
        "--from-savepoint",
        "jobs/x/savepoints/none/_metadata",
    ]);
    outcome.assert_code(2).assert_stderr_contains("savepoint");
    eprintln!("missing savepoint: {}", outcome.stderr.trim());

    let id = cluster.submit(&job, &["--workers", "1"]);
    let outcome = cluster.sluice(&["rescale", &id, "--parallelism", "0"]);
    outcome.assert_code(2).assert_stderr_contains("parallelism");
    eprintln!("parallelism 0: {}", outcome.stderr.trim());
    // The job is unharmed.
    let status = cluster.status(&id);
    assert!(
        matches!(
            status["state"].as_str(),
            Some("created" | "scheduling" | "running")
        ),
        "{status:#}"
    );
    cluster.sluice(&["cancel", &id]).assert_success();
}

#[test]
fn a_corrupt_newest_checkpoint_resumes_the_job_from_the_one_before() {
    let _serial = serial();
    let dir = tempdir();
    // Killed after a few checkpoints, long before the first window fires (at about 60%
    // of the input): no output is committed yet, so resuming from an older checkpoint
    // must still give exactly the reference output.
    let Started {
        expected,
        mut cluster,
        out,
        id,
        ..
    } = start(dir.path(), windowed_job, &["--workers", "2"], 2);
    cluster.wait_checkpoint(&id, 3);
    cluster.kill_coordinator();
    cluster.kill_workers();

    let checkpoints = cluster.store.join("jobs").join(&id).join("checkpoints");
    let mut ids: Vec<u64> = std::fs::read_dir(&checkpoints)
        .unwrap_or_else(|e| panic!("listing {}: {e}", checkpoints.display()))
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|id| {
            checkpoints
                .join(format!("{id:020}"))
                .join("_metadata")
                .is_file()
        })
        .collect();
    ids.sort_unstable();
    let newest = *ids.last().expect("checkpoints in the store");
    let previous = ids[ids.len() - 2];
    let metadata = checkpoints.join(format!("{newest:020}")).join("_metadata");
    eprintln!("corrupting {} (checkpoints {ids:?})", metadata.display());
    std::fs::write(&metadata, b"\x00garbage, not a checkpoint\xff\xfe")
        .expect("corrupting _metadata");

    let started = cluster.start_coordinator();
    let resumed = cluster
        .coordinator()
        .proc
        .wait_for_line("resumed jobs:", START_TIMEOUT);
    assert!(resumed.contains(&id), "{resumed}");
    // No worker is attached yet, so the job cannot have checkpointed since.
    let status = cluster.status(&id);
    assert_eq!(
        status["last_checkpoint"].as_u64(),
        Some(previous),
        "resumed from the checkpoint before the corrupt one: {status:#}"
    );
    let log = cluster.coordinator().proc.output();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains(&format!("{newest:020}")));
    assert!(
        warning.is_some(),
        "the coordinator should warn about the corrupt checkpoint {newest}:\n{started}\n{log}"
    );
    eprintln!("warning: {}", warning.unwrap_or_default());

    cluster.start_workers(2);
    cluster.wait_finished(&id);
    assert_output_matches(&out, &dir.path().join("reference"), &expected);
}

/// The stateless job reading 8 splits (`rate` 0: unthrottled).
fn eight_splits_job(out: &Path, rate: u64) -> String {
    stateless_job(out, rate).replace("splits: 4", "splits: 8")
}

#[test]
fn stop_with_a_savepoint_after_rescaling_above_the_split_count() {
    let _serial = serial();
    let dir = tempdir();
    let Started {
        expected,
        mut cluster,
        out,
        job,
        id,
    } = start(dir.path(), eight_splits_job, &[], 2);
    cluster.wait_checkpoint(&id, 1);

    // 16 source subtasks for 8 splits: half of them have nothing to read.
    let answer = cluster.json(&["rescale", &id, "--parallelism", "16"]);
    eprintln!("rescale to 16: {answer}");
    assert_eq!(answer["unchanged"], false, "{answer}");
    let checkpoint = answer["checkpoint_id"].as_u64().expect("checkpoint_id");
    // The same parallelism again changes nothing and says so.
    let attempt = cluster.status(&id)["attempt"].clone();
    let again = cluster.json(&["rescale", &id, "--parallelism", "16"]);
    eprintln!("rescale to 16 again: {again}");
    assert_eq!(again["unchanged"], true, "{again}");
    assert!(
        again["message"]
            .as_str()
            .is_some_and(|m| m.contains("already")),
        "{again}"
    );
    assert_eq!(
        cluster.status(&id)["attempt"],
        attempt,
        "nothing was redeployed"
    );
    let human = cluster.sluice(&["rescale", &id, "--parallelism", "16"]);
    human.assert_success();
    assert!(human.stdout.contains("already"), "{}", human.stdout);
    cluster.wait_checkpoint(&id, checkpoint + 1);

    // Every task, with a split or without, confirms the savepoint's commit: the stop
    // answers without a warning (a task that did not confirm within 30 s would give one).
    let stopped = cluster.json(&["stop", &id, "--savepoint", "sp16"]);
    eprintln!("stop: {stopped}");
    assert!(stopped.get("warning").is_none(), "{stopped}");
    let path = stopped["savepoint"]
        .as_str()
        .expect("a savepoint path")
        .to_owned();
    cluster.wait_status(&id, "cancelled", START_TIMEOUT, |s| {
        s["state"] == "cancelled"
    });
    // The rescale left no savepoint behind: only the one asked for.
    let savepoints = cluster.store.join("jobs").join(&id).join("savepoints");
    let (saved, _) = names(&savepoints);
    assert_eq!(saved, vec!["sp16".to_string()], "savepoints of {id}");
    let (_, hidden) = names(&out);
    eprintln!("hidden files after the stop: {hidden:?}");
    assert!(
        !hidden.iter().any(|n| n.contains(".pending-")),
        "output of the savepoint left uncommitted: {hidden:?}"
    );

    let resumed = cluster.submit(
        &job,
        &[
            "--from-savepoint",
            &path,
            "--parallelism",
            "2",
            "--workers",
            "2",
        ],
    );
    cluster.wait_finished(&resumed);
    assert_output_matches(&out, &dir.path().join("reference"), &expected);
}

#[test]
fn a_job_waits_for_the_workers_it_lacks_without_failing() {
    let _serial = serial();
    let dir = tempdir();
    // Deployments time out after 1 s: waiting for workers must not count against it.
    let mut cluster = Cluster::start_with(dir.path(), 2, &["--deploy-timeout-ms", "1000"]);
    let out = dir.path().join("out");
    let job = write_job(dir.path(), "job.yaml", &stateless_job(&out, 10_000));
    let id = cluster.submit(&job, &["--workers", "3"]);
    let waiting = |s: &Value| {
        s["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("2 of 3"))
    };
    let status = cluster.wait_status(&id, "waiting for a third worker", START_TIMEOUT, waiting);
    eprintln!("waiting: {status:#}");
    std::thread::sleep(Duration::from_secs(4));
    let status = cluster.status(&id);
    assert_eq!(status["state"], "scheduling", "{status:#}");
    assert!(waiting(&status), "{status:#}");
    assert_eq!(status["restarts"], 0, "{status:#}");
    assert_eq!(status["failure"], Value::Null, "{status:#}");
    let human = cluster.sluice(&["status", &id]);
    human.assert_success();
    assert!(
        human
            .stdout
            .contains("waiting_for: workers with a free slot: 2 of 3"),
        "{}",
        human.stdout
    );

    // The job commands survive a reader that goes away (`| head -1`).
    for args in [
        vec!["status", id.as_str()],
        vec!["checkpoints", id.as_str()],
        vec!["jobs"],
        vec!["status", id.as_str(), "--json"],
    ] {
        let (code, stderr) = cluster.sluice_closed_stdout(&args);
        assert_eq!(
            code,
            Some(0),
            "sluice {args:?} with a closed stdout: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "sluice {args:?}: {stderr}");
    }

    // The third worker: the job runs.
    cluster.start_workers(1);
    cluster.wait_status(&id, "running", START_TIMEOUT, |s| s["state"] == "running");
    let status = cluster.status(&id);
    assert_eq!(status["restarts"], 0, "{status:#}");
    assert_eq!(status["waiting_for"], Value::Null, "{status:#}");
    cluster.sluice(&["cancel", &id]).assert_success();
}

#[path = "common/kafka_topics.rs"]
mod kafka_topics;

/// A windowed count per auction on remote state reading the Kafka `topic`.
fn kafka_windowed_job(brokers: &str, topic: &str, out: &Path) -> String {
    format!(
        "name: kafka-rescale\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
         state: {{ backend: remote, shards: 4 }}\n\
         source:\n  kafka:\n    brokers: {brokers}\n    topic: {topic}\n    \
         schema: {{ auction: int64, price: int64, date_time: timestamp }}\n    \
         bounded: latest\n  batch_size: 1024\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 2s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

#[test]
fn rescale_2_3_while_reading_kafka_moves_partitions_with_their_offsets() {
    let _serial = serial();
    let Some(env) = sluice_test_support::kafka::kafka_env(
        "coordinator-kafka-rescale",
        "rescaling a job that reads Kafka",
    ) else {
        return;
    };
    let dir = tempdir();
    let topic = kafka_topics::load(&env, dir.path(), "rescale", 400_000);
    let expected = reference(
        dir.path(),
        &kafka_windowed_job(&env.brokers, &topic, &dir.path().join("reference")),
        &[],
    );
    let mut cluster = Cluster::start(dir.path(), 3);
    let out = dir.path().join("out");
    let job = write_job(
        dir.path(),
        "job.yaml",
        &kafka_windowed_job(&env.brokers, &topic, &out),
    );
    let id = cluster.submit(&job, &["--workers", "3"]);
    cluster.wait_checkpoint(&id, 1);
    // Four partitions over three subtasks: every subtask's share changes, and each
    // partition must continue at the offset its checkpoint recorded.
    let answer = cluster.json(&["rescale", &id, "--parallelism", "3"]);
    assert_eq!(
        answer["state_bytes_restored"].as_u64(),
        Some(0),
        "a rescale moves no state: {answer}"
    );
    let status = cluster.status(&id);
    assert_eq!(status["parallelism"].as_u64(), Some(3), "{status:#}");
    // While it runs, the status names the partition that holds a source task's watermark,
    // and so does the human form of `sluice status`.
    let deadline = Instant::now() + Duration::from_secs(20);
    let partition = format!("{topic}/");
    loop {
        let text = cluster.sluice(&["status", &id]).stdout;
        let line = text.lines().find(|l| l.starts_with("watermark_held_by: "));
        if let Some(line) = line {
            assert!(
                line.contains("source[") && line.contains(&partition),
                "{line}"
            );
            break;
        }
        let status = cluster.status(&id);
        if status["state"] != "running" || Instant::now() > deadline {
            panic!("no watermark_held_by while the job ran:\n{text}\n{status:#}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let status = cluster.wait_finished(&id);
    assert_eq!(status["parallelism"].as_u64(), Some(3), "{status:#}");
    assert_output_matches(&out, &dir.path().join("reference"), &expected);
}
