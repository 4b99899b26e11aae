//! What an exactly-once Kafka sink subtask records with a checkpoint, and what a
//! restarted subtask does with it: plain functions, so every decision is tested without
//! a broker; [`ExactlyOnceWriter::recover`](super::ExactlyOnceWriter) carries the plan
//! out.
//!
//! At each barrier a subtask records one line naming itself and one per transaction it
//! pre-committed and has not committed yet (transactional id, producer id and epoch, the
//! checkpoint it belongs to). Restarted from checkpoint `C`, subtask `i` of `p`:
//!
//! 1. commits every recorded transaction of the subtasks it inherits (`j % p == i`, as
//!    the file sink's parts): their checkpoint completed (they are in `C`) but the
//!    process died before it heard so. EndTxn with the recorded epoch commits it, or
//!    says it was ended before (the commit had gone through, or the id moved on), which
//!    is the same for the output;
//! 2. then takes over every transactional id those subtasks may have used, which
//!    aborts whatever a failed attempt left open (written after `C`, to be written
//!    again) and fences that attempt's zombies.
//!
//! Committing before taking over matters: a takeover aborts the open transaction of the
//! id, which may be the recorded one.

use sluice_compute::connector::SubtaskInfo;
use sluice_compute::error::{Error, Result};

use super::client::ProducerEpoch;

/// Transactional ids per subtask: one receives rows while others wait for their
/// checkpoint to complete.
pub const POOL: usize = 4;

/// The transactional id of `slot` of `subtask` under `prefix`.
pub fn transactional_id(prefix: &str, subtask: usize, slot: usize) -> String {
    format!("{prefix}-{subtask}-{slot}")
}

/// A transaction pre-committed for a checkpoint and not known to be committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTxn {
    /// The subtask that wrote it.
    pub subtask: usize,
    /// The checkpoint whose completion commits it.
    pub checkpoint: u64,
    /// Its transactional id.
    pub id: String,
    /// The producer id and epoch that hold it.
    pub producer: ProducerEpoch,
}

/// One line of a subtask's checkpoint state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Subtask `subtask` took part in the checkpoint (whether or not it holds a
    /// transaction): its transactional ids are taken over on restore.
    Subtask(usize),
    /// A transaction waiting for its commit.
    Pending(PendingTxn),
}

impl Entry {
    /// The line recorded with a checkpoint.
    pub fn line(&self) -> String {
        match self {
            Entry::Subtask(s) => format!("subtask {s}"),
            Entry::Pending(t) => format!(
                "txn subtask {} checkpoint {} producer {} epoch {} id {}",
                t.subtask, t.checkpoint, t.producer.id, t.producer.epoch, t.id
            ),
        }
    }

    /// Reads a line written by [`line`](Self::line).
    pub fn parse(line: &str) -> Result<Self> {
        let bad = || {
            Error::Internal(format!(
                "a Kafka sink's checkpoint state holds an unreadable line `{line}`"
            ))
        };
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["subtask", s] => Ok(Entry::Subtask(s.parse().map_err(|_| bad())?)),
            [
                "txn",
                "subtask",
                s,
                "checkpoint",
                c,
                "producer",
                p,
                "epoch",
                e,
                "id",
                id,
            ] => Ok(Entry::Pending(PendingTxn {
                subtask: s.parse().map_err(|_| bad())?,
                checkpoint: c.parse().map_err(|_| bad())?,
                producer: ProducerEpoch {
                    id: p.parse().map_err(|_| bad())?,
                    epoch: e.parse().map_err(|_| bad())?,
                },
                id: id.to_string(),
            })),
            _ => Err(bad()),
        }
    }
}

/// What a restarted subtask does, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Transactions of completed checkpoints to commit, oldest first.
    pub commit: Vec<PendingTxn>,
    /// Subtasks (old indices, its own among them) whose transactional ids it takes over.
    pub take_over: Vec<usize>,
}

/// The plan of `me`, restarted from checkpoint `last_committed` whose state for this
/// sink is `lines` (every subtask's, at the parallelism the checkpoint was taken at).
pub fn plan(lines: &[String], me: SubtaskInfo, last_committed: u64) -> Result<Recovery> {
    let parallelism = me.parallelism.max(1);
    let mine = |s: usize| s % parallelism == me.index;
    let mut out = Recovery {
        take_over: vec![me.index],
        ..Recovery::default()
    };
    for line in lines.iter().filter(|l| !l.is_empty()) {
        match Entry::parse(line)? {
            Entry::Subtask(s) if mine(s) => out.take_over.push(s),
            Entry::Pending(t) if mine(t.subtask) && t.checkpoint <= last_committed => {
                out.take_over.push(t.subtask);
                out.commit.push(t);
            }
            _ => {}
        }
    }
    out.take_over.sort_unstable();
    out.take_over.dedup();
    out.commit
        .sort_by_key(|t| (t.checkpoint, t.subtask, t.id.clone()));
    out.commit.dedup();
    Ok(out)
}

