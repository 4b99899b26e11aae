//! Bearer tokens on a real coordinator process's REST API (`--auth-tokens FILE`), made
//! with `sluice token new` and used by the CLI (`SLUICE_TOKEN`) and by plain HTTP.

use std::path::Path;
use std::time::Duration;

use sluice_integration_tests::cluster::free_port;
use sluice_integration_tests::http::http_request;
use sluice_integration_tests::procs::Proc;
use sluice_integration_tests::{Outcome, run_sluice, run_sluice_env, tempdir, write_job};

/// A new token of `role`: the token and its tokens-file line.
fn new_token(dir: &Path, role: &str, name: &str) -> (String, String) {
    let out = run_sluice(&["token", "new", "--role", role, "--name", name], dir);
    out.assert_success();
    (out.stdout.trim().to_owned(), out.stderr.trim().to_owned())
}

fn as_user(dir: &Path, rest: &str, token: Option<&str>, args: &[&str]) -> Outcome {
    let mut all = args.to_vec();
    all.extend(["--coordinator", rest]);
    match token {
        Some(token) => run_sluice_env(&all, dir, &[("SLUICE_TOKEN", token)]),
        None => run_sluice(&all, dir),
    }
}

#[test]
fn the_rest_api_takes_valid_tokens_only_and_read_tokens_only_read() {
    let dir = tempdir();
    let root = dir.path();
    let (operator, operator_line) = new_token(root, "operate", "admin");
    let (reader, reader_line) = new_token(root, "read", "dashboards");
    assert_eq!(operator.len(), 64, "{operator}");
    assert!(operator_line.starts_with("operate sha256:") && operator_line.ends_with(" admin"));
    let tokens = root.join("tokens");
    std::fs::write(
        &tokens,
        format!("# REST tokens\n{operator_line}\n{reader_line}\n"),
    )
    .unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let mut coordinator = Proc::start(
        &[
            "coordinator",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            &grpc,
            "--store",
            root.join("store").to_str().unwrap(),
            "--auth-tokens",
            tokens.to_str().unwrap(),
        ],
        root,
    );
    let line = coordinator.wait_for_line("coordinator listening:", Duration::from_secs(30));
    let http = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no http= in {line:?}"))
        .to_owned();
    let rest = format!("http://{http}");

    // No token, or a wrong one: refused with a clear message, exit code 2.
    let out = as_user(root, &rest, None, &["jobs"]);
    out.assert_code(2);
    out.assert_stderr_contains("this API needs a bearer token");
    let out = as_user(root, &rest, Some("not-a-token"), &["jobs"]);
    out.assert_code(2);
    out.assert_stderr_contains("the bearer token is not valid here");
    let (status, body) = http_request(&http, "GET", "/metrics", None);
    assert_eq!(status, 401, "{body}");
    // The web UI's files and the API description hold no data.
    for path in ["/ui/", "/ui/app.js", "/v1/openapi.yaml"] {
        assert_eq!(http_request(&http, "GET", path, None).0, 200, "{path}");
    }

    // An operator submits (no worker: the job waits for slots); a reader reads it but
    // cannot cancel it; the operator can.
    let job = write_job(
        root,
        "job.yaml",
        "name: waiting\nsource:\n  nexmark: { events: 1000 }\nsink:\n  blackhole: {}\n",
    );
    let out = as_user(
        root,
        &rest,
        Some(&operator),
        &["submit", job.to_str().unwrap()],
    );
    out.assert_success();
    let id = out.stdout.trim().to_owned();
    as_user(root, &rest, Some(&reader), &["status", &id]).assert_success();
    as_user(root, &rest, Some(&reader), &["jobs"]).assert_success();
    let out = as_user(root, &rest, Some(&reader), &["cancel", &id]);
    out.assert_code(2);
    out.assert_stderr_contains(&format!(
        "token `dashboards` may only read; POST /v1/jobs/{id}/cancel needs an operate token"
    ));
    let out = as_user(root, &rest, Some(&operator), &["cancel", &id]);
    out.assert_success();
    let status = as_user(root, &rest, Some(&reader), &["status", &id, "--json"]);
    assert!(status.stdout.contains("\"cancelled\""), "{}", status.stdout);
    for secret in [&operator, &reader] {
        assert!(
            !coordinator.output().contains(secret.as_str()),
            "the coordinator logged a token"
        );
    }
}

#[test]
fn a_bad_tokens_file_stops_the_coordinator_at_start() {
    let dir = tempdir();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "operate sha256:1234 admin\n").unwrap();
    let out = run_sluice(
        &[
            "coordinator",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--auth-tokens",
            tokens.to_str().unwrap(),
        ],
        dir.path(),
    );
    out.assert_code(2);
    out.assert_stderr_contains(":1: expected `sha256:` and 64 hex digits after the role");
}
