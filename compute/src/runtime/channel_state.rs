//! Channel state of unaligned checkpoints: what a task records and what a restored task
//! replays.
//!
//! Recording: a task's gate hands over the elements an unaligned barrier overtook per
//! input channel ([`ChannelState`]); they are encoded with the network codec, followed
//! by the bytes of an element a remote channel had only begun to receive (the *input*
//! side). The task's router hands over the buffers the barrier overtook per output
//! channel (the *output* side). Both go into one object per task
//! (`sluice_common::channel_state`), which the coordinator keeps beside `_metadata`.
//!
//! Replay: a restored consumer takes, per channel of its input edge, the input side then
//! the producer's output side, decodes them as one stream and queues the elements on
//! the channel ahead of new input ([`InputGate::replay`]). At the same parallelism on
//! both ends every channel maps to itself and keeps its watermarks. At another
//! parallelism a hash edge's records go to the subtask that owns their key group now,
//! other edges' to subtask `old % new`; watermarks are dropped there (a channel no
//! longer exists to hold them; the sources regenerate them), so a record that was late
//! behind a replayed watermark is counted as on time.
//!
//! This module does not know where channel state is stored.
//!
//! [`InputGate::replay`]: crate::runtime::input_gate::InputGate::replay

use std::collections::BTreeMap;

use arrow::array::UInt32Array;
use arrow::compute::take_record_batch;
use bytes::Bytes;
use sluice_common::channel_state::{ChannelKey, ChannelPart, Side};
use sluice_common::key_group::{key_group_of, subtask_for_key_group};

use crate::element::StreamElement;
use crate::error::{Error, Result};
use crate::keys::{EncodedKeys, KeyEncoder};
use crate::network::codec::{self, Decoder};
use crate::runtime::input_gate::ChannelState;

/// The largest element replayed; channel state holds only what Sluice itself encoded.
const MAX_ELEMENT: usize = 1 << 30;

/// The input side of `state`: each channel's overtaken elements, encoded, then its
/// partial element's bytes; `keys` names the gate's channels in order. Empty channels
/// are left out.
pub fn input_parts(state: &ChannelState, keys: &[ChannelKey]) -> Result<Vec<ChannelPart>> {
    let mut parts = Vec::new();
    for (ch, key) in keys.iter().enumerate() {
        let elements = state.channels.get(ch).map_or(&[][..], Vec::as_slice);
        let partial = state.partial.get(ch).cloned().unwrap_or_default();
        if elements.is_empty() && partial.is_empty() {
            continue;
        }
        let mut out = Vec::new();
        for e in elements {
            codec::encode(e, &mut out)?;
        }
        out.extend_from_slice(&partial);
        parts.push(ChannelPart {
            key: *key,
            side: Side::Input,
            bytes: Bytes::from(out),
        });
    }
    Ok(parts)
}

/// The restored task a replay is for: a consumer subtask and its input edge now.
#[derive(Debug, Clone)]
pub struct ReplayTarget {
    /// Head node of the consuming chain.
    pub consumer_node: u32,
    /// The consuming subtask.
    pub consumer_subtask: u32,
    /// The consumer's parallelism now.
    pub consumer_parallelism: u32,
    /// The producer's parallelism now.
    pub producer_parallelism: u32,
    /// The edge is forward (one channel, from the same-index producer).
    pub forward: bool,
    /// A hash edge's key columns and the job's key groups.
    pub hash: Option<(KeyEncoder, u32)>,
}

impl ReplayTarget {
    /// The gate channel of producer subtask `producer` now.
    fn gate_channel(&self, producer: u32) -> usize {
        if self.forward {
            0
        } else {
            (producer % self.producer_parallelism.max(1)) as usize
        }
    }
}

