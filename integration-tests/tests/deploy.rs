//! `sluice deploy` against real OpenSSH servers: three "hosts" on this machine, each an
//! `sshd` of Debian's `openssh-server` on its own loopback address (127.0.0.2-4) and
//! port, with its own install directory. The deploy command drives the real `ssh`
//! client with a config file of the test's (its key, its known_hosts), exactly as a user's
//! `~/.ssh/config` would. Roles run as plain processes (`service: process`): no systemd
//! runs here.
//!
//! `scripts/test` installs the server (without starting it) and exports
//! `SLUICE_TEST_SSHD`; each test starts its own servers on 127.0.0.x only and stops
//! them, and every process a test's deploy started, when it ends.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_integration_tests::procs::Proc;
use sluice_integration_tests::{
    Outcome, assert_same_rows, read_jsonl_dir, run_sluice, run_sluice_env, sluice_bin, tempdir,
    write_job, yaml_path,
};
use sluice_test_support::s3::s3_env;

/// SSH servers standing in for hosts, and everything started under their directory.
struct Hosts {
    dir: PathBuf,
    sshd: Vec<Child>,
    /// `(address, port)` per host.
    addrs: Vec<(String, u16)>,
    ssh_config: PathBuf,
}

fn sshd_binary() -> PathBuf {
    let path = std::env::var("SLUICE_TEST_SSHD").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_SSHD is not set: run the tests through scripts/test, which installs \
             Debian's openssh-server and exports it"
        )
    });
    PathBuf::from(path)
}

fn free_port_on(address: &str) -> u16 {
    TcpListener::bind((address, 0))
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("binding a port on {address}: {e}"))
        .port()
}

