//! How a job's key space is cut into state-service shards, and which shard a key is in.
//!
//! A shard is a fixed key-group range of a job, chosen when the job is first run and
//! independent of its parallelism, so a rescale changes which subtask talks to which
//! shard and moves no state. Shard `i` of `n` owns `key_group_range(max, n, i)`; the last
//! shard also owns every key group above `max_parallelism` (up to `u16::MAX`), so any
//! byte string is in exactly one shard. Shards are byte ranges between the big-endian
//! first key groups of consecutive shards (the first shard starts at the empty key), so
//! a key of two bytes or more is in the shard of its key group, a shorter key where it
//! sorts, and a byte range maps to a contiguous run of shards.

use std::ops::Range;

use bytes::Bytes;
use sluice_common::key_group::key_group_range;
use sluice_common::pb::state::ShardId;

/// One past the largest key group a two-byte prefix can name.
pub const KEY_GROUP_SPACE: u32 = 1 << 16;

/// The shards of one job.
#[derive(Clone, Debug)]
pub struct ShardLayout {
    job_id: String,
    ranges: Vec<Range<u32>>,
}

impl ShardLayout {
    /// `shards` equal key-group ranges over `max_parallelism` key groups.
    pub fn new(job_id: impl Into<String>, max_parallelism: u32, shards: u32) -> Self {
        let shards = shards.clamp(1, max_parallelism.max(1));
        let mut ranges: Vec<Range<u32>> = (0..shards)
            .map(|i| key_group_range(max_parallelism, shards, i))
            .collect();
        if let Some(last) = ranges.last_mut() {
            last.end = KEY_GROUP_SPACE;
        }
        Self {
            job_id: job_id.into(),
            ranges,
        }
    }

    /// The job the shards belong to.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there are no shards (never: a layout has at least one).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The shard holding `key`: the last one whose first key is not after it.
    pub fn shard_of(&self, key: &[u8]) -> usize {
        self.ranges[1..].partition_point(|r| group_bytes(r.start).as_ref() <= key)
    }

    /// The wire id of shard `index`.
    pub fn id(&self, index: usize) -> ShardId {
        let r = &self.ranges[index];
        ShardId {
            job_id: self.job_id.clone(),
            key_group_start: r.start,
            key_group_end: r.end,
        }
    }

    /// The key groups of shard `index`.
    pub fn range(&self, index: usize) -> Range<u32> {
        self.ranges[index].clone()
    }

    /// The shards that hold keys in `[start, end)` (empty `end`: unbounded), each with
    /// the part of the range inside it (an empty end again meaning "to the shard's end").
    pub fn split_range(&self, start: &[u8], end: &[u8]) -> Vec<(usize, Bytes, Bytes)> {
        if !end.is_empty() && start >= end {
            return Vec::new();
        }
        let first = self.shard_of(start);
        let last = if end.is_empty() {
            self.ranges.len() - 1
        } else {
            self.shard_of(end)
        };
        let mut parts = Vec::new();
        for i in first..=last {
            let r = &self.ranges[i];
            let shard_start = group_bytes(r.start);
            let lo = if i == first {
                Bytes::copy_from_slice(start)
            } else {
                shard_start
            };
            let shard_end = if r.end >= KEY_GROUP_SPACE {
                Bytes::new()
            } else {
                group_bytes(r.end)
            };
            let hi = if i == last && !end.is_empty() {
                Bytes::copy_from_slice(end)
            } else {
                shard_end
            };
            if !hi.is_empty() && lo >= hi {
                continue;
            }
            parts.push((i, lo, hi));
        }
        parts
    }

    /// The shards that hold any of the key groups in `groups`.
    pub fn shards_for_key_groups(&self, groups: Range<u32>) -> Range<usize> {
        if groups.start >= groups.end {
            return 0..0;
        }
        let first = self.ranges.partition_point(|r| r.end <= groups.start);
        let last = self.ranges.partition_point(|r| r.end < groups.end);
        first..(last + 1).min(self.ranges.len())
    }
}

fn group_bytes(group: u32) -> Bytes {
    Bytes::copy_from_slice(&(group as u16).to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_in_the_shard_whose_range_holds_its_group() {
        let layout = ShardLayout::new("j", 128, 4);
        assert_eq!(layout.range(0), 0..32);
        assert_eq!(layout.range(3), 96..KEY_GROUP_SPACE);
        assert_eq!(layout.shard_of(b""), 0);
        assert_eq!(
            layout.shard_of(b"a"),
            3,
            "0x61 sorts after group 96's first key"
        );
        assert_eq!(layout.shard_of(&[0]), 0);
        assert_eq!(layout.shard_of(&[0, 31, 0xff]), 0);
        assert_eq!(layout.shard_of(&[0, 31, 9]), 0);
        assert_eq!(layout.shard_of(&[0, 32]), 1);
        assert_eq!(layout.shard_of(&[0xff, 0xff, 0xff]), 3);
    }

    #[test]
    fn a_range_splits_at_shard_boundaries() {
        let layout = ShardLayout::new("j", 128, 4);
        let parts = layout.split_range(&[0, 10], &[0, 40, 1]);
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[0],
            (
                0,
                Bytes::from_static(&[0, 10]),
                Bytes::from_static(&[0, 32])
            )
        );
        assert_eq!(
            parts[1],
            (
                1,
                Bytes::from_static(&[0, 32]),
                Bytes::from_static(&[0, 40, 1])
            )
        );
        let all = layout.split_range(b"", b"");
        assert_eq!(all.len(), 4);
        assert!(all[3].2.is_empty(), "the last shard runs to the end");
        assert!(layout.split_range(b"b", b"a").is_empty());
        assert_eq!(layout.split_range(&[0, 32], &[0, 32, 0]).len(), 1);
        assert_eq!(layout.shards_for_key_groups(0..64), 0..2);
        assert_eq!(layout.shards_for_key_groups(40..41), 1..2);
    }
}
