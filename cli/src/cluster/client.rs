//! The job commands: `sluice submit | jobs | status | cancel | checkpoints | savepoint |
//! stop | rescale`, over the coordinator's REST API (`--coordinator URL` or
//! `SLUICE_COORDINATOR`, default `http://127.0.0.1:8081`). Tables for people, `--json`
//! for scripts. A job file is parsed and planned here before it is sent, so its mistakes
//! come back with file, line and column and exit code 2.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::run::load_job_text;
use crate::{Failure, runtime};
use sluice_common::outln;

/// Where the coordinator is and how to print.
#[derive(Args, Clone)]
pub struct ClientArgs {
    /// The coordinator's REST API.
    #[arg(
        long,
        env = "SLUICE_COORDINATOR",
        default_value = "http://127.0.0.1:8081",
        global = true
    )]
    coordinator: String,
    #[command(flatten)]
    credentials: Credentials,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

/// How a client proves itself to the coordinator's REST API and checks the
/// coordinator: a bearer token, the CA of an `https://` coordinator, and a client
/// certificate where the API asks for one (mutual TLS).
#[derive(Args, Clone, Default)]
pub struct Credentials {
    /// A bearer token for the REST API, when it requires one (never printed).
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Trust this CA's certificates (PEM) for an https:// coordinator.
    #[arg(long, env = "SLUICE_CA", value_name = "PEM", global = true)]
    pub ca: Option<PathBuf>,
    /// Present this client certificate (PEM) to a coordinator that asks for one.
    #[arg(long, env = "SLUICE_CLIENT_CERT", value_name = "PEM", global = true)]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "SLUICE_CLIENT_KEY", value_name = "PEM", global = true)]
    pub client_key: Option<PathBuf>,
    /// Call from this address (a joining worker calls from its data address, which
    /// its certificate will name).
    #[arg(skip)]
    pub local_address: Option<std::net::IpAddr>,
}

impl Credentials {
    /// An HTTP client that checks the coordinator against `--ca` and presents the
    /// client certificate.
    fn client(&self) -> Result<reqwest::Client, Failure> {
        sluice_common::tls::install_default_provider();
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .local_address(self.local_address);
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            (None, None) => None,
            _ => {
                return Err(Failure::usage("--client-cert and --client-key go together"));
            }
        };
        if let Some(ca) = &self.ca {
            let config = sluice_common::tls::client_config(ca, identity)
                .map_err(|e| Failure::usage(format!("--ca: {e}")))?;
            builder = builder.use_preconfigured_tls(config);
        } else if identity.is_some() {
            return Err(Failure::usage(
                "--client-cert needs --ca (the coordinator's CA)",
            ));
        }
        builder
            .build()
            .map_err(|e| Failure::from(anyhow::anyhow!("HTTP client: {e}")))
    }
}

/// A job command.
#[derive(Subcommand)]
pub enum JobCommand {
    /// Submit a job file to the coordinator; prints the job's id.
    Submit {
        #[command(flatten)]
        client: ClientArgs,
        /// The job file (without one, `--from-savepoint` runs the savepoint's own job
        /// again, as it was planned).
        #[arg(required_unless_present = "from_savepoint")]
        job: Option<PathBuf>,
        /// Worker processes to run it on.
        #[arg(long)]
        workers: Option<usize>,
        /// Parallelism of every node.
        #[arg(long)]
        parallelism: Option<u32>,
        /// Start from this savepoint (`_metadata` path from `sluice savepoint`).
        #[arg(long)]
        from_savepoint: Option<String>,
    },
    /// List jobs.
    Jobs {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The cluster: the coordinator, its workers and the state nodes registered with it
    /// (`sluice state-service --coordinator URL`), with their load; `drain` and
    /// `rebalance` move jobs' state shards between the nodes.
    Cluster {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        action: Option<ClusterAction>,
    },
    /// One job's status.
    Status {
        #[command(flatten)]
        client: ClientArgs,
        /// The job's id.
        job: String,
    },
    /// Cancel a job now.
    Cancel {
        #[command(flatten)]
        client: ClientArgs,
        /// The job's id.
        job: String,
    },
    /// A job's completed checkpoints.
    Checkpoints {
        #[command(flatten)]
        client: ClientArgs,
        /// The job's id.
        job: String,
    },
    /// Take a savepoint (kept until deleted); prints its path.
    Savepoint {
        #[command(flatten)]
        client: ClientArgs,
        /// The job's id.
        job: String,
        /// Its name (default: savepoint-<time>).
        #[arg(long)]
        name: Option<String>,
    },
    /// Stop a job, after a savepoint with --savepoint.
    Stop {
        #[command(flatten)]
        client: ClientArgs,
        /// The job's id.
        job: String,
        /// Take this savepoint first.
        #[arg(long, num_args = 0..=1, default_missing_value = "")]
        savepoint: Option<String>,
    },
    /// Run a job at another parallelism (checkpoint, redeploy; no state moves).
    Rescale {
        #[command(flatten)]
        client: ClientArgs,
        /// The job's id.
        job: String,
        /// The new parallelism.
        #[arg(long)]
        parallelism: u32,
    },
}

/// What `sluice cluster` does besides listing.
#[derive(Subcommand)]
pub enum ClusterAction {
    /// Take a state node out of placement: every job with shards on it checkpoints and
    /// redeploys with them reopened on the other nodes (then the node can be stopped).
    Drain {
        /// The node's name (`--node-id`).
        node: String,
    },
    /// Spread every job's shards evenly over the live state nodes (after nodes joined),
    /// moving only the shards beyond each node's share.
    Rebalance,
}

fn default_savepoint_name() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    format!("savepoint-{secs}")
}