/// The elements `target` replays, per gate channel, from every task's recorded `parts`.
pub fn replay_for(
    parts: &[ChannelPart],
    target: &ReplayTarget,
) -> Result<Vec<(usize, Vec<StreamElement>)>> {
    // Each old channel into this consumer node: input side, then output side.
    let mut channels: BTreeMap<ChannelKey, [Vec<&Bytes>; 2]> = BTreeMap::new();
    for p in parts
        .iter()
        .filter(|p| p.key.consumer_node == target.consumer_node)
    {
        let side = match p.side {
            Side::Input => 0,
            Side::Output => 1,
        };
        channels.entry(p.key).or_default()[side].push(&p.bytes);
    }
    let mut replay: BTreeMap<usize, Vec<StreamElement>> = BTreeMap::new();
    let mut keys = EncodedKeys::default();
    for (key, sides) in channels {
        let same = key.consumer_parallelism == target.consumer_parallelism
            && key.producer_parallelism == target.producer_parallelism;
        if same && key.consumer_subtask != target.consumer_subtask {
            continue;
        }
        if !same
            && target.hash.is_none()
            && key.consumer_subtask % target.consumer_parallelism.max(1) != target.consumer_subtask
        {
            continue;
        }
        let elements = decode_channel(&key, sides)?;
        let into = replay
            .entry(target.gate_channel(key.producer_subtask))
            .or_default();
        for e in elements {
            match e {
                StreamElement::Batch(b) if !same => match &target.hash {
                    Some((encoder, max_parallelism)) => {
                        encoder.encode(&b, &mut keys)?;
                        let rows: Vec<u32> = (0..b.num_rows())
                            .filter(|&row| {
                                let kg = key_group_of(keys.row(row), *max_parallelism);
                                subtask_for_key_group(
                                    *max_parallelism,
                                    target.consumer_parallelism,
                                    kg,
                                ) == target.consumer_subtask
                            })
                            .map(|row| row as u32)
                            .collect();
                        if rows.len() == b.num_rows() {
                            into.push(StreamElement::Batch(b));
                        } else if !rows.is_empty() {
                            let part = take_record_batch(&b, &UInt32Array::from(rows))?;
                            into.push(StreamElement::Batch(part));
                        }
                    }
                    None => into.push(StreamElement::Batch(b)),
                },
                StreamElement::Batch(_) => into.push(e),
                StreamElement::Watermark(_) if same => into.push(e),
                // Barriers, idleness and ends belong to the attempt that recorded them.
                _ => {}
            }
        }
    }
    Ok(replay.into_iter().filter(|(_, e)| !e.is_empty()).collect())
}

