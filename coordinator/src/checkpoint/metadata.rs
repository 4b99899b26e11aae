//! The `_metadata` object: a completed checkpoint, as written to the object store.
//!
//! It holds what a coordinator needs to resume the job with nothing else: job id,
//! checkpoint id, timestamps, the encoded `JobGraph`, the parallelism of every node and
//! `max_parallelism`, the job's state shards (fixed key-group ranges) with the handles
//! their writers returned, and per task its source positions, channel-state handles and
//! figures.
//!
//! ## Format (version 1)
//!
//! ```text
//! "SLUICECK" (8 bytes) | version u32 BE | payload length u64 BE
//! | payload: sluice.checkpoint.CheckpointMetadata (protobuf, common/proto/checkpoint.proto)
//! | XXH3-64 of everything before, u64 BE
//! ```
//!
//! A truncated, extended or bit-flipped object fails [`decode`] with a
//! [`MetadataError`] saying which check failed; it is never half-trusted. Conversions
//! between the protobuf and the types below live in the private `to_proto` /
//! `from_proto` functions of this file only.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use sluice_common::pb::checkpoint as pb;
use xxhash_rust::xxh3::xxh3_64;

use super::ack::{ShardRange, SourcePosition, TaskFigures, TaskId};

/// First bytes of every `_metadata` object.
pub const MAGIC: &[u8; 8] = b"SLUICECK";
/// The format this code writes (and the only one it reads).
pub const FORMAT_VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8;
const TRAILER: usize = 8;

/// A completed checkpoint or savepoint (the default: no checkpoint, id 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointMetadata {
    /// The job.
    pub job_id: String,
    /// The checkpoint's id (ids only grow within a job, across coordinators).
    pub checkpoint_id: u64,
    /// Wall-clock ms since the Unix epoch when it was triggered.
    pub triggered_at_ms: u64,
    /// Wall-clock ms when its last acknowledgement arrived.
    pub completed_at_ms: u64,
    /// The coordinator incarnation that wrote it.
    pub coordinator_id: String,
    /// The savepoint's name, for savepoints.
    pub savepoint: Option<String>,
    /// Kept until deleted by the user (savepoints), not by retention.
    pub kept: bool,
    /// The encoded `sluice.job.JobGraph`.
    pub job_graph: Bytes,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Parallelism per job-graph node id.
    pub parallelism: BTreeMap<u32, u32>,
    /// The job's state shards and the handles of this checkpoint.
    pub shards: Vec<ShardState>,
    /// Per task: positions, channel state, figures.
    pub tasks: Vec<TaskCheckpoint>,
    /// Records the job's sources read up to this checkpoint, over every attempt.
    pub records_in: u64,
}

/// One state shard in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardState {
    /// Its key-group range.
    pub range: ShardRange,
    /// Handles returned by its writers' `Flush` (one per writer).
    pub handles: Vec<String>,
    /// `http://host:port` of the state node that held it (empty: not recorded).
    pub node: String,
}

/// One task's part of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskCheckpoint {
    /// The task.
    pub task: TaskId,
    /// Positions of its source splits.
    pub source_positions: Vec<SourcePosition>,
    /// Channel state of an unaligned checkpoint: the paths of its objects.
    pub channel_state_handles: Vec<String>,
    /// The objects' bytes, when this process holds them (not part of `_metadata`: taken
    /// from the acknowledgement, or read from the handles on recovery).
    pub channel_state: Option<Bytes>,
    /// Its figures.
    pub figures: TaskFigures,
}

impl CheckpointMetadata {
    /// Duration from trigger to the last acknowledgement.
    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.completed_at_ms.saturating_sub(self.triggered_at_ms))
    }

    /// Bytes made durable by every task.
    pub fn bytes(&self) -> u64 {
        self.tasks.iter().map(|t| t.figures.bytes).sum()
    }
}

