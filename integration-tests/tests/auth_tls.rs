//! Bearer tokens on a real coordinator process's REST API (`--auth-tokens FILE`), made
//! with `sluice token new` and used by the CLI (`SLUICE_TOKEN`) and by plain HTTP.

use std::path::Path;
use std::time::Duration;

use sluice_integration_tests::cluster::lone_coordinator;
use sluice_integration_tests::http::http_request;
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
    let (coordinator, http) = lone_coordinator(root, &["--auth-tokens", tokens.to_str().unwrap()]);
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

/// A CA and certificates it signs, made with rcgen for the TLS tests.
struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate for 127.0.0.1, server and client use, written to `dir/name.pem`
    /// and `dir/name.key`; expired when `expired`.
    fn sign(&self, dir: &Path, name: &str, expired: bool) -> (String, String) {
        self.sign_for(dir, name, "127.0.0.1", expired)
    }

    fn sign_for(&self, dir: &Path, name: &str, san: &str, expired: bool) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec![san.to_string()]).unwrap();
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (
            cert_path.to_str().unwrap().to_owned(),
            key_path.to_str().unwrap().to_owned(),
        )
    }

    fn write(&self, dir: &Path, name: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, &self.pem).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

#[test]
fn the_rest_api_over_mutual_tls_refuses_plaintext_and_certificates_it_does_not_trust() {
    let dir = tempdir();
    let root = dir.path();
    let (ca, stranger) = (TestCa::new("cluster CA"), TestCa::new("another CA"));
    let ca_pem = ca.write(root, "ca.pem");
    let stranger_pem = stranger.write(root, "stranger-ca.pem");
    let (server_cert, server_key) = ca.sign(root, "server", false);
    let (client_cert, client_key) = ca.sign(root, "client", false);
    let (foreign_cert, foreign_key) = stranger.sign(root, "foreign", false);
    let (_coordinator, http) = lone_coordinator(
        root,
        &[
            "--tls-cert",
            &server_cert,
            "--tls-key",
            &server_key,
            "--tls-client-ca",
            &ca_pem,
        ],
    );
    let rest = format!("https://{http}");
    let jobs = |extra: &[&str]| {
        let mut args = vec!["jobs", "--coordinator", rest.as_str()];
        args.extend_from_slice(extra);
        run_sluice(&args, root)
    };

    jobs(&[
        "--ca",
        &ca_pem,
        "--client-cert",
        &client_cert,
        "--client-key",
        &client_key,
    ])
    .assert_success();
    // Without a client certificate, with one of another CA, trusting another CA, or
    // in plain HTTP: a clear refusal, at once.
    let started = std::time::Instant::now();
    let out = jobs(&["--ca", &ca_pem]);
    out.assert_code(1);
    out.assert_stderr_contains("cannot reach the coordinator");
    eprintln!("no client certificate: {}", out.stderr.trim());
    let out = jobs(&[
        "--ca",
        &ca_pem,
        "--client-cert",
        &foreign_cert,
        "--client-key",
        &foreign_key,
    ]);
    out.assert_code(1);
    eprintln!("a foreign client certificate: {}", out.stderr.trim());
    let out = jobs(&[
        "--ca",
        &stranger_pem,
        "--client-cert",
        &client_cert,
        "--client-key",
        &client_key,
    ]);
    out.assert_code(1);
    out.assert_stderr_contains("UnknownIssuer");
    let plain = format!("http://{http}");
    let out = run_sluice(&["jobs", "--coordinator", &plain], root);
    out.assert_code(1);
    // A plain request gets a TLS alert back, never an HTTP answer.
    let mut stream = std::net::TcpStream::connect(&http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    std::io::Write::write_all(&mut stream, b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP was served: {answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "refusals must not hang: {:?}",
        started.elapsed()
    );

    // An expired server certificate is named as such.
    let (old_cert, old_key) = ca.sign(root, "expired", true);
    let (_old, old_http) =
        lone_coordinator(root, &["--tls-cert", &old_cert, "--tls-key", &old_key]);
    let out = run_sluice(
        &[
            "jobs",
            "--coordinator",
            &format!("https://{old_http}"),
            "--ca",
            &ca_pem,
        ],
        root,
    );
    out.assert_code(1);
    out.assert_stderr_contains("certificate expired");
    // A key that does not fit the certificate stops the coordinator at start.
    let out = run_sluice(
        &[
            "coordinator",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--tls-cert",
            &server_cert,
            "--tls-key",
            &client_key,
        ],
        root,
    );
    out.assert_code(2);
    out.assert_stderr_contains("the key does not fit the certificate");
}

#[test]
fn grpc_between_roles_runs_over_mutual_tls_with_the_same_results() {
    let dir = tempdir();
    let root = dir.path();
    let ca = TestCa::new("cluster CA");
    let ca_pem = ca.write(root, "ca.pem");
    let (cert, key) = ca.sign(root, "host", false);
    let job = |out: &Path| {
        format!(
            "name: tls\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
             state: {{ backend: remote }}\n\
             source:\n  nexmark: {{ stream: bid, events: 50000, seed: 3 }}\n\
             watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
             pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 2s }}\n    \
             aggregate: [\"count(*) AS bids\"]\n\
             sink:\n  file: {{ path: {}, format: jsonl }}\n",
            out.display()
        )
    };
    // Worker processes, the embedded coordinator and the embedded state service all
    // talk gRPC over mutual TLS with these files.
    let out = root.join("tls-out");
    let file = write_job(root, "tls.yaml", &job(&out));
    let tls = [
        ("SLUICE_TLS_CA", ca_pem.as_str()),
        ("SLUICE_TLS_CERT", cert.as_str()),
        ("SLUICE_TLS_KEY", key.as_str()),
    ];
    run_sluice_env(
        &["run", file.to_str().unwrap(), "--workers", "2"],
        root,
        &tls,
    )
    .assert_success()
    .assert_no_panic();
    let plain = root.join("plain-out");
    let file = write_job(root, "plain.yaml", &job(&plain));
    run_sluice(&["run", file.to_str().unwrap(), "--workers", "2"], root).assert_success();
    sluice_integration_tests::assert_same_rows(
        "over TLS vs. plain",
        &sluice_integration_tests::read_jsonl_dir(&out),
        &sluice_integration_tests::read_jsonl_dir(&plain),
    );
    // A certificate for another address is named as the reason, at once.
    let (wrong_cert, wrong_key) = ca.sign_for(root, "elsewhere", "10.9.9.9", false);
    let out = run_sluice_env(
        &["run", file.to_str().unwrap(), "--workers", "2"],
        root,
        &[
            ("SLUICE_TLS_CA", ca_pem.as_str()),
            ("SLUICE_TLS_CERT", wrong_cert.as_str()),
            ("SLUICE_TLS_KEY", wrong_key.as_str()),
        ],
    );
    out.assert_code(1);
    out.assert_stderr_contains("certificate not valid for name \"127.0.0.1\"");
    // Half a configuration is refused at start.
    let out = run_sluice_env(&["run", file.to_str().unwrap()], root, &tls[..1]);
    out.assert_code(2);
    out.assert_stderr_contains("SLUICE_TLS_CA, SLUICE_TLS_CERT and SLUICE_TLS_KEY go together");
}
