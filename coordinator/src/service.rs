//! The coordinator process's core: jobs, workers and the operations the REST API and
//! `sluice run` call.
//!
//! Every submitted job is recorded in the metadata store (`jobs/<id>/job`, the encoded
//! graph, and `jobs/<id>/workers`); a job's end is recorded at `jobs/<id>/end`. A new
//! coordinator process ([`Coordinator::resume_jobs`]) resumes every recorded job without
//! an end from its newest valid checkpoint, so a coordinator crash costs the time to
//! restart, not the job.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use sluice_common::pb;
use sluice_common::pb::cluster::coordinator_server::CoordinatorServer;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::task::AbortOnDropHandle;

use crate::checkpoint::metadata::CheckpointMetadata;
use crate::checkpoint::store::{self, MetadataStore};
use crate::cluster::grpc::ControlService;
use crate::cluster::registry::{Registry, WorkerView};
use crate::cluster::state_nodes::{StateNodeView, StateNodes};
use crate::ha::Elector;
use crate::job::command::{Command, RescaleOutcome, StopOutcome};
use crate::job::graph::{max_parallelism, set_parallelism, uses_remote_state};
use crate::job::lifecycle::JobState;
use crate::job::master::{JobMaster, MasterConfig, StateConnector, WorkerLauncher};
use crate::job::status::JobStatus;

/// An error of an API call, with the HTTP status it maps to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The request is wrong (400); `field` names what was wrong.
    #[error("{message}")]
    BadRequest {
        /// The request field at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// No such job (404).
    #[error("{0}")]
    NotFound(String),
    /// The job cannot do that now (409).
    #[error("{0}")]
    Conflict(String),
    /// Something failed inside (500).
    #[error("{0}")]
    Internal(String),
    /// The request, or `field` in it, is larger than allowed (413).
    #[error("{message}")]
    TooLarge {
        /// What is too large (`body`, `job`).
        field: String,
        /// By how much, and the limit.
        message: String,
    },
    /// The request body is not JSON (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
}

