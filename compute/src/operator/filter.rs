//! `filter`: keeps the rows for which a SQL predicate is true.

use arrow::array::{Array, BooleanArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use sluice_common::pb;

use super::{Operator, Output};
use crate::error::{Error, Result};
use crate::expr::{CompiledExpr, ExprCompiler};

/// Filters batches by a compiled predicate.
pub struct FilterOperator {
    predicate: CompiledExpr,
}

impl FilterOperator {
    /// Compiles the predicate over `input`; the output schema equals the input's.
    pub fn build(
        spec: &pb::FilterSpec,
        input: &SchemaRef,
        compiler: &ExprCompiler,
    ) -> Result<Self> {
        let sql = spec
            .predicate
            .as_ref()
            .map(|e| e.sql.as_str())
            .unwrap_or_default();
        let predicate = compiler.compile(sql, input)?;
        if predicate.data_type != DataType::Boolean {
            return Err(Error::Plan(format!(
                "filter `{sql}` is of type {}, expected a boolean condition",
                predicate.data_type
            )));
        }
        Ok(Self { predicate })
    }
}

#[async_trait]
impl Operator for FilterOperator {
    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let mask = self.predicate.evaluate(&batch)?;
        let mask = mask
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| Error::Internal("filter predicate did not yield booleans".into()))?;
        if mask.true_count() == batch.num_rows() && mask.null_count() == 0 {
            out.batch(batch);
        } else {
            out.batch(filter_record_batch(&batch, mask)?);
        }
        Ok(())
    }
}
