//! `sluice deploy`: a cluster file's roles brought up on its hosts over SSH, checked,
//! reported and removed.
//!
//! `sluice deploy [cluster.yaml]` checks every host first (SSH reaches it, its OS and
//! CPU run this binary, its service manager is there), copies the binary where that
//! checksum is missing, then starts the roles in dependency order (coordinator, state
//! nodes, workers), each restarted only when what it runs as changed, and waits for
//! each to be healthy: the coordinator answering its REST API, state nodes and workers
//! registered with it under the process ids that were started. A second run with
//! nothing changed touches nothing and says so. `status` reports every role; `destroy`
//! stops them and removes what deploy installed (data directories only with `--purge`).
//!
//! This module owns the order and the checks; [`role`] renders what runs, [`ssh`]
//! reaches hosts, [`progress`] shows the step under way. It must not know job internals: health comes from the coordinator's
//! REST API as any client sees it.

mod pki;
mod progress;
mod release;
mod role;
mod ssh;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::Value;

use sluice_common::outln;
use sluice_planner::cluster_file::{ClusterSpec, HostSpec, ServiceManager, parse_cluster};

use crate::cluster::client::{Credentials, call_any};
use crate::{Failure, runtime};
use pki::Pki;
use progress::{Progress, doing, say};
use role::{Extras, Kind, Role, TlsMaterial, join_host_port, roles};
use ssh::{Input, Ssh, quote};

/// Arguments of `sluice deploy`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DeployArgs {
    #[command(subcommand)]
    action: Option<DeployAction>,
    #[command(flatten)]
    up: UpArgs,
}

#[derive(Subcommand)]
enum DeployAction {
    /// Replace the binary on every host: running jobs stop with a savepoint, roles
    /// restart on the new binary in dependency order, the jobs resume from their
    /// savepoints.
    Upgrade(UpArgs),
    /// Read the cluster file and print what deploy would run where, without
    /// connecting anywhere.
    Check {
        #[command(flatten)]
        common: Common,
        /// Also write the systemd units deploy would install, as `DIR/<host>/<unit>`.
        #[arg(long, value_name = "DIR")]
        write_units: Option<PathBuf>,
        /// The binary the units would run (default: this `sluice`).
        #[arg(long)]
        binary: Option<PathBuf>,
    },
    /// Every role of the cluster: running or not, its pid and version, and whether the
    /// coordinator sees it (an etcd member: whether it answers healthy); exit code 1
    /// when one is not healthy.
    Status(Common),
    /// Stop every role and remove what deploy installed; data directories stay unless
    /// `--purge`.
    Destroy {
        #[command(flatten)]
        common: Common,
        /// Also remove data directories (state nodes' RocksDB and caches).
        #[arg(long)]
        purge: bool,
    },
}

/// The cluster file and how to reach its hosts.
#[derive(Args)]
struct Common {
    /// The cluster file.
    #[arg(default_value = "cluster.yaml")]
    file: PathBuf,
    /// An OpenSSH config file to use instead of `~/.ssh/config` (`ssh -F`).
    #[arg(long)]
    ssh_config: Option<PathBuf>,
    /// The cluster's operator token for its REST API: made by the first deploy, read
    /// by the other commands (default: `<name>.token` beside the cluster file).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

#[derive(Args)]
struct UpArgs {
    #[command(flatten)]
    common: Common,
    /// The binary to install (default: the cluster file's `version`, else this `sluice`).
    #[arg(long, conflicts_with = "version")]
    binary: Option<PathBuf>,
    /// The release to install, fetched from the cluster file's `releases` (default: its
    /// `version`).
    #[arg(long)]
    version: Option<String>,
    /// How long each role may take to become healthy, in seconds.
    #[arg(long, default_value_t = 60)]
    health_timeout: u64,
}

/// Runs `sluice deploy`.
pub fn run(args: DeployArgs) -> Result<(), Failure> {
    let _progress = Progress::start();
    match args.action {
        None => up(args.up),
        Some(DeployAction::Upgrade(args)) => upgrade(args),
        Some(DeployAction::Check {
            common,
            write_units,
            binary,
        }) => check(common, write_units, binary),
        Some(DeployAction::Status(common)) => status(common),
        Some(DeployAction::Destroy { common, purge }) => destroy(common, purge),
    }
}

/// A cluster file read and checked, and an SSH client for its hosts.
struct Session {
    cluster: ClusterSpec,
    ssh: Ssh,
    /// The operator token of the cluster's REST API (empty until one is made).
    token: String,
    /// Where it is kept on this machine.
    token_file: PathBuf,
    /// The cluster's CA and the coordinator's certificate (`<name>.tls/` beside the
    /// cluster file), once a deploy made them.
    pki: Option<Pki>,
    pki_dir: PathBuf,
    /// The token workers not listed join with (`worker_join: true`; empty until made).
    join_token: String,
    join_token_file: PathBuf,
}

impl Session {
    fn open(common: &Common) -> Result<Session, Failure> {
        let name = common.file.display().to_string();
        let text = std::fs::read_to_string(&common.file)
            .map_err(|e| Failure::usage(format!("cannot read cluster file {name}: {e}")))?;
        let cluster = parse_cluster(&name, &text).map_err(|e| Failure::usage(e.to_string()))?;
        let ssh = Ssh::new(common.ssh_config.clone())
            .map_err(|e| Failure::from(anyhow::anyhow!("temporary directory: {e}")))?;
        let token_file = common.token_file.clone().unwrap_or_else(|| {
            common
                .file
                .with_file_name(format!("{}.token", cluster.name))
        });
        let token = std::fs::read_to_string(&token_file)
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        let pki_dir = common.file.with_file_name(format!("{}.tls", cluster.name));
        let join_token_file = common
            .file
            .with_file_name(format!("{}.join-token", cluster.name));
        let join_token = std::fs::read_to_string(&join_token_file)
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        Ok(Session {
            join_token,
            join_token_file,
            pki: Pki::existing(&pki_dir),
            pki_dir,
            cluster,
            ssh,
            token,
            token_file,
        })
    }

