//! The element stream of one channel: how [`StreamElement`]s become bytes and back.
//!
//! A subpartition is one byte stream of encoded elements, cut into network buffers
//! wherever a buffer is full, so an element may span several buffers. Each element is a
//! tag byte and a body: a batch is `u32 length` + one Arrow IPC stream (schema, batch,
//! end of stream); a watermark an `i64`; a barrier its checkpoint id and kind. The
//! decoder reassembles elements from buffers and refuses (rather than waits for) an
//! element longer than its limit, so a corrupt length cannot make it buffer without
//! bound.
//!
//! Copies: a batch is encoded as a list of chunks ([`encode_chunks`]) whose bodies are
//! the batch's own Arrow buffers (Arrow's `StreamEncoder` shares them), so the producer
//! copies only what shares a network buffer with something else. The decoder copies a
//! batch's bytes once, as they arrive, into one allocation aligned for Arrow, which the
//! decoded arrays then point into (no second copy by an IPC reader, no zero-filling); it
//! keeps no received buffer, which may be a slice of a much larger socket read. The
//! arrays are validated (UTF-8, offsets): the bytes come from the network.
//!
//! Nothing here knows about sockets, credits or channels.

use arrow::buffer::{Buffer, MutableBuffer};
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamEncoder;
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
    for chunk in encode_chunks(element)? {
        out.extend_from_slice(&chunk);
    }
    Ok(())
}

/// `element` encoded as chunks to send in order: a batch's Arrow buffers are shared, not
/// copied.
pub fn encode_chunks(element: &StreamElement) -> crate::Result<Vec<Bytes>> {
    let mut head = BytesMut::with_capacity(16);
    match element {
        StreamElement::Batch(batch) => {
            let mut encoder = StreamEncoder::try_new(&batch.schema())?;
            let mut buffers = encoder.encode(batch)?;
            buffers.extend(encoder.finish()?);
            let len: usize = buffers.iter().map(|b| b.len()).sum();
            let len = u32::try_from(len).map_err(|_| {
                crate::Error::Internal(format!("an encoded batch of {len} bytes exceeds 4 GiB"))
            })?;
            head.put_u8(BATCH);
            head.put_u32(len);
            let mut chunks = Vec::with_capacity(buffers.len() + 1);
            chunks.push(head.freeze());
            chunks.extend(
                buffers
                    .into_iter()
                    .filter(|b| !b.is_empty())
                    .map(|b| Bytes::from_owner(Shared(b))),
            );
            return Ok(chunks);
        }
        StreamElement::Watermark(ts) => {
            head.put_u8(WATERMARK);
            head.put_i64(*ts);
        }
        StreamElement::Idle => head.put_u8(IDLE),
        StreamElement::Barrier(b) => {
            head.put_u8(BARRIER);
            head.put_u64(b.checkpoint_id);
            head.put_u8(match b.kind {
                BarrierKind::Aligned => 0,
                BarrierKind::Unaligned => 1,
                BarrierKind::Savepoint => 2,
            });
            head.put_u64(b.timeout_at_ms);
        }
        StreamElement::EndOfPartition => head.put_u8(END),
    }
    Ok(vec![head.freeze()])
}

/// An Arrow buffer lent to [`Bytes`] (the batch's memory, sent without a copy).
struct Shared(Buffer);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Reassembles elements from the buffers of one channel.
#[derive(Debug)]
pub struct Decoder {
    /// Received bytes not yet part of an element or a batch in reassembly.
    pending: BytesMut,
    /// A batch being received: its IPC bytes so far, and how many it has.
    body: Option<(MutableBuffer, usize)>,
    max_element: usize,
}

/// Room a batch in reassembly gets at first; a longer one grows as its bytes arrive (so
/// a corrupt or hostile length does not allocate its claim up front).
const FIRST_BODY_BYTES: usize = 4 << 20;

impl Decoder {
    /// A decoder refusing elements longer than `max_element` bytes.
    pub fn new(max_element: usize) -> Self {
        Self {
            pending: BytesMut::new(),
            body: None,
            max_element,
        }
    }

    /// Adds the bytes of one buffer. Bytes of a batch in reassembly go straight into
    /// its allocation: the buffer is not kept (it may be a slice of a larger read).
    pub fn push(&mut self, mut data: &[u8]) {
        if let Some((body, len)) = &mut self.body {
            let take = (*len - body.len()).min(data.len());
            body.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        self.pending.extend_from_slice(data);
    }

    /// Bytes of an incomplete element held.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len() + self.body.as_ref().map_or(0, |(body, _)| 5 + body.len())
    }

    /// A copy of the bytes of the incomplete element held.
    pub fn pending(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.pending_bytes());
        if let Some((body, len)) = &self.body {
            out.put_u8(BATCH);
            out.put_u32(*len as u32);
            out.extend_from_slice(body.as_slice());
        }
        out.extend_from_slice(&self.pending);
        out.freeze()
    }

    /// The next complete element, if the bytes so far hold one.
    pub fn next_element(&mut self) -> Result<Option<StreamElement>, CodecError> {
        if let Some((body, len)) = &self.body {
            if body.len() < *len {
                return Ok(None);
            }
            let (body, _) = self.body.take().unwrap_or_default();
            return Ok(Some(StreamElement::Batch(decode_batch(body.into())?)));
        }
        let Some(&tag) = self.pending.first() else {
            return Ok(None);
        };
        let need = match tag {
            BATCH => {
                if self.pending.len() < 5 {
                    return Ok(None);
                }
                let len = u32::from_be_bytes([
                    self.pending[1],
                    self.pending[2],
                    self.pending[3],
                    self.pending[4],
                ]) as usize;
                if len > self.max_element {
                    return Err(CodecError::TooLong {
                        len,
                        max: self.max_element,
                    });
                }
                // The batch moves into an aligned allocation of its own, now and as
                // the rest of it arrives.
                self.pending.advance(5);
                let mut body = MutableBuffer::with_capacity(len.min(FIRST_BODY_BYTES));
                let take = len.min(self.pending.len());
                body.extend_from_slice(&self.pending[..take]);
                self.pending.advance(take);
                self.body = Some((body, len));
                return self.next_element();
            }
            WATERMARK => 9,
            IDLE | END => 1,
            BARRIER => 18,
            other => return Err(CodecError::UnknownTag(other)),
        };
        if self.pending.len() < need {
            return Ok(None);
        }
        let mut el = self.pending.split_to(need);
        el.advance(1);
        Ok(Some(match tag {
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
                    timeout_at_ms: el.get_u64(),
                })
            }
            _ => StreamElement::EndOfPartition,
        }))
    }
}

