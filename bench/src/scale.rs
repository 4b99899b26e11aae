//! `sluice bench scale`: the coordinator at a size this machine cannot run for real,
//! by simulation. One real coordinator (`sluice_coordinator::service::Coordinator`, with
//! the binary's master settings and state connector from [`Host`]) serves `--workers`
//! simulated workers and `--state-nodes` simulated state nodes, all in this process and
//! all speaking the real gRPC protocols over loopback:
//! - a simulated worker attaches (`Coordinator.Attach`), heartbeats, binds no port but
//!   answers `Prepare`, plans the deployed job and announces the subtasks round-robin
//!   placement gives it (as `sluice worker` does), acknowledges every checkpoint for
//!   each of them at once and reports a cancelled attempt; it runs no operator;
//! - a simulated state node registers (`Coordinator.AttachStateNode`), heartbeats the
//!   shards it has open, and serves the state service's RPCs with no data behind them.
//!
//! A job of `--parallelism` subtasks per chain (two chains: `2 x parallelism` subtasks)
//! with remote state in `--shards` shards and a checkpoint every `--interval-ms` runs for
//! `--seconds`. Measured: the checkpoints' coordination time, trigger to the last
//! acknowledgement and to the `_metadata` commit (p50, p99, max), the CPU this process
//! spent per checkpoint (the simulated roles' included: an upper bound for the
//! coordinator), and, after one state node is stopped and a worker reports the failure a
//! real one would, the time until the job runs again with every shard placed on the
//! surviving nodes (`replace_ms`).
//!
//! Output: `workers state_nodes subtasks shards checkpoints p50_ms p99_ms max_ms
//! commit_p99_ms cpu_ms_per_checkpoint replace_ms`; progress on stderr.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args as ClapArgs;
use sluice_common::outln;
use sluice_common::pb::cluster::coordinator_client::CoordinatorClient;
use sluice_common::pb::cluster::{
    self as pbc, coordinator_message as cm, state_node_command, state_node_message,
    worker_message as wm,
};
use sluice_common::pb::state as pbs;
use sluice_common::pb::state::state_service_server::{StateService, StateServiceServer};
use sluice_compute::network::NetworkConfig;
use sluice_compute::runtime::build::Placement;
use sluice_coordinator::checkpoint::store::MemoryMetadataStore;
use sluice_coordinator::job::JobState;
use sluice_coordinator::service::{self, Coordinator, CoordinatorOptions, SubmitOptions};
use sluice_planner::job_spec;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use tonic::{Request, Response, Status};

use crate::harness::runtime;
use crate::harness::table::Table;
use crate::harness::timing::{percentile, wait_for};
use crate::{Error, Host, Result};

const TABLE: Table = Table::new(
    &[
        "workers",
        "state_nodes",
        "subtasks",
        "shards",
        "checkpoints",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "commit_p99_ms",
        "cpu_ms_per_checkpoint",
        "replace_ms",
    ],
    " ",
);

/// How often the simulated roles heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(500);

/// Arguments of `sluice bench scale`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Simulated workers (each takes one slot of the job).
    #[arg(long, default_value_t = 500)]
    workers: u32,
    /// Simulated state nodes.
    #[arg(long, default_value_t = 50)]
    state_nodes: u32,
    /// Parallelism of the job's two chains (subtasks: twice this).
    #[arg(long, default_value_t = 2500)]
    parallelism: u32,
    /// State shards of the job.
    #[arg(long, default_value_t = 500)]
    shards: u32,
    /// Checkpoint interval.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Seconds of running over which checkpoints are measured.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
}

/// Runs `sluice bench scale`.
pub fn run(args: Args, host: &dyn Host) -> Result<()> {
    if args.workers == 0 || args.state_nodes < 2 || args.parallelism == 0 || args.shards == 0 {
        return Err(Error::usage(
            "--workers, --parallelism and --shards must be positive, --state-nodes at least 2",
        ));
    }
    let rt = runtime()?;
    outln!("{}", TABLE.header());
    let line = rt
        .block_on(run_one(&args, host))
        .context("scale simulation")?;
    outln!("{line}");
    Ok(())
}

