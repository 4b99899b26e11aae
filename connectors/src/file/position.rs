//! Where a file split stands at a checkpoint: its name and its opaque position bytes.
//!
//! # Names
//!
//! A split is one file, named by its path relative to the source's root (`2024/a.csv`
//! under `s3://bucket/events`), or by its file name when the root is the file itself.
//! The name depends only on the listing, so the same file has the same name at any
//! parallelism and after any restart.
//!
//! # Positions
//!
//! A position describes exactly the records already returned by
//! [`next_batch`](sluice_compute::connector::SourceReader::next_batch), never what is buffered:
//!
//! - a CSV or JSON-lines file: `T`, then the byte offset of the next unread record (just
//!   past a record's terminating newline, or 0) and the line it starts on, each 8 bytes
//!   big-endian. Offset 0 is the start of the file, where a CSV header is still to be
//!   skipped; any other offset lies past the header.
//! - a Parquet file: `P`, then the next row group and the rows of it already returned,
//!   each 8 bytes big-endian.
//! - [`FINISHED`] once the file's last batch was returned.
//!
//! Malformed bytes fail [`Position::decode`] with an [`Error::Plan`] naming the split.

use object_store::path::Path;

use sluice_compute::error::{Error, Result};

/// The position of a file that has been read to its end.
pub const FINISHED: &[u8] = b"finished";

const TEXT: u8 = b'T';
const PARQUET: u8 = b'P';
const ENCODED_LEN: usize = 17;

/// Where the next record of a split is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// A CSV or JSON-lines file: the byte offset of the next unread record (at a line
    /// start) and its 1-based line.
    Text { offset: u64, line: u64 },
    /// A Parquet file: the next row group and the rows of it already read.
    Parquet { row_group: u64, row: u64 },
    /// Every record of the file has been returned.
    Finished,
}

impl Position {
    /// The beginning of a file, of Parquet or text.
    pub fn start(parquet: bool) -> Self {
        if parquet {
            Position::Parquet {
                row_group: 0,
                row: 0,
            }
        } else {
            Position::Text { offset: 0, line: 1 }
        }
    }

    /// The checkpointed bytes of this position.
    pub fn encode(&self) -> bytes::Bytes {
        let (tag, a, b) = match *self {
            Position::Finished => return bytes::Bytes::from_static(FINISHED),
            Position::Text { offset, line } => (TEXT, offset, line),
            Position::Parquet { row_group, row } => (PARQUET, row_group, row),
        };
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(tag);
        out.extend_from_slice(&a.to_be_bytes());
        out.extend_from_slice(&b.to_be_bytes());
        out.into()
    }

    /// The position `bytes` of split `name`, for a source reading Parquet or text.
    pub fn decode(name: &str, bytes: &[u8], parquet: bool) -> Result<Self> {
        if bytes == FINISHED {
            return Ok(Position::Finished);
        }
        let malformed = |what: String| {
            Error::Plan(format!(
                "the checkpoint's position of file split `{name}` is malformed: {what}"
            ))
        };
        if bytes.len() != ENCODED_LEN {
            return Err(malformed(format!(
                "{} bytes where {ENCODED_LEN} (a kind and two numbers) or `finished` were \
                 expected",
                bytes.len()
            )));
        }
        let number = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let (a, b) = (number(1), number(9));
        let position = match bytes[0] {
            TEXT => {
                if b == 0 || (a == 0 && b != 1) {
                    return Err(malformed(format!("line {b} at byte offset {a}")));
                }
                Position::Text { offset: a, line: b }
            }
            PARQUET => Position::Parquet {
                row_group: a,
                row: b,
            },
            other => {
                return Err(malformed(format!("unknown kind byte {other:#04x}")));
            }
        };
        let is_parquet = matches!(position, Position::Parquet { .. });
        if is_parquet != parquet {
            let (was, is) = if is_parquet {
                ("Parquet", "CSV or JSON lines")
            } else {
                ("CSV or JSON lines", "Parquet")
            };
            return Err(Error::Plan(format!(
                "the checkpoint's position of file split `{name}` is one of {was}, but the \
                 source now reads {is}; was the job's format changed?"
            )));
        }
        Ok(position)
    }

    /// The position after `rows` more rows of a Parquet file whose row groups hold
    /// `group_rows` rows each (empty and exhausted groups are passed over).
    pub fn after_rows(self, rows: u64, group_rows: &[u64]) -> Self {
        let Position::Parquet { row_group, row } = self else {
            return self;
        };
        let (mut group, mut row) = (row_group as usize, row + rows);
        while group < group_rows.len() && row >= group_rows[group] {
            row -= group_rows[group];
            group += 1;
        }
        Position::Parquet {
            row_group: group as u64,
            row,
        }
    }
}

/// The split name of the file at `location` under the source's `root`.
pub fn split_name(root: &Path, location: &Path) -> String {
    let relative: Vec<String> = location
        .prefix_match(root)
        .map(|parts| parts.map(|p| p.as_ref().to_string()).collect())
        .unwrap_or_default();
    if relative.is_empty() {
        // The root names the file itself (or, never from a listing, lies elsewhere).
        location
            .filename()
            .map_or_else(|| location.to_string(), str::to_string)
    } else {
        relative.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip() {
        for (p, parquet) in [
            (Position::start(false), false),
            (
                Position::Text {
                    offset: 1 << 40,
                    line: 77,
                },
                false,
            ),
            (Position::start(true), true),
            (
                Position::Parquet {
                    row_group: 3,
                    row: 9,
                },
                true,
            ),
            (Position::Finished, true),
            (Position::Finished, false),
        ] {
            assert_eq!(Position::decode("a", &p.encode(), parquet).unwrap(), p);
        }
    }

    #[test]
    fn malformed_positions_name_their_split() {
        let text = Position::Text {
            offset: 10,
            line: 2,
        }
        .encode();
        for (bytes, parquet, expected) in [
            (&b"abc"[..], false, "3 bytes"),
            (&text[..], true, "source now reads Parquet"),
            (&[b'X'; 17][..], false, "unknown kind"),
        ] {
            let msg = Position::decode("dir/a.csv", bytes, parquet)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains("`dir/a.csv`") && msg.contains(expected),
                "{msg}"
            );
        }
        let mut zero_line = text.to_vec();
        zero_line[9..].fill(0);
        let msg = Position::decode("a.csv", &zero_line, false)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("line 0"), "{msg}");
    }

    #[test]
    fn parquet_positions_pass_over_full_and_empty_row_groups() {
        let groups = [3, 0, 2, 4];
        let at = |row_group, row| Position::Parquet { row_group, row };
        assert_eq!(at(0, 0).after_rows(2, &groups), at(0, 2));
        assert_eq!(at(0, 2).after_rows(1, &groups), at(2, 0));
        assert_eq!(at(0, 0).after_rows(6, &groups), at(3, 1));
        assert_eq!(at(2, 1).after_rows(5, &groups), at(4, 0));
    }

    #[test]
    fn split_names_are_relative_to_the_root() {
        let root = Path::from("data/events");
        assert_eq!(
            split_name(&root, &Path::from("data/events/2024/a.csv")),
            "2024/a.csv"
        );
        assert_eq!(
            split_name(&Path::from("data/a.csv"), &Path::from("data/a.csv")),
            "a.csv"
        );
        assert_eq!(
            split_name(&Path::from(""), &Path::from("x/b.csv")),
            "x/b.csv"
        );
    }
}
