//! Updating results: how a stream of changes is told apart from an append-only one.
//!
//! An operator whose results change after they were emitted (an unbounded `GROUP BY`)
//! emits a changelog: every row carries its change kind in a first column, `op`, holding
//! Flink's short forms `+I` (insert), `-U` (the row before an update), `+U` (the row
//! after it) and `-D` (delete). The column is marked in its field's metadata, so that
//! planning can tell an updating stream from one that merely has a column named `op`:
//! operators that need append-only input refuse it, projections carry it through, and
//! sinks write it like any other column (stdout prints `{"op":"+I",...}`, a CSV file has
//! an `op` column), or refuse it when they cannot represent a retraction (Kafka).
//!
//! This module knows nothing of which operators produce or consume changes.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

/// Name of the change-kind column of an updating stream.
pub const OP_COLUMN: &str = "op";

/// Field metadata key that marks [`OP_COLUMN`] as a change kind, not user data.
const MARKER: &str = "sluice.changelog";

/// The kind of one change, as Flink's `RowKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// A new row.
    Insert,
    /// The previous version of an updated row, retracted.
    UpdateBefore,
    /// The new version of an updated row.
    UpdateAfter,
    /// A row removed.
    Delete,
}

impl RowKind {
    /// The short form written in the `op` column.
    pub fn short(self) -> &'static str {
        match self {
            RowKind::Insert => "+I",
            RowKind::UpdateBefore => "-U",
            RowKind::UpdateAfter => "+U",
            RowKind::Delete => "-D",
        }
    }
}

/// The `op` field that heads an updating stream's schema.
pub fn op_field() -> Field {
    Field::new(OP_COLUMN, DataType::Utf8, false)
        .with_metadata(HashMap::from([(MARKER.to_owned(), "op".to_owned())]))
}

/// Whether `schema` is an updating stream's (its first column is the marked `op`).
pub fn is_changelog(schema: &Schema) -> bool {
    schema
        .fields()
        .first()
        .is_some_and(|f| f.name() == OP_COLUMN && f.metadata().contains_key(MARKER))
}

/// An input's columns without the change kind of an updating input: the rows a join or
/// a Top-N keeps.
pub fn data_schema(schema: &SchemaRef) -> SchemaRef {
    match is_changelog(schema) {
        true => Arc::new(Schema::new(schema.fields()[1..].to_vec())),
        false => schema.clone(),
    }
}

/// The `op` column for `kinds`.
pub fn op_array(kinds: &[RowKind]) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(
        kinds.iter().map(|k| k.short()),
    ))
}

/// Per row of an `op` column, +1 for a row that adds (`+I`, `+U`) and -1 for one that
/// takes a row away (`-U`, `-D`); `None` when the column is not text.
pub fn signs(ops: &ArrayRef) -> Option<Vec<i64>> {
    let ops = ops.as_any().downcast_ref::<StringArray>()?;
    Some(
        ops.iter()
            .map(|op| match op {
                Some(op) if op.starts_with('-') => -1,
                _ => 1,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_marked_first_column_makes_a_changelog() {
        let plain = Schema::new(vec![Field::new("op", DataType::Utf8, false)]);
        assert!(!is_changelog(&plain));
        let marked = Schema::new(vec![op_field(), Field::new("n", DataType::Int64, false)]);
        assert!(is_changelog(&marked));
        let later = Schema::new(vec![Field::new("n", DataType::Int64, false), op_field()]);
        assert!(!is_changelog(&later));
    }

    #[test]
    fn retractions_count_minus_one() {
        let ops = op_array(&[
            RowKind::Insert,
            RowKind::UpdateBefore,
            RowKind::UpdateAfter,
            RowKind::Delete,
        ]);
        assert_eq!(signs(&ops), Some(vec![1, -1, 1, -1]));
    }
}
