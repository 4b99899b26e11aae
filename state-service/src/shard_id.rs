//! A shard's identity (job and key-group range) as validated from a request, and the
//! checks that keys belong to it.
//!
//! The job id becomes a directory and an object-path segment, so it is restricted to
//! `[A-Za-z0-9._-]`. Keys start with their big-endian key group (DESIGN §4), so the
//! shard is the byte range `[start BE, end BE)`.

use std::fmt;

use sluice_common::pb::state::ShardId;

use crate::error::{Error, Result};

/// Most key groups a job can have (key groups are `u16`).
const KEY_GROUPS: u32 = 1 << 16;

/// A validated shard id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardKey {
    /// The job.
    pub job: String,
    /// First key group.
    pub start: u32,
    /// One past the last key group.
    pub end: u32,
}

impl fmt::Display for ShardKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {}[{}, {})", self.job, self.start, self.end)
    }
}

impl ShardKey {
    /// Validates a request's shard id.
    pub fn from_pb(id: Option<&ShardId>) -> Result<Self> {
        let id = id.ok_or_else(|| Error::InvalidArgument("request names no shard".into()))?;
        let job = &id.job_id;
        let valid_job = !job.is_empty()
            && job.len() <= 200
            && job != "."
            && job != ".."
            && job
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid_job {
            return Err(Error::InvalidArgument(format!(
                "job id {job:?} must be 1-200 characters of [A-Za-z0-9._-]"
            )));
        }
        if id.key_group_start >= id.key_group_end || id.key_group_end > KEY_GROUPS {
            return Err(Error::InvalidArgument(format!(
                "key-group range [{}, {}) of job {job} is empty or beyond {KEY_GROUPS}",
                id.key_group_start, id.key_group_end
            )));
        }
        Ok(Self {
            job: job.clone(),
            start: id.key_group_start,
            end: id.key_group_end,
        })
    }

    /// The protobuf form.
    pub fn to_pb(&self) -> ShardId {
        ShardId {
            job_id: self.job.clone(),
            key_group_start: self.start,
            key_group_end: self.end,
        }
    }

    /// First key of the shard: empty for the first shard, so keys shorter than a key
    /// group (which sort before every two-byte prefix they start) belong somewhere.
    pub fn start_bytes(&self) -> Vec<u8> {
        if self.start == 0 {
            return Vec::new();
        }
        (self.start as u16).to_be_bytes().to_vec()
    }

    /// Exclusive end of the shard; `None` when it runs to the last key group.
    pub fn end_bytes(&self) -> Option<Vec<u8>> {
        (self.end < KEY_GROUPS).then(|| (self.end as u16).to_be_bytes().to_vec())
    }

    /// Checks that `key` lies in this shard's byte range `[start BE, end BE)`: for a key
    /// of two bytes or more, that its key group is the shard's. (A shorter key sorts
    /// just before the groups its bytes start, and belongs where it sorts.)
    pub fn check_key(&self, key: &[u8]) -> Result<()> {
        let below = key < self.start_bytes().as_slice();
        let above = self.end_bytes().is_some_and(|e| key >= e.as_slice());
        if below || above {
            let group = match key.first_chunk::<2>() {
                Some(g) => format!("key group {}", u16::from_be_bytes(*g)),
                None => format!("key {key:02x?}"),
            };
            return Err(Error::OutOfRange(format!(
                "{group} is outside {self}: send it to the shard that owns it"
            )));
        }
        Ok(())
    }

    /// Checks and completes a `[start, end)` range: an empty `start` is the shard's start,
    /// an empty `end` the shard's end. Returns `None` for the end when unbounded.
    pub fn clip_range(&self, start: &[u8], end: &[u8]) -> Result<(Vec<u8>, Option<Vec<u8>>)> {
        let start = if start.is_empty() {
            self.start_bytes()
        } else {
            self.check_key(start)?;
            start.to_vec()
        };
        let end = if end.is_empty() {
            self.end_bytes()
        } else {
            let shard_end = self.end_bytes();
            let beyond = shard_end.as_deref().is_some_and(|e| end > e);
            if end < self.start_bytes().as_slice() || beyond {
                return Err(Error::OutOfRange(format!(
                    "range end {end:02x?} is outside {self}"
                )));
            }
            Some(end.to_vec())
        };
        Ok((start, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(job: &str, s: u32, e: u32) -> ShardId {
        ShardId {
            job_id: job.into(),
            key_group_start: s,
            key_group_end: e,
        }
    }

    #[test]
    fn validates_ids_and_keys() {
        assert!(ShardKey::from_pb(None).is_err());
        assert!(ShardKey::from_pb(Some(&id("../x", 0, 4))).is_err());
        assert!(ShardKey::from_pb(Some(&id("j", 4, 4))).is_err());
        assert!(ShardKey::from_pb(Some(&id("j", 0, 65_537))).is_err());
        let s = ShardKey::from_pb(Some(&id("j", 4, 8))).unwrap();
        assert!(s.check_key(&[0, 4, 1]).is_ok());
        assert!(s.check_key(&[0, 7]).is_ok());
        assert!(
            matches!(s.check_key(&[0, 8]), Err(Error::OutOfRange(m)) if m.contains("key group 8"))
        );
        assert!(matches!(s.check_key(&[0]), Err(Error::OutOfRange(_))));
        let first = ShardKey::from_pb(Some(&id("j", 0, 4))).unwrap();
        assert!(first.check_key(&[]).is_ok() && first.check_key(&[0]).is_ok());
        assert!(s.check_key(&[0, 8, 0]).is_err() && s.check_key(&[1]).is_err());
        let (a, b) = s.clip_range(&[], &[]).unwrap();
        assert_eq!((a, b), (vec![0, 4], Some(vec![0, 8])));
        assert!(s.clip_range(&[0, 5], &[0, 9]).is_err());
        let all = ShardKey::from_pb(Some(&id("j", 0, 65_536))).unwrap();
        assert_eq!(all.end_bytes(), None);
    }
}