/// Why bytes are not a usable `_metadata` object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// Shorter than header and trailer: truncated or not ours.
    #[error("only {0} bytes, shorter than the smallest metadata object (truncated?)")]
    TooShort(usize),
    /// Does not start with the magic.
    #[error("not a Sluice checkpoint metadata object (bad magic)")]
    BadMagic,
    /// Written by a newer (or unknown) format.
    #[error("format version {0} is not supported (this build reads version {FORMAT_VERSION})")]
    UnsupportedVersion(u32),
    /// The payload length disagrees with the object's size.
    #[error("payload length {declared} does not match the object ({actual} bytes): truncated?")]
    LengthMismatch {
        /// Length in the header.
        declared: u64,
        /// Payload bytes present.
        actual: u64,
    },
    /// The bytes changed after they were written.
    #[error("checksum mismatch (stored {stored:016x}, computed {computed:016x}): corrupt")]
    ChecksumMismatch {
        /// Checksum in the trailer.
        stored: u64,
        /// Checksum of the bytes read.
        computed: u64,
    },
    /// The checksum holds but the payload does not decode (a bug in the writer).
    #[error("payload does not decode: {0}")]
    Payload(String),
    /// A channel-state object the checkpoint references is missing or fails its checks.
    #[error("its channel state `{path}` {reason}")]
    ChannelState {
        /// The object's path below the store's root.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Encodes `meta` in the current format.
pub fn encode(meta: &CheckpointMetadata) -> Bytes {
    let payload = to_proto(meta).encode_to_vec();
    let mut out = BytesMut::with_capacity(HEADER + payload.len() + TRAILER);
    out.put_slice(MAGIC);
    out.put_u32(FORMAT_VERSION);
    out.put_u64(payload.len() as u64);
    out.put_slice(&payload);
    let sum = xxh3_64(&out);
    out.put_u64(sum);
    out.freeze()
}

/// Decodes and checks a `_metadata` object.
pub fn decode(bytes: &[u8]) -> Result<CheckpointMetadata, MetadataError> {
    if bytes.len() < HEADER + TRAILER {
        return Err(MetadataError::TooShort(bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err(MetadataError::BadMagic);
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER);
    let stored = u64::from_be_bytes(trailer.try_into().expect("8-byte trailer"));
    let computed = xxh3_64(body);
    let declared = u64::from_be_bytes(body[12..20].try_into().expect("8-byte length"));
    let actual = (body.len() - HEADER) as u64;
    // The checksum first: a flipped version or length byte is corruption, not a format.
    if stored != computed {
        if declared != actual {
            return Err(MetadataError::LengthMismatch { declared, actual });
        }
        return Err(MetadataError::ChecksumMismatch { stored, computed });
    }
    let version = u32::from_be_bytes(body[8..12].try_into().expect("4-byte version"));
    if version != FORMAT_VERSION {
        return Err(MetadataError::UnsupportedVersion(version));
    }
    if declared != actual {
        return Err(MetadataError::LengthMismatch { declared, actual });
    }
    let msg = pb::CheckpointMetadata::decode(&body[HEADER..])
        .map_err(|e| MetadataError::Payload(e.to_string()))?;
    Ok(from_proto(msg))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn to_proto(m: &CheckpointMetadata) -> pb::CheckpointMetadata {
    pb::CheckpointMetadata {
        job_id: m.job_id.clone(),
        checkpoint_id: m.checkpoint_id,
        triggered_at_ms: m.triggered_at_ms,
        completed_at_ms: m.completed_at_ms,
        coordinator_id: m.coordinator_id.clone(),
        savepoint_name: m.savepoint.clone().unwrap_or_default(),
        kept: m.kept,
        job_graph: m.job_graph.to_vec(),
        max_parallelism: m.max_parallelism,
        parallelism: m
            .parallelism
            .iter()
            .map(|(&node_id, &parallelism)| pb::NodeParallelism {
                node_id,
                parallelism,
            })
            .collect(),
        shards: m
            .shards
            .iter()
            .map(|s| pb::ShardState {
                key_group_start: s.range.start,
                key_group_end: s.range.end,
                handles: s.handles.clone(),
                node_endpoint: s.node.clone(),
            })
            .collect(),
        tasks: m
            .tasks
            .iter()
            .map(|t| pb::TaskCheckpoint {
                node_id: t.task.node,
                subtask: t.task.subtask,
                source_positions: t
                    .source_positions
                    .iter()
                    .map(|p| pb::SourcePosition {
                        split: p.split.clone(),
                        position: p.position.to_vec(),
                    })
                    .collect(),
                channel_state_handles: t.channel_state_handles.clone(),
                sync_micros: micros(t.figures.sync),
                async_micros: micros(t.figures.async_part),
                alignment_micros: micros(t.figures.alignment),
                bytes: t.figures.bytes,
                records: t.figures.records,
                channel_state_bytes: t.figures.channel_state_bytes,
            })
            .collect(),
        records_in: m.records_in,
    }
}

fn from_proto(m: pb::CheckpointMetadata) -> CheckpointMetadata {
    CheckpointMetadata {
        job_id: m.job_id,
        checkpoint_id: m.checkpoint_id,
        triggered_at_ms: m.triggered_at_ms,
        completed_at_ms: m.completed_at_ms,
        coordinator_id: m.coordinator_id,
        savepoint: Some(m.savepoint_name).filter(|n| !n.is_empty()),
        kept: m.kept,
        job_graph: Bytes::from(m.job_graph),
        max_parallelism: m.max_parallelism,
        parallelism: m
            .parallelism
            .into_iter()
            .map(|p| (p.node_id, p.parallelism))
            .collect(),
        shards: m
            .shards
            .into_iter()
            .map(|s| ShardState {
                range: ShardRange {
                    start: s.key_group_start,
                    end: s.key_group_end,
                },
                handles: s.handles,
                node: s.node_endpoint,
            })
            .collect(),
        tasks: m
            .tasks
            .into_iter()
            .map(|t| TaskCheckpoint {
                task: TaskId::new(t.node_id, t.subtask),
                source_positions: t
                    .source_positions
                    .into_iter()
                    .map(|p| SourcePosition {
                        split: p.split,
                        position: Bytes::from(p.position),
                    })
                    .collect(),
                channel_state_handles: t.channel_state_handles,
                channel_state: None,
                figures: TaskFigures {
                    sync: Duration::from_micros(t.sync_micros),
                    async_part: Duration::from_micros(t.async_micros),
                    alignment: Duration::from_micros(t.alignment_micros),
                    bytes: t.bytes,
                    records: t.records,
                    channel_state_bytes: t.channel_state_bytes,
                },
            })
            .collect(),
        records_in: m.records_in,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A metadata object with every field set.
    pub(crate) fn sample(checkpoint_id: u64) -> CheckpointMetadata {
        CheckpointMetadata {
            job_id: "q5".into(),
            checkpoint_id,
            triggered_at_ms: 1_700_000_000_000,
            completed_at_ms: 1_700_000_000_250,
            coordinator_id: "coord-a".into(),
            savepoint: Some("before-upgrade".into()),
            kept: true,
            job_graph: Bytes::from_static(b"\x0a\x02q5\x10\x80\x01"),
            max_parallelism: 128,
            parallelism: BTreeMap::from([(1, 2), (2, 4)]),
            shards: vec![
                ShardState {
                    range: ShardRange { start: 0, end: 64 },
                    handles: vec!["jobs/q5/shards/0-64/deltas/7".into()],
                    node: "http://127.0.0.1:7071".into(),
                },
                ShardState {
                    range: ShardRange {
                        start: 64,
                        end: 128,
                    },
                    handles: vec![],
                    node: String::new(),
                },
            ],
            tasks: vec![TaskCheckpoint {
                task: TaskId::new(1, 0),
                source_positions: vec![SourcePosition {
                    split: "bids-0".into(),
                    position: Bytes::from_static(&[0, 0, 1, 44]),
                }],
                channel_state_handles: vec!["cs/1".into()],
                channel_state: None,
                figures: TaskFigures {
                    sync: Duration::from_micros(1500),
                    async_part: Duration::from_millis(40),
                    alignment: Duration::from_micros(7),
                    bytes: 4096,
                    records: 1000,
                    channel_state_bytes: 2048,
                },
            }],
            records_in: 123_456,
        }
    }

    #[test]
    fn round_trips_every_field() {
        let m = sample(42);
        let bytes = encode(&m);
        assert_eq!(&bytes[..8], MAGIC);
        let back = decode(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.duration(), Duration::from_millis(250));
        assert_eq!(back.bytes(), 4096);
        let plain = CheckpointMetadata {
            savepoint: None,
            kept: false,
            ..sample(1)
        };
        assert_eq!(decode(&encode(&plain)).unwrap(), plain);
    }

    #[test]
    fn every_truncation_is_detected() {
        let bytes = encode(&sample(7));
        for len in 0..bytes.len() {
            let err = decode(&bytes[..len]).unwrap_err();
            assert!(
                matches!(
                    err,
                    MetadataError::TooShort(_)
                        | MetadataError::LengthMismatch { .. }
                        | MetadataError::ChecksumMismatch { .. }
                ),
                "truncated to {len}: {err:?}"
            );
        }
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let bytes = encode(&sample(7));
        for i in 0..bytes.len() {
            for bit in [0u8, 3, 7] {
                let mut bad = bytes.to_vec();
                bad[i] ^= 1 << bit;
                assert!(
                    decode(&bad).is_err(),
                    "flip of bit {bit} in byte {i} accepted"
                );
            }
        }
    }

    #[test]
    fn appended_bytes_foreign_objects_and_future_versions_are_refused() {
        let bytes = encode(&sample(7));
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"junk");
        assert!(decode(&longer).is_err());
        assert_eq!(
            decode(b"{\"not\": \"metadata at all, just json\"}"),
            Err(MetadataError::BadMagic)
        );
        // A well-formed object of a future version: checksum valid, version unknown.
        let mut future = bytes[..bytes.len() - TRAILER].to_vec();
        future[8..12].copy_from_slice(&2u32.to_be_bytes());
        let sum = xxh3_64(&future);
        future.extend_from_slice(&sum.to_be_bytes());
        assert_eq!(decode(&future), Err(MetadataError::UnsupportedVersion(2)));
    }
}
