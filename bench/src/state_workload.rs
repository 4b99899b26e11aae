//! Keyed state written straight into state-service shards through the gRPC API, in
//! the real key layout: what `sluice bench checkpoint` measures, and the state `sluice
//! bench cluster` preloads before its job starts.
//!
//! A [`Workload`] is `state_bytes / value_bytes` keys spread over 128 key groups (the
//! big-endian key group first, then operator, state name and user key, as
//! [`encode_key`] lays them out), each with the last version written; a value is
//! derived from its key and version, so a read checks itself. A [`Writer`] buffers puts
//! per shard into `Write` RPCs of up to 1000 ops / 8 MiB with several in flight;
//! [`checkpoint`] is `Flush(epoch)` on every shard, then `Commit(epoch)` on every shard,
//! as the coordinator does; [`load`] writes every key and checkpoints every so many
//! bytes; [`read_and_verify`] reads a sample back and checks each value. Every RPC has
//! a bound, and every error names the RPC and the shard's key groups.

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use sluice_common::pb::state as pb;
use sluice_common::pb::state::state_service_client::StateServiceClient;
use sluice_common::rng::Rng;
use sluice_common::state::encode_key;
use sluice_compute::state_client::ShardLayout;
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// Key groups the keys are spread over (the job's max parallelism).
pub const KEY_GROUPS: u32 = 128;
/// Most ops in one `Write` RPC and most keys in one `MultiGet` RPC.
const BATCH_OPS: usize = 1000;
/// Most payload bytes in one `Write` or `MultiGet` RPC.
const BATCH_BYTES: usize = 8 << 20;
/// Bound on `Write` and `MultiGet` calls.
const DATA_RPC_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on `Flush`, `Commit` and `OpenShard` calls (they upload or download objects).
const DURABILITY_RPC_TIMEOUT: Duration = Duration::from_secs(600);
/// The operator id and state name of every benchmark key.
const OPERATOR_ID: u32 = 7;
const STATE_NAME: &[u8] = b"bench-checkpoint";

/// Writes `state_bytes` of incompressible values into the shards of `layout` on the node
/// at `addr`, committing a checkpoint every `checkpoint_every` bytes; returns the last
/// committed checkpoint (the shards' epoch). For benchmarks that need state to exist.
pub async fn preload(
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
pub async fn load(
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

/// An error once `deadline` has passed, saying what was going on.
pub fn check_deadline(deadline: Instant, what: &str) -> anyhow::Result<()> {
    if Instant::now() > deadline {
        bail!("gave up while {what}: the run took longer than --max-seconds");
    }
    Ok(())
}

/// The keys of one run and what was last written to each.
pub struct Workload {
    /// The shards the keys belong to.
    pub layout: ShardLayout,
    /// Bytes of one value.
    pub value_bytes: usize,
    /// The last version written of each key (values derive from key and version).
    versions: Vec<u16>,
    rng: Rng,
}

impl Workload {
    /// `state_bytes` of values of `value_bytes` each over the shards of `layout`, every
    /// key at version 0; random choices start from `seed`.
    pub fn new(layout: ShardLayout, state_bytes: u64, value_bytes: u64, seed: u64) -> Self {
        let keys = (state_bytes / value_bytes).max(1);
        Self {
            layout,
            value_bytes: value_bytes as usize,
            versions: vec![0; keys as usize],
            rng: Rng::new(seed),
        }
    }

    /// How many keys there are.
    pub fn keys(&self) -> u64 {
        self.versions.len() as u64
    }

    /// The state key of key `i`: key group `i % 128`, then the user key `i`.
    pub fn key(&self, i: u64) -> Bytes {
        let group = (i % u64::from(KEY_GROUPS)) as u16;
        encode_key(group, OPERATOR_ID, STATE_NAME, &i.to_be_bytes(), b"")
    }

    /// The value of key `i` at `version`: pseudo-random bytes (incompressible, so the
    /// object store holds about as many bytes as the state).
    pub fn value(&self, i: u64, version: u16) -> Bytes {
        value_of(i, version, self.value_bytes)
    }

    /// A key chosen at random.
    pub fn random_key(&mut self) -> u64 {
        self.rng.below(self.keys())
    }

    /// Records a new version of key `i` and returns it.
    pub fn bump(&mut self, i: u64) -> u16 {
        let v = &mut self.versions[i as usize];
        *v = v.wrapping_add(1);
        *v
    }

    /// `n` random keys (with their expected versions), grouped by shard.
    pub fn sample(&mut self, n: u64) -> Vec<Vec<(u64, u16)>> {
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
    // Key `i`'s stream, one per version.
    let mut rng = Rng::for_event(u64::from(version) ^ 0x5151, i);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// A state-service gRPC client.
pub type Client = StateServiceClient<Channel>;

/// A client of the node at `addr` (`host:port`), for messages of up to 64 MiB.
pub async fn connect(addr: &str) -> anyhow::Result<Client> {
    let url = format!("{}://{addr}", sluice_common::tls::scheme());
    let endpoint = sluice_common::tls::endpoint(&url).map_err(|e| anyhow!("{e}"))?;
    let client = tokio::time::timeout(
        Duration::from_secs(30),
        StateServiceClient::connect(endpoint),
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
pub async fn open_all(
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
pub async fn checkpoint(
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
pub struct Writer {
    client: Client,
    layout: ShardLayout,
    buffers: Vec<(Vec<pb::WriteOp>, usize)>,
    in_flight: usize,
    running: JoinSet<anyhow::Result<()>>,
}

impl Writer {
    /// A writer to the shards of `layout`, with up to `in_flight` RPCs outstanding.
    pub fn new(client: Client, layout: ShardLayout, in_flight: usize) -> Self {
        let buffers = (0..layout.len()).map(|_| (Vec::new(), 0)).collect();
        Self {
            client,
            layout,
            buffers,
            in_flight,
            running: JoinSet::new(),
        }
    }

    /// Buffers a put, sending the shard's buffer when it is full.
    pub async fn put(&mut self, epoch: u64, key: Bytes, value: Bytes) -> anyhow::Result<()> {
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
    pub async fn drain(&mut self, epoch: u64) -> anyhow::Result<()> {
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
pub async fn read_and_verify(
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
