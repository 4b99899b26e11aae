//! What a restarted file-sink subtask does with the parts an earlier attempt left behind.
//!
//! A plain function over the names in the sink's directory, so every decision is tested
//! without I/O; [`FileWriter::recover`](super::FileWriter) carries the plan out.
//!
//! Given the last committed checkpoint `C` (0 when none was):
//!
//! - in-progress parts are deleted: what they hold was written after the last barrier,
//!   and the sources rewind to before it;
//! - parts pending for a checkpoint `<= C` are committed: the crash came between the
//!   commit of `C` and the notification that would have committed them (committing is
//!   idempotent, so a part already committed is fine);
//! - parts pending for a checkpoint `> C` are deleted: that checkpoint never completed
//!   and its records will be written again;
//! - the sequence continues after the highest number this subtask ever used, in any
//!   stage, so a new part never reuses a name;
//! - a part some [`FenceMark`] voids (left by an attempt older than the mark's, in
//!   progress or pending after the checkpoint the mark's attempt restored: a zombie
//!   worker's, written after that recovery) is deleted whatever its checkpoint.
//!
//! A subtask handles its own parts and those of subtasks that no longer exist after a
//! rescale: subtask `i` of `p` takes every index `j` with `j % p == i`, so each old index
//! has exactly one heir.

use super::part_name::{FenceMark, PartName, Stage};
use sluice_compute::connector::SubtaskInfo;

/// What recovery does, in order: delete, then commit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// In-progress parts and parts pending for checkpoints after the last committed one.
    pub delete: Vec<PartName>,
    /// Pending parts of committed checkpoints, to be made visible (by subtask, sequence).
    pub commit: Vec<PartName>,
    /// The sequence number of this subtask's next part.
    pub next_seq: u64,
}

/// The sequence number after the highest one `subtask` used in any of `names`.
pub fn next_seq(names: &[String], subtask: usize) -> u64 {
    names
        .iter()
        .filter_map(|n| PartName::parse(n))
        .filter(|p| p.subtask == subtask)
        .filter_map(|p| p.seq)
        .map(|seq| seq + 1)
        .max()
        .unwrap_or(0)
}

