//! `sluice bench checkpoint`: epoch commit latency, memory bound and shard open time of
//! the state service, each node a real child process (issue 3, "Performance" and
//! "Memory").
//!
//! # One run (per `--state-bytes` size, each with a fresh node, job id and store)
//! 1. Node A: `sluice state-service` as a child process on a free loopback port, with
//!    `--memory` and a fresh data directory; its RSS is sampled every 100 ms from
//!    `/proc/<pid>/status` through every phase.
//! 2. Load: `--state-bytes` of values in the real key layout (big-endian key group
//!    first, 128 key groups, `--shards` shards of [`ShardLayout`]), in `Write` RPCs of up
//!    to 1000 ops / 8 MiB with several in flight; every `--checkpoint-every` bytes a
//!    checkpoint: `Flush(epoch)` on every shard, then `Commit(epoch)` on every shard.
//! 3. Steady: `--epochs` epochs, each overwriting `--change-bytes` of random existing
//!    keys and then timing the checkpoint from the first `Flush` call to the last
//!    `Commit` answer ("barrier to durable acknowledgement"; flush-only time too).
//! 4. Reads: a random sample read back with `MultiGet` and checked against the last
//!    version written of each key (values are derived from key and version).
//! 5. Open: node A is killed (SIGKILL), node B starts with an empty data directory on
//!    the same object store, opens every shard from it in parallel, and a second sample
//!    is read and checked.
//!
//! Output: a header and one comma-separated line per size on stdout; progress on stderr.
//! A wrong or missing value, a failed RPC or a node that does not start ends the run
//! with exit code 1 and a message naming what failed.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use clap::Args;
use sluice_common::pb::state as pb;
use sluice_common::pb::state::state_service_client::StateServiceClient;
use sluice_common::state::encode_key;
use sluice_compute::state_client::ShardLayout;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use crate::output::outln;
use crate::{Failure, byte_size, runtime};

/// Key groups the keys are spread over (the job's max parallelism).
const KEY_GROUPS: u32 = 128;
/// Most ops in one `Write` RPC and most keys in one `MultiGet` RPC.
const BATCH_OPS: usize = 1000;
/// Most payload bytes in one `Write` or `MultiGet` RPC.
const BATCH_BYTES: usize = 8 << 20;
/// Bound on `Write` and `MultiGet` calls.
const DATA_RPC_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on `Flush`, `Commit` and `OpenShard` calls (they upload or download objects).
const DURABILITY_RPC_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a node may take to print its address.
const NODE_START_TIMEOUT: Duration = Duration::from_secs(60);
/// RSS sampling period.
const RSS_PERIOD: Duration = Duration::from_millis(100);
/// The operator id and state name of every benchmark key.
const OPERATOR_ID: u32 = 7;
const STATE_NAME: &[u8] = b"bench-checkpoint";

/// Arguments of `sluice bench checkpoint`.
#[derive(Args)]
pub struct CheckpointBenchArgs {
    /// Total state sizes, one run each (e.g. 100MB,1GB,4GB).
    #[arg(long, value_delimiter = ',', default_value = "100MB", value_parser = byte_size::parse)]
    state_bytes: Vec<u64>,
    /// Bytes of one value.
    #[arg(long, default_value = "1024", value_parser = byte_size::parse)]
    value_bytes: u64,
    /// Shards of the job.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// The node's `--memory` budget.
    #[arg(long, default_value = "512MiB", value_parser = byte_size::parse)]
    memory: u64,
    /// Durable tier (`s3://bucket/prefix` or `file:///dir`); default: a fresh temporary
    /// directory per run.
    #[arg(long)]
    object_store: Option<String>,
    /// Epochs measured after the load.
    #[arg(long, default_value_t = 20)]
    epochs: u32,
    /// Bytes overwritten per measured epoch.
    #[arg(long, default_value = "16MB", value_parser = byte_size::parse)]
    change_bytes: u64,
    /// A checkpoint every this many bytes written during the load.
    #[arg(long, default_value = "256MiB", value_parser = byte_size::parse)]
    checkpoint_every: u64,
    /// Keys read back and checked after the steady phase, and again on the fresh node.
    #[arg(long, default_value_t = 100_000)]
    sample_keys: u64,
    /// RPCs in flight at once.
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    /// Seed of the key choices.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Directory for the nodes' data directories and the default object store.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 7200)]
    max_seconds: u64,
    /// Leave the run's objects in the object store (by default they are deleted).
    #[arg(long)]
    keep_objects: bool,
}

