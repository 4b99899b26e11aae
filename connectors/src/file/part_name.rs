//! The names of a file sink's part files, and what a name says about its file.
//!
//! A name carries everything recovery needs: whose part it is (the subtask index), its
//! sequence number within that subtask, its format, and its stage. Hidden names (a
//! leading `.`) are skipped by every listing, so readers see committed parts only.
//!
//! | stage        | name                                        |
//! |--------------|---------------------------------------------|
//! | in progress  | `.part-<i>-<seq>.<ext>.inprogress[-<F>]`    |
//! | pending      | `.part-<i>-<seq>.<ext>.pending-<N>[-<F>]`   |
//! | committed    | `part-<i>-<seq>.<ext>`                      |
//!
//! `F` is the fence of the deployment attempt that wrote the part (absent: unfenced).
//! A recovering attempt leaves a [`FenceMark`], `.fence-<A>-<C>`: parts that attempts
//! older than `A` leave in progress, or pending for checkpoints after `C`, are void (a
//! zombie's, written after that recovery) and are never committed.
//!
//! A job that never checkpoints keeps one part per subtask with no sequence number,
//! `part-<i>.<ext>` (written as `.part-<i>.<ext>.inprogress`), as before the two-phase
//! commit existed. Pending parts always have a sequence number. This module knows
//! nothing about stores: it only formats and parses names.

use std::fmt;

/// The stage of a part file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Being written; discarded by recovery.
    InProgress,
    /// Finished at the barrier of this checkpoint; committed once it completes.
    Pending(u64),
    /// Visible to readers.
    Committed,
}

/// A parsed part-file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartName {
    /// The subtask that wrote it.
    pub subtask: usize,
    /// Its sequence number within the subtask; `None` for the single part of a job
    /// without checkpoints.
    pub seq: Option<u64>,
    /// The format's file extension (`jsonl`, `csv`, `parquet`).
    pub ext: String,
    /// Its stage.
    pub stage: Stage,
    /// The fence of the attempt that wrote it (0: unfenced; not in committed names).
    pub fence: u64,
}

impl PartName {
    /// The name of a part in `stage`.
    pub fn new(subtask: usize, seq: Option<u64>, ext: &str, stage: Stage) -> Self {
        Self {
            subtask,
            seq,
            ext: ext.to_owned(),
            stage,
            fence: 0,
        }
    }

    /// The same part, written by the attempt with `fence`.
    pub fn fenced(self, fence: u64) -> Self {
        Self { fence, ..self }
    }

    /// The same part in another stage.
    pub fn with_stage(&self, stage: Stage) -> Self {
        Self {
            stage,
            ..self.clone()
        }
    }

    /// Parses a file name (no directory); `None` when it is not a part file.
    pub fn parse(name: &str) -> Option<Self> {
        let (hidden, rest) = match name.strip_prefix('.') {
            Some(rest) => (true, rest),
            None => (false, name),
        };
        let rest = rest.strip_prefix("part-")?;
        let (ids, rest) = rest.split_once('.')?;
        let (subtask, seq) = match ids.split_once('-') {
            Some((i, seq)) => (number(i)?, Some(number(seq)?)),
            None => (number(ids)?, None),
        };
        let (ext, stage, fence) = if hidden {
            let (ext, suffix) = rest.split_once('.')?;
            let (stage, fence) = if let Some(f) = suffix.strip_prefix("inprogress") {
                let fence = match f.strip_prefix('-') {
                    Some(f) => number(f)?,
                    None if f.is_empty() => 0,
                    None => return None,
                };
                (Stage::InProgress, fence)
            } else {
                let rest = suffix.strip_prefix("pending-")?;
                let (n, fence) = match rest.split_once('-') {
                    Some((n, f)) => (number(n)?, number(f)?),
                    None => (number(rest)?, 0),
                };
                (Stage::Pending(n), fence)
            };
            (ext, stage, fence)
        } else {
            (rest, Stage::Committed, 0)
        };
        if ext.is_empty() || !ext.chars().all(|c| c.is_ascii_alphanumeric()) {
            return None;
        }
        if matches!(stage, Stage::Pending(_)) && seq.is_none() {
            return None;
        }
        Some(Self::new(subtask, seq, ext, stage).fenced(fence))
    }
}

/// What a recovering attempt leaves in the sink's directory: `.fence-<A>-<C>`, attempt
/// `A` restored checkpoint `C`. From then on an older attempt still running (a zombie
/// worker) can only leave void parts: in progress, or pending for checkpoints after `C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceMark {
    /// The recovering attempt's fence.
    pub attempt: u64,
    /// The checkpoint it restored.
    pub committed: u64,
}

impl FenceMark {
    /// Parses a file name; `None` when it is not a fence mark.
    pub fn parse(name: &str) -> Option<Self> {
        let (a, c) = name.strip_prefix(".fence-")?.split_once('-')?;
        Some(Self {
            attempt: number(a)?,
            committed: number(c)?,
        })
    }

