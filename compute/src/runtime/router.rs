//! A task's output router: partitions what the chain emits onto downstream channels.
//!
//! Each outgoing edge has a partitioner (DESIGN §5): forward (to the same-index
//! subtask), hash (by the key group of the key columns, DESIGN §4), rebalance (round
//! robin by batch) or broadcast. Control elements (watermarks, barriers, idleness, end
//! of partition) go to every channel of every edge, so downstream gates see them on
//! each input; an unaligned barrier goes ahead of what is queued (a priority event).
//!
//! A channel is local (a byte-bounded queue into a gate of this process) or remote (a
//! subpartition of the data plane, `network::partition`); the router does not care.

use arrow::array::UInt32Array;
use arrow::compute::take_record_batch;
use arrow::record_batch::RecordBatch;
use sluice_common::channel_state::{ChannelKey, ChannelPart, Side};
use sluice_common::key_group::{key_group_of, subtask_for_key_group};

use crate::runtime::metrics::now_ns;
use std::sync::Arc;

use bytes::Bytes;

use crate::element::{BarrierKind, StreamElement};
use crate::error::Result;
use crate::keys::{EncodedKeys, KeyEncoder};
use crate::network::partition::SubpartitionWriter;
use crate::queue::QueueSender;
use crate::runtime::metrics::TaskMetrics;

/// One outgoing channel.
#[derive(Debug)]
pub enum ChannelSender {
    /// To a task of this process.
    Local(QueueSender),
    /// To a task of another worker.
    Remote(SubpartitionWriter),
}

impl ChannelSender {
    async fn send(&mut self, element: StreamElement, metrics: &TaskMetrics) -> Result<()> {
        let rows = element.num_rows() as u64;
        let start = metrics.blocked.begin();
        let r = match self {
            ChannelSender::Local(q) => {
                let bytes = element.size_bytes() as u64;
                let r = q.send(element).await;
                metrics.add_bytes_out(bytes);
                r
            }
            ChannelSender::Remote(w) => w.write(&element).await,
        };
        let took = std::time::Duration::from_nanos(now_ns().saturating_sub(start));
        metrics.add_send(rows, took);
        metrics.blocked.end();
        r
    }

    /// Whether a send of an ordinary element would not wait for room.
    fn has_room(&self) -> bool {
        match self {
            ChannelSender::Local(q) => q.has_room(),
            ChannelSender::Remote(w) => w.has_room(),
        }
    }

    /// Until [`Self::has_room`] holds.
    async fn room(&self) {
        match self {
            ChannelSender::Local(q) => q.room().await,
            ChannelSender::Remote(w) => w.room().await,
        }
    }

    /// Sends an unaligned barrier ahead of queued data; returns the buffers it overtook
    /// (remote channels; a local channel's consumer captures them itself).
    fn send_priority(&mut self, element: &StreamElement) -> Result<Vec<Bytes>> {
        match self {
            ChannelSender::Local(q) => q.send_priority(element.clone()).map(|_| Vec::new()),
            ChannelSender::Remote(w) => w.write_priority(element),
        }
    }
}

/// How records of one edge are spread over the consumer's subtasks.
#[derive(Debug, Clone)]
pub enum Partitioner {
    /// One channel, to the subtask with the same index.
    Forward,
    /// By key group of the key columns.
    Hash {
        /// Encodes the key columns.
        encoder: KeyEncoder,
        /// Number of key groups of the job.
        max_parallelism: u32,
    },
    /// Batches round-robin.
    Rebalance,
    /// Every batch to every subtask.
    Broadcast,
}

/// One outgoing edge of a task: its partitioner and a sender per consumer subtask.
#[derive(Debug)]
pub struct OutputEdge {
    partitioner: Partitioner,
    senders: Vec<ChannelSender>,
    metrics: Arc<TaskMetrics>,
    /// Buffers the last unaligned barrier overtook, per channel (output channel state).
    output_state: Vec<Vec<Bytes>>,
    /// Each channel as checkpoints name it (set when the task takes checkpoints).
    channel_keys: Vec<ChannelKey>,
    next: usize,
    keys: EncodedKeys,
    targets: Vec<Vec<u32>>,
}