/// Runs `sluice bench checkpoint`.
pub fn bench(args: CheckpointBenchArgs) -> Result<(), Failure> {
    if args.state_bytes.is_empty() || args.state_bytes.contains(&0) {
        return Err(Failure::usage("--state-bytes sizes must be positive"));
    }
    if args.value_bytes < 16 || args.value_bytes > (4 << 20) {
        return Err(Failure::usage(
            "--value-bytes must be between 16 bytes and 4 MiB",
        ));
    }
    if args.shards == 0 || args.shards > KEY_GROUPS {
        return Err(Failure::usage(format!(
            "--shards must be between 1 and {KEY_GROUPS}"
        )));
    }
    if args.in_flight == 0 || args.in_flight > 64 {
        return Err(Failure::usage("--in-flight must be between 1 and 64"));
    }
    if args.memory < (16 << 20) {
        return Err(Failure::usage("--memory must be at least 16MiB"));
    }
    if let Some(url) = &args.object_store
        && !(url.starts_with("s3://") || url.starts_with("file:///"))
    {
        return Err(Failure::usage(format!(
            "--object-store `{url}`: use s3://bucket/prefix or file:///abs/dir"
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Failure::from(anyhow!("cannot find the sluice binary to start nodes: {e}")))?;
    let rt = runtime()?;
    outln!("{}", Figures::HEADER);
    for &size in &args.state_bytes {
        let figures = rt
            .block_on(Box::pin(run_one(&args, &exe, size)))
            .with_context(|| format!("checkpoint benchmark with {size} bytes of state"))?;
        outln!("{}", figures.line());
    }
    Ok(())
}

/// Writes `state_bytes` of incompressible values into the shards of `layout` on the node
/// at `addr`, committing a checkpoint every `checkpoint_every` bytes; returns the last
/// committed checkpoint (the shards' epoch). For benchmarks that need state to exist.
pub(crate) async fn preload(
    addr: &str,
    layout: &ShardLayout,
    state_bytes: u64,
    value_bytes: u64,
    checkpoint_every: u64,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let w = Workload::new(layout.clone(), state_bytes, value_bytes, 42);
    let mut client = connect(addr).await?;
    open_all(&mut client, layout, deadline).await?;
    let (next_epoch, _) = load(&client, &w, 4, checkpoint_every, deadline).await?;
    Ok(next_epoch - 1)
}

/// Writes every key of `w` (version 0) with up to `in_flight` RPCs outstanding,
/// committing a checkpoint every `checkpoint_every` bytes and at the end; returns the
/// epoch after the last checkpoint and each checkpoint's flush-to-commit time.
async fn load(
    client: &Client,
    w: &Workload,
    in_flight: usize,
    checkpoint_every: u64,
    deadline: Instant,
) -> anyhow::Result<(u64, Vec<Duration>)> {
    let layout = &w.layout;
    let mut epoch = 1u64;
    let mut writer = Writer::new(client.clone(), layout.clone(), in_flight);
    let mut since_checkpoint = 0u64;
    let mut commits = Vec::new();
    for i in 0..w.keys() {
        if i % 4096 == 0 {
            check_deadline(deadline, "loading state")?;
        }
        writer.put(epoch, w.key(i), w.value(i, 0)).await?;
        since_checkpoint += w.value_bytes as u64;
        if since_checkpoint >= checkpoint_every {
            writer.drain(epoch).await?;
            let (_, total) = checkpoint(client, layout, epoch).await?;
            commits.push(total);
            epoch += 1;
            since_checkpoint = 0;
        }
    }
    writer.drain(epoch).await?;
    if since_checkpoint > 0 || commits.is_empty() {
        let (_, total) = checkpoint(client, layout, epoch).await?;
        commits.push(total);
        epoch += 1;
    }
    Ok((epoch, commits))
}

/// Every figure of one run.
#[derive(Default)]
struct Figures {
    state_bytes: u64,
    value_bytes: u64,
    keys: u64,
    shards: u32,
    memory: u64,
    load: Duration,
    load_checkpoints: usize,
    load_commit_max: Duration,
    commits: Vec<Duration>,
    flushes: Vec<Duration>,
    read_keys_per_s: f64,
    verified_keys: u64,
    load_rss: u64,
    steady_rss: u64,
    read_rss: u64,
    open: Duration,
    open_bytes: u64,
    open_rss: u64,
    open_verified_keys: u64,
}

impl Figures {
    const HEADER: &str = "state_mb,value_bytes,keys,shards,memory_mib,load_s,load_mb_per_s,\
        load_ckpts,load_commit_max_ms,commit_p50_ms,commit_p99_ms,commit_max_ms,\
        flush_p50_ms,flush_p99_ms,read_keys_per_s,verified_keys,max_rss_mib,\
        rss_over_memory,load_rss_mib,steady_rss_mib,read_rss_mib,open_s,open_mb,\
        open_rss_mib,open_verified_keys";

    fn line(&self) -> String {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let max_rss = self.load_rss.max(self.steady_rss).max(self.read_rss);
        let mut commits = self.commits.clone();
        commits.sort();
        let mut flushes = self.flushes.clone();
        flushes.sort();
        format!(
            "{:.0},{},{},{},{:.0},{:.1},{:.1},{},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{},\
             {:.0},{:.2},{:.0},{:.0},{:.0},{:.2},{:.1},{:.0},{}",
            self.state_bytes as f64 / 1e6,
            self.value_bytes,
            self.keys,
            self.shards,
            mib(self.memory),
            self.load.as_secs_f64(),
            self.state_bytes as f64 / 1e6 / self.load.as_secs_f64().max(1e-9),
            self.load_checkpoints,
            ms(self.load_commit_max),
            ms(percentile(&commits, 0.50)),
            ms(percentile(&commits, 0.99)),
            ms(commits.last().copied().unwrap_or_default()),
            ms(percentile(&flushes, 0.50)),
            ms(percentile(&flushes, 0.99)),
            self.read_keys_per_s,
            self.verified_keys,
            mib(max_rss),
            max_rss as f64 / self.memory.max(1) as f64,
            mib(self.load_rss),
            mib(self.steady_rss),
            mib(self.read_rss),
            self.open.as_secs_f64(),
            self.open_bytes as f64 / 1e6,
            mib(self.open_rss),
            self.open_verified_keys,
        )
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One benchmark run with `state_bytes` of state.
async fn run_one(
    args: &CheckpointBenchArgs,
    exe: &Path,
    state_bytes: u64,
) -> anyhow::Result<Figures> {
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds.max(1));
    let base = match &args.work_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir(),
    };
    std::fs::create_dir_all(&base)
        .with_context(|| format!("creating work directory {}", base.display()))?;
    let temp = tempfile::Builder::new()
        .prefix("sluice-bench-checkpoint-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a temporary directory in {}", base.display()))?;
    let store_url = match &args.object_store {
        Some(url) => url.clone(),
        None => {
            let objects = temp.path().join("objects");
            std::fs::create_dir_all(&objects)
                .with_context(|| format!("creating {}", objects.display()))?;
            format!("file://{}", objects.display())
        }
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let job_id = format!("bench-ckpt-{}-{}-{nanos}", std::process::id(), state_bytes);
    let layout = ShardLayout::new(job_id, KEY_GROUPS, args.shards);
    let result = Box::pin(run_phases(
        args,
        exe,
        temp.path(),
        &store_url,
        &layout,
        state_bytes,
        deadline,
    ))
    .await;
    if args.object_store.is_some()
        && !args.keep_objects
        && let Err(e) = delete_objects(&store_url, &layout).await
    {
        eprintln!("warning: could not delete the run's objects in {store_url}: {e:#}");
    }
    // The nodes are gone by now (their guards were dropped): remove their files.
    temp.close()
        .context("removing the run's temporary directory")?;
    result
}

async fn run_phases(
    args: &CheckpointBenchArgs,
    exe: &Path,
    dir: &Path,
    store_url: &str,
    layout: &ShardLayout,
    state_bytes: u64,
    deadline: Instant,
) -> anyhow::Result<Figures> {
    let mut w = Workload::new(layout.clone(), state_bytes, args.value_bytes, args.seed);
    let mut fig = Figures {
        state_bytes,
        value_bytes: args.value_bytes,
        keys: w.keys(),
        shards: args.shards,
        memory: args.memory,
        ..Figures::default()
    };
    eprintln!(
        "[{} MB] node A; {} keys of {} bytes in {} shards, memory {} MiB, store {store_url}",
        state_bytes / 1_000_000,
        w.keys(),
        args.value_bytes,
        layout.len(),
        args.memory >> 20
    );
    let node_a = NodeProcess::start(exe, dir, "node-a", store_url, args.memory)?;
    let mut client = connect(&node_a.addr).await?;
    open_all(&mut client, layout, deadline).await?;

    // Load.
    let started = Instant::now();
    let (mut epoch, load_commits) =
        load(&client, &w, args.in_flight, args.checkpoint_every, deadline).await?;
    let mut writer = Writer::new(client.clone(), layout.clone(), args.in_flight);
    fig.load = started.elapsed();
    fig.load_checkpoints = load_commits.len();
    fig.load_commit_max = load_commits.iter().max().copied().unwrap_or_default();
    fig.load_rss = node_a.rss.take_phase_max();
    eprintln!(
        "[{} MB] loaded in {:.1}s ({} checkpoints, slowest {:.0} ms), node RSS max {} MiB",
        state_bytes / 1_000_000,
        fig.load.as_secs_f64(),
        fig.load_checkpoints,
        fig.load_commit_max.as_secs_f64() * 1e3,
        fig.load_rss >> 20
    );

    // Steady epochs.
    let per_epoch = (args.change_bytes / args.value_bytes).clamp(1, w.keys());
    let mut touched = vec![false; usize::try_from(w.keys()).context("too many keys")?];
    for _ in 0..args.epochs {
        check_deadline(deadline, "steady epochs")?;
        let mut chosen = Vec::with_capacity(usize::try_from(per_epoch).unwrap_or(0));
        // Distinct keys per epoch: writes in flight together may be applied in any order.
        let mut tries = 0u64;
        while (chosen.len() as u64) < per_epoch && tries < per_epoch.saturating_mul(8) {
            tries += 1;
            let i = w.rng.below(w.keys());
            let slot = &mut touched[i as usize];
            if !*slot {
                *slot = true;
                chosen.push(i);
            }
        }
        for &i in &chosen {
            touched[i as usize] = false;
            let v = w.bump(i);
            writer.put(epoch, w.key(i), w.value(i, v)).await?;
        }
        writer.drain(epoch).await?;
        let (flush, total) = checkpoint(&client, layout, epoch).await?;
        fig.flushes.push(flush);
        fig.commits.push(total);
        epoch += 1;
    }
    fig.steady_rss = node_a.rss.take_phase_max();
    eprintln!(
        "[{} MB] {} epochs of {} keys; commit max {:.0} ms; node RSS max {} MiB",
        state_bytes / 1_000_000,
        args.epochs,
        per_epoch,
        fig.commits
            .iter()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
        fig.steady_rss >> 20
    );

    // Reads.
    let sample = w.sample(args.sample_keys);
    let started = Instant::now();
    fig.verified_keys = read_and_verify(&client, &w, &sample, args.in_flight, deadline)
        .await
        .context("reading back on node A")?;
    fig.read_keys_per_s = fig.verified_keys as f64 / started.elapsed().as_secs_f64().max(1e-9);
    fig.read_rss = node_a.rss.take_phase_max();

    // Open on a fresh node.
    let node_a_dir = node_a.data_dir.clone();
    drop(client);
    drop(writer);
    node_a.kill();
    if let Err(e) = std::fs::remove_dir_all(&node_a_dir) {
        eprintln!("warning: removing {}: {e}", node_a_dir.display());
    }
    let node_b = NodeProcess::start(exe, dir, "node-b", store_url, args.memory)?;
    let mut client = connect(&node_b.addr).await?;
    let started = Instant::now();
    let restored = open_all(&mut client, layout, deadline).await?;
    fig.open = started.elapsed();
    fig.open_bytes = restored;
    let sample = w.sample(args.sample_keys);
    fig.open_verified_keys = read_and_verify(&client, &w, &sample, args.in_flight, deadline)
        .await
        .context("reading back on node B after opening from the object store")?;
    fig.open_rss = node_b.rss.take_phase_max();
    eprintln!(
        "[{} MB] node B opened {} shards in {:.2}s ({:.1} MB read), verified {} keys",
        state_bytes / 1_000_000,
        layout.len(),
        fig.open.as_secs_f64(),
        fig.open_bytes as f64 / 1e6,
        fig.open_verified_keys
    );
    drop(client);
    drop(node_b);
    Ok(fig)
}

fn check_deadline(deadline: Instant, what: &str) -> anyhow::Result<()> {
    if Instant::now() > deadline {
        bail!("gave up while {what}: the run took longer than --max-seconds");
    }
    Ok(())
}

/// Deletes every object of the run's shards.
async fn delete_objects(url: &str, layout: &ShardLayout) -> anyhow::Result<()> {
    let durable = sluice_state_service::store::Durable::from_url(url)?;
    for s in 0..layout.len() {
        let id = layout.id(s);
        let key = sluice_state_service::shard_id::ShardKey::from_pb(Some(&id))?;
        let root = durable.shard_root(&key);
        for object in durable.list(&root).await? {
            durable.delete(&object).await?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The workload: keys, values and the last version written of each key.

/// The keys of one run and what was last written to each.
struct Workload {
    layout: ShardLayout,
    value_bytes: usize,
    /// The last version written of each key (values derive from key and version).
    versions: Vec<u16>,
    rng: XorShift,
}

impl Workload {
    fn new(layout: ShardLayout, state_bytes: u64, value_bytes: u64, seed: u64) -> Self {
        let keys = (state_bytes / value_bytes).max(1);
        Self {
            layout,
            value_bytes: value_bytes as usize,
            versions: vec![0; keys as usize],
            rng: XorShift::new(seed),
        }
    }

    fn keys(&self) -> u64 {
        self.versions.len() as u64
    }

    /// The state key of key `i`: key group `i % 128`, then the user key `i`.
    fn key(&self, i: u64) -> Bytes {
        let group = (i % u64::from(KEY_GROUPS)) as u16;
        encode_key(group, OPERATOR_ID, STATE_NAME, &i.to_be_bytes(), b"")
    }

    /// The value of key `i` at `version`: pseudo-random bytes (incompressible, so the
    /// object store holds about as many bytes as the state).
    fn value(&self, i: u64, version: u16) -> Bytes {
        value_of(i, version, self.value_bytes)
    }

    /// Records a new version of key `i` and returns it.
    fn bump(&mut self, i: u64) -> u16 {
        let v = &mut self.versions[i as usize];
        *v = v.wrapping_add(1);
        *v
    }

    /// `n` random keys (with their expected versions), grouped by shard.
    fn sample(&mut self, n: u64) -> Vec<Vec<(u64, u16)>> {
        let mut per_shard = vec![Vec::new(); self.layout.len()];
        for _ in 0..n.min(10_000_000) {
            let i = self.rng.below(self.keys());
            let shard = self.layout.shard_of(&self.key(i));
            per_shard[shard].push((i, self.versions[i as usize]));
        }
        per_shard
    }
}

fn value_of(i: u64, version: u16, len: usize) -> Bytes {
    let mut rng =
        XorShift::new(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(version) << 48) ^ 0x5151);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// xorshift64*: a tiny seeded generator (key choices and value bytes).
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        // splitmix64 of the seed, never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Self(z.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------
// RPCs.

type Client = StateServiceClient<Channel>;

async fn connect(addr: &str) -> anyhow::Result<Client> {
    let url = format!("http://{addr}");
    let client = tokio::time::timeout(
        Duration::from_secs(30),
        StateServiceClient::connect(url.clone()),
    )
    .await
    .map_err(|_| anyhow!("connecting to the node at {url} timed out"))?
    .with_context(|| format!("connecting to the node at {url}"))?;
    Ok(client
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20))
}

/// Awaits an RPC within `limit`, naming `what` on failure.
async fn call<T>(
    what: &str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(anyhow!(
            "{what} failed: {:?}: {}",
            status.code(),
            status.message()
        )),
        Err(_) => Err(anyhow!("{what} got no answer within {}s", limit.as_secs())),
    }
}

/// Calls `rpc` (named `what` in errors) on every shard of `layout` at once, each
/// within [`DURABILITY_RPC_TIMEOUT`]; returns the answers.
async fn on_every_shard<T, F, Fut>(
    client: &Client,
    layout: &ShardLayout,
    what: &str,
    rpc: F,
) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(Client, pb::ShardId) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
{
    let mut set = JoinSet::new();
    for s in 0..layout.len() {
        let id = layout.id(s);
        let what = format!(
            "{what} of key groups [{}, {})",
            id.key_group_start, id.key_group_end
        );
        let answer = rpc(client.clone(), id);
        set.spawn(async move { call(&what, DURABILITY_RPC_TIMEOUT, answer).await });
    }
    let mut answers = Vec::with_capacity(layout.len());
    while let Some(done) = set.join_next().await {
        answers.push(done.with_context(|| format!("a {what} task panicked"))??);
    }
    Ok(answers)
}

/// Opens every shard (checkpoint 0: the latest committed one) in parallel; returns the
/// bytes read from the object store.
async fn open_all(
    client: &mut Client,
    layout: &ShardLayout,
    deadline: Instant,
) -> anyhow::Result<u64> {
    check_deadline(deadline, "opening shards")?;
    let opened = on_every_shard(client, layout, "OpenShard", |mut c, id| async move {
        c.open_shard(pb::OpenShardRequest {
            fence: 0,
            shard: Some(id),
            checkpoint_id: 0,
            ttl_states: Vec::new(),
        })
        .await
    })
    .await?;
    Ok(opened.iter().map(|o| o.restore_bytes).sum())
}

/// Flushes `epoch` on every shard, then commits it on every shard (retaining the
/// previous checkpoint too); returns the time until the last flush answered and until
/// the last commit answered, both from the first flush call.
async fn checkpoint(
    client: &Client,
    layout: &ShardLayout,
    epoch: u64,
) -> anyhow::Result<(Duration, Duration)> {
    let started = Instant::now();
    let flush = format!("Flush({epoch})");
    on_every_shard(client, layout, &flush, |mut c, id| async move {
        c.flush(pb::FlushRequest {
            fence: 0,
            shard: Some(id),
            epoch,
        })
        .await
    })
    .await?;
    let flushed = started.elapsed();
    let retained: Vec<u64> = [epoch.saturating_sub(1), epoch]
        .into_iter()
        .filter(|&c| c > 0)
        .collect();
    let commit = format!("Commit({epoch})");
    on_every_shard(client, layout, &commit, |mut c, id| {
        let retained = retained.clone();
        async move {
            c.commit(pb::CommitRequest {
                shard: Some(id),
                checkpoint_id: epoch,
                retained,
            })
            .await
        }
    })
    .await?;
    Ok((flushed, started.elapsed()))
}

/// Buffers puts per shard and sends them as `Write` RPCs of up to [`BATCH_OPS`] ops and
/// [`BATCH_BYTES`] bytes, with at most `in_flight` RPCs outstanding.
struct Writer {
    client: Client,
    layout: ShardLayout,
    buffers: Vec<(Vec<pb::WriteOp>, usize)>,
    in_flight: usize,
    running: JoinSet<anyhow::Result<()>>,
}

impl Writer {
    fn new(client: Client, layout: ShardLayout, in_flight: usize) -> Self {
        let buffers = (0..layout.len()).map(|_| (Vec::new(), 0)).collect();
        Self {
            client,
            layout,
            buffers,
            in_flight,
            running: JoinSet::new(),
        }
    }

    async fn put(&mut self, epoch: u64, key: Bytes, value: Bytes) -> anyhow::Result<()> {
        let shard = self.layout.shard_of(&key);
        let (ops, bytes) = &mut self.buffers[shard];
        *bytes += key.len() + value.len() + 8;
        ops.push(pb::WriteOp {
            kind: pb::write_op::Kind::Put as i32,
            key,
            value,
            end: Bytes::new(),
        });
        if ops.len() >= BATCH_OPS || *bytes >= BATCH_BYTES - (BATCH_BYTES / 16) {
            self.send(epoch, shard).await?;
        }
        Ok(())
    }

    async fn send(&mut self, epoch: u64, shard: usize) -> anyhow::Result<()> {
        let (ops, bytes) = std::mem::take(&mut self.buffers[shard]);
        if ops.is_empty() {
            return Ok(());
        }
        while self.running.len() >= self.in_flight {
            if let Some(done) = self.running.join_next().await {
                done.context("a Write task panicked")??;
            }
        }
        let mut c = self.client.clone();
        let id = self.layout.id(shard);
        self.running.spawn(async move {
            let what = format!(
                "Write of {} ops ({bytes} bytes, epoch {epoch}) to key groups [{}, {})",
                ops.len(),
                id.key_group_start,
                id.key_group_end
            );
            let req = pb::WriteRequest {
                fence: 0,
                shard: Some(id),
                epoch,
                ops,
            };
            call(&what, DATA_RPC_TIMEOUT, c.write(req))
                .await
                .map(|_| ())
        });
        Ok(())
    }

    /// Sends every buffered op and waits for every RPC (the barrier).
    async fn drain(&mut self, epoch: u64) -> anyhow::Result<()> {
        for shard in 0..self.buffers.len() {
            self.send(epoch, shard).await?;
        }
        while let Some(done) = self.running.join_next().await {
            done.context("a Write task panicked")??;
        }
        Ok(())
    }
}

/// Reads `sample` (per shard) in `MultiGet` batches and checks every value against the
/// last version written; returns how many keys were checked.
async fn read_and_verify(
    client: &Client,
    w: &Workload,
    sample: &[Vec<(u64, u16)>],
    in_flight: usize,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let per_call = BATCH_OPS.min((BATCH_BYTES / w.value_bytes.max(1)).max(1));
    let mut set: JoinSet<anyhow::Result<u64>> = JoinSet::new();
    let mut checked = 0u64;
    for (shard, wanted) in sample.iter().enumerate() {
        for chunk in wanted.chunks(per_call) {
            check_deadline(deadline, "reading back")?;
            while set.len() >= in_flight {
                if let Some(done) = set.join_next().await {
                    checked += done.context("a MultiGet task panicked")??;
                }
            }
            let keys: Vec<Bytes> = chunk.iter().map(|&(i, _)| w.key(i)).collect();
            let expected = chunk.to_vec();
            let id = w.layout.id(shard);
            let value_bytes = w.value_bytes;
            let mut c = client.clone();
            set.spawn(async move {
                let what = format!(
                    "MultiGet of {} keys from key groups [{}, {})",
                    keys.len(),
                    id.key_group_start,
                    id.key_group_end
                );
                let req = pb::MultiGetRequest {
                    shard: Some(id),
                    keys,
                };
                let got = call(&what, DATA_RPC_TIMEOUT, c.multi_get(req)).await?;
                if got.values.len() != expected.len() || got.found.len() != expected.len() {
                    bail!(
                        "{what}: {} values and {} found flags for {} keys",
                        got.values.len(),
                        got.found.len(),
                        expected.len()
                    );
                }
                for (((i, version), value), found) in
                    expected.iter().zip(&got.values).zip(&got.found)
                {
                    if !found {
                        bail!("key {i} (version {version}) is missing: {what}");
                    }
                    if *value != value_of(*i, *version, value_bytes) {
                        bail!(
                            "key {i} holds a value other than its last one (version {version}; \
                             {} bytes read): {what}",
                            value.len()
                        );
                    }
                }
                Ok(expected.len() as u64)
            });
        }
    }
    while let Some(done) = set.join_next().await {
        checked += done.context("a MultiGet task panicked")??;
    }
    Ok(checked)
}

// ---------------------------------------------------------------------------------------
// Nodes as child processes.

/// A `sluice state-service` child process, killed (SIGKILL) when dropped.
pub(crate) struct NodeProcess {
    child: Child,
    /// Its gRPC address (host:port).
    pub(crate) addr: String,
    data_dir: PathBuf,
    rss: RssSampler,
}

impl NodeProcess {
    /// Starts a node with data directory `dir/name` (its stderr in `dir/name.log`) and
    /// waits for the address it prints.
    pub(crate) fn start(
        exe: &Path,
        dir: &Path,
        name: &str,
        store_url: &str,
        memory: u64,
    ) -> anyhow::Result<Self> {
        let data_dir = dir.join(name);
        let log_path = dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut child = Command::new(exe)
            .arg("state-service")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data_dir)
            .args(["--object-store", store_url, "--memory", &memory.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {} state-service", exe.display()))?;
        let pid = child.id();
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("state-service {name} has no stdout pipe");
        };
        // From here on the guard kills the child on every exit path.
        let mut node = Self {
            child,
            addr: String::new(),
            data_dir,
            rss: RssSampler::start(pid),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut first = String::new();
            let got = reader.read_line(&mut first).map(|_| first);
            let _ = tx.send(got);
            // Keep draining so the node never blocks on a full pipe; ends with the node.
            let mut sink = [0u8; 4096];
            while let Ok(n) = reader.read(&mut sink) {
                if n == 0 {
                    break;
                }
            }
        });
        let line = match rx.recv_timeout(NODE_START_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => bail!(
                "reading state-service {name}'s stdout: {e}{}",
                log_tail(&log_path)
            ),
            Err(_) => bail!(
                "state-service {name} printed no address within {}s{}",
                NODE_START_TIMEOUT.as_secs(),
                log_tail(&log_path)
            ),
        };
        let Some(addr) = line.trim().strip_prefix("state-service listening on ") else {
            bail!(
                "state-service {name} exited or printed {:?} instead of its address{}",
                line.trim(),
                log_tail(&log_path)
            );
        };
        node.addr = addr.to_owned();
        Ok(node)
    }

    /// Kills the node now (SIGKILL) and waits for it.
    fn kill(self) {
        drop(self);
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.rss.stop();
    }
}

/// The last lines of a node's log, for error messages.
fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            format!("; its log ({}) ends:\n{tail}", path.display())
        }
        _ => String::new(),
    }
}

