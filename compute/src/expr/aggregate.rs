//! Aggregate calls in a window's or a group-by's `aggregate:` list.
//!
//! DataFusion parses the call (`sum(price * 2) AS volume`); this module checks that the
//! function is one the window operator can keep incrementally in keyed state and
//! compiles its argument as a scalar expression. The accumulation itself lives in
//! `window::accumulator`, where partial results are merged into state.
//!
//! `FILTER (WHERE cond)` needs no state of its own: every supported function skips nulls,
//! so the argument becomes `CASE WHEN cond THEN arg END` (`count(*)` counts a constant).

use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::logical_expr::{Expr, lit, when};

use super::udf::{self, AggregateUdf};
use super::{CompiledExpr, ExprCompiler};
use crate::error::{Error, Result};

/// The aggregate functions windows support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggFunc {
    /// `count(*)`: rows.
    CountStar,
    /// `count(x)`: non-null values.
    Count,
    /// `sum(x)`.
    Sum,
    /// `min(x)`.
    Min,
    /// `max(x)`.
    Max,
    /// `avg(x)` (also `mean`).
    Avg,
    /// An aggregate function the program registered (`expr::udf`).
    Udf(&'static AggregateUdf),
}

/// How an argument's values are held while aggregating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// Any integer type, widened to i64.
    Int,
    /// Floats and decimals, as f64.
    Float,
    /// Timestamps, as milliseconds.
    TimestampMs,
}

/// One compiled aggregate call.
#[derive(Debug, Clone)]
pub struct AggregateCall {
    /// The function.
    pub func: AggFunc,
    /// The argument (`None` for `count(*)`).
    pub arg: Option<CompiledExpr>,
    /// How the argument is held (irrelevant for counts).
    pub arg_kind: ArgKind,
    /// Output column name.
    pub name: String,
    /// Output column type.
    pub output_type: DataType,
    /// `count(DISTINCT x)`: each distinct value of the argument counts once (only
    /// unbounded group-bys keep the values seen; windows refuse it).
    pub distinct: bool,
    /// A `count(DISTINCT x)`'s value and FILTER apart (`arg` folds them into one), so
    /// that calls over the same value share the values seen.
    pub distinct_parts: Option<DistinctParts>,
}

/// The parts of a `count(DISTINCT x) FILTER (WHERE f)` call.
#[derive(Debug, Clone)]
pub struct DistinctParts {
    /// `x`, as written (calls with the same text count the same values).
    pub value_sql: String,
    /// `x`, compiled.
    pub value: CompiledExpr,
    /// `f`, compiled (a boolean), if the call has a FILTER.
    pub filter: Option<CompiledExpr>,
}

const SUPPORTED: &str = "count, sum, min, max, avg, or one the program registers";

