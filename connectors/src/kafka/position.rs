//! A partition's position in a checkpoint: the offset of the next record not yet
//! returned, and where a bounded read stops.
//!
//! Encoded as two little-endian i64 values (16 bytes): `next`, then `end` (`-1` when the
//! read is unbounded). The end is recorded so that a restarted bounded job stops where
//! the first attempt would have, not at whatever is last when it restarts.

use bytes::Bytes;
use sluice_compute::error::{Error, Result};

/// Where one partition stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionPosition {
    /// Offset of the next record to return.
    pub next: i64,
    /// Offset at which a bounded read stops (exclusive); `None` when unbounded.
    pub end: Option<i64>,
}

impl PartitionPosition {
    /// The checkpoint form.
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(16);
        out.extend_from_slice(&self.next.to_le_bytes());
        out.extend_from_slice(&self.end.unwrap_or(-1).to_le_bytes());
        Bytes::from(out)
    }

    /// Reads the checkpoint form of split `name`.
    pub fn decode(name: &str, bytes: &[u8]) -> Result<Self> {
        let (Ok(next), Ok(end)) = (
            bytes.get(..8).unwrap_or_default().try_into(),
            bytes.get(8..16).unwrap_or_default().try_into(),
        ) else {
            return Err(Error::Plan(format!(
                "the checkpoint's position of Kafka partition `{name}` is {} bytes, not 16: \
                 it was not written by a Kafka source",
                bytes.len()
            )));
        };
        let end = i64::from_le_bytes(end);
        Ok(PartitionPosition {
            next: i64::from_le_bytes(next),
            end: (end >= 0).then_some(end),
        })
    }

    /// Whether a bounded read has nothing left.
    pub fn is_done(&self) -> bool {
        self.end.is_some_and(|end| self.next >= end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_foreign_bytes_are_refused() {
        for p in [
            PartitionPosition { next: 0, end: None },
            PartitionPosition {
                next: 42,
                end: Some(100),
            },
        ] {
            assert_eq!(PartitionPosition::decode("t/0", &p.encode()).unwrap(), p);
        }
        let err = PartitionPosition::decode("t/0", b"abc")
            .unwrap_err()
            .to_string();
        assert!(err.contains("t/0") && err.contains("3 bytes"), "{err}");
        assert!(
            PartitionPosition {
                next: 5,
                end: Some(5)
            }
            .is_done()
        );
        assert!(!PartitionPosition { next: 5, end: None }.is_done());
    }
}
