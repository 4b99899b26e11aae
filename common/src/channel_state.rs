//! The channel state of an unaligned checkpoint, as one task records it: the bytes of
//! the elements an unaligned barrier overtook, per channel and side.
//!
//! A channel is named by its consumer (the head node of the consuming chain and its
//! subtask) and its producer subtask, with both ends' parallelism when the checkpoint was
//! taken, so that a restore at another parallelism can tell which channels it no longer
//! has. The consumer records the *input* side (the overtaken elements it had received,
//! encoded, then the bytes of an element it had only begun to receive); the producer
//! records the *output* side (the buffers still queued in its subpartition). Replayed in
//! that order, the two sides are the channel's stream from the consumer's last processed
//! element to the barrier.
//!
//! The object is framed like `_metadata`: magic, format version, entries, and an XXH3-64
//! trailer over everything before it, so that a corrupt or truncated object is detected
//! on restore and an older checkpoint used. The element bytes themselves are opaque
//! here (the runtime's network codec writes and reads them).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 4] = b"SLCS";
const VERSION: u32 = 1;
/// Magic, version, entry count.
const HEADER: usize = 4 + 4 + 4;
/// Key (five u32), side (u8), length (u64).
const ENTRY_HEADER: usize = 5 * 4 + 1 + 8;
const TRAILER: usize = 8;

/// One channel between two tasks as a checkpoint saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelKey {
    /// Job-graph node id of the consuming chain's head.
    pub consumer_node: u32,
    /// The consuming subtask.
    pub consumer_subtask: u32,
    /// The consumer's parallelism when the checkpoint was taken.
    pub consumer_parallelism: u32,
    /// The producing subtask.
    pub producer_subtask: u32,
    /// The producer's parallelism when the checkpoint was taken.
    pub producer_parallelism: u32,
}

/// Which end of a channel recorded a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// The consumer: elements received but not processed before the barrier.
    Input,
    /// The producer: buffers queued behind which the barrier was sent ahead.
    Output,
}

/// The bytes one end of one channel recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelPart {
    /// The channel.
    pub key: ChannelKey,
    /// Which end.
    pub side: Side,
    /// Encoded elements (the network codec's stream format).
    pub bytes: Bytes,
}

/// Why bytes are not a usable channel-state object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChannelStateError {
    /// Shorter than header and trailer, or an entry runs past the end.
    #[error("truncated: {0}")]
    Truncated(String),
    /// Does not start with the magic.
    #[error("not a Sluice channel-state object (bad magic)")]
    BadMagic,
    /// Written by a newer (or unknown) format.
    #[error("format version {0} is not supported (this build reads version {VERSION})")]
    UnsupportedVersion(u32),
    /// The bytes changed after they were written.
    #[error("checksum mismatch (stored {stored:016x}, computed {computed:016x}): corrupt")]
    ChecksumMismatch {
        /// Checksum in the trailer.
        stored: u64,
        /// Checksum of the bytes read.
        computed: u64,
    },
    /// An entry names a side this build does not know.
    #[error("entry {0} has an unknown side")]
    BadSide(usize),
}

/// The object holding `parts`.
pub fn encode(parts: &[ChannelPart]) -> Bytes {
    let body: usize = parts.iter().map(|p| ENTRY_HEADER + p.bytes.len()).sum();
    let mut out = BytesMut::with_capacity(HEADER + body + TRAILER);
    out.put_slice(MAGIC);
    out.put_u32(VERSION);
    out.put_u32(parts.len() as u32);
    for p in parts {
        let k = &p.key;
        for v in [
            k.consumer_node,
            k.consumer_subtask,
            k.consumer_parallelism,
            k.producer_subtask,
            k.producer_parallelism,
        ] {
            out.put_u32(v);
        }
        out.put_u8(match p.side {
            Side::Input => 0,
            Side::Output => 1,
        });
        out.put_u64(p.bytes.len() as u64);
        out.put_slice(&p.bytes);
    }
    let sum = xxh3_64(&out);
    out.put_u64(sum);
    out.freeze()
}

/// The parts of an object written by [`encode`]; checks magic, version and checksum.
pub fn decode(object: &Bytes) -> Result<Vec<ChannelPart>, ChannelStateError> {
    if object.len() < HEADER + TRAILER {
        return Err(ChannelStateError::Truncated(format!(
            "{} bytes, shorter than an empty object",
            object.len()
        )));
    }
    let (body, trailer) = object.split_at(object.len() - TRAILER);
    let stored = u64::from_be_bytes(trailer.try_into().unwrap_or_default());
    if &body[..4] != MAGIC {
        return Err(ChannelStateError::BadMagic);
    }
    let computed = xxh3_64(body);
    if stored != computed {
        return Err(ChannelStateError::ChecksumMismatch { stored, computed });
    }
    let mut rest = &body[4..];
    let version = rest.get_u32();
    if version != VERSION {
        return Err(ChannelStateError::UnsupportedVersion(version));
    }
    let count = rest.get_u32() as usize;
    let mut parts = Vec::with_capacity(count.min(rest.len() / ENTRY_HEADER));
    for i in 0..count {
        if rest.len() < ENTRY_HEADER {
            return Err(ChannelStateError::Truncated(format!(
                "entry {i} of {count} is cut off"
            )));
        }
        let key = ChannelKey {
            consumer_node: rest.get_u32(),
            consumer_subtask: rest.get_u32(),
            consumer_parallelism: rest.get_u32(),
            producer_subtask: rest.get_u32(),
            producer_parallelism: rest.get_u32(),
        };
        let side = match rest.get_u8() {
            0 => Side::Input,
            1 => Side::Output,
            _ => return Err(ChannelStateError::BadSide(i)),
        };
        let len = rest.get_u64();
        if (rest.len() as u64) < len {
            return Err(ChannelStateError::Truncated(format!(
                "entry {i} declares {len} bytes, {} remain",
                rest.len()
            )));
        }
        let start = object.len() - TRAILER - rest.len();
        let bytes = object.slice(start..start + len as usize);
        rest.advance(len as usize);
        parts.push(ChannelPart { key, side, bytes });
    }
    if !rest.is_empty() {
        return Err(ChannelStateError::Truncated(format!(
            "{} bytes after the last entry",
            rest.len()
        )));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Vec<ChannelPart> {
        let key = ChannelKey {
            consumer_node: 3,
            consumer_subtask: 1,
            consumer_parallelism: 2,
            producer_subtask: 0,
            producer_parallelism: 2,
        };
        vec![
            ChannelPart {
                key,
                side: Side::Input,
                bytes: Bytes::from_static(b"input elements"),
            },
            ChannelPart {
                key,
                side: Side::Output,
                bytes: Bytes::new(),
            },
        ]
    }

    #[test]
    fn parts_round_trip() {
        let object = encode(&parts());
        assert_eq!(decode(&object).unwrap(), parts());
        assert_eq!(decode(&encode(&[])).unwrap(), Vec::new());
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_detected() {
        let object = encode(&parts());
        for i in 0..object.len() {
            let mut bad = object.to_vec();
            bad[i] ^= 0x40;
            assert!(
                decode(&Bytes::from(bad)).is_err(),
                "flip at {i} went unseen"
            );
        }
        for len in 0..object.len() {
            assert!(
                decode(&object.slice(..len)).is_err(),
                "cut at {len} went unseen"
            );
        }
    }
}
