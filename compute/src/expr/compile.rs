//! Compiling SQL text into DataFusion physical expressions.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};

/// A scalar expression ready to evaluate on batches of one schema.
#[derive(Debug, Clone)]
pub struct CompiledExpr {
    /// The physical expression.
    pub physical: Arc<dyn PhysicalExpr>,
    /// Output column name: the alias, or DataFusion's name for the expression.
    pub name: String,
    /// Output type.
    pub data_type: DataType,
    /// Whether the output may hold nulls.
    pub nullable: bool,
}

impl CompiledExpr {
    /// Evaluates on `batch`, always returning an array of `batch.num_rows()` rows.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<ArrayRef> {
        Ok(self
            .physical
            .evaluate(batch)?
            .into_array(batch.num_rows())?)
    }

    /// The output field.
    pub fn field(&self) -> Field {
        Field::new(&self.name, self.data_type.clone(), self.nullable)
    }
}

/// Parses and plans expressions with DataFusion's default function registry.
pub struct ExprCompiler {
    ctx: SessionContext,
}

impl Default for ExprCompiler {
    fn default() -> Self {
        Self::new()
    }
}

impl ExprCompiler {
    /// A compiler with DataFusion's built-in functions, Flink's that Sluice adds and
    /// the functions registered in this process ([`super::udf`]).
    pub fn new() -> Self {
        let ctx = SessionContext::new();
        super::udf::install(&ctx);
        Self { ctx }
    }

    /// Parses `sql` into a logical expression over `schema` (aliases kept).
    pub fn parse(&self, sql: &str, schema: &SchemaRef) -> Result<(Expr, DFSchema)> {
        let df_schema = DFSchema::try_from(schema.as_ref().clone())?;
        let expr = self.ctx.parse_sql_expr(sql, &df_schema)?;
        Ok((expr, df_schema))
    }

    /// Compiles a scalar expression over `schema` whose columns belong to the tables
    /// `qualifiers` names, one per column (a join's pair: `a.price`, `b.price`); an
    /// unqualified name resolves when only one table has it.
    pub fn compile_qualified(
        &self,
        sql: &str,
        schema: &SchemaRef,
        qualifiers: &[String],
    ) -> Result<CompiledExpr> {
        let (expr, df_schema) = self.parse_qualified(sql, schema, qualifiers)?;
        for column in expr.column_refs() {
            if column.relation.is_some() {
                continue;
            }
            let owners: Vec<&str> = schema
                .fields()
                .iter()
                .zip(qualifiers)
                .filter(|(f, _)| f.name() == &column.name)
                .map(|(_, q)| q.as_str())
                .collect();
            if owners.len() > 1 {
                return Err(Error::Plan(format!(
                    "column `{}` is ambiguous: both {} have it; qualify it (`{}.{}`)",
                    column.name,
                    owners.join(" and "),
                    owners[0],
                    column.name
                )));
            }
        }
        self.plan(expr, &df_schema, schema)
    }

    /// Parses `sql` over `schema` whose columns belong to the tables `qualifiers` names
    /// (see [`ExprCompiler::compile_qualified`]); names are matched in lower case, as SQL
    /// folds unquoted names.
    pub fn parse_qualified(
        &self,
        sql: &str,
        schema: &SchemaRef,
        qualifiers: &[String],
    ) -> Result<(Expr, DFSchema)> {
        let df_schema = DFSchema::from_field_specific_qualified_schema(
            qualifiers
                .iter()
                .map(|q| Some(datafusion::common::TableReference::bare(q.to_lowercase())))
                .collect(),
            schema,
        )?;
        let expr = self.ctx.parse_sql_expr(sql, &df_schema)?;
        Ok((expr, df_schema))
    }

    /// Compiles a scalar expression over `schema`.
    pub fn compile(&self, sql: &str, schema: &SchemaRef) -> Result<CompiledExpr> {
        let (expr, df_schema) = self.parse(sql, schema)?;
        self.plan(expr, &df_schema, schema)
    }

    /// Plans an already parsed logical expression.
    pub fn plan(
        &self,
        expr: Expr,
        df_schema: &DFSchema,
        schema: &SchemaRef,
    ) -> Result<CompiledExpr> {
        if contains_aggregate(&expr) {
            return Err(Error::Plan(format!(
                "`{expr}` is an aggregate; aggregates belong in a window's `aggregate:` list"
            )));
        }
        let (alias, inner) = strip_aliases(expr);
        let name = match (alias, &inner) {
            (Some(a), _) => a,
            // `a.price` is named `price`, as SQL names a qualified column.
            (None, Expr::Column(c)) => c.name.clone(),
            (None, _) => inner.schema_name().to_string(),
        };
        let physical = self.ctx.create_physical_expr(inner, df_schema)?;
        let data_type = physical.data_type(schema)?;
        let nullable = physical.nullable(schema)?;
        Ok(CompiledExpr {
            physical,
            name,
            data_type,
            nullable,
        })
    }
}

/// Removes every alias layer (DataFusion nests them, e.g. `count(*) AS n`); the
/// outermost name is the one the user wrote.
pub fn strip_aliases(mut expr: Expr) -> (Option<String>, Expr) {
    let mut name = None;
    while let Expr::Alias(alias) = expr {
        name.get_or_insert(alias.name);
        expr = *alias.expr;
    }
    (name, expr)
}

fn contains_aggregate(expr: &Expr) -> bool {
    let mut found = false;
    let _ = expr.apply(|e| {
        if matches!(e, Expr::AggregateFunction(_) | Expr::WindowFunction(_)) {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, Int64Array};
    use arrow::datatypes::Schema;

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("auction", DataType::Int64, false),
            Field::new("price", DataType::Int64, false),
        ]))
    }

    #[test]
    fn evaluates_arithmetic_with_alias() {
        let c = ExprCompiler::new()
            .compile("price * 0.5 AS half", &schema())
            .unwrap();
        assert_eq!(c.name, "half");
        assert_eq!(c.data_type, DataType::Float64);
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(Int64Array::from(vec![10, 3])),
            ],
        )
        .unwrap();
        let out = c.evaluate(&batch).unwrap();
        let out = out.as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(out.values(), &[5.0, 1.5]);
    }

    #[test]
    fn unknown_column_is_a_clear_error() {
        let err = ExprCompiler::new()
            .compile("pricee > 1", &schema())
            .unwrap_err()
            .to_string();
        assert!(err.contains("pricee"), "{err}");
    }

    #[test]
    fn aggregates_are_refused_in_scalar_position() {
        let err = ExprCompiler::new()
            .compile("sum(price)", &schema())
            .unwrap_err()
            .to_string();
        assert!(err.contains("aggregate"), "{err}");
    }
}