    /// Whether this mark makes `part` void: written by an older attempt, and either
    /// in progress or pending for a checkpoint after the restored one.
    pub fn voids(&self, part: &PartName) -> bool {
        part.fence < self.attempt
            && match part.stage {
                Stage::InProgress => true,
                Stage::Pending(n) => n > self.committed,
                Stage::Committed => false,
            }
    }
}

impl fmt::Display for FenceMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, ".fence-{}-{}", self.attempt, self.committed)
    }
}

impl fmt::Display for PartName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = if self.stage == Stage::Committed {
            ""
        } else {
            "."
        };
        write!(f, "{hidden}part-{}", self.subtask)?;
        if let Some(seq) = self.seq {
            write!(f, "-{seq}")?;
        }
        write!(f, ".{}", self.ext)?;
        match self.stage {
            Stage::InProgress => write!(f, ".inprogress")?,
            Stage::Pending(checkpoint) => write!(f, ".pending-{checkpoint}")?,
            Stage::Committed => return Ok(()),
        }
        match self.fence {
            0 => Ok(()),
            fence => write!(f, "-{fence}"),
        }
    }
}

/// A decimal number without sign or leading `+` (so that names round-trip).
fn number<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parse() {
        for (name, subtask, seq, stage) in [
            ("part-3.jsonl", 3, None, Stage::Committed),
            ("part-3-17.jsonl", 3, Some(17), Stage::Committed),
            (".part-0.csv.inprogress", 0, None, Stage::InProgress),
            (".part-0-2.csv.inprogress", 0, Some(2), Stage::InProgress),
            (
                ".part-12-4.parquet.pending-9",
                12,
                Some(4),
                Stage::Pending(9),
            ),
        ] {
            let parsed = PartName::parse(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(parsed.subtask, subtask, "{name}");
            assert_eq!(parsed.seq, seq, "{name}");
            assert_eq!(parsed.stage, stage, "{name}");
            assert_eq!(parsed.to_string(), name);
        }
    }

    #[test]
    fn other_names_are_not_parts() {
        for name in [
            "part-.jsonl",
            "part-1",
            "part-x.jsonl",
            "part-1-x.jsonl",
            "part-+1.jsonl",
            "bad-0.txt",
            ".part-1.jsonl.pending-3",
            ".part-1-2.jsonl.pending-",
            ".part-1-2.jsonl.done",
            ".part-1-2.jsonl",
            "part-1-2.jsonl.inprogress",
            "_SUCCESS",
        ] {
            assert_eq!(PartName::parse(name), None, "{name}");
        }
    }

    #[test]
    fn fenced_names_round_trip_and_commit_to_the_same_visible_name() {
        for (name, stage, fence) in [
            (
                ".part-1-4.jsonl.inprogress-1700000000123",
                Stage::InProgress,
                1_700_000_000_123,
            ),
            (".part-1-4.jsonl.pending-9-77", Stage::Pending(9), 77),
        ] {
            let parsed = PartName::parse(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!((parsed.stage, parsed.fence), (stage, fence), "{name}");
            assert_eq!(parsed.to_string(), name);
            assert_eq!(
                parsed.with_stage(Stage::Committed).to_string(),
                "part-1-4.jsonl"
            );
        }
        for name in [
            ".part-1-4.jsonl.inprogress-",
            ".part-1-4.jsonl.inprogressx",
            ".part-1-4.jsonl.pending-9-",
            ".part-1-4.jsonl.pending-9-x",
        ] {
            assert_eq!(PartName::parse(name), None, "{name}");
        }
    }

    #[test]
    fn a_fence_mark_voids_what_older_attempts_leave_after_it() {
        let mark = FenceMark::parse(".fence-200-5").expect("a mark");
        assert_eq!(
            mark,
            FenceMark {
                attempt: 200,
                committed: 5
            }
        );
        assert_eq!(mark.to_string(), ".fence-200-5");
        assert_eq!(FenceMark::parse(".fence-200"), None);
        assert_eq!(FenceMark::parse("part-1-2.jsonl"), None);
        let part = |stage, fence| PartName::new(0, Some(1), "jsonl", stage).fenced(fence);
        // An older attempt's pending part of a checkpoint it completed stays valid.
        assert!(!mark.voids(&part(Stage::Pending(5), 100)));
        // One for a checkpoint after the restored one is a zombie's.
        assert!(mark.voids(&part(Stage::Pending(6), 100)));
        assert!(mark.voids(&part(Stage::InProgress, 100)));
        // The recovering attempt's own and later ones' are not.
        assert!(!mark.voids(&part(Stage::Pending(6), 200)));
        assert!(!mark.voids(&part(Stage::Pending(9), 300)));
        assert!(!mark.voids(&part(Stage::Committed, 100)));
    }

    #[test]
    fn a_pending_part_commits_to_its_visible_name() {
        let pending = PartName::new(2, Some(5), "parquet", Stage::Pending(7));
        assert_eq!(pending.to_string(), ".part-2-5.parquet.pending-7");
        assert_eq!(
            pending.with_stage(Stage::Committed).to_string(),
            "part-2-5.parquet"
        );
    }
}