impl ApiError {
    /// A 400 about `field`.
    pub fn bad(field: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

/// How a coordinator runs.
#[derive(Clone)]
pub struct CoordinatorOptions {
    /// Where `_metadata` objects and the job records live.
    pub store: Arc<dyn MetadataStore>,
    /// The state service jobs with remote state use.
    pub state: Option<Arc<dyn StateConnector>>,
    /// Starts workers on demand (embedded clusters).
    pub launcher: Option<Arc<dyn WorkerLauncher>>,
    /// Workers heartbeat this often.
    pub heartbeat_interval: Duration,
    /// A worker silent this long is lost.
    pub heartbeat_timeout: Duration,
    /// Settings every job's master starts from (`workers` is the default per job).
    pub master: MasterConfig,
}

struct JobEntry {
    /// Whose state-service shards it uses (remote state only).
    state_id: Option<String>,
    commands: mpsc::UnboundedSender<Command>,
    status: watch::Receiver<JobStatus>,
    done: Option<AbortOnDropHandle<JobState>>,
}

/// What a drain or a rebalance did to one job.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardMove {
    /// The job.
    pub job: String,
    /// What it did, when it could.
    pub outcome: Option<RescaleOutcome>,
    /// Why it could not move its shards (it keeps running where it was).
    pub error: Option<String>,
}

/// What `submit` needs besides the graph.
#[derive(Debug, Clone, Default)]
pub struct SubmitOptions {
    /// Worker processes to use (default: the coordinator's setting).
    pub workers: Option<usize>,
    /// Start from this savepoint's `_metadata` path.
    pub from_savepoint: Option<String>,
    /// Run every node at this parallelism.
    pub parallelism: Option<u32>,
    /// The job's id (default: its name and a unique suffix); must not be in use.
    pub job_id: Option<String>,
}

/// The coordinator: a registry of workers and a master per job.
pub struct Coordinator {
    registry: Arc<Registry>,
    state_nodes: Arc<StateNodes>,
    options: CoordinatorOptions,
    jobs: Mutex<BTreeMap<String, JobEntry>>,
    /// The election this coordinator takes part in (`--ha`); without one it leads.
    elector: std::sync::OnceLock<Arc<Elector>>,
    /// The cluster CA's signing half, when workers may join with a join token.
    join_authority: std::sync::OnceLock<Arc<sluice_common::tls::CertificateAuthority>>,
    /// How long after a state node joined every job's shards are spread again (ms;
    /// 0: only `sluice cluster rebalance` does).
    rebalance_after_join_ms: std::sync::atomic::AtomicU64,
}

impl Coordinator {
    /// A coordinator with no workers and no jobs.
    pub fn new(options: CoordinatorOptions) -> Arc<Self> {
        Arc::new(Self {
            registry: Arc::new(Registry::new(options.heartbeat_timeout)),
            state_nodes: Arc::new(StateNodes::new(options.heartbeat_timeout)),
            options,
            jobs: Mutex::new(BTreeMap::new()),
            elector: std::sync::OnceLock::new(),
            join_authority: std::sync::OnceLock::new(),
            rebalance_after_join_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Spreads every job's shards again `after` a state node joined (once the joins
    /// settled), as `sluice cluster rebalance` does; `Duration::ZERO`: never by itself.
    pub fn set_rebalance_after_join(&self, after: Duration) {
        self.rebalance_after_join_ms.store(
            u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Starts a rebalance when a node joined long enough ago (see
    /// [`Coordinator::set_rebalance_after_join`]); called on every reaper tick.
    fn rebalance_if_joined(self: &Arc<Self>) {
        let ms = self
            .rebalance_after_join_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        if ms == 0
            || self.serving().is_err()
            || !self.state_nodes.joined_before(Duration::from_millis(ms))
        {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            for m in me.rebalance_state().await {
                match (m.outcome, m.error) {
                    (Some(outcome), _) => {
                        tracing::info!(job = %m.job, "a state node joined: shards spread again ({outcome:?})");
                    }
                    (None, Some(e)) => {
                        tracing::warn!(job = %m.job, "a state node joined, but the shards stay: {e}");
                    }
                    (None, None) => {}
                }
            }
        });
    }

    /// Makes this coordinator serve only while `elector` says it leads: until then its
    /// gRPC and REST APIs refuse with the leader's address.
    pub fn set_elector(&self, elector: Arc<Elector>) {
        let _ = self.elector.set(elector);
    }

    /// Lets workers it was not given join (`POST /v1/workers/join`): it signs their
    /// certificates with the cluster's CA.
    pub fn set_join_authority(&self, ca: Arc<sluice_common::tls::CertificateAuthority>) {
        let _ = self.join_authority.set(ca);
    }

    /// A certificate of the cluster's CA for a joining worker seen at `peer`, which says
    /// its data address is `host`: the certificate and the CA, PEM.
    ///
    /// # Errors
    /// No CA here (409), a `host` other than the address the request came from, or a
    /// request that is not a valid certificate signing request (400).
    pub fn join_worker(
        &self,
        peer: std::net::IpAddr,
        host: &str,
        csr: &str,
    ) -> Result<serde_json::Value, ApiError> {
        let Some(ca) = self.join_authority.get() else {
            return Err(ApiError::Conflict(
                "this coordinator does not let workers join: start it with --join-ca-key \
                 (sluice deploy does with `worker_join: true`)"
                    .into(),
            ));
        };
        let asked: std::net::IpAddr = host
            .parse()
            .map_err(|_| ApiError::bad("host", format!("`{host}` is not an IP address")))?;
        // The certificate names the address the worker was seen at: a token alone does
        // not let one host pose as another.
        if asked.to_canonical() != peer.to_canonical() {
            return Err(ApiError::bad(
                "host",
                format!(
                    "this worker says its address is {asked} but its request came from {}; \
                     run it with --host {}",
                    peer.to_canonical(),
                    peer.to_canonical()
                ),
            ));
        }
        let certificate = ca
            .sign_request(csr, asked, &format!("sluice worker {asked}"))
            .map_err(|e| ApiError::bad("csr", e))?;
        tracing::info!("signed a certificate for a worker joining from {asked}");
        Ok(serde_json::json!({ "certificate": certificate, "ca": ca.ca_pem() }))
    }

    /// Whether this coordinator serves now; otherwise why not (a standby, naming the
    /// leader).
    pub fn serving(&self) -> Result<(), String> {
        self.elector.get().map_or(Ok(()), |e| e.check())
    }

    /// The coordinators of this cluster, each with its role (`leader` or `standby`):
    /// from etcd under `--ha`, otherwise this one.
    pub async fn coordinators(&self) -> Vec<serde_json::Value> {
        let Some(elector) = self.elector.get() else {
            return vec![
                serde_json::json!({ "id": "-", "role": "leader", "pid": std::process::id() }),
            ];
        };
        match elector.members().await {
            Ok((members, leader)) => members
                .into_iter()
                .map(|m| {
                    let role = if leader.as_ref().is_some_and(|l| l.id == m.id) {
                        "leader"
                    } else {
                        "standby"
                    };
                    serde_json::json!({ "id": m.id, "http": m.http, "grpc": m.grpc, "role": role })
                })
                .collect(),
            Err(e) => vec![serde_json::json!({
                "id": elector.me().id, "role": "unknown", "error": e
            })],
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, JobEntry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves the workers' gRPC API on `listener` and watches their heartbeats, until
    /// the returned handle is dropped.
    pub fn serve_workers(self: &Arc<Self>, listener: TcpListener) -> AbortOnDropHandle<()> {
        let registry = self.registry.clone();
        let reaper = registry.clone();
        let nodes = self.state_nodes.clone();
        let period = self.options.heartbeat_interval;
        let me = Arc::downgrade(self);
        let reaping = AbortOnDropHandle::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                reaper.reap();
                nodes.reap();
                if let Some(c) = me.upgrade() {
                    c.rebalance_if_joined();
                }
            }
        }));
        // A standby refuses workers and state nodes, naming the leader they should try.
        let gate = Arc::clone(self);
        let service = ControlService::new(
            registry,
            self.state_nodes.clone(),
            self.options.heartbeat_interval.as_millis() as u64,
        );
        AbortOnDropHandle::new(tokio::spawn(async move {
            let _reaping = reaping;
            // Without TCP_NODELAY a small control message waits out the peer's delayed
            // ACK (40 ms on Linux): that alone doubled an empty job's start-up.
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            let mut builder = match sluice_common::tls::grpc_server() {
                Ok(builder) => builder,
                Err(e) => {
                    tracing::error!("the coordinator's gRPC server cannot start: {e}");
                    return;
                }
            };
            let served = builder
                .add_service(tonic::service::interceptor::InterceptedService::new(
                    CoordinatorServer::new(service)
                        .max_decoding_message_size(sluice_common::MAX_CONTROL_MESSAGE_BYTES)
                        .max_encoding_message_size(sluice_common::MAX_CONTROL_MESSAGE_BYTES),
                    move |request: tonic::Request<()>| match gate.serving() {
                        Ok(()) => Ok(request),
                        Err(why) => Err(tonic::Status::unavailable(why)),
                    },
                ))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = served {
                tracing::error!("the coordinator's gRPC server stopped: {e}");
            }
        }))
    }

    /// The attached workers.
    pub fn workers(&self) -> Vec<WorkerView> {
        self.registry.view()
    }

    /// The registered state nodes.
    pub fn state_nodes(&self) -> Vec<StateNodeView> {
        self.state_nodes.view()
    }

    /// Accepts `graph` as a new job and starts it; returns its id.
    pub async fn submit(
        self: &Arc<Self>,
        mut graph: pb::JobGraph,
        options: SubmitOptions,
    ) -> Result<String, ApiError> {
        if graph.nodes.is_empty() {
            return Err(ApiError::bad("job", "the job has no nodes"));
        }
        if options.workers == Some(0) {
            return Err(ApiError::bad("workers", "must be at least 1"));
        }
        let (resume, savepoint_state) = match &options.from_savepoint {
            Some(path) => {
                let (meta, state) = self.read_savepoint(path, &graph).await?;
                (Some(meta), state)
            }
            None => (None, None),
        };
        if let Some(p) = options.parallelism {
            let max = max_parallelism(&graph);
            if p == 0 || p > max {
                return Err(ApiError::bad(
                    "parallelism",
                    format!("must be between 1 and the job's max_parallelism ({max})"),
                ));
            }
            set_parallelism(&mut graph, p);
        }
        let id = match options.job_id {
            Some(id) => {
                store::validate_name("job id", &id)
                    .map_err(|e| ApiError::bad("job_id", e.to_string()))?;
                if self.lock().contains_key(&id) {
                    return Err(ApiError::Conflict(format!("job `{id}` exists")));
                }
                id
            }
            None => new_job_id(&graph.name),
        };
        let workers = options
            .workers
            .unwrap_or(self.options.master.workers)
            .max(1);
        let state_id =
            uses_remote_state(&graph).then(|| savepoint_state.unwrap_or_else(|| id.clone()));
        let store = &self.options.store;
        let mut records = vec![("workers", workers.to_string())];
        if let Some(s) = &state_id {
            records.push(("state", s.clone()));
        }
        if let Some(p) = &options.from_savepoint {
            let rel = store
                .relative(p)
                .map_err(|e| ApiError::bad("from_savepoint", e))?;
            records.push(("from", rel));
        }
        for (name, value) in records {
            store
                .create_if_absent(&format!("jobs/{id}/{name}"), Bytes::from(value))
                .await
                .map_err(|e| ApiError::Internal(format!("cannot record the job: {e}")))?;
        }
        store
            .create_if_absent(
                &format!("jobs/{id}/job"),
                Bytes::from(graph.encode_to_vec()),
            )
            .await
            .map_err(|e| ApiError::Internal(format!("cannot record the job: {e}")))?;
        self.start(id.clone(), graph, workers, resume, state_id);
        Ok(id)
    }

    /// Reads a savepoint for `graph`; with remote state, also whose shards hold its
    /// state (the savepoint's job's), which no running job may be using.
    /// The job graph savepoint `path` was taken with, to run its job again as it was
    /// (at the parallelism it had then).
    pub async fn savepoint_graph(&self, path: &str) -> Result<pb::JobGraph, ApiError> {
        let meta = self.savepoint_metadata(path).await?;
        pb::JobGraph::decode(meta.job_graph).map_err(|e| {
            ApiError::bad(
                "from_savepoint",
                format!("savepoint `{path}` records no readable job graph: {e}"),
            )
        })
    }

    /// The `_metadata` of savepoint `path`, checked to be restorable.
    async fn savepoint_metadata(&self, path: &str) -> Result<CheckpointMetadata, ApiError> {
        let store = self.options.store.as_ref();
        let path = &store
            .relative(path)
            .map_err(|e| ApiError::bad("from_savepoint", e))?;
        store::read_restorable(store, path)
            .await
            .map_err(|e| match e {
                crate::Error::NotFound(_) => {
                    ApiError::bad("from_savepoint", format!("no savepoint at `{path}`"))
                }
                other => ApiError::bad(
                    "from_savepoint",
                    format!("savepoint `{path}` cannot be used: {other}"),
                ),
            })
    }

    async fn read_savepoint(
        &self,
        path: &str,
        graph: &pb::JobGraph,
    ) -> Result<(CheckpointMetadata, Option<String>), ApiError> {
        let meta = self.savepoint_metadata(path).await?;
        let store = self.options.store.as_ref();
        if !uses_remote_state(graph) {
            return Ok((meta, None));
        }
        let record = format!("jobs/{}/state", meta.job_id);
        let state_id = match store.get(&record).await {
            Ok(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(None) => meta.job_id.clone(),
            Err(e) => return Err(ApiError::Internal(format!("reading {record}: {e}"))),
        };
        let busy = self.lock().iter().find_map(|(id, e)| {
            let ended = e.status.borrow().state.is_terminal();
            (e.state_id.as_deref() == Some(state_id.as_str()) && !ended).then(|| id.clone())
        });
        if let Some(other) = busy {
            return Err(ApiError::Conflict(format!(
                "job `{other}` still runs on the state of this savepoint; stop it first"
            )));
        }
        Ok((meta, Some(state_id)))
    }

    fn start(
        self: &Arc<Self>,
        id: String,
        graph: pb::JobGraph,
        workers: usize,
        resume: Option<CheckpointMetadata>,
        state_id: Option<String>,
    ) {
        let mut config = self.options.master.clone();
        config.workers = workers;
        config.state_id = state_id.clone();
        let handle = JobMaster::spawn(
            id.clone(),
            graph,
            config,
            self.registry.clone(),
            self.options.store.clone(),
            self.options.state.clone(),
            self.state_nodes.clone(),
            self.options.launcher.clone(),
            resume,
        );
        self.lock().insert(
            id,
            JobEntry {
                state_id,
                commands: handle.commands,
                status: handle.status,
                done: Some(handle.done),
            },
        );
    }

    /// Resumes every job the store records without an end, from its newest valid
    /// checkpoint; returns their ids.
    pub async fn resume_jobs(self: &Arc<Self>) -> Result<Vec<String>, ApiError> {
        let store = self.options.store.as_ref();
        let paths = store
            .list("jobs")
            .await
            .map_err(|e| ApiError::Internal(format!("cannot list jobs: {e}")))?;
        let mut resumed = Vec::new();
        for path in paths.iter().filter(|p| p.ends_with("/job")) {
            let Some(id) = path
                .strip_prefix("jobs/")
                .and_then(|p| p.strip_suffix("/job"))
            else {
                continue;
            };
            if paths.iter().any(|p| p == &format!("jobs/{id}/end")) || self.lock().contains_key(id)
            {
                continue;
            }
            let graph = match store.get(path).await {
                Ok(Some(b)) => match pb::JobGraph::decode(b) {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::warn!(job = id, "job record is corrupt ({e}); not resumed");
                        continue;
                    }
                },
                _ => continue,
            };
            let workers = match store.get(&format!("jobs/{id}/workers")).await {
                Ok(Some(b)) => String::from_utf8_lossy(&b).trim().parse().unwrap_or(1),
                _ => self.options.master.workers,
            };
            let mut latest = store::latest_valid(store, id)
                .await
                .map_err(|e| ApiError::Internal(format!("reading checkpoints of {id}: {e}")))?;
            if latest.is_none()
                && let Ok(Some(from)) = store.get(&format!("jobs/{id}/from")).await
            {
                // Started from a savepoint and no checkpoint of its own yet.
                let path = String::from_utf8_lossy(&from).into_owned();
                latest = store::read_restorable(store, &path).await.ok();
            }
            let graph = match &latest {
                // The checkpoint records the graph it was taken with (a rescale
                // changes parallelism).
                Some(m) if m.job_id == id => {
                    pb::JobGraph::decode(m.job_graph.clone()).unwrap_or(graph)
                }
                _ => graph,
            };
            let state_id = match store.get(&format!("jobs/{id}/state")).await {
                Ok(Some(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                _ => uses_remote_state(&graph).then(|| id.to_string()),
            };
            tracing::info!(job = id, checkpoint = ?latest.as_ref().map(|m| m.checkpoint_id), "resuming job");
            self.start(id.to_string(), graph, workers, latest, state_id);
            resumed.push(id.to_string());
        }
        Ok(resumed)
    }

    /// Every job's status.
    pub fn jobs(&self) -> Vec<JobStatus> {
        self.lock()
            .values()
            .map(|e| e.status.borrow().clone())
            .collect()
    }

    /// One job's status.
    pub fn status(&self, id: &str) -> Result<JobStatus, ApiError> {
        self.lock()
            .get(id)
            .map(|e| e.status.borrow().clone())
            .ok_or_else(|| ApiError::NotFound(format!("no job `{id}`")))
    }

    async fn ask<T>(
        &self,
        id: &str,
        make: impl FnOnce(oneshot::Sender<Result<T, String>>) -> Command,
    ) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        {
            let jobs = self.lock();
            let entry = jobs
                .get(id)
                .ok_or_else(|| ApiError::NotFound(format!("no job `{id}`")))?;
            if entry.commands.send(make(tx)).is_err() {
                return Err(ApiError::Conflict(format!("job `{id}` has ended")));
            }
        }
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(ApiError::Conflict(e)),
            Err(_) => Err(ApiError::Conflict(format!("job `{id}` has ended"))),
        }
    }

    /// Cancels job `id`.
    pub async fn cancel(&self, id: &str) -> Result<(), ApiError> {
        self.ask(id, |reply| Command::Cancel { reply }).await
    }

    /// Takes savepoint `name` of job `id`; returns its `_metadata` path.
    pub async fn savepoint(&self, id: &str, name: &str) -> Result<String, ApiError> {
        store::validate_name("savepoint name", name)
            .map_err(|e| ApiError::bad("name", e.to_string()))?;
        let name = name.to_string();
        self.ask(id, |reply| Command::Savepoint { name, reply })
            .await
    }

    /// Stops job `id`, after savepoint `savepoint` if given; returns its path (and a
    /// warning when the stop did not go entirely as it should).
    pub async fn stop(&self, id: &str, savepoint: Option<String>) -> Result<StopOutcome, ApiError> {
        if let Some(n) = &savepoint {
            store::validate_name("savepoint name", n)
                .map_err(|e| ApiError::bad("savepoint", e.to_string()))?;
        }
        self.ask(id, |reply| Command::Stop { savepoint, reply })
            .await
    }

    /// Rescales job `id` to `parallelism`.
    pub async fn rescale(&self, id: &str, parallelism: u32) -> Result<RescaleOutcome, ApiError> {
        if parallelism == 0 {
            return Err(ApiError::bad("parallelism", "must be at least 1"));
        }
        self.ask(id, |reply| Command::Rescale { parallelism, reply })
            .await
    }

    /// Drains state node `node`: no shard is placed on it any more, and every job with
    /// shards on it moves them to the other nodes (a checkpoint, then a redeploy that
    /// reopens them there); returns what each job did, by job id.
    pub async fn drain_state_node(&self, node: &str) -> Result<Vec<ShardMove>, ApiError> {
        let endpoint = self.state_nodes.drain(node).map_err(ApiError::NotFound)?;
        Ok(self.move_shards(Some(endpoint)).await)
    }

    /// Spreads every job's shards evenly over the live state nodes (after nodes joined),
    /// moving only what must; returns what each job did.
    pub async fn rebalance_state(&self) -> Vec<ShardMove> {
        self.move_shards(None).await
    }

    async fn move_shards(&self, off: Option<String>) -> Vec<ShardMove> {
        let live: Vec<String> = self
            .state_nodes
            .live()
            .into_iter()
            .filter(|n| !n.draining)
            .map(|n| n.endpoint)
            .collect();
        let jobs: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, e)| e.state_id.is_some() && !e.status.borrow().state.is_terminal())
            .map(|(id, _)| id.clone())
            .collect();
        let mut moves = Vec::new();
        for job in jobs {
            let (off, live) = (off.clone(), live.clone());
            let outcome = self
                .ask(&job, |reply| Command::MoveShards { off, live, reply })
                .await;
            moves.push(ShardMove {
                job,
                outcome: outcome.as_ref().ok().cloned(),
                error: outcome.err().map(|e| e.to_string()),
            });
        }
        moves
    }

    /// Waits for job `id` to end; returns its final status.
    pub async fn wait(&self, id: &str) -> Result<JobStatus, ApiError> {
        let done = self
            .lock()
            .get_mut(id)
            .ok_or_else(|| ApiError::NotFound(format!("no job `{id}`")))?
            .done
            .take();
        if let Some(d) = done {
            let _ = d.await;
        }
        self.status(id)
    }
}

/// A fresh job id: the job's name (letters, digits, `-`, `_`) and a unique suffix.
fn new_job_id(name: &str) -> String {
    let base: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    let base = if base.is_empty() { "job".into() } else { base };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let seed = format!("{nanos}-{}-{base}", std::process::id());
    let h = xxhash_rust::xxh3::xxh3_64(seed.as_bytes());
    format!("{base}-{:08x}", h as u32)
}

/// Binds `addr` for a coordinator API.
pub async fn bind(addr: &str, what: &str) -> Result<(TcpListener, SocketAddr), ApiError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| ApiError::Internal(format!("cannot listen on {addr} for {what}: {e}")))?;
    let a = l
        .local_addr()
        .map_err(|e| ApiError::Internal(format!("{what} address: {e}")))?;
    Ok((l, a))
}

