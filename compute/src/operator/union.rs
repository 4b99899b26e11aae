//! `union`: UNION ALL of two inputs, each batch passed on as it comes under input 0's
//! column names (stateless; the task gives it the lower of the two watermarks and aligns
//! barriers of both inputs, as for a join).
//!
//! It knows nothing of where its inputs come from: both are batches of the same column
//! types, append-only or both updating (a changelog's `op` first).

use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use async_trait::async_trait;

use super::{Operator, Output};
use crate::changelog;
use crate::error::{Error, Result};

/// The union operator of one subtask.
#[derive(Debug)]
pub struct UnionOperator {
    schema: SchemaRef,
}

impl UnionOperator {
    /// The union of `left` and `right` rows; an error names the first column whose types
    /// differ, a different number of columns, or an updating input beside an
    /// append-only one.
    pub fn build(left: &SchemaRef, right: &SchemaRef) -> Result<Self> {
        let updating = [left, right].map(|s| changelog::is_changelog(s));
        if updating[0] != updating[1] {
            let which = if updating[0] { "first" } else { "second" };
            return Err(Error::Plan(format!(
                "UNION ALL of an updating result (its {which} input, a GROUP BY's, a Top-N's \
                 or an outer join's changelog) and an append-only one is not supported"
            )));
        }
        let (l, r) = (left.fields(), right.fields());
        if l.len() != r.len() {
            return Err(Error::Plan(format!(
                "UNION ALL needs as many columns on both sides: the first has {} ({}), the \
                 second {} ({})",
                l.len(),
                names(left),
                r.len(),
                names(right)
            )));
        }
        let mut fields = Vec::with_capacity(l.len());
        for (i, (a, b)) in l.iter().zip(r.iter()).enumerate() {
            if a.data_type() != b.data_type() {
                return Err(Error::Plan(format!(
                    "UNION ALL column {} is `{}` {} on the first side and `{}` {} on the \
                     second; CAST one side to the other's type",
                    i + 1,
                    a.name(),
                    a.data_type(),
                    b.name(),
                    b.data_type()
                )));
            }
            fields.push(
                a.as_ref()
                    .clone()
                    .with_nullable(a.is_nullable() || b.is_nullable()),
            );
        }
        Ok(Self {
            schema: std::sync::Arc::new(Schema::new(fields)),
        })
    }

    /// The schema of the rows this operator emits: input 0's names.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

fn names(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[async_trait]
impl Operator for UnionOperator {
    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        self.process_input(0, batch, out).await
    }

    async fn process_input(
        &mut self,
        _input: usize,
        batch: RecordBatch,
        out: &mut Output,
    ) -> Result<()> {
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        out.batch(RecordBatch::try_new_with_options(
            self.schema.clone(),
            batch.columns().to_vec(),
            &options,
        )?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field};

    use super::*;
    use crate::element::StreamElement;

    fn schema(names: [&str; 2], nullable: bool) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(names[0], DataType::Int64, false),
            Field::new(names[1], DataType::Utf8, nullable),
        ]))
    }

    #[tokio::test]
    async fn both_inputs_pass_under_the_first_inputs_names() {
        let (left, right) = (schema(["k", "v"], false), schema(["id", "name"], true));
        let mut op = UnionOperator::build(&left, &right).unwrap();
        let batch = RecordBatch::try_new(
            right.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
            ],
        )
        .unwrap();
        let mut out = Output::default();
        op.process_input(1, batch, &mut out).await.unwrap();
        let Some(StreamElement::Batch(b)) = out.main.first() else {
            panic!("no batch");
        };
        assert_eq!(b.schema().field(1).name(), "v");
        assert!(b.schema().field(1).is_nullable());
        assert_eq!(b.num_rows(), 2);
    }

    #[test]
    fn mismatches_are_named() {
        let left = schema(["k", "v"], false);
        let wider = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, false),
            Field::new("w", DataType::Utf8, false),
        ]));
        let err = UnionOperator::build(&left, &wider).unwrap_err().to_string();
        assert!(
            err.contains("as many columns") && err.contains("k, v, w"),
            "{err}"
        );
        let other = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let err = UnionOperator::build(&left, &other).unwrap_err().to_string();
        assert!(
            err.contains("column 2 is `v` Utf8") && err.contains("CAST"),
            "{err}"
        );
        let updating = Arc::new(Schema::new(vec![
            changelog::op_field(),
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, false),
        ]));
        let err = UnionOperator::build(&left, &updating)
            .unwrap_err()
            .to_string();
        assert!(err.contains("updating result"), "{err}");
    }
}