async fn run_one(args: &Args, host: &dyn Host) -> anyhow::Result<String> {
    let (listener, addr) = service::bind("127.0.0.1:0", "workers")
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let grpc = format!("http://{addr}");
    let mut master = host.master_config(args.workers as usize, &NetworkConfig::default(), 0);
    master.deploy_timeout = Duration::from_secs(120);
    let coordinator = Coordinator::new(CoordinatorOptions {
        store: Arc::new(MemoryMetadataStore::new()),
        state: Some(host.state_connector(String::new())),
        launcher: None,
        heartbeat_interval: HEARTBEAT,
        heartbeat_timeout: Duration::from_secs(10),
        master,
    });
    let _server = coordinator.serve_workers(listener);

    let started = Instant::now();
    let mut nodes = Vec::new();
    for i in 0..args.state_nodes {
        nodes.push(SimNode::start(&grpc, &format!("sim-node-{i}")).await?);
    }
    let triggers = Triggers::default();
    let workers: Vec<_> = (0..args.workers)
        .map(|i| {
            let name = format!("sim-worker-{i}");
            tokio::spawn(sim_worker(grpc.clone(), name, triggers.clone()))
        })
        .map(AbortOnDropHandle::new)
        .collect();
    let (w, n) = (args.workers as usize, args.state_nodes as usize);
    wait_for(
        "the simulated roles to attach",
        Duration::from_secs(120),
        || coordinator.workers().len() >= w && coordinator.state_nodes().len() >= n,
    )
    .await
    .with_context(|| {
        format!(
            "{} of {w} workers and {} of {n} state nodes attached",
            coordinator.workers().len(),
            coordinator.state_nodes().len()
        )
    })?;
    eprintln!(
        "{w} workers and {n} state nodes attached in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let yaml = format!(
        "name: scale\nparallelism: {p}\nmax_parallelism: {max}\n\
         checkpoint: {{ interval: {i}ms }}\n\
         state: {{ backend: remote, shards: {s} }}\n\
         source:\n  nexmark: {{ stream: bid, events: 0, splits: {p} }}\n\
         watermark: {{ column: date_time, max_out_of_orderness: 2s }}\n\
         pipeline:\n  - key_by: [auction]\n  - window: {{ tumbling: 10s }}\n    aggregate: [\"count(*) AS bids\"]\n\
         sink:\n  blackhole: {{}}\n",
        p = args.parallelism,
        max = args
            .parallelism
            .max(args.shards)
            .next_power_of_two()
            .max(128),
        i = args.interval_ms,
        s = args.shards,
    );
    let graph = job_spec::parse_job("scale.yaml", &yaml)?;
    let deploying = Instant::now();
    let id = coordinator
        .submit(graph, SubmitOptions::default())
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let status = || coordinator.status(&id).map_err(|e| anyhow!("{e}"));
    let limit = Duration::from_secs(300);
    wait_for("the first checkpoint", limit, || {
        coordinator
            .status(&id)
            .is_ok_and(|s| s.last_checkpoint.is_some() || s.state == JobState::Failed)
    })
    .await?;
    let st = status()?;
    if st.state == JobState::Failed {
        bail!("the job failed: {}", st.failure.unwrap_or_default());
    }
    eprintln!(
        "deployed and first checkpoint in {:.1} s",
        deploying.elapsed().as_secs_f64()
    );

    let first = st.checkpoints.len();
    let cpu_before = sluice_common::process::cpu_seconds(std::process::id()).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let cpu = sluice_common::process::cpu_seconds(std::process::id()).unwrap_or(0.0) - cpu_before;
    let st = status()?;
    let measured = &st.checkpoints[first.min(st.checkpoints.len())..];
    let mut acked: Vec<u64> = measured.iter().map(|c| c.duration_ms).collect();
    let mut committed: Vec<u64> = measured.iter().map(|c| c.commit_ms).collect();
    acked.sort_unstable();
    committed.sort_unstable();
    let cpu_per = if measured.is_empty() {
        0.0
    } else {
        cpu * 1000.0 / measured.len() as f64
    };

    // A state node goes; a worker fails as a real one would when its shard's node stops
    // answering; the job runs again with the node's shards on the survivors.
    let victim = nodes.remove(0);
    let lost: HashSet<String> = victim.open();
    let before = st.attempt;
    let killed = Instant::now();
    drop(victim);
    let worker = coordinator
        .workers()
        .into_iter()
        .find(|w| !w.jobs.is_empty())
        .ok_or_else(|| anyhow!("no worker runs the job"))?;
    if let Some(tx) = triggers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&worker.id)
    {
        let _ = tx.send(before);
    }
    wait_for("the job to run again", limit, || {
        coordinator.status(&id).is_ok_and(|s| {
            (s.attempt > before && s.state == JobState::Running) || s.state == JobState::Failed
        })
    })
    .await?;
    let replace = killed.elapsed();
    let st = status()?;
    if st.state == JobState::Failed {
        bail!(
            "the job failed after the node's loss: {}",
            st.failure.unwrap_or_default()
        );
    }
    let reopened: usize = nodes
        .iter()
        .map(|n| n.open().intersection(&lost).count())
        .sum();
    eprintln!(
        "the lost node held {} shards; the survivors opened {reopened} of them",
        lost.len()
    );
    if reopened < lost.len() {
        bail!(
            "only {reopened} of the lost node's {} shards were opened elsewhere",
            lost.len()
        );
    }
    let _ = coordinator.cancel(&id).await;
    drop(workers);
    Ok(TABLE.row(&[
        args.workers.to_string(),
        args.state_nodes.to_string(),
        (2 * args.parallelism).to_string(),
        args.shards.to_string(),
        measured.len().to_string(),
        percentile(&acked, 0.5).to_string(),
        percentile(&acked, 0.99).to_string(),
        acked.last().copied().unwrap_or(0).to_string(),
        percentile(&committed, 0.99).to_string(),
        format!("{cpu_per:.1}"),
        replace.as_millis().to_string(),
    ]))
}