    /// Makes the cluster's first operator token when there is none yet, in a file only
    /// this user reads (the coordinator keeps only its hash); with `worker_join`, the
    /// join token too.
    fn ensure_token(&mut self) -> Result<(), Failure> {
        if self.token.is_empty() {
            self.token = new_token_file(&self.token_file, "operator token")?;
            say(&format!(
                "made the cluster's operator token: {} (export SLUICE_TOKEN=$(cat {0}))",
                self.token_file.display()
            ));
        }
        if self.cluster.worker_join && self.join_token.is_empty() {
            self.join_token = new_token_file(&self.join_token_file, "join token")?;
            say(&format!(
                "made the cluster's join token for workers not listed: {} \
                 (sluice worker --join ... --join-token-file)",
                self.join_token_file.display()
            ));
        }
        Ok(())
    }

    /// Makes the cluster's CA when there is none yet.
    fn ensure_pki(&mut self) -> Result<(), Failure> {
        if self.pki.is_none() {
            let pki = Pki::ensure(&self.pki_dir, &self.cluster.name)
                .map_err(|e| Failure::from(anyhow::anyhow!("the cluster's CA: {e}")))?;
            say(&format!(
                "made the cluster's CA: {} (clients trust it with --ca or SLUICE_CA)",
                pki.ca().display()
            ));
            self.pki = Some(pki);
        }
        Ok(())
    }

    /// What roles are given: the operator token's hash for the coordinator, and the
    /// CA with each host's certificate.
    fn extras(&self) -> Result<Extras, Failure> {
        let mut extras = Extras::default();
        if !self.token.is_empty() {
            extras.tokens = format!(
                "operate {} deploy\n",
                sluice_coordinator::auth::hash_line(&self.token)
            );
        }
        if self.cluster.worker_join && !self.join_token.is_empty() {
            extras.tokens.push_str(&format!(
                "join {} workers\n",
                sluice_coordinator::auth::hash_line(&self.join_token)
            ));
        }
        if let Some(pki) = &self.pki {
            let mut tls = TlsMaterial {
                ca: std::fs::read_to_string(pki.ca())
                    .map_err(|e| Failure::from(anyhow::anyhow!("{}: {e}", pki.ca().display())))?,
                ..TlsMaterial::default()
            };
            for host in &self.cluster.hosts {
                let mut names = vec![host.bind.clone()];
                if host.address != host.bind {
                    names.push(host.address.clone());
                }
                // A host on a loopback address other than 127.0.0.1 dials out from
                // 127.0.0.1, and etcd checks a peer's certificate against the address it
                // connects from.
                if host
                    .bind
                    .parse::<std::net::Ipv4Addr>()
                    .is_ok_and(|ip| ip.is_loopback() && ip != std::net::Ipv4Addr::LOCALHOST)
                {
                    names.push("127.0.0.1".into());
                }
                let cert = pki
                    .host(&self.cluster.name, &host.name, &names)
                    .map_err(|e| {
                        Failure::from(anyhow::anyhow!("host {}'s certificate: {e}", host.name))
                    })?;
                tls.hosts.insert(host.name.clone(), (cert.cert, cert.key));
            }
            extras.tls = Some(tls);
            if self.cluster.worker_join {
                let path = pki.ca_key();
                extras.ca_key = Some(
                    std::fs::read_to_string(&path)
                        .map_err(|e| Failure::from(anyhow::anyhow!("{}: {e}", path.display())))?,
                );
            }
        }
        Ok(extras)
    }