/// A port free on every one of `addresses` (etcd's one client port for all members).
fn free_port_on_all(addresses: &[&str]) -> u16 {
    for _ in 0..50 {
        let port = free_port_on(addresses[0]);
        if addresses[1..]
            .iter()
            .all(|a| TcpListener::bind((*a, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no port free on all of {addresses:?} in 50 tries")
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("running ssh-keygen");
    assert!(status.success(), "ssh-keygen failed");
}

impl Hosts {
    /// Starts an sshd on each of `addresses` accepting the test's client key.
    fn start(dir: &Path, addresses: &[&str]) -> Hosts {
        let sshd = sshd_binary();
        let ssh = dir.join("ssh");
        std::fs::create_dir_all(&ssh).unwrap();
        keygen(&ssh.join("client_key"));
        keygen(&ssh.join("host_key"));
        std::fs::copy(ssh.join("client_key.pub"), ssh.join("authorized_keys")).unwrap();
        // Privilege separation needs its empty directory when sshd runs as root.
        let _ = std::fs::create_dir_all("/run/sshd");
        let mut hosts = Hosts {
            dir: dir.to_path_buf(),
            sshd: Vec::new(),
            addrs: Vec::new(),
            ssh_config: ssh.join("config"),
        };
        for (i, address) in addresses.iter().enumerate() {
            let port = free_port_on(address);
            let config = ssh.join(format!("sshd_config_{i}"));
            std::fs::write(
                &config,
                format!(
                    "ListenAddress {address}:{port}\nHostKey {key}\nAuthorizedKeysFile {auth}\n\
                     PidFile {pid}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n",
                    key = ssh.join("host_key").display(),
                    auth = ssh.join("authorized_keys").display(),
                    pid = ssh.join(format!("sshd_{i}.pid")).display(),
                ),
            )
            .unwrap();
            let child = Command::new(&sshd)
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(
                    std::fs::File::create(ssh.join(format!("sshd_{i}.log")))
                        .map(Stdio::from)
                        .unwrap_or_else(|_| Stdio::null()),
                )
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", sshd.display()));
            hosts.sshd.push(child);
            hosts.addrs.push((address.to_string(), port));
        }
        std::fs::write(
            &hosts.ssh_config,
            format!(
                "Host 127.0.0.*\n  IdentityFile {key}\n  IdentitiesOnly yes\n  \
                 UserKnownHostsFile {known}\n  StrictHostKeyChecking accept-new\n  LogLevel ERROR\n",
                key = ssh.join("client_key").display(),
                known = ssh.join("known_hosts").display(),
            ),
        )
        .unwrap();
        for (address, port) in &hosts.addrs {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect((address.as_str(), *port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "sshd on {address}:{port} did not start"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        hosts
    }

    /// `sluice deploy ARGS FILE --ssh-config ...` in the test directory.
    fn deploy(&self, args: &[&str], file: &Path) -> Outcome {
        let config = self.ssh_config.display().to_string();
        let file = file.display().to_string();
        let mut all: Vec<&str> = vec!["deploy"];
        all.extend_from_slice(args);
        all.extend([file.as_str(), "--ssh-config", config.as_str()]);
        run_sluice(&all, &self.dir)
    }

    /// Processes started from this test's directory (roles a deploy left running).
    fn processes(&self) -> Vec<(u32, String)> {
        let needle = format!("{}/", self.dir.display());
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // Sluice's roles run from a release; the etcd members deploy runs are
            // known by their cluster token.
            if cmdline.contains(&needle)
                && (cmdline.contains("/releases/") || cmdline.contains("--initial-cluster-token"))
            {
                found.push((pid, cmdline));
            }
        }
        found
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for (pid, _) in self.processes() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        for child in &mut self.sshd {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The windowed job of the coordinator tests: exactly-once file output, remote state,
/// checkpoints every 500 ms; throttled so that it is still running while deploy
/// upgrades the cluster under it.
fn job(out: &Path, backend: &str, rate: u64) -> String {
    format!(
        "name: deployed\nparallelism: 2\ncheckpoint: {{ interval: 500ms }}\n\
         state: {{ backend: {backend} }}\n\
         source:\n  nexmark: {{ stream: bid, events: 240000, seed: 5, splits: 4, max_events_per_second: {rate} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 4s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 2s }}\n    \
         aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n\
         sink:\n  file: {{ path: {}, format: jsonl }}\n",
        yaml_path(out)
    )
}

/// `sluice ARGS --coordinator REST` with the cluster's token and CA (the files the
/// first deploy made beside the cluster file, in `dir`).
fn client(rest: &str, dir: &Path, args: &[&str]) -> Outcome {
    let token = std::fs::read_to_string(dir.join("it.token")).unwrap();
    let ca = dir.join("it.tls/ca.pem");
    let mut all = args.to_vec();
    all.extend(["--coordinator", rest]);
    run_sluice_env(
        &all,
        dir,
        &[
            ("SLUICE_TOKEN", token.trim()),
            ("SLUICE_CA", ca.to_str().unwrap()),
        ],
    )
}

/// Polls job `id` until `done` says so, for at most `limit`.
fn wait_for(
    (rest, dir): (&str, &Path),
    id: &str,
    limit: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let out = client(rest, dir, &["status", id, "--json"]);
        let s: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: {what} not within {limit:?}: {s}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn line_after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.split_once(marker).map(|(_, rest)| rest.trim()))
}

/// The deployed cluster's object store: the test S3 server's bucket (with the
/// variables roles need for it), or a directory every "host" here shares.
fn object_store(root: &Path, test: &str) -> (String, Vec<(String, String)>) {
    match s3_env(test, "the object store of a deployed cluster") {
        Some(s3) => (
            s3.url(),
            vec![
                ("AWS_ENDPOINT_URL".to_string(), s3.endpoint.clone()),
                ("AWS_ALLOW_HTTP".into(), "true".into()),
                ("AWS_REGION".into(), "us-east-1".into()),
                (
                    "AWS_ACCESS_KEY_ID".into(),
                    std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default(),
                ),
                (
                    "AWS_SECRET_ACCESS_KEY".into(),
                    std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default(),
                ),
            ],
        ),
        None => (format!("file://{}/store", root.display()), Vec::new()),
    }
}

impl Hosts {
    /// Host `i` as a cluster file entry named `name`, installed under the test's
    /// directory.
    fn entry(&self, name: &str, i: usize) -> String {
        let (address, port) = &self.addrs[i];
        format!(
            "  {name}: {{ address: {address}, port: {port}, user: {user}, install_dir: {dir} }}\n",
            user = std::env::var("USER").unwrap_or_else(|_| "root".into()),
            dir = self.dir.join(name).display()
        )
    }
}

#[test]
fn deploy_runs_a_job_upgrades_under_it_and_destroys_on_three_ssh_hosts() {
    let dir = tempdir();
    let root = dir.path();
    let hosts = Hosts::start(root, &["127.0.0.2", "127.0.0.3", "127.0.0.4"]);
    let (store, env) = object_store(root, "deploy");
    let secret = "do-not-print-this-token-7f3a";
    let mut env_yaml = format!("  SLUICE_TEST_SECRET: {secret}\n");
    for (k, v) in &env {
        env_yaml.push_str(&format!("  {k}: \"{v}\"\n"));
    }
    let (http, grpc, state_port) = (
        free_port_on("127.0.0.2"),
        free_port_on("127.0.0.2"),
        free_port_on("127.0.0.3"),
    );
    let host = |name: &str, i: usize| hosts.entry(name, i);
    let cluster = root.join("cluster.yaml");
    std::fs::write(
        &cluster,
        format!(
            "name: it\nobject_store: {store}\nservice: process\nenv:\n{env_yaml}hosts:\n{}{}{}\
             coordinator: {{ host: a, http: {http}, grpc: {grpc} }}\n\
             state_nodes: [{{ host: b, port: {state_port}, memory: 256MiB, disk_cache: 512MiB }}]\n\
             workers: [{{ host: b, slots: 2 }}, {{ host: c, slots: 2 }}]\n\
             releases: {releases}/{{version}}/sluice\n",
            host("a", 0),
            host("b", 1),
            host("c", 2),
            releases = root.join("releases").display(),
        ),
    )
    .unwrap();
    let rest = format!("https://127.0.0.2:{http}");

    let started = Instant::now();
    let up = hosts.deploy(&[], &cluster);
    up.assert_success().assert_no_panic();
    eprintln!(
        "deploy took {:.1} s:\n{}{}",
        started.elapsed().as_secs_f64(),
        up.stderr,
        up.stdout
    );
    assert!(
        up.stdout.contains(&format!("is up: REST API {rest}")),
        "{}",
        up.stdout
    );
    let again = hosts.deploy(&[], &cluster);
    again.assert_success();
    assert!(
        again.stdout.contains("nothing to change"),
        "a second deploy changes nothing:\n{}{}",
        again.stderr,
        again.stdout
    );
    let report = hosts.deploy(&["status"], &cluster);
    report.assert_success();
    assert_eq!(
        report.stdout.matches(" running ").count(),
        4,
        "{}",
        report.stdout
    );
    assert_eq!(
        report.stdout.matches("sees it").count(),
        4,
        "{}",
        report.stdout
    );
    // The first deploy made an operator token, kept here; the REST API needs it.
    let token_file = root.join("it.token");
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o077, 0, "the token file is its owner's only");
    // The REST API speaks only TLS, with a certificate of the cluster's CA, and wants
    // the token.
    let ca = root.join("it.tls/ca.pem");
    let refused = run_sluice(&["jobs", "--coordinator", &rest], root);
    refused.assert_code(2);
    refused.assert_stderr_contains("an https:// coordinator needs --ca");
    let plain = run_sluice(
        &["jobs", "--coordinator", &rest.replace("https", "http")],
        root,
    );
    plain.assert_code(1);
    let refused = run_sluice(
        &["jobs", "--coordinator", &rest, "--ca", ca.to_str().unwrap()],
        root,
    );
    refused.assert_code(2);
    refused.assert_stderr_contains("needs a bearer token");
    let api = (rest.as_str(), root);
    let env_file = root.join("a/etc/sluice-it-coordinator.env");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&env_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o077, 0, "the environment file is its owner's only");

    // gRPC between roles is mutual TLS: a process without the cluster's certificate
    // cannot join as a worker (before, any process could attach and be sent jobs).
    let grpc_url = format!("http://127.0.0.2:{grpc}");
    let mut stranger = Proc::start(
        &["worker", "--coordinator", &grpc_url, "--host", "127.0.0.9"],
        root,
    );
    std::thread::sleep(Duration::from_secs(3));
    let cluster_now = client(&rest, root, &["cluster", "--json"]);
    cluster_now.assert_success();
    assert!(
        !cluster_now.stdout.contains("127.0.0.9"),
        "a worker without the cluster's certificate attached: {}",
        cluster_now.stdout
    );
    stranger.kill();
    eprintln!(
        "the stranger worker said: {}",
        stranger.output().lines().last().unwrap_or("")
    );

    // A job with remote state on the deployed cluster, upgraded under it.
    let out = root.join("out");
    let job_file = write_job(root, "job.yaml", &job(&out, "remote", 8000));
    let submitted = client(
        &rest,
        root,
        &["submit", job_file.to_str().unwrap(), "--workers", "2"],
    );
    submitted.assert_success();
    let id = submitted.stdout.trim().to_string();
    wait_for(api, &id, Duration::from_secs(60), "a checkpoint", |s| {
        s["last_checkpoint"].as_u64() >= Some(2)
    });
    // The next release, where the cluster file's `releases` says release `next` lies.
    let new_binary = root.join("releases/next/sluice");
    std::fs::create_dir_all(new_binary.parent().unwrap()).unwrap();
    std::fs::copy(sluice_bin(), &new_binary).unwrap();
    // The same program with a different checksum: a release deploy has not seen.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&new_binary)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"next"))
        .unwrap();
    let started = Instant::now();
    let upgraded = hosts.deploy(&["upgrade", "--version", "next"], &cluster);
    upgraded.assert_success().assert_no_panic();
    assert!(
        upgraded.stderr.contains("release next: "),
        "{}",
        upgraded.stderr
    );
    eprintln!(
        "upgrade took {:.1} s:\n{}{}",
        started.elapsed().as_secs_f64(),
        upgraded.stderr,
        upgraded.stdout
    );
    let resumed = line_after(&upgraded.stderr, "resumed as ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no resumed job in:\n{}", upgraded.stderr))
        .to_string();
    let finished = wait_for(api, &resumed, Duration::from_secs(120), "finishing", |s| {
        s["state"] == "finished" || s["state"] == "failed"
    });
    assert_eq!(finished["state"], "finished", "{finished}");
    let report = hosts.deploy(&["status"], &cluster);
    report.assert_success();
    assert_eq!(
        report.stdout.matches(" running ").count(),
        4,
        "{}",
        report.stdout
    );
    for output in [&up, &again, &report, &upgraded] {
        for secret in [secret, token.as_str()] {
            assert!(
                !output.stdout.contains(secret) && !output.stderr.contains(secret),
                "a secret was printed"
            );
        }
    }

    // The output equals a run without deploy or upgrade.
    let reference = root.join("reference");
    let reference_job = write_job(root, "reference.yaml", &job(&reference, "memory", 0));
    run_sluice_env(&["run", reference_job.to_str().unwrap()], root, &[]).assert_success();
    assert_same_rows(
        "the upgraded cluster's committed output vs. a run without it",
        &read_jsonl_dir(&out),
        &read_jsonl_dir(&reference),
    );

    let destroyed = hosts.deploy(&["destroy"], &cluster);
    destroyed.assert_success();
    assert!(
        hosts.processes().is_empty(),
        "left running: {:?}",
        hosts.processes()
    );
    for name in ["a", "c"] {
        let left: Vec<_> = std::fs::read_dir(root.join(name))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "host {name} keeps {left:?}");
    }
    assert!(
        root.join("b/data/state").is_dir(),
        "data directories stay without --purge"
    );
    let report = hosts.deploy(&["status"], &cluster);
    report.assert_code(1);
    assert_eq!(
        report.stdout.matches(" stopped ").count(),
        4,
        "{}",
        report.stdout
    );
    hosts
        .deploy(&["destroy", "--purge"], &cluster)
        .assert_success();
    assert!(
        !root.join("b/data").exists(),
        "--purge removes data directories"
    );
}

#[test]
fn deploy_refuses_hosts_it_cannot_use_and_starts_nothing() {
    let dir = tempdir();
    let root = dir.path();
    let hosts = Hosts::start(root, &["127.0.0.5"]);
    let (address, port) = hosts.addrs[0].clone();
    let closed = free_port_on("127.0.0.6");
    let cluster = |b_address: &str, b_port: u16, service: &str| {
        let path = root.join("cluster.yaml");
        std::fs::write(
            &path,
            format!(
                "name: bad\nobject_store: file://{root}/store\nservice: {service}\nhosts:\n  \
                 a: {{ address: {address}, port: {port}, install_dir: {root}/a }}\n  \
                 b: {{ address: {b_address}, port: {b_port}, install_dir: {root}/b }}\n\
                 coordinator: {{ host: a, http: {http} }}\nworkers: [{{ host: b }}]\n",
                root = root.display(),
                http = free_port_on(&address),
            ),
        )
        .unwrap();
        path
    };
    // A host nothing answers on: named, with the step, and no role starts anywhere.
    let out = hosts.deploy(&[], &cluster("127.0.0.6", closed, "process"));
    out.assert_code(1).assert_no_panic();
    out.assert_stderr_contains("nothing was started");
    out.assert_stderr_contains("host b (127.0.0.6): checking the host: cannot connect over SSH");
    assert!(
        hosts.processes().is_empty(),
        "started: {:?}",
        hosts.processes()
    );

    // A key the host does not accept.
    let other = root.join("ssh/other_key");
    keygen(&other);
    let config = std::fs::read_to_string(&hosts.ssh_config)
        .unwrap()
        .replace("client_key", "other_key");
    let bad_config = root.join("ssh/config-other-key");
    std::fs::write(&bad_config, config).unwrap();
    let file = cluster(&address, port, "process");
    let out = run_sluice(
        &[
            "deploy",
            file.to_str().unwrap(),
            "--ssh-config",
            bad_config.to_str().unwrap(),
        ],
        root,
    );
    out.assert_code(1);
    out.assert_stderr_contains(&format!(
        "host a ({address}): checking the host: cannot connect over SSH"
    ));
    out.assert_stderr_contains("Permission denied (publickey)");

    // A host without systemd, asked to run roles under it.
    if !Path::new("/run/systemd/system").exists() {
        let out = hosts.deploy(&[], &cluster(&address, port, "systemd"));
        out.assert_code(1);
        out.assert_stderr_contains("systemd is not running there");
        out.assert_stderr_contains("`service: process`");
    }
    assert!(
        hosts.processes().is_empty(),
        "started: {:?}",
        hosts.processes()
    );

    // The good cluster file with `from` replaced by `to`.
    let edited = |from: &str, to: &str| {
        let file = cluster(&address, port, "process");
        let text = std::fs::read_to_string(&file).unwrap().replace(from, to);
        std::fs::write(&file, text).unwrap();
        file
    };
    // An etcd member on a host without that etcd: named before anything starts.
    let file = edited(
        "coordinator: {",
        "etcd: { hosts: [a], binary: /nonexistent/etcd }\ncoordinator: {",
    );
    let out = hosts.deploy(&[], &file);
    out.assert_code(1).assert_no_panic();
    out.assert_stderr_contains(&format!(
        "host a ({address}): checking the host: it runs an etcd member and `/nonexistent/etcd --version` does not answer there"
    ));
    assert!(
        hosts.processes().is_empty(),
        "started: {:?}",
        hosts.processes()
    );

    // A binary for another architecture: the host is named, nothing is copied.
    let foreign = root.join("sluice-aarch64");
    let mut bytes = std::fs::read(sluice_bin()).unwrap();
    bytes[18..20].copy_from_slice(&0xb7u16.to_le_bytes());
    std::fs::write(&foreign, bytes).unwrap();
    let file = cluster(&address, port, "process");
    let out = hosts.deploy(&["--binary", foreign.to_str().unwrap()], &file);
    out.assert_code(1).assert_no_panic();
    out.assert_stderr_contains(&format!(
        "host a ({address}): checking the host: it runs Linux on {}; this binary is for Linux on aarch64",
        std::env::consts::ARCH
    ));
    let sum = Command::new("sha256sum").arg(&foreign).output().unwrap();
    let sha = String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    for host in ["a", "b"] {
        assert!(
            !root.join(host).join("releases").join(&sha).exists(),
            "the foreign binary was copied to host {host}"
        );
    }
    // A release the cluster file's `releases` does not hold.
    let file = edited(
        "workers: [{ host: b }]",
        &format!(
            "workers: [{{ host: b }}]\nreleases: {}/r/{{version}}/sluice",
            root.display()
        ),
    );
    let out = hosts.deploy(&["upgrade", "--version", "7.0"], &file);
    out.assert_code(2).assert_no_panic();
    out.assert_stderr_contains(&format!(
        "release 7.0: {}/r/7.0/sluice is not a file (from `releases` in the cluster file)",
        root.display()
    ));

    // Two roles on one port: the cluster file's line and column, before any SSH.
    let file = edited(
        "workers: [{ host: b }]",
        "workers: [{ host: b }]\nstate_nodes: [{ host: a, port: 6123 }]",
    );
    let out = hosts.deploy(&[], &file);
    out.assert_code(2);
    out.assert_stderr_contains("cluster.yaml:9:32: port 6123 on host a (127.0.0.5) is already taken by `coordinator.grpc (default 6123)`");
}

#[test]
fn two_deployed_coordinators_elect_a_leader_and_a_job_outlives_it() {
    let dir = tempdir();
    let root = dir.path();
    let addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let hosts = Hosts::start(root, &addresses);
    // Deploy runs the etcd the coordinators elect through: a member on each host,
    // over mutual TLS with the cluster's certificates.
    let etcd_binary = std::env::var("SLUICE_TEST_ETCD").unwrap_or_else(|_| "etcd".into());
    let (etcd_client, etcd_peer) = (free_port_on_all(&addresses), free_port_on_all(&addresses));
    let (store, env) = object_store(root, "deploy-ha");
    let env_yaml: String = env
        .iter()
        .map(|(k, v)| format!("  {k}: \"{v}\"\n"))
        .collect();
    let ports: Vec<u16> = [
        "127.0.0.2",
        "127.0.0.2",
        "127.0.0.3",
        "127.0.0.3",
        "127.0.0.4",
    ]
    .iter()
    .map(|a| free_port_on(a))
    .collect();
    let cluster = root.join("cluster.yaml");
    std::fs::write(
        &cluster,
        format!(
            "name: it\nobject_store: {store}\nservice: process\nenv:\n  SLUICE_TEST: ha\n{env_yaml}hosts:\n{}{}{}\
             coordinators:\n  - {{ host: a, http: {}, grpc: {} }}\n  - {{ host: b, http: {}, grpc: {} }}\n\
             etcd: {{ hosts: [a, b, c], client_port: {etcd_client}, peer_port: {etcd_peer}, binary: {etcd_binary} }}\n\
             state_nodes: [{{ host: c, port: {}, memory: 256MiB, disk_cache: 512MiB }}]\n\
             workers: [{{ host: b, slots: 1 }}]\nworker_join: true\n",
            hosts.entry("a", 0),
            hosts.entry("b", 1),
            hosts.entry("c", 2),
            ports[0],
            ports[1],
            ports[2],
            ports[3],
            ports[4],
        ),
    )
    .unwrap();
    let up = hosts.deploy(&[], &cluster);
    up.assert_success().assert_no_panic();
    let rest = format!(
        "https://127.0.0.2:{},https://127.0.0.3:{}",
        ports[0], ports[2]
    );
    assert!(
        up.stdout
            .contains(&format!("is up: REST API {rest} (2 coordinators")),
        "{}",
        up.stdout
    );
    let report = hosts.deploy(&["status"], &cluster);
    report.assert_success();
    assert_eq!(
        report.stdout.matches("sees it").count(),
        4,
        "{}",
        report.stdout
    );
    assert_eq!(
        report.stdout.matches("healthy").count() - report.stdout.matches("unhealthy").count(),
        3,
        "three etcd members: {}",
        report.stdout
    );

    // A worker deploy was not given (an auto-scaled one) joins with the join token:
    // a coordinator signs it a certificate for its address, and the job's second slot
    // is its, so records cross between it and the deployed worker over mutual TLS.
    let grpc = format!(
        "https://127.0.0.2:{},https://127.0.0.3:{}",
        ports[1], ports[3]
    );
    let join_args = |token_file: &str| {
        vec![
            "worker".to_string(),
            "--coordinator".into(),
            grpc.clone(),
            "--host".into(),
            "127.0.0.4".into(),
            "--listen".into(),
            "127.0.0.4:0".into(),
            "--join".into(),
            rest.clone(),
            "--join-token-file".into(),
            token_file.into(),
            "--join-ca".into(),
            root.join("it.tls/ca.pem").display().to_string(),
        ]
    };
    let wrong = root.join("wrong-token");
    std::fs::write(&wrong, "0".repeat(64)).unwrap();
    let refused = run_sluice(
        &join_args(wrong.to_str().unwrap())
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        root,
    );
    refused.assert_code(1).assert_no_panic();
    refused.assert_stderr_contains("joining the cluster at");
    refused.assert_stderr_contains("the bearer token is not valid here");
    let token_file = root.join("it.join-token");
    let args = join_args(token_file.to_str().unwrap());
    let mut joined = Proc::start(&args.iter().map(String::as_str).collect::<Vec<_>>(), root);
    joined.wait_for_line("joined the cluster at", Duration::from_secs(30));

    let out = root.join("out");
    let job_file = write_job(root, "job.yaml", &job(&out, "remote", 10000));
    let submitted = client(
        &rest,
        root,
        &["submit", job_file.to_str().unwrap(), "--workers", "2"],
    );
    submitted.assert_success();
    let id = submitted.stdout.trim().to_string();
    wait_for(
        (&rest, root),
        &id,
        Duration::from_secs(60),
        "a checkpoint",
        |s| s["last_checkpoint"].as_u64() >= Some(2),
    );
    // Kill the leader: the standby takes over and the job carries on from its newest
    // checkpoint with the same workers and state node.
    let view = client(&rest, root, &["cluster", "--json"]);
    let view: Value = serde_json::from_str(&view.stdout).unwrap_or(Value::Null);
    let leader = view["coordinators"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["role"] == "leader"))
        .and_then(|c| c["id"].as_str())
        .unwrap_or_else(|| panic!("no leader in {view}"))
        .to_string();
    let victim = hosts
        .processes()
        .into_iter()
        .find(|(_, cmd)| {
            cmd.contains(" coordinator ") && cmd.contains(&format!("--ha-id {leader} "))
        })
        .unwrap_or_else(|| panic!("the leader {leader}'s process"));
    eprintln!(
        "killing the leading coordinator {leader} (pid {})",
        victim.0
    );
    let _ = Command::new("kill")
        .args(["-9", &victim.0.to_string()])
        .status();
    let finished = wait_for(
        (&rest, root),
        &id,
        Duration::from_secs(180),
        "finishing",
        |s| s["state"] == "finished" || s["state"] == "failed",
    );
    assert_eq!(finished["state"], "finished", "{finished}");
    let reference = root.join("reference");
    let reference_job = write_job(root, "reference.yaml", &job(&reference, "memory", 0));
    run_sluice(&["run", reference_job.to_str().unwrap()], root).assert_success();
    assert_same_rows(
        "the output of a job whose leading coordinator was killed vs. a run without",
        &read_jsonl_dir(&out),
        &read_jsonl_dir(&reference),
    );
    // Deploy again: only the killed coordinator is started.
    let again = hosts.deploy(&[], &cluster);
    again.assert_success();
    assert!(
        again.stdout.contains("1 changes"),
        "{}{}",
        again.stderr,
        again.stdout
    );
    joined.kill();
    hosts
        .deploy(&["destroy", "--purge"], &cluster)
        .assert_success();
    assert!(
        hosts.processes().is_empty(),
        "left running: {:?}",
        hosts.processes()
    );
}