/// The plan of `subtask` over the file names of the sink's directory.
pub fn plan(names: &[String], subtask: SubtaskInfo, last_committed: u64) -> RecoveryPlan {
    let parallelism = subtask.parallelism.max(1);
    let mut out = RecoveryPlan {
        next_seq: next_seq(names, subtask.index),
        ..RecoveryPlan::default()
    };
    let marks: Vec<FenceMark> = names.iter().filter_map(|n| FenceMark::parse(n)).collect();
    for part in names.iter().filter_map(|n| PartName::parse(n)) {
        if part.subtask % parallelism != subtask.index {
            continue;
        }
        if part.stage != Stage::Committed && marks.iter().any(|m| m.voids(&part)) {
            out.delete.push(part);
            continue;
        }
        match part.stage {
            Stage::InProgress => out.delete.push(part),
            Stage::Pending(checkpoint) if checkpoint <= last_committed => out.commit.push(part),
            Stage::Pending(_) => out.delete.push(part),
            Stage::Committed => {}
        }
    }
    let order = |p: &PartName| (p.subtask, p.seq, p.to_string());
    out.delete.sort_by_key(order);
    out.commit.sort_by_key(order);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn strings(parts: &[PartName]) -> Vec<String> {
        parts.iter().map(PartName::to_string).collect()
    }

    const LEFT_BEHIND: &[&str] = &[
        "part-0-0.jsonl",
        "part-0-1.jsonl",
        ".part-0-2.jsonl.pending-3",
        ".part-0-3.jsonl.pending-4",
        ".part-0-4.jsonl.inprogress",
        ".part-0.jsonl.inprogress",
        "part-1-0.jsonl",
        ".part-1-1.jsonl.pending-4",
        "bad-0.txt",
        "part-0.jsonl",
    ];

    #[test]
    fn pending_up_to_the_last_commit_commits_the_rest_goes() {
        let p = plan(
            &names(LEFT_BEHIND),
            SubtaskInfo {
                index: 0,
                parallelism: 2,
                fence: 0,
            },
            3,
        );
        assert_eq!(strings(&p.commit), [".part-0-2.jsonl.pending-3"]);
        assert_eq!(
            strings(&p.delete),
            [
                ".part-0.jsonl.inprogress",
                ".part-0-3.jsonl.pending-4",
                ".part-0-4.jsonl.inprogress"
            ]
        );
        assert_eq!(p.next_seq, 5);

        let p = plan(
            &names(LEFT_BEHIND),
            SubtaskInfo {
                index: 0,
                parallelism: 2,
                fence: 0,
            },
            4,
        );
        assert_eq!(
            strings(&p.commit),
            [".part-0-2.jsonl.pending-3", ".part-0-3.jsonl.pending-4"]
        );
        assert_eq!(
            strings(&p.delete),
            [".part-0.jsonl.inprogress", ".part-0-4.jsonl.inprogress"]
        );
    }

    #[test]
    fn no_checkpoint_yet_discards_every_pending_part() {
        let p = plan(
            &names(LEFT_BEHIND),
            SubtaskInfo {
                index: 1,
                parallelism: 2,
                fence: 0,
            },
            0,
        );
        assert!(p.commit.is_empty());
        assert_eq!(strings(&p.delete), [".part-1-1.jsonl.pending-4"]);
        assert_eq!(p.next_seq, 2);
    }

    #[test]
    fn a_zombies_parts_written_after_a_recovery_are_never_committed() {
        // Attempt 100 completed checkpoint 3; attempt 200 restored it (its mark); the
        // zombie of 100 then pre-committed checkpoint 4, which only ids of 200 complete.
        let left = names(&[
            ".part-0-1.jsonl.pending-3-100",
            ".fence-200-3",
            ".part-0-2.jsonl.pending-4-100",
            ".part-0-3.jsonl.inprogress-100",
            ".part-0-3.jsonl.pending-5-200",
        ]);
        let sub = SubtaskInfo {
            index: 0,
            parallelism: 1,
            fence: 300,
        };
        let p = plan(&left, sub, 5);
        assert_eq!(
            strings(&p.commit),
            [
                ".part-0-1.jsonl.pending-3-100",
                ".part-0-3.jsonl.pending-5-200"
            ]
        );
        assert_eq!(
            strings(&p.delete),
            [
                ".part-0-2.jsonl.pending-4-100",
                ".part-0-3.jsonl.inprogress-100"
            ]
        );
        assert_eq!(p.next_seq, 4);
    }

    #[test]
    fn an_empty_directory_starts_at_zero() {
        let p = plan(
            &[],
            SubtaskInfo {
                index: 0,
                parallelism: 1,
                fence: 0,
            },
            7,
        );
        assert_eq!(p, RecoveryPlan::default());
    }

    #[test]
    fn after_scaling_in_a_survivor_adopts_the_parts_of_gone_subtasks() {
        let left = names(&[
            ".part-1-0.csv.pending-2",
            ".part-3-5.csv.pending-2",
            ".part-3-6.csv.pending-3",
            ".part-3-7.csv.inprogress",
            ".part-2-0.csv.pending-2",
        ]);
        let p = plan(
            &left,
            SubtaskInfo {
                index: 1,
                parallelism: 2,
                fence: 0,
            },
            2,
        );
        assert_eq!(
            strings(&p.commit),
            [".part-1-0.csv.pending-2", ".part-3-5.csv.pending-2"]
        );
        assert_eq!(
            strings(&p.delete),
            [".part-3-6.csv.pending-3", ".part-3-7.csv.inprogress"]
        );
        // The sequence is the subtask's own: index 3's numbers do not count.
        assert_eq!(p.next_seq, 1);
        let p = plan(
            &left,
            SubtaskInfo {
                index: 0,
                parallelism: 2,
                fence: 0,
            },
            2,
        );
        assert_eq!(strings(&p.commit), [".part-2-0.csv.pending-2"]);
    }
}
