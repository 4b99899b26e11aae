//! A cluster of separate processes for tests that act on a running job: state-service
//! nodes, a coordinator and workers, each a `sluice` process on 127.0.0.1, killed when the
//! handle drops.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::http::http_request;
use crate::procs::{Proc, poll_until};
use crate::run_sluice;
use crate::service::ServiceProcess;

/// How long a role may take to start.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running cluster.
pub struct MiniCluster {
    /// The state node (`--node-id node-a`, 256 MiB).
    pub state: ServiceProcess,
    /// Further state nodes (`node-b`, `node-c`, ...), on the same object store.
    pub more_state: Vec<ServiceProcess>,
    /// Each state node's command line and the environment, to start it again.
    state_commands: Vec<Vec<String>>,
    env: Vec<(String, String)>,
    /// The coordinators' gRPC URLs (comma-separated) and the state nodes' extra
    /// arguments, for nodes added later.
    grpc: String,
    node_args: Vec<String>,
    /// The coordinator.
    pub coordinator: Proc,
    /// The coordinator's REST `host:port`.
    pub http: String,
    /// The workers.
    pub workers: Vec<Proc>,
    /// With [`MiniCluster::start_ha`]: the standby coordinator and its REST `host:port`.
    pub standby: Option<(Proc, String)>,
}

/// Role arguments for [`MiniCluster::start`] that give `args` to `role` alone.
pub fn args_for(role: &'static str, args: &[&str]) -> impl Fn(&str) -> Vec<String> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    move |r| if r == role { args.clone() } else { Vec::new() }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range: a port found free here is closed again before
    // its owner binds it, and a process binding port 0 meanwhile (a state node started
    // first) could otherwise be given the same one. Never the same port twice per test
    // process, since ports handed out are not bound yet.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(12_000));
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let seed = std::process::id() as u64
        ^ std::time::UNIX_EPOCH
            .elapsed()
            .unwrap_or_default()
            .as_nanos() as u64;
    let span = u64::from(high - low);
    for i in 0..span {
        let port = low + ((seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7919)) % span) as u16;
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 between {low} and {high}")
}

/// The command line of state node `i` registering at `grpc` (the coordinators' gRPC
/// URLs), all nodes on the object store in `dir/state-objects`.
fn state_node_command(dir: &Path, i: usize, grpc: &str, extra: &[String]) -> Vec<String> {
    let name = node_name(i);
    let data = match i {
        0 => dir.join("state-data"),
        _ => dir.join(format!("state-data-{name}")),
    };
    let mut args: Vec<String> = [
        "state-service",
        "--listen",
        "127.0.0.1:0",
        "--node-id",
        &name,
    ]
    .map(String::from)
    .to_vec();
    args.push("--data-dir".into());
    args.push(data.display().to_string());
    args.push("--object-store".into());
    args.push(format!("file://{}", dir.join("state-objects").display()));
    if !extra.iter().any(|a| a == "--memory") {
        args.extend(["--memory", "256MiB"].map(String::from));
    }
    args.extend(["--coordinator".to_owned(), grpc.to_owned()]);
    args.extend(extra.iter().cloned());
    args
}

/// The name of the `i`th state node: `node-a`, `node-b`, ...
pub fn node_name(i: usize) -> String {
    format!("node-{}", (b'a' + i as u8) as char)
}

/// Starts `sluice ARGS` (a coordinator), waits for the line containing `ready`; the
/// process and its REST `host:port`.
fn start_coordinator(
    args: &[String],
    dir: &Path,
    env: &[(&str, &str)],
    ready: &str,
) -> (Proc, String) {
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut coordinator = Proc::start_env(&argv, dir, env);
    let line = coordinator.wait_for_line("coordinator listening:", START_TIMEOUT);
    let http = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no http= in {line:?}"))
        .to_owned();
    coordinator.wait_for_line(ready, START_TIMEOUT);
    (coordinator, http)
}

