//! `sluice bench state`: state-service operations per second over gRPC on loopback.
//!
//! Starts an embedded state-service node (its own gRPC server on 127.0.0.1, objects in
//! a temporary directory) unless `--state-service` names one, and drives it with the
//! raw gRPC client: puts, and multi-gets of keys that exist (served by the node's
//! cache after the first pass) and of keys that do not, at several batch sizes. Each
//! figure is one call at a time for about `--seconds`. It compares against nothing in
//! the same run: the batch sizes against each other, and runs against earlier runs.
//!
//! Output: the CSV header `op,batch,ops_per_s,calls_per_s,mean_call_us`, then one row
//! per operation (`put`, `get_hit`, `get_miss`) and batch size.

use sluice_common::outln;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use bytes::Bytes;
use clap::Args as ClapArgs;
use sluice_common::byte_size;
use sluice_common::pb::state as pb;
use sluice_common::pb::state::state_service_client::StateServiceClient;

use crate::harness::runtime;
use crate::harness::table::Table;
use crate::{Error, Host, Result};

/// The result table.
const TABLE: Table = Table::new(
    &["op", "batch", "ops_per_s", "calls_per_s", "mean_call_us"],
    ",",
);

/// Arguments of `sluice bench state`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Batch sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    batch: Vec<usize>,
    /// Seconds per figure.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Distinct keys written (and read back by the hit benchmark).
    #[arg(long, default_value_t = 100_000)]
    keys: u32,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// A running node (`http://host:port`) instead of an embedded one.
    #[arg(long)]
    state_service: Option<String>,
    /// Memory budget of the embedded node.
    #[arg(long, default_value = "512MiB", value_parser = byte_size::parse)]
    memory: u64,
}

fn key(i: u32) -> Bytes {
    let kg = (i % 128) as u16;
    let mut k = kg.to_be_bytes().to_vec();
    k.extend_from_slice(&[0, 0, 0, 1, 0, 1, b's', 0, 0, 0, 4]);
    k.extend_from_slice(&i.to_be_bytes());
    Bytes::from(k)
}

/// Runs `sluice bench state`.
pub fn run(args: Args, host: &dyn Host) -> Result<()> {
    if args.batch.contains(&0) || args.keys == 0 {
        return Err(Error::usage("--batch sizes and --keys must be at least 1"));
    }
    let rt = runtime()?;
    rt.block_on(async {
        let temp = tempfile::tempdir().context("temp dir")?;
        let (url, embedded) = match &args.state_service {
            Some(url) => (url.clone(), None),
            None => {
                let node = host.start_state_service(temp.path(), args.memory).await?;
                (format!("http://{}", node.local_addr()), Some(node))
            }
        };
        let mut client = StateServiceClient::connect(url.clone())
            .await
            .with_context(|| format!("connecting to {url}"))?
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let shard = pb::ShardId {
            job_id: "bench-state".into(),
            key_group_start: 0,
            key_group_end: 1 << 16,
        };
        client
            .open_shard(pb::OpenShardRequest {
                fence: 0,
                shard: Some(shard.clone()),
                checkpoint_id: 0,
                ttl_states: Vec::new(),
            })
            .await
            .context("open shard")?;
        let value = Bytes::from(vec![b'v'; args.value_bytes]);
        let budget = Duration::from_secs_f64(args.seconds.max(0.1));
        outln!("{}", TABLE.header());
        for &batch in &args.batch {
            // Puts: fill the key space round-robin, in batches.
            let mut next = 0u32;
            let figure = measure(budget, || {
                let ops: Vec<pb::WriteOp> = (0..batch)
                    .map(|_| {
                        let k = key(next % args.keys);
                        next = next.wrapping_add(1);
                        pb::WriteOp {
                            kind: pb::write_op::Kind::Put as i32,
                            key: k,
                            value: value.clone(),
                            end: Bytes::new(),
                        }
                    })
                    .collect();
                let req = pb::WriteRequest {
                    fence: 0,
                    shard: Some(shard.clone()),
                    epoch: 1,
                    ops,
                };
                let mut c = client.clone();
                async move { c.write(req).await.map(|_| ()) }
            })
            .await?;
            report("put", batch, figure);
            // Make sure every key exists before reading hits.
            if next < args.keys {
                for start in (next..args.keys).step_by(1000) {
                    let ops = (start..(start + 1000).min(args.keys))
                        .map(|i| pb::WriteOp {
                            kind: pb::write_op::Kind::Put as i32,
                            key: key(i),
                            value: value.clone(),
                            end: Bytes::new(),
                        })
                        .collect();
                    client
                        .write(pb::WriteRequest {
                            fence: 0,
                            shard: Some(shard.clone()),
                            epoch: 1,
                            ops,
                        })
                        .await
                        .context("fill")?;
                }
            }
            for (name, offset) in [("get_hit", 0u32), ("get_miss", u32::MAX / 2)] {
                let mut next = 0u32;
                let keys = args.keys;
                let figure = measure(budget, || {
                    let ks: Vec<Bytes> = (0..batch)
                        .map(|_| {
                            let k = key(offset.wrapping_add(next % keys));
                            next = next.wrapping_add(1);
                            k
                        })
                        .collect();
                    let req = pb::MultiGetRequest {
                        shard: Some(shard.clone()),
                        keys: ks,
                    };
                    let mut c = client.clone();
                    async move { c.multi_get(req).await.map(|_| ()) }
                })
                .await?;
                report(name, batch, figure);
            }
        }
        if let Some(node) = embedded {
            let _ = node.shutdown().await;
        }
        Ok::<_, Error>(())
    })
}

/// Calls made and elapsed time of one figure.
struct Figure {
    calls: u64,
    elapsed: Duration,
}

async fn measure<F, Fut>(budget: Duration, mut call: F) -> anyhow::Result<Figure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let start = Instant::now();
    let mut calls = 0u64;
    // Bounded in time and in count.
    while start.elapsed() < budget && calls < 10_000_000 {
        call()
            .await
            .map_err(|e| anyhow!("state call failed: {e}"))?;
        calls += 1;
    }
    Ok(Figure {
        calls,
        elapsed: start.elapsed(),
    })
}

/// One row: `batch` operations per call.
fn report(op: &str, batch: usize, f: Figure) {
    let secs = f.elapsed.as_secs_f64().max(1e-9);
    let calls_per_s = f.calls as f64 / secs;
    let row = TABLE.row(&[
        op.to_owned(),
        batch.to_string(),
        format!("{:.0}", calls_per_s * batch as f64),
        format!("{calls_per_s:.0}"),
        format!("{:.1}", 1e6 / calls_per_s.max(1e-9)),
    ]);
    outln!("{row}");
}