    /// The roles, rendered. Status and destroy need only their names and places, so a
    /// certificate that cannot be read there does not stop them.
    fn roles(&self) -> Vec<Role<'_>> {
        roles(&self.cluster, &self.extras().unwrap_or_default())
    }

    /// One REST call to the coordinator with the cluster's token and CA.
    async fn api(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        let credentials = Credentials {
            token: (!self.token.is_empty()).then(|| self.token.clone()),
            ca: self.pki.as_ref().map(Pki::ca),
            ..Credentials::default()
        };
        call_any(method, &self.rest_url(), path, body, &credentials).await
    }

    /// `script` on `host`, failing with the host and the step named.
    fn on(
        &self,
        host: &HostSpec,
        step: &str,
        script: &str,
        input: Input<'_>,
    ) -> Result<String, Failure> {
        self.ssh
            .run(host, script, input)
            .map_err(|reason| step_failed(host, step, &reason))
    }

    /// Every coordinator's REST API, comma-separated: calls go to the first that
    /// serves (a standby refuses and names the leader).
    fn rest_url(&self) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        self.cluster
            .coordinators
            .iter()
            .map(|c| {
                format!(
                    "{scheme}://{}",
                    join_host_port(&self.cluster.hosts[c.host].bind, c.http)
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The pid a role runs under, if it runs.
    fn pid_of(&self, role: &Role<'_>) -> Result<Option<u32>, Failure> {
        let out = self.on(
            role.host,
            "finding the running role",
            &role.find_script(),
            Input::None,
        )?;
        Ok(out.trim().parse().ok().filter(|p| *p != 0))
    }
}

fn step_failed(host: &HostSpec, step: &str, reason: &str) -> Failure {
    Failure::from(anyhow::anyhow!(
        "host {} ({}): {step}: {reason}",
        host.name,
        host.address
    ))
}

fn up(args: UpArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let (session, binary, sha) = begin(&args)?;
    let copied = prepare_all(&session, &binary, &sha)?;
    let rt = runtime()?;
    let changed = copied + roll(&session, &rt, &sha, &args)?;
    summary(&session);
    if changed == 0 {
        outln!("nothing to change: every host held this binary and every role ran as configured");
    } else {
        outln!(
            "{changed} changes in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The session, the binary to install and its checksum.
fn begin(args: &UpArgs) -> Result<(Session, PathBuf, String), Failure> {
    let mut session = Session::open(&args.common)?;
    let binary = binary(&session.cluster, args)?;
    session.ensure_token()?;
    session.ensure_pki()?;
    let sha = sha256_file(&binary)?;
    say(&format!(
        "cluster {} ({} hosts): {} (sha256 {})",
        session.cluster.name,
        session.cluster.hosts.len(),
        binary.display(),
        &sha[..12]
    ));
    Ok((session, binary, sha))
}

/// `--binary`, else the release `--version` or the cluster file's `version` names,
/// else this `sluice`.
fn binary(cluster: &ClusterSpec, args: &UpArgs) -> Result<PathBuf, Failure> {
    if let Some(path) = &args.binary {
        return Ok(path.clone());
    }
    let Some(version) = args.version.as_deref().or(cluster.version.as_deref()) else {
        return std::env::current_exe()
            .map_err(|e| Failure::from(anyhow::anyhow!("finding this binary: {e}")));
    };
    sluice_planner::cluster_file::check_version(version)
        .map_err(|e| Failure::usage(format!("--version: {e}")))?;
    let Some(template) = &cluster.releases else {
        return Err(Failure::usage(format!(
            "--version {version}: the cluster file has no `releases`, the URL or path with \
             {{version}} in it that releases are fetched from"
        )));
    };
    doing(format!("fetching release {version}"));
    let path = release::fetch(template, version)?;
    say(&format!("release {version}: {}", path.display()));
    if let (Some(asked), Some(written)) = (&args.version, &cluster.version)
        && asked != written
    {
        say(&format!(
            "note: the cluster file says `version: {written}`; set it to {asked} there, or the \
             next `sluice deploy` installs {written} again"
        ));
    }
    Ok(path)
}

/// Checks every host that runs a role and installs the binary where it is missing;
/// how many hosts it was copied to. Nothing starts unless every host passes, so a host
/// that cannot take part leaves nothing half-deployed.
fn prepare_all(session: &Session, binary: &Path, sha: &str) -> Result<usize, Failure> {
    let arch = release::elf_arch(binary)
        .map_err(|e| Failure::usage(format!("{}: {e}", binary.display())))?;
    let cluster = &session.cluster;
    let roles = session.roles();
    let used: Vec<&HostSpec> = cluster
        .hosts
        .iter()
        .filter(|h| roles.iter().any(|r| r.host.name == h.name))
        .collect();
    doing(format!(
        "checking {} hosts, copying the binary where it is missing",
        used.len()
    ));
    let prepared: Vec<Result<bool, Failure>> = std::thread::scope(|scope| {
        let handles: Vec<_> = used
            .iter()
            .map(|host| scope.spawn(|| prepare(session, host, binary, arch, sha)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Failure::from(anyhow::anyhow!("a host check panicked")))
                })
            })
            .collect()
    });
    let mut failures = Vec::new();
    let mut copied = 0;
    for (host, result) in used.iter().zip(prepared) {
        match result {
            Ok(true) => {
                copied += 1;
                say(&format!("{}: binary installed", host.name));
            }
            Ok(false) => say(&format!("{}: binary already there", host.name)),
            Err(f) => failures.push(f.message().to_owned()),
        }
    }
    if !failures.is_empty() {
        return Err(Failure::from(anyhow::anyhow!(
            "nothing was started: {}",
            failures.join("\n")
        )));
    }
    Ok(copied)
}

/// Starts, in dependency order, every role not running as configured with binary
/// `sha`, waiting for each to be healthy before the next; how many it (re)started.
fn roll(
    session: &Session,
    rt: &tokio::runtime::Runtime,
    sha: &str,
    args: &UpArgs,
) -> Result<usize, Failure> {
    let rest = session.rest_url();
    let timeout = Duration::from_secs(args.health_timeout);
    let mut changed = 0;
    let extras = session.extras()?;
    let mut members = Vec::new();
    let mut remaining = roles(&session.cluster, &extras).into_iter().peekable();
    while let Some(role) = remaining.next() {
        doing(format!(
            "{}: checking the {}",
            role.host.name,
            role.kind.name()
        ));
        let digest = sha256_bytes(role.fingerprint(sha).as_bytes())?;
        let current = session.on(
            role.host,
            "reading the installed role",
            &role.digest_script(),
            Input::None,
        )?;
        let running = session.pid_of(&role)?;
        let pid = match running {
            Some(pid) if current.trim() == digest => {
                say(&format!(
                    "{}: {} unchanged (pid {pid})",
                    role.host.name,
                    role.kind.name()
                ));
                pid
            }
            _ => {
                changed += 1;
                let what = if running.is_some() {
                    "restarting"
                } else {
                    "starting"
                };
                say(&format!("{}: {what} {}", role.host.name, role.kind.name()));
                doing(format!("{}: {what} {}", role.host.name, role.kind.name()));
                let secrets = role.secret_input();
                let out = session.on(
                    role.host,
                    &format!("installing the {}", role.kind.name()),
                    &role.install_script(sha, &digest),
                    Input::Bytes(secrets.as_bytes()),
                )?;
                match out
                    .trim()
                    .lines()
                    .last()
                    .and_then(|l| l.trim().parse::<u32>().ok())
                {
                    Some(pid) => pid,
                    None => {
                        return Err(role_failed(
                            session,
                            &role,
                            "it exited right after it started",
                        ));
                    }
                }
            }
        };
        // An etcd member alone has no quorum: every member starts before any is
        // waited for.
        members.push((role, pid));
        if members[0].0.kind == Kind::Etcd && remaining.peek().is_some_and(|r| r.kind == Kind::Etcd)
        {
            continue;
        }
        for (role, pid) in members.drain(..) {
            doing(format!(
                "{}: waiting for the {} (pid {pid}) to be healthy",
                role.host.name,
                role.kind.name()
            ));
            rt.block_on(healthy(session, &extras, &role, pid, &rest, timeout))?;
            say(&format!(
                "{}: {} healthy (pid {pid})",
                role.host.name,
                role.kind.name()
            ));
        }
    }
    Ok(changed)
}

fn summary(session: &Session) {
    let cluster = &session.cluster;
    let slots: u32 = cluster.workers.iter().map(|w| w.slots).sum();
    outln!(
        "cluster {} is up: REST API {} ({} coordinators, {} state nodes, {} workers with {slots} slots)",
        cluster.name,
        session.rest_url(),
        cluster.coordinators.len(),
        cluster.state_nodes.len(),
        cluster.workers.len(),
    );
}

/// `sluice deploy upgrade`: every running job stopped with a savepoint, every role
/// restarted on the new binary in dependency order, the jobs resumed from their
/// savepoints.
fn upgrade(args: UpArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let (session, binary, sha) = begin(&args)?;
    prepare_all(&session, &binary, &sha)?;
    let rt = runtime()?;
    let rest = session.rest_url();
    let jobs = rt
        .block_on(session.api("GET", "/v1/jobs", None))
        .map_err(|f| Failure::from(anyhow::anyhow!("listing jobs at {rest}: {}", f.message())))?;
    let running: Vec<(String, usize)> = jobs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|j| {
            !matches!(
                j["state"].as_str(),
                Some("finished" | "cancelled" | "failed")
            )
        })
        .filter_map(|j| {
            let workers = j["workers"].as_array().map_or(1, |w| w.len().max(1));
            Some((j["id"].as_str()?.to_owned(), workers))
        })
        .collect();
    let name = format!("upgrade-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S"));
    let paused = Instant::now();
    let mut saved = Vec::new();
    for (id, workers) in &running {
        doing(format!("job {id}: stopping with a savepoint"));
        let body = serde_json::json!({ "savepoint": name });
        let path = rt
            .block_on(session.api("POST", &format!("/v1/jobs/{id}/stop"), Some(body)))
            .ok()
            .and_then(|v| v["savepoint"].as_str().map(str::to_owned))
            .filter(|p| !p.is_empty());
        let Some(path) = path else {
            return Err(Failure::from(anyhow::anyhow!(
                "job {id} could not be stopped with a savepoint; no role was replaced{}",
                resumed_note(&saved)
            )));
        };
        say(&format!("job {id}: stopped with savepoint {path}"));
        saved.push((id.clone(), *workers, path));
    }
    let changed = roll(&session, &rt, &sha, &args)
        .map_err(|f| Failure::from(anyhow::anyhow!("{}{}", f.message(), resumed_note(&saved))))?;
    for (id, workers, path) in &saved {
        doing(format!("job {id}: resuming from {path}"));
        let body = serde_json::json!({ "from_savepoint": path, "workers": workers });
        let new = rt
            .block_on(session.api("POST", "/v1/jobs", Some(body)))
            .map_err(|f| {
                Failure::from(anyhow::anyhow!(
                    "job {id} was stopped but not resumed: {}{}",
                    f.message(),
                    resumed_note(&saved)
                ))
            })?;
        say(&format!(
            "job {id}: resumed as {} from {path}",
            new["id"].as_str().unwrap_or("?")
        ));
    }
    summary(&session);
    outln!(
        "upgraded {changed} roles in {:.1} s; {} jobs paused for {:.1} s",
        started.elapsed().as_secs_f64(),
        saved.len(),
        if saved.is_empty() {
            0.0
        } else {
            paused.elapsed().as_secs_f64()
        },
    );
    Ok(())
}

/// How to resume the jobs an interrupted upgrade stopped.
fn resumed_note(saved: &[(String, usize, String)]) -> String {
    saved
        .iter()
        .map(|(id, workers, path)| {
            format!(
                "\njob {id} is stopped: `sluice submit --from-savepoint {path} --workers {workers}` resumes it"
            )
        })
        .collect()
}

/// Checks that `host` can run the binary and installs it there unless that checksum
/// already is; true when it copied.
fn prepare(
    session: &Session,
    host: &HostSpec,
    binary: &Path,
    binary_arch: &str,
    sha: &str,
) -> Result<bool, Failure> {
    let dir = quote(&host.install_dir);
    // The etcd member deploy runs here uses the host's own etcd.
    let etcd_binary = session.cluster.managed_etcd.as_ref().and_then(|e| {
        e.hosts
            .iter()
            .any(|&h| session.cluster.hosts[h].name == host.name)
            .then_some(e.binary.as_str())
    });
    let etcd = etcd_binary.map_or(String::new(), |b| {
        format!(
            "v=$({b} --version 2>/dev/null | head -n 1) && echo \"etcd-version $v\"; ",
            b = quote(b)
        )
    });
    let probe = format!(
        "uname -s; uname -m; if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; \
         then echo systemd; else echo none; fi; \
         command -v sha256sum >/dev/null && echo sha256sum; \
         test -x {dir}/releases/{sha}/sluice && echo present; {etcd}true"
    );
    let out = session.on(host, "checking the host", &probe, Input::None)?;
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let (os, arch) = (
        lines.first().copied().unwrap_or(""),
        lines.get(1).copied().unwrap_or(""),
    );
    if os != "Linux" || arch != binary_arch {
        return Err(step_failed(
            host,
            "checking the host",
            &format!("it runs {os} on {arch}; this binary is for Linux on {binary_arch}"),
        ));
    }
    if host.service == ServiceManager::Systemd && lines.get(2) != Some(&"systemd") {
        return Err(step_failed(
            host,
            "checking the host",
            "systemd is not running there (no /run/systemd/system); install systemd, or set \
             `service: process` for this host in the cluster file",
        ));
    }
    if !lines.contains(&"sha256sum") {
        return Err(step_failed(
            host,
            "checking the host",
            "sha256sum (coreutils) is missing",
        ));
    }
    if let Some(binary) = etcd_binary
        && !lines
            .iter()
            .any(|l| l.starts_with("etcd-version etcd Version:"))
    {
        return Err(step_failed(
            host,
            "checking the host",
            &format!(
                "it runs an etcd member and `{binary} --version` does not answer there; \
                 install etcd (Debian: etcd-server) or set `etcd.binary` in the cluster file"
            ),
        ));
    }
    if lines.contains(&"present") {
        return Ok(false);
    }
    let release = format!("{dir}/releases/{sha}");
    let copy = format!(
        "set -e\nmkdir -p {release} {dir}/bin\ncat > {release}/sluice.part\n\
         echo '{sha}  {release}/sluice.part' | sha256sum -c --quiet\n\
         chmod 755 {release}/sluice.part\nmv {release}/sluice.part {release}/sluice\n\
         ln -sfn {release}/sluice {dir}/bin/sluice.part\nmv -T {dir}/bin/sluice.part {dir}/bin/sluice\n\
         {release}/sluice --version >/dev/null"
    );
    session.on(host, "copying the binary", &copy, Input::File(binary))?;
    Ok(true)
}

/// Waits until the coordinator answers and sees `role` under `pid`.
async fn healthy(
    session: &Session,
    extras: &Extras,
    role: &Role<'_>,
    pid: u32,
    rest: &str,
    timeout: Duration,
) -> Result<(), Failure> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    let mut checks = 0u32;
    let etcd = match role.kind {
        Kind::Etcd => Some(EtcdProbe::new(&session.cluster, extras, role)?),
        _ => None,
    };
    while Instant::now() < deadline {
        if let Some(etcd) = &etcd {
            match etcd.health().await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        } else {
            match session.api("GET", "/v1/cluster", None).await {
                Ok(cluster) => {
                    if registered(&cluster, role, pid) {
                        return Ok(());
                    }
                    last = format!("the coordinator at {rest} does not list it yet");
                }
                Err(e) => last = e.message().to_owned(),
            }
        }
        checks += 1;
        // A role that died will not become healthy: say so now, with its log.
        if checks.is_multiple_of(4) && session.pid_of(role)? != Some(pid) {
            return Err(role_failed(session, role, "it stopped while starting"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(role_failed(
        session,
        role,
        &format!("not healthy after {} s: {last}", timeout.as_secs()),
    ))
}

/// Whether `/v1/cluster` shows `role` running as `pid`.
fn registered(cluster: &Value, role: &Role<'_>, pid: u32) -> bool {
    let listed = |key: &str, field: &str, value: &str| {
        cluster[key].as_array().is_some_and(|items| {
            items.iter().any(|item| {
                item[field].as_str() == Some(value) && item["pid"].as_u64() == Some(u64::from(pid))
            })
        })
    };
    match role.kind {
        // A coordinator alone reports its pid; under etcd the leader lists every
        // member, leader or standby, by its id (the host's name).
        Kind::Coordinator => {
            cluster["coordinator"]["pid"].as_u64() == Some(u64::from(pid))
                || cluster["coordinators"].as_array().is_some_and(|members| {
                    members
                        .iter()
                        .any(|m| m["id"].as_str() == Some(role.host.name.as_str()))
                })
        }
        Kind::StateNode => listed("state_nodes", "node_id", &role.host.name),
        Kind::Worker => listed("workers", "host", &role.host.bind),
        // etcd is not the coordinator's to list; its own health endpoint tells.
        Kind::Etcd => false,
    }
}

/// An etcd member's health endpoint, called with a host certificate of the cluster
/// when the cluster talks TLS (the members require one of their clients).
struct EtcdProbe {
    url: String,
    client: reqwest::Client,
}

impl EtcdProbe {
    fn new(cluster: &ClusterSpec, extras: &Extras, role: &Role<'_>) -> Result<Self, Failure> {
        let etcd = cluster.managed_etcd.as_ref().ok_or_else(|| {
            Failure::from(anyhow::anyhow!("an etcd role without `etcd: {{ hosts }}`"))
        })?;
        let scheme = if extras.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(5));
        if let Some(tls) = &extras.tls {
            sluice_common::tls::install_default_provider();
            let (cert, key) = tls.hosts.get(&role.host.name).cloned().unwrap_or_default();
            let config = sluice_common::tls::ClusterTls::from_pem(
                tls.ca.clone().into_bytes(),
                cert.into_bytes(),
                key.into_bytes(),
            )
            .and_then(|t| t.rustls_client())
            .map_err(|e| step_failed(role.host, "checking the etcd member", &e))?;
            builder = builder.use_preconfigured_tls((*config).clone());
        }
        let client = builder
            .build()
            .map_err(|e| Failure::from(anyhow::anyhow!("HTTP client: {e}")))?;
        Ok(Self {
            url: format!(
                "{scheme}://{}/health",
                join_host_port(&role.host.bind, etcd.client_port)
            ),
            client,
        })
    }

    /// Ok when the member answers healthy (it has a leader, so a quorum).
    async fn health(&self) -> Result<(), String> {
        let response = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|e| format!("{}: {}", self.url, sluice_common::tls::with_causes(&e)))?;
        let body: Value = response
            .json()
            .await
            .map_err(|e| format!("{}: not etcd's health answer: {e}", self.url))?;
        if body["health"] == "true" {
            Ok(())
        } else {
            Err(format!("{} answers {body}", self.url))
        }
    }
}

/// A role's failure, with the last lines it logged.
fn role_failed(session: &Session, role: &Role<'_>, why: &str) -> Failure {
    let log = session
        .ssh
        .run(role.host, &role.log_tail_script(), Input::None)
        .unwrap_or_default();
    let log = if log.trim().is_empty() {
        String::new()
    } else {
        format!("\nits last log lines:\n{}", log.trim_end())
    };
    step_failed(
        role.host,
        &format!("starting the {}", role.kind.name()),
        &format!("{why}; the roll stopped here (`sluice deploy status` shows what runs){log}"),
    )
}

fn check(common: Common, units: Option<PathBuf>, binary: Option<PathBuf>) -> Result<(), Failure> {
    let session = Session::open(&common)?;
    if let Some(dir) = units {
        let binary = match binary {
            Some(b) => b,
            None => std::env::current_exe()
                .map_err(|e| Failure::from(anyhow::anyhow!("finding this binary: {e}")))?,
        };
        let sha = sha256_file(&binary)?;
        for role in session.roles() {
            // One directory per host: every worker's unit has the same name.
            let host_dir = dir.join(&role.host.name);
            std::fs::create_dir_all(&host_dir).map_err(|e| {
                Failure::usage(format!("--write-units {}: {e}", host_dir.display()))
            })?;
            let path = host_dir.join(format!("{}.service", role.service));
            std::fs::write(&path, role.unit(&sha))
                .map_err(|e| Failure::usage(format!("writing {}: {e}", path.display())))?;
        }
    }
    let cluster = &session.cluster;
    outln!(
        "cluster {}: {} hosts, object store {}",
        cluster.name,
        cluster.hosts.len(),
        cluster.object_store
    );
    match (&cluster.version, &cluster.releases) {
        (Some(version), Some(template)) => outln!(
            "release {version} from {}",
            release::shown(&template.replace("{version}", version))
        ),
        _ => outln!(
            "binary: the one deploy is given (--binary, --version), else the deploying sluice"
        ),
    }
    for role in session.roles() {
        let via = role
            .host
            .jump
            .as_deref()
            .map(|j| format!(" via {j}"))
            .unwrap_or_default();
        outln!(
            "{:<12} {:<12} {}{via} ({:?}): sluice {}",
            role.host.name,
            role.kind.name(),
            role.host.address,
            role.host.service,
            role.args.join(" ")
        );
    }
    outln!("REST API {}", session.rest_url());
    Ok(())
}

fn status(common: Common) -> Result<(), Failure> {
    let session = Session::open(&common)?;
    let rest = session.rest_url();
    let rt = runtime()?;
    let cluster = rt.block_on(session.api("GET", "/v1/cluster", None)).ok();
    outln!(
        "{:<12} {:<12} {:<8} {:<9} {:<10} VERSION",
        "HOST",
        "ROLE",
        "STATE",
        "PID",
        "COORDINATOR"
    );
    let mut healthy = true;
    // Status needs only the roles' names and places (and etcd's certificates), so a
    // certificate that cannot be read does not stop it.
    let extras = session.extras().unwrap_or_default();
    for role in roles(&session.cluster, &extras) {
        let (state, pid, seen, version) = match role_status(&session, &role) {
            Ok(Some((pid, version))) => {
                let seen = if role.kind == Kind::Etcd {
                    let probe = EtcdProbe::new(&session.cluster, &extras, &role)?;
                    rt.block_on(probe.health()).is_ok()
                } else {
                    cluster.as_ref().is_some_and(|c| registered(c, &role, pid))
                };
                healthy &= seen;
                (
                    "running",
                    pid.to_string(),
                    match (role.kind, seen) {
                        // The column is the coordinator's view; etcd answers for itself.
                        (Kind::Etcd, true) => "healthy",
                        (Kind::Etcd, false) => "unhealthy",
                        (_, true) => "sees it",
                        (_, false) => "does not",
                    },
                    version,
                )
            }
            Ok(None) => {
                healthy = false;
                ("stopped", "-".into(), "-", "-".into())
            }
            Err(f) => {
                healthy = false;
                say(f.message());
                ("unknown", "-".into(), "-", "-".into())
            }
        };
        outln!(
            "{:<12} {:<12} {:<8} {:<9} {:<10} {version}",
            role.host.name,
            role.kind.name(),
            state,
            pid,
            seen
        );
    }
    match &cluster {
        Some(_) => outln!("REST API {rest}"),
        None => outln!("REST API {rest} does not answer"),
    }
    if healthy {
        Ok(())
    } else {
        Err(Failure::from(anyhow::anyhow!("the cluster is not healthy")))
    }
}

/// A running role's pid and version.
fn role_status(session: &Session, role: &Role<'_>) -> Result<Option<(u32, String)>, Failure> {
    let Some(pid) = session.pid_of(role)? else {
        return Ok(None);
    };
    let version = session
        .on(
            role.host,
            "reading the version",
            &format!("\"$(readlink -f /proc/{pid}/exe)\" --version"),
            Input::None,
        )
        .map(|v| v.lines().next().unwrap_or("").trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    Ok(Some((pid, version)))
}

fn destroy(common: Common, purge: bool) -> Result<(), Failure> {
    let session = Session::open(&common)?;
    let cluster = &session.cluster;
    let mut roles = session.roles();
    roles.reverse();
    let mut failures = Vec::new();
    for role in &roles {
        doing(format!(
            "{}: stopping the {}",
            role.host.name,
            role.kind.name()
        ));
        match session.on(
            role.host,
            &format!("removing the {}", role.kind.name()),
            &role.remove_script(),
            Input::None,
        ) {
            Ok(_) => say(&format!(
                "{}: {} stopped and removed",
                role.host.name,
                role.kind.name()
            )),
            Err(f) => failures.push(f.message().to_owned()),
        }
    }
    for host in &cluster.hosts {
        let dir = quote(&host.install_dir);
        let mut script = format!(
            "rm -rf {dir}/releases {dir}/bin {dir}/run {dir}/log\nrm -rf {dir}/etc/tls\nrmdir {dir}/etc 2>/dev/null; true\n"
        );
        if purge {
            for role in roles.iter().filter(|r| r.host.name == host.name) {
                for data in &role.data_dirs {
                    script.push_str(&format!("rm -rf {}\n", quote(data)));
                }
            }
            script.push_str(&format!(
                "rm -rf {dir}/data\nrmdir {dir} 2>/dev/null; true\n"
            ));
        }
        match session.on(host, "removing the installation", &script, Input::None) {
            Ok(_) => say(&format!(
                "{}: installation removed{}",
                host.name,
                if purge { " with its data" } else { "" }
            )),
            Err(f) => failures.push(f.message().to_owned()),
        }
    }
    if failures.is_empty() {
        outln!(
            "cluster {} destroyed{}",
            cluster.name,
            if purge {
                ""
            } else {
                " (data directories kept; --purge removes them)"
            }
        );
        Ok(())
    } else {
        Err(Failure::from(anyhow::anyhow!("{}", failures.join("\n"))))
    }
}

/// The SHA-256 of a file, by coreutils' `sha256sum` (what the hosts check it with).
fn sha256_file(path: &Path) -> Result<String, Failure> {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .map_err(|e| Failure::from(anyhow::anyhow!("running sha256sum: {e}")))?;
    hex_of(&out.stdout).ok_or_else(|| {
        Failure::usage(format!(
            "cannot read {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })
}

fn sha256_bytes(bytes: &[u8]) -> Result<String, Failure> {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Failure::from(anyhow::anyhow!("running sha256sum: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(bytes)
            .map_err(|e| Failure::from(anyhow::anyhow!("sha256sum: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Failure::from(anyhow::anyhow!("sha256sum: {e}")))?;
    hex_of(&out.stdout).ok_or_else(|| Failure::from(anyhow::anyhow!("sha256sum printed nothing")))
}

fn hex_of(stdout: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stdout);
    let hex = text.split_whitespace().next()?;
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| hex.to_owned())
}

/// A new random token in a new file only this user reads.
fn new_token_file(path: &Path, what: &str) -> Result<String, Failure> {
    let fail = |e: std::io::Error| {
        Failure::from(anyhow::anyhow!(
            "writing the cluster's {what} to {}: {e}",
            path.display()
        ))
    };
    let token = crate::random_token()?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes()).map_err(fail)?;
    Ok(token)
}