/// Samples a process's `VmRSS` every [`RSS_PERIOD`] on its own thread.
struct RssSampler {
    phase_max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let phase_max = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (max, halt) = (Arc::clone(&phase_max), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let status = format!("/proc/{pid}/status");
            // Ends when stopped or when the process is gone.
            while !halt.load(Ordering::Relaxed) {
                match vm_rss(&status) {
                    Some(bytes) => {
                        max.fetch_max(bytes, Ordering::Relaxed);
                    }
                    None => break,
                }
                std::thread::sleep(RSS_PERIOD);
            }
        });
        Self {
            phase_max,
            stop,
            thread: Some(thread),
        }
    }

    /// The largest RSS seen since the last call (and a fresh sample now).
    fn take_phase_max(&self) -> u64 {
        self.phase_max.swap(0, Ordering::Relaxed)
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes.
fn vm_rss(status_path: &str) -> Option<u64> {
    let status = std::fs::read_to_string(status_path).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_depend_on_key_and_version() {
        assert_eq!(value_of(5, 1, 100), value_of(5, 1, 100));
        assert_ne!(value_of(5, 1, 100), value_of(5, 2, 100));
        assert_ne!(value_of(5, 1, 100), value_of(6, 1, 100));
        assert_eq!(value_of(5, 1, 13).len(), 13);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let d: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 0.5), Duration::from_millis(10));
        assert_eq!(percentile(&d, 0.99), Duration::from_millis(20));
        assert_eq!(percentile(&[], 0.99), Duration::ZERO);
    }

    #[test]
    fn keys_are_in_their_key_groups_shard() {
        let layout = ShardLayout::new("j", KEY_GROUPS, 4);
        let w = Workload::new(layout.clone(), 1 << 20, 1024, 1);
        for i in 0..256 {
            let k = w.key(i);
            let group = u32::from(u16::from_be_bytes([k[0], k[1]]));
            assert!(layout.range(layout.shard_of(&k)).contains(&group));
        }
    }
}