/// Kafka's murmur2 of a key, as the Java client's default partitioner computes it, so a
/// keyed record lands where a Java producer would put it.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `partitions` a keyed record goes to.
pub fn partition_of(key: &[u8], partitions: usize) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) as usize % partitions.max(1)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me(index: usize, parallelism: usize) -> SubtaskInfo {
        SubtaskInfo {
            index,
            parallelism,
            fence: 0,
        }
    }

    fn txn(subtask: usize, checkpoint: u64, epoch: i16) -> PendingTxn {
        PendingTxn {
            subtask,
            checkpoint,
            id: transactional_id("sluice-job-sink", subtask, checkpoint as usize % POOL),
            producer: ProducerEpoch {
                id: 1000 + subtask as i64,
                epoch,
            },
        }
    }

    fn lines(entries: &[Entry]) -> Vec<String> {
        entries.iter().map(Entry::line).collect()
    }

    #[test]
    fn lines_read_back() {
        for e in [Entry::Subtask(3), Entry::Pending(txn(2, 17, 4))] {
            assert_eq!(Entry::parse(&e.line()).unwrap(), e);
        }
        for bad in [
            "",
            "subtask",
            "subtask x",
            "txn subtask 1 checkpoint 2",
            "nonsense 1",
        ] {
            let err = Entry::parse(bad).unwrap_err().to_string();
            assert!(err.contains("unreadable line"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_restart_commits_its_completed_transactions_then_takes_over_its_ids() {
        let state = lines(&[
            Entry::Subtask(0),
            Entry::Pending(txn(0, 4, 2)),
            Entry::Pending(txn(0, 5, 3)),
            Entry::Subtask(1),
            Entry::Pending(txn(1, 5, 7)),
        ]);
        let plan0 = plan(&state, me(0, 2), 5).unwrap();
        assert_eq!(plan0.commit, vec![txn(0, 4, 2), txn(0, 5, 3)]);
        assert_eq!(plan0.take_over, vec![0]);
        let plan1 = plan(&state, me(1, 2), 5).unwrap();
        assert_eq!(plan1.commit, vec![txn(1, 5, 7)]);
        assert_eq!(plan1.take_over, vec![1]);
    }

    #[test]
    fn no_checkpoint_means_only_taking_over() {
        let plan = plan(&[], me(1, 3), 0).unwrap();
        assert!(plan.commit.is_empty());
        assert_eq!(plan.take_over, vec![1]);
    }

    #[test]
    fn after_a_rescale_each_old_subtask_has_one_heir() {
        let state = lines(&[
            Entry::Subtask(0),
            Entry::Subtask(1),
            Entry::Subtask(2),
            Entry::Pending(txn(2, 9, 1)),
        ]);
        // 3 -> 2: subtask 0 inherits 2; 3 -> 4: subtask 3 inherits nothing.
        let down = plan(&state, me(0, 2), 9).unwrap();
        assert_eq!(down.take_over, vec![0, 2]);
        assert_eq!(down.commit, vec![txn(2, 9, 1)]);
        assert_eq!(plan(&state, me(1, 2), 9).unwrap().take_over, vec![1]);
        let up = plan(&state, me(3, 4), 9).unwrap();
        assert_eq!(up.take_over, vec![3]);
        assert!(up.commit.is_empty());
        let mut heirs: Vec<usize> = (0..4)
            .flat_map(|i| plan(&state, me(i, 4), 9).unwrap().take_over)
            .collect();
        heirs.sort_unstable();
        assert_eq!(heirs, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_transaction_newer_than_the_restored_checkpoint_is_not_committed() {
        let state = lines(&[Entry::Subtask(0), Entry::Pending(txn(0, 8, 1))]);
        let plan = plan(&state, me(0, 1), 7).unwrap();
        assert!(plan.commit.is_empty());
        assert_eq!(plan.take_over, vec![0]);
    }

    #[test]
    fn murmur2_matches_the_java_client() {
        // The vectors of Kafka's own UtilsTest.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{}", String::from_utf8_lossy(key));
        }
        assert!((0..4).contains(&partition_of(b"any key", 4)));
    }
}