/// Runs a job command.
pub fn run(command: JobCommand) -> Result<(), Failure> {
    let (args, method, path, body) = request(command)?;
    let value = runtime()?.block_on(call_any(
        method,
        &args.coordinator,
        &path,
        body,
        &args.credentials,
    ))?;
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
        return Ok(());
    }
    print_human(&path, &value);
    Ok(())
}

/// The HTTP request of a command.
fn request(
    command: JobCommand,
) -> Result<(ClientArgs, &'static str, String, Option<Value>), Failure> {
    Ok(match command {
        JobCommand::Submit {
            client,
            job,
            workers,
            parallelism,
            from_savepoint,
        } => {
            let (text, file) = match &job {
                Some(job) => {
                    let (text, graph) = load_job_text(job)?;
                    runtime()?
                        .block_on(sluice_compute::plan::plan(
                            graph,
                            sluice_connectors::Builtin::shared(),
                        ))
                        .map_err(Failure::from_compute)?;
                    (Some(text), Some(job.display().to_string()))
                }
                None => (None, None),
            };
            let body = json!({
                "job": text,
                "file": file,
                "workers": workers,
                "parallelism": parallelism,
                "from_savepoint": from_savepoint,
            });
            (client, "POST", "/v1/jobs".to_string(), Some(body))
        }
        JobCommand::Jobs { client } => (client, "GET", "/v1/jobs".into(), None),
        JobCommand::Cluster {
            client,
            action: None,
        } => (client, "GET", "/v1/cluster".into(), None),
        JobCommand::Cluster {
            client,
            action: Some(ClusterAction::Drain { node }),
        } => (
            client,
            "POST",
            format!("/v1/state-nodes/{node}/drain"),
            None,
        ),
        JobCommand::Cluster {
            client,
            action: Some(ClusterAction::Rebalance),
        } => (client, "POST", "/v1/state-nodes/rebalance".into(), None),
        JobCommand::Status { client, job } => (client, "GET", format!("/v1/jobs/{job}"), None),
        JobCommand::Cancel { client, job } => {
            (client, "POST", format!("/v1/jobs/{job}/cancel"), None)
        }
        JobCommand::Checkpoints { client, job } => {
            (client, "GET", format!("/v1/jobs/{job}/checkpoints"), None)
        }
        JobCommand::Savepoint { client, job, name } => (
            client,
            "POST",
            format!("/v1/jobs/{job}/savepoints"),
            Some(json!({ "name": name.unwrap_or_else(default_savepoint_name) })),
        ),
        JobCommand::Stop {
            client,
            job,
            savepoint,
        } => {
            let savepoint = savepoint.map(|s| {
                if s.is_empty() {
                    default_savepoint_name()
                } else {
                    s
                }
            });
            (
                client,
                "POST",
                format!("/v1/jobs/{job}/stop"),
                Some(json!({ "savepoint": savepoint })),
            )
        }
        JobCommand::Rescale {
            client,
            job,
            parallelism,
        } => (
            client,
            "POST",
            format!("/v1/jobs/{job}/rescale"),
            Some(json!({ "parallelism": parallelism })),
        ),
    })
}

