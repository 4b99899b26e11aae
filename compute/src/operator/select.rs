//! `select`: computes a new set of columns from SQL expressions.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::{RecordBatch, RecordBatchOptions};
use async_trait::async_trait;
use sluice_common::pb;

use super::{Operator, Output};
use crate::changelog;
use crate::error::{Error, Result};
use crate::expr::{CompiledExpr, ExprCompiler};

/// Projects batches through compiled expressions.
pub struct SelectOperator {
    exprs: Vec<CompiledExpr>,
    schema: SchemaRef,
    /// The input is an updating stream: its change kinds go through ahead of the columns.
    changelog: bool,
}

impl SelectOperator {
    /// Compiles each expression over `input`.
    pub fn build(
        spec: &pb::SelectSpec,
        input: &SchemaRef,
        compiler: &ExprCompiler,
    ) -> Result<Self> {
        let changelog = changelog::is_changelog(input);
        let mut exprs = Vec::with_capacity(spec.exprs.len());
        for e in &spec.exprs {
            if let Some(except) = crate::expr::wildcard(&e.sql) {
                // Every input column but those named, as it is (the change kind stays in
                // front by itself).
                for f in input.fields().iter().skip(usize::from(changelog)) {
                    if except.iter().any(|x| x == f.name()) {
                        continue;
                    }
                    let quoted = format!("\"{}\"", f.name().replace('"', "\"\""));
                    exprs.push(compiler.compile(&quoted, input)?);
                }
                continue;
            }
            let compiled = compiler.compile(&e.sql, input)?;
            if changelog && compiled.name == changelog::OP_COLUMN {
                return Err(Error::Plan(format!(
                    "select: `{}` names the change kind of an updating result (+I, -U, +U, \
                     -D), which stays in front by itself; give this column another name with AS",
                    compiled.name
                )));
            }
            if exprs.iter().any(|c: &CompiledExpr| c.name == compiled.name) {
                return Err(Error::Plan(format!(
                    "select: column `{}` appears twice; give one of them another name with AS",
                    compiled.name
                )));
            }
            exprs.push(compiled);
        }
        let fields = changelog
            .then(changelog::op_field)
            .into_iter()
            .chain(exprs.iter().map(CompiledExpr::field));
        let schema = Arc::new(Schema::new(fields.collect::<Vec<_>>()));
        Ok(Self {
            exprs,
            schema,
            changelog,
        })
    }

    /// The schema of the batches this operator emits.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

#[async_trait]
impl Operator for SelectOperator {
    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let ops = self.changelog.then(|| Ok(batch.column(0).clone()));
        let columns = ops
            .into_iter()
            .chain(self.exprs.iter().map(|e| e.evaluate(&batch)))
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        out.batch(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?);
        Ok(())
    }
}