#[cfg(test)]
mod tests {
    use sluice_common::pb::cluster as pbc;

    use super::*;
    use crate::checkpoint::MemoryMetadataStore;
    use crate::checkpoint::metadata::encode;
    use crate::checkpoint::store::checkpoint_path;
    use crate::job::RestartPolicy;
    use crate::job::graph::node_parallelism;

    fn graph(parallelism: u32) -> pb::JobGraph {
        let node = |id| pb::Node {
            id,
            parallelism,
            ..Default::default()
        };
        pb::JobGraph {
            name: "j".into(),
            nodes: vec![node(1), node(2)],
            checkpoint: Some(pb::CheckpointConfig {
                interval_ms: 1000,
                mode: 0,
                timeout_ms: 0,
                aligned_timeout_ms: 0,
            }),
            ..Default::default()
        }
    }

    fn checkpoint(id: u64, parallelism: u32) -> Bytes {
        let g = graph(parallelism);
        encode(&CheckpointMetadata {
            job_id: "j-1".into(),
            checkpoint_id: id,
            job_graph: Bytes::from(g.encode_to_vec()),
            parallelism: node_parallelism(&g),
            ..CheckpointMetadata::default()
        })
    }

    fn options(store: Arc<MemoryMetadataStore>) -> CoordinatorOptions {
        CoordinatorOptions {
            store,
            state: None,
            launcher: None,
            heartbeat_interval: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_secs(1),
            master: MasterConfig {
                workers: 1,
                restart: RestartPolicy::default(),
                deploy_timeout: Duration::from_secs(1),
                network: pbc::NetworkConfig::default(),
                metrics_interval_ms: 0,
                coordinator_id: "c2".into(),
                state_id: None,
                in_process_state: false,
            },
        }
    }