impl OutputEdge {
    /// An edge sending through local `senders` (one per consumer subtask; one for
    /// forward).
    pub fn new(partitioner: Partitioner, senders: Vec<QueueSender>) -> Self {
        Self::with_channels(
            partitioner,
            senders.into_iter().map(ChannelSender::Local).collect(),
            Arc::default(),
        )
    }

    /// An edge over local or remote channels, counting into `metrics`.
    pub fn with_channels(
        partitioner: Partitioner,
        senders: Vec<ChannelSender>,
        metrics: Arc<TaskMetrics>,
    ) -> Self {
        let targets = vec![Vec::new(); senders.len()];
        Self {
            partitioner,
            senders,
            metrics,
            output_state: Vec::new(),
            channel_keys: Vec::new(),
            next: 0,
            keys: EncodedKeys::default(),
            targets,
        }
    }

    /// Whether every channel has room for an ordinary element.
    pub fn has_room(&self) -> bool {
        self.senders.iter().all(ChannelSender::has_room)
    }

    /// Until every channel has room (the caller checks again: room may go meanwhile).
    pub async fn room(&self) {
        for s in &self.senders {
            s.room().await;
        }
    }

    /// Names each channel (in sender order) as channel state records it.
    pub fn with_channel_keys(mut self, keys: Vec<ChannelKey>) -> Self {
        self.channel_keys = keys;
        self
    }

    /// Whether aligned barrier `checkpoint_id` still queues at a remote channel (a
    /// local one's consumer lets it overtake itself).
    pub fn barrier_queued(&self, checkpoint_id: u64) -> bool {
        self.senders.iter().any(|s| match s {
            ChannelSender::Remote(w) => w.barrier_queued(checkpoint_id),
            ChannelSender::Local(_) => false,
        })
    }

    /// Aligned barrier `checkpoint_id`, where it still queues, overtakes what is in
    /// front of it as an unaligned one; what it overtook is the output state
    /// [`Self::take_output_state`] then returns.
    pub fn overtake(&mut self, checkpoint_id: u64) -> Result<()> {
        self.output_state.clear();
        for s in &mut self.senders {
            let overtaken = match s {
                ChannelSender::Remote(w) => w.overtake(checkpoint_id)?.unwrap_or_default(),
                ChannelSender::Local(_) => Vec::new(),
            };
            self.output_state.push(overtaken);
        }
        Ok(())
    }

    /// The output channel state the last unaligned barrier left (the buffers it
    /// overtook), once; empty channels are left out.
    pub fn take_output_state(&mut self) -> Vec<ChannelPart> {
        let state = std::mem::take(&mut self.output_state);
        state
            .into_iter()
            .zip(&self.channel_keys)
            .filter(|(buffers, _)| !buffers.is_empty())
            .map(|(buffers, key)| ChannelPart {
                key: *key,
                side: Side::Output,
                bytes: concat(buffers),
            })
            .collect()
    }

    /// Sends `element` (an unaligned barrier) ahead of what queues on every channel;
    /// what it overtook is the output state [`Self::take_output_state`] then returns.
    pub fn emit_priority(&mut self, element: &StreamElement) -> Result<()> {
        self.output_state.clear();
        for s in &mut self.senders {
            let overtaken = s.send_priority(element)?;
            self.output_state.push(overtaken);
        }
        Ok(())
    }

    /// Whether every channel's consumer took everything sent, its end included (a
    /// finished task's output).
    pub fn drained(&self) -> bool {
        self.senders.iter().all(|s| match s {
            ChannelSender::Local(q) => q.bytes_in_use() == 0,
            ChannelSender::Remote(w) => w.subpartition().is_done(),
        })
    }