/// One REST call at `path` of the first of the coordinators `bases` (`URL1,URL2`)
/// that serves: one out of reach, or a standby (which answers 503 naming the leader),
/// gives way to the next; the last one's answer is the result.
pub(crate) async fn call_any(
    method: &str,
    bases: &str,
    path: &str,
    body: Option<Value>,
    credentials: &Credentials,
) -> Result<Value, Failure> {
    let bases = sluice_common::url_list::url_list(bases);
    if credentials.ca.is_none() && bases.iter().any(|b| b.starts_with("https://")) {
        return Err(Failure::usage(
            "an https:// coordinator needs --ca (or SLUICE_CA): the CA that signed its certificate",
        ));
    }
    let client = credentials.client()?;
    let token = credentials.token.as_deref();
    let mut refused = Vec::new();
    for (i, base) in bases.iter().enumerate() {
        let url = format!("{}{path}", base.trim_end_matches('/'));
        match attempt(&client, method, &url, body.clone(), token).await {
            Ok(v) => return Ok(v),
            Err((true, f)) if i + 1 < bases.len() => refused.push(f.message().to_owned()),
            Err((_, f)) if refused.is_empty() => return Err(f),
            Err((_, f)) => {
                refused.push(f.message().to_owned());
                return Err(Failure::from(anyhow::anyhow!(
                    "no coordinator serves: {}",
                    refused.join("; ")
                )));
            }
        }
    }
    Err(Failure::usage(
        "no coordinator address given (set --coordinator or SLUICE_COORDINATOR)",
    ))
}

/// One REST call; on failure, also whether another coordinator may serve it (this
/// one is out of reach or a standby).
async fn attempt(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> Result<Value, (bool, Failure)> {
    let mut request = match method {
        "POST" => client.post(url).json(&body.unwrap_or(json!({}))),
        _ => client.get(url),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| {
        // The causes say what went wrong with TLS (an unknown CA, an expired
        // certificate, a refused client certificate).
        let mut why = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            why.push_str(&format!(": {c}"));
            cause = c.source();
        }
        (
            e.is_connect(),
            Failure::from(anyhow::anyhow!(
                "cannot reach the coordinator at {url}: {why} (set --coordinator or \
                 SLUICE_COORDINATOR)"
            )),
        )
    })?;
    let status = response.status();
    let standby = response.headers().contains_key("x-sluice-standby");
    let text = response.text().await.map_err(|e| {
        (
            false,
            Failure::from(anyhow::anyhow!("reading the answer of {url}: {e}")),
        )
    })?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status.is_success() {
        return Ok(value);
    }
    let message = value
        .get("error")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| value.to_string());
    let message = match value.get("field").and_then(Value::as_str) {
        Some(f) if !f.is_empty() => format!("{message} (field `{f}`)"),
        _ => message,
    };
    Err((
        standby,
        if matches!(status.as_u16(), 400 | 401 | 403 | 404) {
            Failure::usage(message)
        } else {
            Failure::from(anyhow::anyhow!("{message}"))
        },
    ))
}

fn s(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".into(),
        Some(other) => other.to_string(),
    }
}

/// Prints `rows` under `header` in aligned columns.
pub(crate) fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        outln!("{}", parts.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r);
    }
}

