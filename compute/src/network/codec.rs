//! The element stream of one channel: how [`StreamElement`]s become bytes and back.
//!
//! A subpartition is one byte stream of encoded elements, cut into network buffers
//! wherever a buffer is full, so an element may span several buffers. Each element is a
//! tag byte and a body: a batch is `u32 length` + one Arrow IPC stream (schema and
//! batch); a watermark an `i64`; a barrier its checkpoint id and kind. The decoder
//! reassembles elements from buffers and refuses (rather than waits for) an element
//! longer than its limit, so a corrupt length cannot make it buffer without bound.
//!
//! Nothing here knows about sockets, credits or channels.

use std::io::Cursor;

use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::element::{Barrier, BarrierKind, StreamElement};

const BATCH: u8 = 0;
const WATERMARK: u8 = 1;
const IDLE: u8 = 2;
const BARRIER: u8 = 3;
const END: u8 = 4;

/// Largest element the decoder accepts by default (one encoded batch).
pub const DEFAULT_MAX_ELEMENT_BYTES: usize = 256 << 20;

/// What was wrong with a channel's byte stream.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// An unknown element tag.
    #[error("unknown element tag {0}")]
    UnknownTag(u8),
    /// An element longer than allowed.
    #[error("element of {len} bytes exceeds the maximum of {max}")]
    TooLong {
        /// Announced length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The Arrow IPC payload did not decode.
    #[error("bad Arrow IPC payload: {0}")]
    Ipc(String),
    /// A bad barrier kind.
    #[error("unknown barrier kind {0}")]
    BarrierKind(u8),
}

/// Appends `element` to `out`.
pub fn encode(element: &StreamElement, out: &mut Vec<u8>) -> crate::Result<()> {
    match element {
        StreamElement::Batch(batch) => {
            out.push(BATCH);
            let at = out.len();
            out.extend_from_slice(&[0; 4]);
            encode_batch(batch, out)?;
            let len = (out.len() - at - 4) as u32;
            out[at..at + 4].copy_from_slice(&len.to_be_bytes());
        }
        StreamElement::Watermark(ts) => {
            out.push(WATERMARK);
            out.put_i64(*ts);
        }
        StreamElement::Idle => out.push(IDLE),
        StreamElement::Barrier(b) => {
            out.push(BARRIER);
            out.put_u64(b.checkpoint_id);
            out.push(match b.kind {
                BarrierKind::Aligned => 0,
                BarrierKind::Unaligned => 1,
                BarrierKind::Savepoint => 2,
            });
        }
        StreamElement::EndOfPartition => out.push(END),
    }
    Ok(())
}

fn encode_batch(batch: &RecordBatch, out: &mut Vec<u8>) -> crate::Result<()> {
    let mut writer = StreamWriter::try_new(out, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    Ok(())
}

/// Reassembles elements from the buffers of one channel.
#[derive(Debug)]
pub struct Decoder {
    pending: BytesMut,
    max_element: usize,
}

impl Decoder {
    /// A decoder refusing elements longer than `max_element` bytes.
    pub fn new(max_element: usize) -> Self {
        Self {
            pending: BytesMut::new(),
            max_element,
        }
    }

    /// Adds the bytes of one buffer.
    pub fn push(&mut self, data: &[u8]) {
        self.pending.extend_from_slice(data);
    }

    /// Bytes of an incomplete element held.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// A copy of the bytes of the incomplete element held.
    pub fn pending(&self) -> Bytes {
        Bytes::copy_from_slice(&self.pending)
    }

    /// The next complete element, if the bytes so far hold one.
    pub fn next_element(&mut self) -> Result<Option<StreamElement>, CodecError> {
        let Some(&tag) = self.pending.first() else {
            return Ok(None);
        };
        let fixed = |n: usize| -> Option<usize> { Some(n) };
        let need = match tag {
            BATCH => {
                if self.pending.len() < 5 {
                    return Ok(None);
                }
                let len =
                    u32::from_be_bytes(self.pending[1..5].try_into().unwrap_or_default()) as usize;
                if len > self.max_element {
                    return Err(CodecError::TooLong {
                        len,
                        max: self.max_element,
                    });
                }
                fixed(5 + len)
            }
            WATERMARK => fixed(9),
            IDLE | END => fixed(1),
            BARRIER => fixed(10),
            other => return Err(CodecError::UnknownTag(other)),
        };
        let need = need.unwrap_or(1);
        if self.pending.len() < need {
            return Ok(None);
        }
        let mut el = self.pending.split_to(need);
        el.advance(1);
        Ok(Some(match tag {
            BATCH => {
                el.advance(4);
                StreamElement::Batch(decode_batch(&el)?)
            }
            WATERMARK => StreamElement::Watermark(el.get_i64()),
            IDLE => StreamElement::Idle,
            BARRIER => {
                let checkpoint_id = el.get_u64();
                let kind = match el.get_u8() {
                    0 => BarrierKind::Aligned,
                    1 => BarrierKind::Unaligned,
                    2 => BarrierKind::Savepoint,
                    k => return Err(CodecError::BarrierKind(k)),
                };
                StreamElement::Barrier(Barrier {
                    checkpoint_id,
                    kind,
                })
            }
            _ => StreamElement::EndOfPartition,
        }))
    }
}

fn decode_batch(bytes: &[u8]) -> Result<RecordBatch, CodecError> {
    let mut reader = StreamReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| CodecError::Ipc(e.to_string()))?;
    match reader.next() {
        Some(Ok(batch)) => Ok(batch),
        Some(Err(e)) => Err(CodecError::Ipc(e.to_string())),
        None => Err(CodecError::Ipc("no record batch".into())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn elements_survive_arbitrary_buffer_cuts() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..100)),
                Arc::new(StringArray::from_iter_values(
                    (0..100).map(|i| format!("v{i}")),
                )),
            ],
        )
        .unwrap();
        let elements = [
            StreamElement::Watermark(5),
            StreamElement::Batch(batch.slice(10, 50)),
            StreamElement::Barrier(Barrier {
                checkpoint_id: 3,
                kind: BarrierKind::Aligned,
            }),
            StreamElement::Idle,
            StreamElement::EndOfPartition,
        ];
        let mut bytes = Vec::new();
        for e in &elements {
            encode(e, &mut bytes).unwrap();
        }
        for cut in [1, 7, 64, 100_000] {
            let mut dec = Decoder::new(1 << 20);
            let mut out = Vec::new();
            for chunk in bytes.chunks(cut) {
                dec.push(chunk);
                while let Some(e) = dec.next_element().unwrap() {
                    out.push(e);
                }
            }
            assert_eq!(out.len(), elements.len());
            let StreamElement::Batch(b) = &out[1] else {
                panic!("not a batch")
            };
            assert_eq!(b, &batch.slice(10, 50));
            assert!(matches!(out[0], StreamElement::Watermark(5)));
            assert_eq!(dec.pending_bytes(), 0);
        }
    }

    #[test]
    fn corrupt_streams_are_errors() {
        let mut dec = Decoder::new(1000);
        dec.push(&[BATCH, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            dec.next_element(),
            Err(CodecError::TooLong { .. })
        ));
        let mut dec = Decoder::new(1000);
        dec.push(&[42]);
        assert!(matches!(
            dec.next_element(),
            Err(CodecError::UnknownTag(42))
        ));
        let mut dec = Decoder::new(1000);
        dec.push(&[BATCH, 0, 0, 0, 3, 1, 2, 3]);
        assert!(matches!(dec.next_element(), Err(CodecError::Ipc(_))));
    }
}