    #[tokio::test]
    async fn a_joining_worker_gets_a_certificate_only_for_the_address_it_calls_from() {
        let c = Coordinator::new(options(Arc::new(MemoryMetadataStore::new())));
        let (_, csr) = sluice_common::tls::certificate_request("w").unwrap();
        let peer: std::net::IpAddr = "10.0.2.7".parse().unwrap();
        // Without the CA's key nothing is signed, and the operator is told how to enable it.
        let no_ca = c.join_worker(peer, "10.0.2.7", &csr).unwrap_err();
        assert!(matches!(&no_ca, ApiError::Conflict(m) if m.contains("--join-ca-key")));
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap().pem();
        c.set_join_authority(Arc::new(
            sluice_common::tls::CertificateAuthority::from_pem(&ca, &key.serialize_pem()).unwrap(),
        ));
        let signed = c.join_worker(peer, "10.0.2.7", &csr).unwrap();
        assert!(
            signed["certificate"]
                .as_str()
                .unwrap()
                .contains("BEGIN CERTIFICATE")
        );
        assert_eq!(signed["ca"].as_str(), Some(ca.as_str()));
        // Another host's address, or a request that is not one, is refused by field.
        match c.join_worker(peer, "10.0.2.8", &csr) {
            Err(ApiError::BadRequest { field, message }) => {
                assert_eq!(field, "host");
                assert!(
                    message.contains(
                        "says its address is 10.0.2.8 but its request came from 10.0.2.7"
                    ),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            c.join_worker(peer, "10.0.2.7", "junk"),
            Err(ApiError::BadRequest { field, .. }) if field == "csr"
        ));
    }

    /// A coordinator that died while a rescale 2 → 4 deployed its new attempt left the
    /// rescale's checkpoint (at 2), one checkpoint at 4, and a corrupt newer one.
    #[tokio::test]
    async fn a_new_coordinator_resumes_from_the_newest_valid_checkpoint_at_its_parallelism() {
        let store = Arc::new(MemoryMetadataStore::new());
        let put = |path: &str, bytes: Bytes| store.overwrite(path, bytes);
        put("jobs/j-1/job", Bytes::from(graph(2).encode_to_vec()));
        put("jobs/j-1/workers", Bytes::from_static(b"2"));
        put(&checkpoint_path("j-1", 5).unwrap(), checkpoint(5, 2));
        put(&checkpoint_path("j-1", 6).unwrap(), checkpoint(6, 4));
        put(
            &checkpoint_path("j-1", 7).unwrap(),
            Bytes::from_static(b"torn"),
        );
        let c = Coordinator::new(options(store.clone()));
        assert_eq!(c.resume_jobs().await.unwrap(), vec!["j-1".to_string()]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let status = loop {
            let s = c.status("j-1").unwrap();
            if s.waiting_for.is_some() || tokio::time::Instant::now() >= deadline {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(status.state, JobState::Scheduling, "{status:?}");
        assert_eq!(status.last_checkpoint, Some(6));
        assert_eq!(status.parallelism, 4);
        assert_eq!(
            status.waiting_for.as_deref(),
            Some("workers with a free slot: 0 of 2")
        );
        // A job that is not running takes no savepoint and says why.
        let refused = c.savepoint("j-1", "sp").await.unwrap_err();
        assert!(refused.to_string().contains("being scheduled"), "{refused}");
        c.cancel("j-1").await.unwrap();
        let ended = c.wait("j-1").await.unwrap();
        assert_eq!(ended.state, JobState::Cancelled);
        assert!(store.get("jobs/j-1/end").await.unwrap().is_some());
    }
}