/// Each simulated worker's trigger, by its worker id: sending attempt `A` makes it report
/// attempt `A` failed because its state node stopped answering.
type Triggers = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<u64>>>>;

/// Attempts at attaching a simulated worker.
const ATTACH_TRIES: u32 = 20;

/// A simulated worker's sender of messages and the coordinator's stream, attached (with
/// the client, kept for the connection's life).
async fn attach_worker(
    grpc: &str,
    name: &str,
) -> anyhow::Result<(
    impl Fn(wm::Msg) + Send + 'static,
    tonic::Streaming<pbc::CoordinatorMessage>,
    CoordinatorClient<tonic::transport::Channel>,
)> {
    let mut client = CoordinatorClient::connect(grpc.to_string()).await?;
    let (tx, rx) = mpsc::unbounded_channel::<pbc::WorkerMessage>();
    let send = move |msg: wm::Msg| {
        let _ = tx.send(pbc::WorkerMessage { msg: Some(msg) });
    };
    send(wm::Msg::Register(pbc::Register {
        protocol_version: pbc::PROTOCOL_VERSION,
        pid: std::process::id(),
        host: "127.0.0.1".into(),
        slots: 1,
        name: name.to_string(),
    }));
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let inbound = client.attach(outbound).await?.into_inner();
    Ok((send, inbound, client))
}

