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
    /// The coordinator's gRPC address and the state nodes' extra arguments, for nodes
    /// added later.
    grpc: String,
    node_args: Vec<String>,
    /// The coordinator.
    pub coordinator: Proc,
    /// The coordinator's REST `host:port`.
    pub http: String,
    /// The workers.
    pub workers: Vec<Proc>,
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding an ephemeral port")
        .port()
}

/// The command line of state node `i` registering at `grpc`, all nodes on the object
/// store in `dir/state-objects`.
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
    args.extend(["--memory", "256MiB"].map(String::from));
    args.extend(["--coordinator".to_owned(), format!("http://{grpc}")]);
    args.extend(extra.iter().cloned());
    args
}

/// The name of the `i`th state node: `node-a`, `node-b`, ...
pub fn node_name(i: usize) -> String {
    format!("node-{}", (b'a' + i as u8) as char)
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
        let objects = dir.join("state-objects");
        std::fs::create_dir_all(&objects).expect("objects dir");
        // The coordinator's gRPC port is chosen first: the state nodes register there
        // (retrying until the coordinator is up).
        let grpc = format!("127.0.0.1:{}", free_port());
        let node_args = role_args("state-service");
        let commands: Vec<Vec<String>> = (0..state_nodes.max(1))
            .map(|i| state_node_command(dir, i, &grpc, &node_args))
            .collect();
        let mut nodes: Vec<ServiceProcess> = commands
            .iter()
            .map(|args| {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ServiceProcess::start(&args, dir, env)
            })
            .collect();
        let state = nodes.remove(0);

        let store = dir.join("coordinator-store");
        let mut args: Vec<String> = vec![
            "coordinator".into(),
            "--http".into(),
            "127.0.0.1:0".into(),
            "--grpc".into(),
            grpc.clone(),
            "--store".into(),
            store.display().to_string(),
            "--state-service".into(),
            state.url(),
        ];
        args.extend(role_args("coordinator"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut coordinator = Proc::start_env(&args, dir, env);
        let line = coordinator.wait_for_line("coordinator listening:", START_TIMEOUT);
        let http = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .unwrap_or_else(|| panic!("no http= in {line:?}"))
            .to_owned();

        let url = format!("http://{grpc}");
        let mut procs = Vec::new();
        for _ in 0..workers {
            let mut args: Vec<String> = vec!["worker".into(), "--coordinator".into(), url.clone()];
            args.extend(role_args("worker"));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            procs.push(Proc::start_env(&args, dir, env));
        }
        let cluster = Self {
            state,
            more_state: nodes,
            state_commands: commands,
            grpc: grpc.clone(),
            node_args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            coordinator,
            http,
            workers: procs,
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
        format!("http://{}", self.grpc)
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

    /// Everything the roles printed, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = format!("--- coordinator\n{}\n", self.coordinator.output());
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