impl AggregateCall {
    /// Compiles `sql` (for example `count(*) AS bids`) over `schema`.
    pub fn compile(compiler: &ExprCompiler, sql: &str, schema: &SchemaRef) -> Result<Self> {
        let (expr, df_schema) = compiler.parse(sql, schema)?;
        let (alias, expr) = super::compile::strip_aliases(expr);
        let name = match alias {
            Some(a) => a,
            None => expr.schema_name().to_string(),
        };
        let Expr::AggregateFunction(agg) = expr else {
            return Err(Error::Plan(format!(
                "`{sql}` is not an aggregate call; expected one of {SUPPORTED}, e.g. `count(*) AS n`"
            )));
        };
        let fname = agg.func.name().to_ascii_lowercase();
        let params = agg.params;
        let distinct = params.distinct;
        let registered = udf::registered_aggregate(&fname);
        if distinct && registered.is_some() {
            return Err(Error::Plan(format!(
                "`{sql}`: {fname}(DISTINCT ...) is not supported: an aggregate function \
                 registered in Rust folds every value in"
            )));
        }
        if distinct && fname != "count" {
            return Err(Error::Plan(format!(
                "`{sql}`: {}(DISTINCT ...) is not supported yet (COUNT(DISTINCT ...) is, \
                 in a GROUP BY and in HOP, TUMBLE and CUMULATE windows)",
                fname.to_ascii_uppercase()
            )));
        }
        if !params.order_by.is_empty() {
            return Err(Error::Plan(format!(
                "`{sql}`: ORDER BY inside an aggregate is not supported in windows and GROUP BY"
            )));
        }
        let mut func = match (registered, fname.as_str()) {
            (Some(udf), _) => AggFunc::Udf(udf),
            (None, "count") => AggFunc::Count,
            (None, "sum") => AggFunc::Sum,
            (None, "min") => AggFunc::Min,
            (None, "max") => AggFunc::Max,
            (None, "avg" | "mean") => AggFunc::Avg,
            (None, other) => {
                return Err(Error::Plan(format!(
                    "`{sql}`: aggregate `{other}` is not supported in windows and GROUP BY; use one of {SUPPORTED}"
                )));
            }
        };
        let [arg] = <[Expr; 1]>::try_from(params.args).map_err(|args| {
            Error::Plan(format!(
                "`{sql}`: expected one argument, got {}",
                args.len()
            ))
        })?;
        let is_star = func == AggFunc::Count
            && !distinct
            && matches!(&arg, Expr::Literal(v, _) if !v.is_null());
        let distinct_parts = match distinct {
            true => {
                let filter = match &params.filter {
                    Some(f) => {
                        let f = compiler.plan((**f).clone(), &df_schema, schema)?;
                        if f.data_type != DataType::Boolean {
                            return Err(Error::Plan(format!(
                                "`{sql}`: its FILTER is of type {}, not a boolean",
                                f.data_type
                            )));
                        }
                        Some(f)
                    }
                    None => None,
                };
                Some(DistinctParts {
                    value_sql: arg.schema_name().to_string(),
                    value: compiler.plan(arg.clone(), &df_schema, schema)?,
                    filter,
                })
            }
            false => None,
        };
        let arg = match params.filter {
            // Rows the filter refuses become nulls, which every function skips.
            Some(filter) => when(*filter, if is_star { lit(true) } else { arg })
                .end()
                .map_err(|e| Error::Plan(format!("`{sql}`: cannot plan its FILTER: {e}")))?,
            None if is_star => {
                func = AggFunc::CountStar;
                return Ok(Self {
                    func,
                    arg: None,
                    arg_kind: ArgKind::Int,
                    name,
                    output_type: DataType::Int64,
                    distinct: false,
                    distinct_parts: None,
                });
            }
            None => arg,
        };
        let arg = compiler.plan(arg, &df_schema, schema)?;
        let arg_kind = match &arg.data_type {
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => ArgKind::Int,
            DataType::Float16
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(_, _)
            | DataType::Decimal256(_, _) => ArgKind::Float,
            DataType::Timestamp(_, _) if func != AggFunc::Sum => ArgKind::TimestampMs,
            other if func == AggFunc::Count => {
                let _ = other;
                ArgKind::Int
            }
            other => {
                return Err(Error::Plan(format!(
                    "`{sql}`: cannot compute {fname} over values of type {other}"
                )));
            }
        };
        let output_type = match (func, arg_kind) {
            (AggFunc::Udf(udf), _) => udf.returns.clone(),
            (AggFunc::Count | AggFunc::CountStar, _) => DataType::Int64,
            (AggFunc::Avg, _) | (_, ArgKind::Float) => DataType::Float64,
            (_, ArgKind::Int) => DataType::Int64,
            (_, ArgKind::TimestampMs) => DataType::Timestamp(TimeUnit::Millisecond, None),
        };
        Ok(Self {
            func,
            arg: Some(arg),
            arg_kind,
            name,
            output_type,
            distinct,
            distinct_parts,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("price", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
            Field::new(
                "date_time",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
        ]))
    }

    #[test]
    fn compiles_supported_calls() {
        let c = ExprCompiler::new();
        let s = schema();
        let star = AggregateCall::compile(&c, "count(*) AS bids", &s).unwrap();
        assert_eq!(
            (star.func, star.name.as_str()),
            (AggFunc::CountStar, "bids")
        );
        let sum = AggregateCall::compile(&c, "sum(price * 2)", &s).unwrap();
        let cheap = "count(*) FILTER (WHERE price < 10) AS cheap";
        let cheap = AggregateCall::compile(&c, cheap, &s).unwrap();
        assert_eq!((cheap.func, cheap.arg.is_some()), (AggFunc::Count, true));
        let dear = "sum(price) FILTER (WHERE name = 'x') AS dear";
        let dear = AggregateCall::compile(&c, dear, &s).unwrap();
        assert_eq!(
            (dear.func, dear.output_type),
            (AggFunc::Sum, DataType::Int64)
        );
        assert_eq!((sum.func, sum.arg_kind), (AggFunc::Sum, ArgKind::Int));
        let avg = AggregateCall::compile(&c, "avg(price) AS a", &s).unwrap();
        assert_eq!(avg.output_type, DataType::Float64);
        let bidders = "count(DISTINCT name) FILTER (WHERE price < 10) AS n";
        let bidders = AggregateCall::compile(&c, bidders, &s).unwrap();
        assert_eq!((bidders.func, bidders.distinct), (AggFunc::Count, true));
        let first = AggregateCall::compile(&c, "min(date_time) AS first", &s).unwrap();
        assert_eq!(first.arg_kind, ArgKind::TimestampMs);
    }

    #[test]
    fn rejects_what_windows_cannot_keep() {
        let c = ExprCompiler::new();
        let s = schema();
        for (sql, needle) in [
            ("price + 1", "not an aggregate"),
            ("sum(name)", "cannot compute sum"),
            ("sum(DISTINCT price)", "SUM(DISTINCT ...) is not supported"),
            ("median(price)", "median"),
            ("sum(nope)", "nope"),
            ("count(*) FILTER (WHERE nope > 1)", "nope"),
        ] {
            let err = AggregateCall::compile(&c, sql, &s).unwrap_err().to_string();
            assert!(err.contains(needle), "{sql}: {err}");
        }
    }
}