/// One simulated worker: see the module docs. Ends when its stream does.
async fn sim_worker(grpc: String, name: String, triggers: Triggers) -> anyhow::Result<()> {
    // Hundreds attach at once: a refused or reset connection is tried again, as a real
    // worker does (a few lost in a burst of 500 left the benchmark waiting for them).
    let mut tries = 0;
    let (send, mut inbound, _client) = loop {
        tries += 1;
        match attach_worker(&grpc, &name).await {
            Ok(attached) => break attached,
            Err(e) if tries >= ATTACH_TRIES => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let (fail_tx, mut fail_rx) = mpsc::unbounded_channel::<u64>();
    let mut tick = tokio::time::interval(HEARTBEAT);
    // The tasks of each deployed attempt.
    let mut tasks: HashMap<u64, Vec<pbc::TaskRef>> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => send(wm::Msg::Heartbeat(pbc::Heartbeat { rss_bytes: 0 })),
            Some(attempt) = fail_rx.recv() => send(wm::Msg::Report(pbc::Report {
                attempt,
                r#final: true,
                error: "state: state backend unavailable: the state node stopped answering".into(),
                unavailable: true,
                ..Default::default()
            })),
            m = futures::StreamExt::next(&mut inbound) => {
                let Some(m) = m.transpose()? else { return Ok(()) };
                match m.msg {
                    Some(cm::Msg::Registered(r)) => {
                        triggers
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(r.worker_id, fail_tx.clone());
                    }
                    Some(cm::Msg::Prepare(p)) => send(wm::Msg::Prepared(pbc::Prepared {
                        attempt: p.attempt,
                        data_address: "127.0.0.1:9".into(),
                        error: String::new(),
                    })),
                    Some(cm::Msg::Deploy(d)) => {
                        let mine = match d.deployment {
                            Some(dep) => my_tasks(&dep).await?,
                            None => Vec::new(),
                        };
                        send(wm::Msg::Deployed(pbc::Deployed {
                            attempt: d.attempt,
                            tasks: mine.clone(),
                            ..Default::default()
                        }));
                        tasks.insert(d.attempt, mine);
                    }
                    Some(cm::Msg::Trigger(t)) => {
                        for task in tasks.get(&t.attempt).into_iter().flatten() {
                            send(wm::Msg::Ack(pbc::CheckpointAck {
                                attempt: t.attempt,
                                checkpoint_id: t.checkpoint_id,
                                task: Some(*task),
                                ..Default::default()
                            }));
                        }
                    }
                    Some(cm::Msg::Cancel(c)) => {
                        tasks.remove(&c.attempt);
                        send(wm::Msg::Report(pbc::Report {
                            attempt: c.attempt,
                            r#final: true,
                            cancelled: true,
                            ..Default::default()
                        }));
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The subtasks round-robin placement gives this worker, as `sluice worker` computes.
async fn my_tasks(d: &pbc::Deployment) -> anyhow::Result<Vec<pbc::TaskRef>> {
    let graph = d
        .job
        .clone()
        .ok_or_else(|| anyhow!("a deployment without a job"))?;
    let plan = sluice_compute::plan::plan(graph, sluice_connectors::Builtin::shared()).await?;
    let placement = Placement::round_robin(&plan, d.peers.len() as u32);
    let mut out = Vec::new();
    for c in &plan.chains {
        let node = c
            .source
            .or_else(|| c.operators.first().copied())
            .unwrap_or(0);
        for s in 0..c.parallelism {
            if placement.worker_of(c.id, s) == d.worker_index {
                out.push(pbc::TaskRef {
                    node,
                    subtask: s as u32,
                    source: c.source.is_some(),
                });
            }
        }
    }
    Ok(out)
}

/// A simulated state node: the state service's RPCs with nothing behind them, and its
/// registration with the coordinator. Stops (server and stream) when dropped.
struct SimNode {
    open: Arc<Mutex<HashSet<String>>>,
    _server: AbortOnDropHandle<()>,
    _registration: AbortOnDropHandle<()>,
}

impl SimNode {
    async fn start(grpc: &str, name: &str) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let open = Arc::new(Mutex::new(HashSet::new()));
        let service = SimStateService { open: open.clone() };
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(StateServiceServer::new(service))
                .serve_with_incoming(incoming)
                .await;
        }));
        let registration = AbortOnDropHandle::new(tokio::spawn(register(
            grpc.to_owned(),
            name.to_owned(),
            endpoint,
            open.clone(),
        )));
        Ok(Self {
            open,
            _server: server,
            _registration: registration,
        })
    }

    /// The shards it has open, as `start-end` of every job.
    fn open(&self) -> HashSet<String> {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Registers a simulated node and heartbeats its open shards until aborted.
async fn register(grpc: String, name: String, endpoint: String, open: Arc<Mutex<HashSet<String>>>) {
    let Ok(mut client) = CoordinatorClient::connect(grpc).await else {
        return;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(pbc::StateNodeMessage {
        msg: Some(state_node_message::Msg::Register(pbc::StateNodeRegister {
            protocol_version: pbc::PROTOCOL_VERSION,
            node_id: name,
            endpoint,
            pid: std::process::id(),
            memory_bytes: 1 << 30,
            disk_cache_bytes: 1 << 30,
            object_store: "sim://nowhere".into(),
        })),
    });
    let outbound =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let Ok(resp) = client.attach_state_node(outbound).await else {
        return;
    };
    let mut inbound = resp.into_inner();
    if !matches!(
        futures::StreamExt::next(&mut inbound).await,
        Some(Ok(pbc::StateNodeCommand {
            msg: Some(state_node_command::Msg::Registered(_))
        }))
    ) {
        return;
    }
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tick.tick().await;
        let shards = open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|s| {
                let (job, range) = s.split_once('/')?;
                let (a, b) = range.split_once('-')?;
                Some(pbc::ShardLoad {
                    job_id: job.to_owned(),
                    key_group_start: a.parse().ok()?,
                    key_group_end: b.parse().ok()?,
                    bytes: 0,
                    committed_checkpoint: 0,
                })
            })
            .collect();
        let hb = pbc::StateNodeHeartbeat {
            rss_bytes: 0,
            shards,
        };
        if tx
            .send(pbc::StateNodeMessage {
                msg: Some(state_node_message::Msg::Heartbeat(hb)),
            })
            .is_err()
        {
            return;
        }
    }
}

/// The state service with no data: every shard opens empty, every write is taken.
#[derive(Clone)]
struct SimStateService {
    open: Arc<Mutex<HashSet<String>>>,
}

fn shard_name(s: Option<&pbs::ShardId>) -> String {
    s.map_or_else(String::new, |s| {
        format!("{}/{}-{}", s.job_id, s.key_group_start, s.key_group_end)
    })
}

#[tonic::async_trait]
impl StateService for SimStateService {
    async fn open_shard(
        &self,
        r: Request<pbs::OpenShardRequest>,
    ) -> std::result::Result<Response<pbs::OpenShardResponse>, Status> {
        let r = r.into_inner();
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(shard_name(r.shard.as_ref()));
        Ok(Response::new(pbs::OpenShardResponse {
            checkpoint_id: r.checkpoint_id,
            ..Default::default()
        }))
    }
    async fn multi_get(
        &self,
        r: Request<pbs::MultiGetRequest>,
    ) -> std::result::Result<Response<pbs::MultiGetResponse>, Status> {
        let n = r.into_inner().keys.len();
        Ok(Response::new(pbs::MultiGetResponse {
            values: vec![Default::default(); n],
            found: vec![false; n],
        }))
    }
    async fn write(
        &self,
        _: Request<pbs::WriteRequest>,
    ) -> std::result::Result<Response<pbs::WriteResponse>, Status> {
        Ok(Response::new(pbs::WriteResponse {}))
    }
    async fn scan(
        &self,
        _: Request<pbs::ScanRequest>,
    ) -> std::result::Result<Response<pbs::ScanResponse>, Status> {
        Ok(Response::new(pbs::ScanResponse::default()))
    }
    async fn flush(
        &self,
        _: Request<pbs::FlushRequest>,
    ) -> std::result::Result<Response<pbs::FlushResponse>, Status> {
        Ok(Response::new(pbs::FlushResponse::default()))
    }
    async fn commit(
        &self,
        _: Request<pbs::CommitRequest>,
    ) -> std::result::Result<Response<pbs::CommitResponse>, Status> {
        Ok(Response::new(pbs::CommitResponse::default()))
    }
    async fn rollback(
        &self,
        _: Request<pbs::RollbackRequest>,
    ) -> std::result::Result<Response<pbs::RollbackResponse>, Status> {
        Ok(Response::new(pbs::RollbackResponse::default()))
    }
    async fn close_shard(
        &self,
        r: Request<pbs::CloseShardRequest>,
    ) -> std::result::Result<Response<pbs::CloseShardResponse>, Status> {
        let name = shard_name(r.into_inner().shard.as_ref());
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&name);
        Ok(Response::new(pbs::CloseShardResponse {}))
    }
    async fn status(
        &self,
        _: Request<pbs::StatusRequest>,
    ) -> std::result::Result<Response<pbs::StatusResponse>, Status> {
        Ok(Response::new(pbs::StatusResponse::default()))
    }
}
