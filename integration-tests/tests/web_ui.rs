//! The coordinator's web UI in a real browser: Debian's Chromium, headless, loads the
//! pages from a cluster of processes, runs their JavaScript against the REST API, and
//! the rendered DOM is checked: the job graph has one cell per task, coloured by what the
//! task does (a slow sink busy, the sources back-pressured), completed checkpoints
//! appear in the history, the overview lists the job and the workers. One screenshot per
//! page is kept under `$CARGO_TARGET_DIR/test-output/ui/` (printed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_integration_tests::cluster::MiniCluster;
use sluice_integration_tests::{tempdir, workspace_root, write_job, yaml_path};

const SYMPTOM: Duration = Duration::from_secs(60);

fn chromium() -> String {
    std::env::var("SLUICE_TEST_CHROMIUM").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_CHROMIUM is not set: run the tests through scripts/test, which \
             installs Debian's chromium and exports it"
        )
    })
}

/// Runs Chromium on `url` with `action` (`--dump-dom`, `--screenshot=PATH`) and the
/// flags for a closed machine (no sandbox as root, no background traffic); its stdout.
///
/// # Panics
/// When Chromium fails.
fn browse(profile: &Path, action: &str, url: &str) -> String {
    let mut c = Command::new(chromium());
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,900",
        // Lets the page's timers and fetches run for this long (virtual time) first.
        "--virtual-time-budget=6000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(action)
    .arg(url);
    let out = c.output().expect("chromium ran");
    assert!(
        out.status.success(),
        "chromium {action} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The DOM of `url` once its scripts ran.
fn rendered(profile: &Path, url: &str) -> String {
    browse(profile, "--dump-dom", url)
}

/// A screenshot of `url` kept as `name`.png in the test output; its path.
fn screenshot(profile: &Path, url: &str, name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let dir = target.join("test-output").join("ui");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let path = dir.join(format!("{name}.png"));
    browse(profile, &format!("--screenshot={}", path.display()), url);
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    assert!(size > 1000, "{} is {size} bytes", path.display());
    eprintln!("screenshot of {url}: {}", path.display());
    path
}

/// The `data-state` of the task cell `task` in `dom`.
fn cell_state<'a>(dom: &'a str, task: &str) -> Option<&'a str> {
    let at = dom.find(&format!("data-task=\"{task}\""))?;
    let rest = &dom[at..];
    let s = rest.find("data-state=\"")? + "data-state=\"".len();
    rest[s..].split('"').next()
}

fn task_names(status: &Value) -> Vec<String> {
    status["tasks"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["task"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_web_ui_shows_the_graph_coloured_by_back_pressure_and_the_checkpoint_history() {
    let dir = tempdir();
    let dir = dir.path();
    let profile = dir.join("chromium-profile");
    let cluster = MiniCluster::start(dir, 2, |_| Vec::new(), &[]);
    let base = cluster.url();

    // A slow sink: the sources wait on it.
    let lab = std::fs::read_to_string(workspace_root().join("examples/labs/slow-sink.yaml"))
        .expect("the lab");
    let job = write_job(dir, "slow.yaml", &lab);
    let id = cluster.submit(dir, &job, 2);
    let status = cluster.wait_until("the sources back-pressured by the sink", SYMPTOM, || {
        let s = cluster.status(&id);
        let figure = |prefix: &str, key: &str| {
            s["tasks"].as_array().and_then(|ts| {
                ts.iter()
                    .filter(|t| t["task"].as_str().is_some_and(|n| n.starts_with(prefix)))
                    .filter_map(|t| t[key].as_u64())
                    .min()
            })
        };
        (figure("source", "backpressured_ms_per_s")? >= 600
            && figure("sink", "busy_ms_per_s")? >= 600)
            .then_some(s)
    });
    let page = format!("{base}/ui/#/jobs/{id}");
    let tasks = task_names(&status);
    // The page shows each task's last reported second: a render may fall on a second in
    // which a source's wait for credit was not accounted yet, so a few renders are
    // allowed for the colours to show what the job does.
    let coloured = |dom: &str| {
        cell_state(dom, "sink[0]") == Some("busy")
            && tasks
                .iter()
                .filter(|t| t.starts_with("source"))
                .all(|s| cell_state(dom, s) == Some("backpressured"))
    };
    let mut dom = rendered(&profile, &page);
    for _ in 0..5 {
        if coloured(&dom) {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        dom = rendered(&profile, &page);
    }
    assert_eq!(
        dom.matches("class=\"task\"").count(),
        tasks.len(),
        "one cell per task {tasks:?} in:\n{dom}"
    );
    assert!(
        coloured(&dom),
        "the sink busy and the sources back-pressured in:\n{dom}"
    );
    assert!(dom.contains("class=\"throughput\""), "{dom}");
    screenshot(&profile, &page, "job-backpressure");
    cluster.cancel(dir, &id);

    // A job with checkpoints: they appear in its history.
    let out = dir.join("out");
    let windowed = format!(
        "name: ui-checkpoints\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
         state: {{ backend: remote, shards: 2 }}\n\
         source:\n  nexmark: {{ stream: bid, events: 1000000, seed: 5, splits: 2, \
         max_events_per_second: 5000 }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 2s }}\n    \
         aggregate: [\"count(*) AS bids\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(&out)
    );
    let job = write_job(dir, "windowed.yaml", &windowed);
    let id = cluster.submit(dir, &job, 2);
    let last = cluster.wait_until("two completed checkpoints", SYMPTOM, || {
        cluster.status(&id)["last_checkpoint"]
            .as_u64()
            .filter(|c| *c >= 2)
    });
    let page = format!("{base}/ui/#/jobs/{id}");
    let dom = rendered(&profile, &page);
    let shown = dom.matches("class=\"checkpoint\"").count();
    assert!(
        shown >= 2,
        "{shown} checkpoints shown after {last} completed:\n{dom}"
    );
    assert!(dom.contains("id=\"job-state\">running"), "{dom}");
    screenshot(&profile, &page, "job-checkpoints");

    // The overview: the job, linked, and both workers.
    let overview = format!("{base}/ui/");
    let dom = rendered(&profile, &overview);
    assert!(dom.contains(&format!("href=\"#/jobs/{id}\"")), "{dom}");
    for w in ["Workers", "Memory (MiB)"] {
        assert!(dom.contains(w), "{w} missing:\n{dom}");
    }
    // Header and this job in one table, header and two workers in the other.
    assert!(dom.matches("<tr>").count() >= 5, "{dom}");
    screenshot(&profile, &overview, "overview");
    cluster.cancel(dir, &id);
}

#[test]
fn under_auth_tokens_the_web_ui_asks_for_a_token_instead_of_failing() {
    let dir = tempdir();
    let dir = dir.path();
    let profile = dir.join("chromium-profile");
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        "read sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 viewer\n",
    )
    .unwrap();
    let (_coordinator, http) = sluice_integration_tests::cluster::lone_coordinator(
        dir,
        &["--auth-tokens", tokens.to_str().unwrap()],
    );
    let dom = rendered(&profile, &format!("http://{http}/ui/"));
    assert!(
        dom.contains("id=\"token-form\"") && dom.contains("This coordinator needs a token"),
        "{dom}"
    );
}