    /// Sends `element` to the right channels.
    pub async fn emit(&mut self, element: &StreamElement) -> Result<()> {
        let metrics = &*self.metrics;
        let StreamElement::Batch(batch) = element else {
            if let StreamElement::Barrier(b) = element
                && b.kind == BarrierKind::Unaligned
            {
                return self.emit_priority(element);
            }
            for s in &mut self.senders {
                s.send(element.clone(), metrics).await?;
            }
            return Ok(());
        };
        match &self.partitioner {
            Partitioner::Forward => self.senders[0].send(element.clone(), metrics).await,
            Partitioner::Rebalance => {
                let i = self.next % self.senders.len();
                self.next = self.next.wrapping_add(1);
                self.senders[i].send(element.clone(), metrics).await
            }
            Partitioner::Broadcast => {
                for s in &mut self.senders {
                    s.send(element.clone(), metrics).await?;
                }
                Ok(())
            }
            Partitioner::Hash { .. } => self.emit_hashed(batch).await,
        }
    }

    async fn emit_hashed(&mut self, batch: &RecordBatch) -> Result<()> {
        let Partitioner::Hash {
            encoder,
            max_parallelism,
        } = &self.partitioner
        else {
            return Ok(());
        };
        let parallelism = self.senders.len() as u32;
        let metrics = &*self.metrics;
        if parallelism == 1 {
            return self.senders[0]
                .send(StreamElement::Batch(batch.clone()), metrics)
                .await;
        }
        encoder.encode(batch, &mut self.keys)?;
        for t in &mut self.targets {
            t.clear();
        }
        for row in 0..batch.num_rows() {
            let kg = key_group_of(self.keys.row(row), *max_parallelism);
            let target = subtask_for_key_group(*max_parallelism, parallelism, kg);
            self.targets[target as usize].push(row as u32);
        }
        for (target, rows) in self.targets.iter_mut().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let part = if rows.len() == batch.num_rows() {
                batch.clone()
            } else {
                take_record_batch(batch, &UInt32Array::from(std::mem::take(rows)))?
            };
            self.senders[target]
                .send(StreamElement::Batch(part), metrics)
                .await?;
        }
        Ok(())
    }
}

/// One buffer of `buffers`' bytes in order.
fn concat(buffers: Vec<Bytes>) -> Bytes {
    if buffers.len() == 1 {
        return buffers.into_iter().next().unwrap_or_default();
    }
    let mut out = bytes::BytesMut::with_capacity(buffers.iter().map(Bytes::len).sum());
    for b in buffers {
        out.extend_from_slice(&b);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::queue::input_queue;

    #[tokio::test]
    async fn hash_sends_each_key_to_its_key_group_owner() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..1000))],
        )
        .unwrap();
        let (s0, mut r0) = input_queue(1, 1 << 24);
        let (s1, mut r1) = input_queue(1, 1 << 24);
        let encoder = KeyEncoder::new(&schema, &["k".into()]).unwrap();
        let mut edge = OutputEdge::new(
            Partitioner::Hash {
                encoder: encoder.clone(),
                max_parallelism: 128,
            },
            vec![s0[0].clone(), s1[0].clone()],
        );
        edge.emit(&StreamElement::Batch(batch)).await.unwrap();
        drop(edge);
        drop((s0, s1));
        let mut total = 0;
        for (subtask, rx) in [(0u32, &mut r0), (1, &mut r1)] {
            while let Some(crate::queue::Received::Element(env)) = rx.recv().await {
                let Ok(StreamElement::Batch(b)) = env.item else {
                    break;
                };
                let mut keys = EncodedKeys::default();
                encoder.encode(&b, &mut keys).unwrap();
                for row in 0..b.num_rows() {
                    let kg = key_group_of(keys.row(row), 128);
                    assert_eq!(subtask_for_key_group(128, 2, kg), subtask);
                }
                total += b.num_rows();
            }
        }
        assert_eq!(total, 1000);
    }
}
