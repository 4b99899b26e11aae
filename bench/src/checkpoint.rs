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
//! It compares against the budget: the node's peak RSS over `--memory`, and the bound
//! the node promises (`rss_bound_mib`: 1.1 x `--memory` + 48 MiB + 1 MiB per shard),
//! are printed next to the latencies, and nothing else runs in the same measurement. The keys, values
//! and RPCs are [`crate::state_workload`]'s.
//!
//! Output: a header and one comma-separated line per size on stdout; progress on stderr.
//! A wrong or missing value, a failed RPC or a node that does not start ends the run
//! with exit code 1 and a message naming what failed.

use sluice_common::outln;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use sluice_common::byte_size;
use sluice_compute::state_client::ShardLayout;

use crate::harness::process::StateServiceNode;
use crate::harness::runtime;
use crate::harness::table::Table;
use crate::harness::timing::percentile;
use crate::state_workload::{
    KEY_GROUPS, Workload, Writer, check_deadline, checkpoint, connect, load, open_all,
    read_and_verify,
};
use crate::{Error, Result};

/// Arguments of `sluice bench checkpoint`.
#[derive(ClapArgs, Debug)]
pub struct Args {
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
pub fn run(args: Args) -> Result<()> {
    if args.state_bytes.is_empty() || args.state_bytes.contains(&0) {
        return Err(Error::usage("--state-bytes sizes must be positive"));
    }
    if args.value_bytes < 16 || args.value_bytes > (4 << 20) {
        return Err(Error::usage(
            "--value-bytes must be between 16 bytes and 4 MiB",
        ));
    }
    if args.shards == 0 || args.shards > KEY_GROUPS {
        return Err(Error::usage(format!(
            "--shards must be between 1 and {KEY_GROUPS}"
        )));
    }
    if args.in_flight == 0 || args.in_flight > 64 {
        return Err(Error::usage("--in-flight must be between 1 and 64"));
    }
    if args.memory < (16 << 20) {
        return Err(Error::usage("--memory must be at least 16MiB"));
    }
    if let Some(url) = &args.object_store
        && !(url.starts_with("s3://") || url.starts_with("file:///"))
    {
        return Err(Error::usage(format!(
            "--object-store `{url}`: use s3://bucket/prefix or file:///abs/dir"
        )));
    }
    let rt = runtime()?;
    outln!("{}", TABLE.header());
    for &size in &args.state_bytes {
        let figures = rt
            .block_on(Box::pin(run_one(&args, size)))
            .with_context(|| format!("checkpoint benchmark with {size} bytes of state"))?;
        outln!("{}", figures.line());
    }
    Ok(())
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

/// The result table.
const TABLE: Table = Table::new(
    &[
        "state_mb",
        "value_bytes",
        "keys",
        "shards",
        "memory_mib",
        "load_s",
        "load_mb_per_s",
        "load_ckpts",
        "load_commit_max_ms",
        "commit_p50_ms",
        "commit_p99_ms",
        "commit_max_ms",
        "flush_p50_ms",
        "flush_p99_ms",
        "read_keys_per_s",
        "verified_keys",
        "max_rss_mib",
        "rss_over_memory",
        "rss_bound_mib",
        "load_rss_mib",
        "steady_rss_mib",
        "read_rss_mib",
        "open_s",
        "open_mb",
        "open_rss_mib",
        "open_verified_keys",
    ],
    ",",
);

impl Figures {
    /// The run's row of [`TABLE`].
    fn line(&self) -> String {
        let mib = |b: u64| format!("{:.0}", b as f64 / f64::from(1u32 << 20));
        let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1e3);
        let max_rss = self.load_rss.max(self.steady_rss).max(self.read_rss);
        let mut commits = self.commits.clone();
        commits.sort();
        let mut flushes = self.flushes.clone();
        flushes.sort();
        TABLE.row(&[
            format!("{:.0}", self.state_bytes as f64 / 1e6),
            self.value_bytes.to_string(),
            self.keys.to_string(),
            self.shards.to_string(),
            mib(self.memory),
            format!("{:.1}", self.load.as_secs_f64()),
            format!(
                "{:.1}",
                self.state_bytes as f64 / 1e6 / self.load.as_secs_f64().max(1e-9)
            ),
            self.load_checkpoints.to_string(),
            ms(self.load_commit_max),
            ms(percentile(&commits, 0.50)),
            ms(percentile(&commits, 0.99)),
            ms(commits.last().copied().unwrap_or_default()),
            ms(percentile(&flushes, 0.50)),
            ms(percentile(&flushes, 0.99)),
            format!("{:.0}", self.read_keys_per_s),
            self.verified_keys.to_string(),
            mib(max_rss),
            format!("{:.2}", max_rss as f64 / self.memory.max(1) as f64),
            mib(sluice_state_service::config::rss_bound(
                self.memory,
                self.shards as u64,
            )),
            mib(self.load_rss),
            mib(self.steady_rss),
            mib(self.read_rss),
            format!("{:.2}", self.open.as_secs_f64()),
            format!("{:.1}", self.open_bytes as f64 / 1e6),
            mib(self.open_rss),
            self.open_verified_keys.to_string(),
        ])
    }
}

/// One benchmark run with `state_bytes` of state.
async fn run_one(args: &Args, state_bytes: u64) -> anyhow::Result<Figures> {
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
    args: &Args,
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
    let node_a = StateServiceNode::start(dir, "node-a", store_url, args.memory)?;
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
            let i = w.random_key();
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
    let node_b = StateServiceNode::start(dir, "node-b", store_url, args.memory)?;
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