/// One batch from an element's IPC stream (schema, batch, end of stream), its arrays
/// pointing into `body`.
fn decode_batch(mut body: Buffer) -> Result<RecordBatch, CodecError> {
    let ipc = |e: arrow::error::ArrowError| CodecError::Ipc(e.to_string());
    let mut decoder = StreamDecoder::new();
    let batch = decoder
        .decode(&mut body)
        .map_err(ipc)?
        .ok_or_else(|| CodecError::Ipc("no record batch".into()))?;
    if !body.is_empty() && decoder.decode(&mut body).map_err(ipc)?.is_some() {
        return Err(CodecError::Ipc("more than one record batch".into()));
    }
    decoder.finish().map_err(ipc)?;
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn elements_survive_arbitrary_buffer_cuts() {
        let batch = strings(100);
        let elements = [
            StreamElement::Watermark(5),
            StreamElement::Batch(batch.slice(10, 50)),
            StreamElement::Barrier(Barrier {
                checkpoint_id: 3,
                kind: BarrierKind::Aligned,
                timeout_at_ms: 0,
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

    fn strings(n: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..n as i64)),
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("value-{i:06}")),
                )),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_batch_is_an_arrow_ipc_stream_as_before() {
        // The bytes on the wire are Arrow's IPC stream format (what a StreamWriter
        // writes): peers of protocol version 2 agree whichever codec they run.
        let batch = strings(1000);
        let mut ours = Vec::new();
        encode(&StreamElement::Batch(batch.clone()), &mut ours).unwrap();
        let mut ipc = Vec::new();
        let mut writer =
            arrow::ipc::writer::StreamWriter::try_new(&mut ipc, &batch.schema()).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
        drop(writer);
        assert_eq!(ours[0], BATCH);
        assert_eq!(
            u32::from_be_bytes(ours[1..5].try_into().unwrap()) as usize,
            ipc.len()
        );
        assert_eq!(&ours[5..], &ipc[..]);
        // The chunks share the batch's value buffer rather than copy it.
        let values = batch.column(1).to_data().buffers()[1].as_ptr();
        let chunks = encode_chunks(&StreamElement::Batch(batch)).unwrap();
        assert!(chunks.iter().any(|c| c.as_ptr() == values), "values copied");
    }

    #[test]
    fn a_batch_decoded_from_odd_cuts_is_aligned_and_whole() {
        let batch = strings(5000);
        let mut bytes = Vec::new();
        encode(&StreamElement::Batch(batch.clone()), &mut bytes).unwrap();
        // Cuts at odd offsets leave no piece aligned; the decoded arrays must be.
        let mut dec = Decoder::new(1 << 20);
        let mut got = None;
        for chunk in bytes[..].chunks(4093) {
            dec.push(chunk);
            if let Some(e) = dec.next_element().unwrap() {
                got = Some(e);
            }
        }
        let Some(StreamElement::Batch(b)) = got else {
            panic!("no batch")
        };
        assert_eq!(b, batch);
        for buffer in b.column(0).to_data().buffers() {
            assert_eq!(buffer.as_ptr() as usize % 8, 0, "unaligned i64 values");
        }
        assert_eq!(dec.pending_bytes(), 0);
    }

    #[test]
    fn a_batch_longer_than_the_first_allocation_grows_and_decodes() {
        let batch = strings(250_000);
        let mut bytes = Vec::new();
        encode(&StreamElement::Batch(batch.clone()), &mut bytes).unwrap();
        assert!(bytes.len() > FIRST_BODY_BYTES, "{} bytes", bytes.len());
        let mut dec = Decoder::new(64 << 20);
        let mut got = Vec::new();
        for chunk in bytes.chunks(32 << 10) {
            dec.push(chunk);
            assert!(dec.pending_bytes() <= bytes.len());
            while let Some(e) = dec.next_element().unwrap() {
                got.push(e);
            }
        }
        assert!(matches!(&got[..], [StreamElement::Batch(b)] if *b == batch));
        assert_eq!(dec.pending_bytes(), 0);
    }

    #[test]
    fn invalid_utf8_from_the_wire_is_an_error() {
        let batch = strings(10);
        let mut bytes = Vec::new();
        encode(&StreamElement::Batch(batch), &mut bytes).unwrap();
        let at = bytes
            .windows(12)
            .position(|w| w == b"value-000003")
            .expect("the string is in the stream");
        bytes[at] = 0xff;
        let mut dec = Decoder::new(1 << 20);
        dec.push(&bytes);
        let err = dec.next_element().unwrap_err();
        assert!(matches!(err, CodecError::Ipc(_)), "{err}");
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