/// One old channel's elements: its input side's bytes, then its output side's.
fn decode_channel(key: &ChannelKey, sides: [Vec<&Bytes>; 2]) -> Result<Vec<StreamElement>> {
    let mut decoder = Decoder::new(MAX_ELEMENT);
    for bytes in sides.iter().flatten() {
        decoder.push(bytes);
    }
    let mut elements = Vec::new();
    let corrupt = |what: String| {
        Error::Internal(format!(
            "the channel state of channel {}#{} -> node {} #{} {what}",
            key.producer_subtask, key.producer_parallelism, key.consumer_node, key.consumer_subtask
        ))
    };
    loop {
        match decoder.next_element() {
            Ok(Some(e)) => elements.push(e),
            Ok(None) => break,
            Err(e) => return Err(corrupt(format!("does not decode: {e}"))),
        }
    }
    if decoder.pending_bytes() > 0 {
        return Err(corrupt(format!(
            "ends inside an element ({} bytes left over)",
            decoder.pending_bytes()
        )));
    }
    Ok(elements)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::*;

    fn batch(values: &[i64]) -> StreamElement {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        StreamElement::Batch(
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))])
                .unwrap(),
        )
    }

    fn values(elements: &[StreamElement]) -> Vec<i64> {
        elements
            .iter()
            .filter_map(|e| match e {
                StreamElement::Batch(b) => Some(b),
                _ => None,
            })
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    fn key(consumer: u32, producer: u32, p: u32) -> ChannelKey {
        ChannelKey {
            consumer_node: 7,
            consumer_subtask: consumer,
            consumer_parallelism: p,
            producer_subtask: producer,
            producer_parallelism: p,
        }
    }

    fn encoded(elements: &[StreamElement]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in elements {
            codec::encode(e, &mut out).unwrap();
        }
        out
    }

    /// Channel 1 -> 0 holds [1, 2] received, an element [3] cut in two between
    /// consumer and producer, and [4] at the producer; a watermark between 2 and 3.
    fn recorded() -> Vec<ChannelPart> {
        let received = encoded(&[batch(&[1]), batch(&[2]), StreamElement::Watermark(50)]);
        let cut = encoded(&[batch(&[3])]);
        let (head, tail) = cut.split_at(cut.len() / 2);
        let gate = ChannelState {
            checkpoint_id: 4,
            channels: vec![
                Vec::new(),
                vec![batch(&[1]), batch(&[2]), StreamElement::Watermark(50)],
            ],
            partial: vec![Bytes::new(), Bytes::copy_from_slice(head)],
            complete: true,
        };
        let mut parts = input_parts(&gate, &[key(0, 0, 2), key(0, 1, 2)]).unwrap();
        assert_eq!(parts.len(), 1, "the empty channel is left out");
        assert_eq!(&parts[0].bytes[..received.len()], &received[..]);
        let mut producer = tail.to_vec();
        producer.extend(encoded(&[batch(&[4]), StreamElement::EndOfPartition]));
        parts.push(ChannelPart {
            key: key(0, 1, 2),
            side: Side::Output,
            bytes: Bytes::from(producer),
        });
        // Another consumer's channel, replayed elsewhere.
        parts.push(ChannelPart {
            key: key(1, 1, 2),
            side: Side::Input,
            bytes: Bytes::from(encoded(&[batch(&[9])])),
        });
        parts
    }

    fn target(subtask: u32, p: u32, hash: bool) -> ReplayTarget {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        ReplayTarget {
            consumer_node: 7,
            consumer_subtask: subtask,
            consumer_parallelism: p,
            producer_parallelism: p,
            forward: false,
            hash: hash.then(|| (KeyEncoder::new(&schema, &["k".into()]).unwrap(), 128)),
        }
    }

    #[test]
    fn at_the_same_parallelism_each_channel_replays_into_itself_with_its_watermarks() {
        let replay = replay_for(&recorded(), &target(0, 2, true)).unwrap();
        assert_eq!(replay.len(), 1);
        let (ch, elements) = &replay[0];
        assert_eq!(*ch, 1);
        assert_eq!(values(elements), vec![1, 2, 3, 4]);
        assert!(matches!(elements[2], StreamElement::Watermark(50)));
        assert!(
            !elements
                .iter()
                .any(|e| matches!(e, StreamElement::EndOfPartition)),
            "an end of partition is the old attempt's"
        );
        let other = replay_for(&recorded(), &target(1, 2, true)).unwrap();
        assert_eq!(values(&other[0].1), vec![9]);
    }

    #[test]
    fn at_another_parallelism_records_follow_their_key_groups_and_none_is_lost() {
        let mut all = Vec::new();
        for subtask in 0..3 {
            let replay = replay_for(&recorded(), &target(subtask, 3, true)).unwrap();
            for (_, elements) in &replay {
                assert!(
                    !elements
                        .iter()
                        .any(|e| matches!(e, StreamElement::Watermark(_))),
                    "watermarks are dropped when channels change"
                );
                for v in values(elements) {
                    let mut keys = EncodedKeys::default();
                    let schema =
                        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
                    let StreamElement::Batch(b) = batch(&[v]) else {
                        unreachable!()
                    };
                    KeyEncoder::new(&schema, &["k".into()])
                        .unwrap()
                        .encode(&b, &mut keys)
                        .unwrap();
                    let kg = key_group_of(keys.row(0), 128);
                    assert_eq!(subtask_for_key_group(128, 3, kg), subtask, "value {v}");
                    all.push(v);
                }
            }
        }
        all.sort_unstable();
        assert_eq!(all, vec![1, 2, 3, 4, 9]);
        // Without keys, old consumer j goes to j % p.
        let one = replay_for(&recorded(), &target(0, 1, false)).unwrap();
        let mut got: Vec<i64> = one.iter().flat_map(|(_, e)| values(e)).collect();
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 3, 4, 9]);
    }

    #[test]
    fn a_channel_cut_inside_an_element_is_an_error() {
        let mut parts = recorded();
        parts.retain(|p| p.side == Side::Input);
        let err = replay_for(&parts, &target(0, 2, true)).unwrap_err();
        assert!(err.to_string().contains("ends inside an element"), "{err}");
    }
}