impl MiniCluster {
    /// Starts a state node (registered with the coordinator), a coordinator and `workers`
    /// workers in `dir`, each with the extra arguments `role_args(role)` gives
    /// (`state-service`, `coordinator`, `worker`) and environment `env`, and waits until
    /// the workers are attached.
    ///
    /// # Panics
    /// When a role does not start or the workers do not attach in time.
    pub fn start(
        dir: &Path,
        workers: usize,
        role_args: impl Fn(&str) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_nodes(dir, workers, 1, role_args, env)
    }

    /// [`MiniCluster::start`] with `state_nodes` state nodes (`node-a`, `node-b`, ...,
    /// one object store), waiting until every one is registered too.
    ///
    /// # Panics
    /// When a role does not start, or the workers and nodes do not attach in time.
    pub fn start_nodes(
        dir: &Path,
        workers: usize,
        state_nodes: usize,
        role_args: impl Fn(&str) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> Self {
        let grpc = format!("127.0.0.1:{}", free_port());
        let store = dir.join("coordinator-store").display().to_string();
        let coordinator = |state_url: &str| {
            let mut args: Vec<String> = [
                "coordinator",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                &grpc,
                "--store",
                &store,
                "--state-service",
                state_url,
            ]
            .map(String::from)
            .to_vec();
            args.extend(role_args("coordinator"));
            args
        };
        Self::start_with(
            dir,
            workers,
            state_nodes,
            &format!("http://{grpc}"),
            &role_args,
            &coordinator,
            "coordinator listening:",
            env,
        )
    }

    /// Starts `state_nodes` state nodes and `workers` workers given the coordinators'
    /// gRPC URLs `grpc`, and the coordinator whose command line `coordinator(state
    /// URL)` gives, ready when it prints `ready`; waits until the workers (and several
    /// state nodes) are attached.
    #[allow(clippy::too_many_arguments)]
    fn start_with(
        dir: &Path,
        workers: usize,
        state_nodes: usize,
        grpc: &str,
        role_args: &dyn Fn(&str) -> Vec<String>,
        coordinator: &dyn Fn(&str) -> Vec<String>,
        ready: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let objects = dir.join("state-objects");
        std::fs::create_dir_all(&objects).expect("objects dir");
        // The coordinators' gRPC ports are chosen first: the state nodes register there
        // (retrying until a coordinator is up).
        let node_args = role_args("state-service");
        let commands: Vec<Vec<String>> = (0..state_nodes.max(1))
            .map(|i| state_node_command(dir, i, grpc, &node_args))
            .collect();
        let mut nodes: Vec<ServiceProcess> = commands
            .iter()
            .map(|args| {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ServiceProcess::start(&args, dir, env)
            })
            .collect();
        let state = nodes.remove(0);
        let (coordinator, http) = start_coordinator(&coordinator(&state.url()), dir, env, ready);

        let mut procs = Vec::new();
        for _ in 0..workers {
            let mut args: Vec<String> = vec!["worker".into(), "--coordinator".into(), grpc.into()];
            args.extend(role_args("worker"));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            procs.push(Proc::start_env(&args, dir, env));
        }
        let cluster = Self {
            state,
            more_state: nodes,
            state_commands: commands,
            grpc: grpc.to_owned(),
            node_args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            coordinator,
            http,
            workers: procs,
            standby: None,
        };
        cluster.wait_until(
            &format!("{workers} workers attached"),
            START_TIMEOUT,
            || {
                let (code, body) = http_request(&cluster.http, "GET", "/v1/workers", None);
                (code == 200 && body.as_array().is_some_and(|w| w.len() >= workers)).then_some(())
            },
        );
        if state_nodes > 1 {
            cluster.wait_until(
                &format!("{state_nodes} state nodes registered"),
                START_TIMEOUT,
                || {
                    let (code, body) = http_request(&cluster.http, "GET", "/v1/state-nodes", None);
                    (code == 200 && body.as_array().is_some_and(|n| n.len() >= state_nodes))
                        .then_some(())
                },
            );
        }
        cluster
    }

    /// Two coordinators electing a leader through the etcd at `etcd` (`etcd://…`;
    /// leases of 3 s), sharing one store: `coord-1` is started first and leads,
    /// `coord-2` stands by. The state nodes and `workers` workers are given both
    /// coordinators' addresses.
    ///
    /// # Panics
    /// When a role does not start, or the workers do not attach in time.
    pub fn start_ha(
        dir: &Path,
        workers: usize,
        state_nodes: usize,
        etcd: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let grpcs = [
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
        ];
        let both = grpcs
            .iter()
            .map(|g| format!("http://{g}"))
            .collect::<Vec<_>>()
            .join(",");
        let coordinator_args = |i: usize| -> Vec<String> {
            [
                "coordinator",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                &grpcs[i],
                "--store",
                &dir.join("coordinator-store").display().to_string(),
                "--ha",
                etcd,
                "--ha-id",
                &format!("coord-{}", i + 1),
                "--ha-lease-ttl-ms",
                "3000",
            ]
            .map(String::from)
            .to_vec()
        };
        let mut cluster = Self::start_with(
            dir,
            workers,
            state_nodes,
            &both,
            &|_| Vec::new(),
            &|state_url| {
                let mut args = coordinator_args(0);
                args.extend(["--state-service".to_owned(), state_url.to_owned()]);
                args
            },
            "coordinator leading:",
            env,
        );
        let standby = start_coordinator(&coordinator_args(1), dir, env, "coordinator standing by:");
        cluster.standby = Some(standby);
        cluster
    }

    /// `--coordinator` with both coordinators' REST addresses (leader first).
    pub fn urls(&self) -> String {
        match &self.standby {
            Some((_, http)) => format!("http://{},http://{http}", self.http),
            None => self.url(),
        }
    }

    /// The standby's REST `host:port`.
    ///
    /// # Panics
    /// Without a standby.
    pub fn standby_http(&self) -> &str {
        &self.standby.as_ref().expect("a standby coordinator").1
    }

    /// Kills the leader with SIGKILL and waits until the standby serves (it becomes
    /// [`MiniCluster::coordinator`]); how long that took.
    ///
    /// # Panics
    /// When the standby does not take over within a minute.
    pub fn fail_over(&mut self) -> Duration {
        self.coordinator.kill();
        let killed = std::time::Instant::now();
        self.promote_standby(START_TIMEOUT);
        killed.elapsed()
    }

    /// Waits until the standby serves, then makes it [`MiniCluster::coordinator`].
    ///
    /// # Panics
    /// When it does not within `timeout`.
    pub fn promote_standby(&mut self, timeout: Duration) {
        let http = self.standby_http().to_owned();
        self.wait_until("the standby to lead", timeout, || {
            let (code, _) = http_request(&http, "GET", "/v1/workers", None);
            (code == 200).then_some(())
        });
        let (proc, http) = self.standby.take().expect("a standby");
        self.coordinator = proc;
        self.http = http;
    }

    /// Waits until the leader exits by itself; what it printed.
    ///
    /// # Panics
    /// When it still runs after `timeout`.
    pub fn wait_leader_exit(&mut self, timeout: Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        while self.coordinator.running() {
            assert!(
                std::time::Instant::now() < deadline,
                "the leader still runs after {timeout:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.coordinator.output()
    }

    /// Starts state node `i` (0: `node-a`) again with the same name, data directory and
    /// object store (it listens on a new port and registers again), killing it first if
    /// it still runs.
    pub fn restart_state_node(&mut self, dir: &Path, i: usize) {
        let args: Vec<&str> = self.state_commands[i].iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let slot = match i {
            0 => &mut self.state,
            i => &mut self.more_state[i - 1],
        };
        slot.kill();
        *slot = ServiceProcess::start(&args, dir, &env);
    }

    /// Starts one more state node (`node-d` after three), registering with the
    /// coordinator; its index for [`MiniCluster::restart_state_node`].
    pub fn add_state_node(&mut self, dir: &Path) -> usize {
        let i = self.state_commands.len();
        let args = state_node_command(dir, i, &self.grpc, &self.node_args);
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        self.more_state
            .push(ServiceProcess::start(&argv, dir, &env));
        self.state_commands.push(args);
        i
    }

    /// The coordinator's gRPC API, which workers and state nodes attach to.
    pub fn grpc_url(&self) -> String {
        self.grpc.clone()
    }

    /// `--coordinator http://HTTP`.
    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Submits `job` on `workers` workers from `dir`; the job's id.
    ///
    /// # Panics
    /// When the submission fails.
    pub fn submit(&self, dir: &Path, job: &Path, workers: usize) -> String {
        let url = self.url();
        let out = run_sluice(
            &[
                "submit",
                job.to_str().expect("UTF-8 path"),
                "--workers",
                &workers.to_string(),
                "--json",
                "--coordinator",
                &url,
            ],
            dir,
        );
        out.assert_success();
        serde_json::from_str::<Value>(&out.stdout).expect("JSON")["id"]
            .as_str()
            .expect("an id")
            .to_owned()
    }

    /// `GET /v1/jobs/{id}`.
    pub fn status(&self, id: &str) -> Value {
        let (code, body) = http_request(&self.http, "GET", &format!("/v1/jobs/{id}"), None);
        assert_eq!(code, 200, "{body}");
        body
    }

    /// Cancels job `id` and waits until it has ended.
    pub fn cancel(&self, dir: &Path, id: &str) {
        run_sluice(&["cancel", id, "--coordinator", &self.url()], dir).assert_success();
        self.wait_until(&format!("job {id} to end"), START_TIMEOUT, || {
            let state = self.status(id)["state"].as_str().unwrap_or("").to_owned();
            matches!(state.as_str(), "cancelled" | "finished" | "failed").then_some(())
        });
    }

    /// Waits (two minutes at most) until job `id` ended, asserts that it finished, and
    /// returns its status.
    ///
    /// # Panics
    /// When it does not end in time, or fails.
    #[track_caller]
    pub fn wait_finished(&self, id: &str) -> Value {
        let status = self.wait_until("the job to finish", Duration::from_secs(120), || {
            let s = self.status(id);
            matches!(s["state"].as_str(), Some("finished" | "failed")).then_some(s)
        });
        assert_eq!(status["state"], "finished", "{status}\n{}", self.logs());
        status
    }

    /// Everything the roles printed, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = format!("--- coordinator\n{}\n", self.coordinator.output());
        if let Some((standby, _)) = &self.standby {
            s.push_str(&format!("--- standby coordinator\n{}\n", standby.output()));
        }
        for (i, w) in self.workers.iter().enumerate() {
            s.push_str(&format!("--- worker {i}\n{}\n", w.output()));
        }
        s.push_str(&format!("--- state node-a\n{}", self.state.stderr()));
        for (i, n) in self.more_state.iter().enumerate() {
            s.push_str(&format!("\n--- state {}\n{}", node_name(i + 1), n.stderr()));
        }
        s
    }

    /// Polls `check` every 250 ms for at most `timeout`.
    ///
    /// # Panics
    /// When it gives nothing in time, with `what` and the roles' logs.
    #[track_caller]
    pub fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        poll_until(what, timeout, || self.logs(), check)
    }
}

/// A lone `sluice coordinator` on 127.0.0.1 (no worker, no state service) with `extra`
/// arguments, its store a new directory in `dir`: the process and its REST address
/// (`host:port`).
///
/// # Panics
/// When it does not start.
pub fn lone_coordinator(dir: &Path, extra: &[&str]) -> (Proc, String) {
    let grpc = format!("127.0.0.1:{}", free_port());
    let store = dir.join(format!("coordinator-store-{}", free_port()));
    let mut args = vec![
        "coordinator",
        "--http",
        "127.0.0.1:0",
        "--grpc",
        &grpc,
        "--store",
        store.to_str().expect("UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    let mut proc = Proc::start(&args, dir);
    let line = proc.wait_for_line("coordinator listening:", Duration::from_secs(30));
    let http = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no http= address in {line:?}"))
        .to_owned();
    (proc, http)
}