fn print_human(path: &str, v: &Value) {
    if path == "/v1/cluster" {
        let mib = |x: &Value, k: &str| {
            x.get(k)
                .and_then(Value::as_u64)
                .map_or("-".into(), |b| format!("{}", b >> 20))
        };
        let list = |k: &str| {
            v.get(k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let coordinators = list("coordinators");
        if coordinators.len() > 1 || coordinators.iter().any(|c| c.get("http").is_some()) {
            outln!("coordinators:");
            table(
                &["ID", "ROLE", "REST", "GRPC"],
                coordinators
                    .iter()
                    .map(|c| vec![s(c, "id"), s(c, "role"), s(c, "http"), s(c, "grpc")])
                    .collect(),
            );
        }
        outln!("workers:");
        table(
            &["ID", "PID", "HOST", "SLOTS", "JOBS", "RSS_MIB"],
            list("workers")
                .iter()
                .map(|w| {
                    vec![
                        s(w, "id"),
                        s(w, "pid"),
                        s(w, "host"),
                        s(w, "slots"),
                        w.get("jobs")
                            .and_then(Value::as_array)
                            .map_or(0, Vec::len)
                            .to_string(),
                        mib(w, "rss_bytes"),
                    ]
                })
                .collect(),
        );
        outln!("state nodes:");
        table(
            &[
                "NODE",
                "ENDPOINT",
                "SHARDS",
                "STATE_MIB",
                "RSS_MIB",
                "MEMORY_MIB",
                "SEEN_MS",
            ],
            list("state_nodes")
                .iter()
                .map(|n| {
                    let shards = n.get("shards").and_then(Value::as_array);
                    let bytes: u64 = shards
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.get("bytes").and_then(Value::as_u64))
                        .sum();
                    let draining = n.get("draining").and_then(Value::as_bool) == Some(true);
                    vec![
                        format!(
                            "{}{}",
                            s(n, "node_id"),
                            if draining { " (drained)" } else { "" }
                        ),
                        s(n, "endpoint"),
                        shards.map_or(0, Vec::len).to_string(),
                        format!("{}", bytes >> 20),
                        mib(n, "rss_bytes"),
                        mib(n, "memory_bytes"),
                        s(n, "last_seen_ms"),
                    ]
                })
                .collect(),
        );
        return;
    }
    if path.starts_with("/v1/state-nodes/") {
        // What a drain or a rebalance did, per job.
        let rows = v
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                let o = m.get("outcome").cloned().unwrap_or(Value::Null);
                let what = match m.get("error").and_then(Value::as_str) {
                    Some(e) => format!("not moved: {e}"),
                    None => s(&o, "message"),
                };
                vec![s(m, "job"), s(&o, "state_bytes_restored"), what]
            })
            .collect();
        table(&["JOB", "BYTES_READ", "WHAT"], rows);
        return;
    }
    if path == "/v1/jobs" {
        if let Some(id) = v.get("id") {
            outln!("{}", id.as_str().unwrap_or_default());
            return;
        }
        let rows = v
            .as_array()
            .map(|jobs| {
                jobs.iter()
                    .map(|j| {
                        vec![
                            s(j, "id"),
                            s(j, "state"),
                            s(j, "parallelism"),
                            j.get("workers")
                                .and_then(Value::as_array)
                                .map_or(0, Vec::len)
                                .to_string(),
                            s(j, "last_checkpoint"),
                            s(j, "restarts"),
                        ]
                    })
                    .collect()
            })
            .unwrap_or_default();
        table(
            &[
                "ID",
                "STATE",
                "PARALLELISM",
                "WORKERS",
                "CHECKPOINT",
                "RESTARTS",
            ],
            rows,
        );
    } else if path.ends_with("/checkpoints") {
        let rows = v
            .as_array()
            .map(|cps| {
                cps.iter()
                    .map(|c| {
                        vec![
                            s(c, "id"),
                            s(c, "duration_ms"),
                            s(c, "commit_ms"),
                            s(c, "max_sync_micros"),
                            s(c, "max_alignment_micros"),
                            s(c, "channel_state_bytes"),
                            s(c, "tasks"),
                            s(c, "savepoint"),
                        ]
                    })
                    .collect()
            })
            .unwrap_or_default();
        table(
            &[
                "ID",
                "ACKED_MS",
                "COMMITTED_MS",
                "MAX_SYNC_US",
                "MAX_ALIGN_US",
                "IN_FLIGHT_BYTES",
                "TASKS",
                "SAVEPOINT",
            ],
            rows,
        );
    } else if let Some(obj) = v.as_object() {
        for (k, val) in obj {
            // Lists with commands or `--json` of their own.
            if k == "checkpoints" || k == "tasks" {
                continue;
            }
            let shown = match val {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            outln!("{k}: {shown}");
        }
        // Which split holds each source task's watermark: what a stalled window waits on.
        let held: Vec<String> = obj
            .get("tasks")
            .and_then(Value::as_array)
            .map(|tasks| {
                tasks
                    .iter()
                    .filter_map(|t| {
                        let split = t.get("watermark_held_by")?.as_str()?;
                        Some(format!("{}={split}", s(t, "task")))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !held.is_empty() {
            outln!("watermark_held_by: {}", held.join(", "));
        }
    } else {
        outln!("{v}");
    }
}
