//! SQL expressions on Arrow batches, compiled and evaluated by DataFusion.
//!
//! The job file holds expressions as SQL text (`price * 0.908 AS price_eur`). This module
//! turns them into DataFusion physical expressions against a known input schema once, at
//! planning time, so that type errors and unknown columns surface before the job runs,
//! and evaluation is vectorized over whole batches. It never interprets rows itself.
//!
//! - [`compile`]: scalar expressions (filters, projections, aggregate arguments).
//! - [`udf`]: Flink's functions DataFusion lacks, and user-defined scalar functions.
//! - [`aggregate`]: aggregate calls (`count(*)`, `sum(price)`) split into a function and
//!   its argument.

pub mod aggregate;
mod compile;
pub mod udf;

pub use compile::{CompiledExpr, ExprCompiler, strip_aliases};
