//! Functions beyond DataFusion's own: Flink's built-ins that Nexmark's queries call, and
//! scalar functions a program registers in Rust (user-defined functions).
//!
//! # Registering a UDF
//! A UDF is process-wide. A program registers it before any job is planned and then
//! hands over to the `sluice` command line, so every role it starts has it (worker
//! processes are started from the same executable):
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Array, ArrayRef, AsArray, Int64Array};
//! use arrow::datatypes::DataType;
//! use sluice_compute::expr::udf;
//!
//! udf::register_scalar(udf::scalar_function(
//!     "count_char",
//!     vec![DataType::Utf8, DataType::Utf8],
//!     DataType::Int64,
//!     |args: &[ArrayRef]| {
//!         let (text, ch) = (args[0].as_string::<i32>(), args[1].as_string::<i32>());
//!         let counts: Int64Array = (0..text.len())
//!             .map(|i| {
//!                 (!text.is_null(i) && !ch.is_null(i)).then(|| {
//!                     let c = ch.value(i);
//!                     if c.is_empty() { 0 } else { text.value(i).matches(c).count() as i64 }
//!                 })
//!             })
//!             .collect();
//!         Ok(Arc::new(counts) as ArrayRef)
//!     },
//! ));
//! ```
//!
//! (`cli/examples/udf.rs` is such a program.) A UDF's argument types are exact: DataFusion
//! reports a call with other types at planning, at the expression's place in the job
//! file. An error the function returns fails the job with its message.
//!
//! # Registering an aggregate function
//! An aggregate function of one numeric argument keeps its running state in an [`Acc`],
//! the fixed-size accumulator windows and GROUP BYs hold per key and window in keyed
//! state: `i` (an i64) and `f` (an f64) are the function's own, starting at 0, and `n`
//! counts the values folded in (Sluice keeps it; a group of no values is null, and the
//! function is not asked). It folds one value in, merges two partial states (of
//! different batches, or of a sliding window's panes), and gives the result:
//!
//! ```
//! use arrow::datatypes::DataType;
//! use sluice_compute::expr::udf::{self, Acc, AggregateFunction, Number};
//!
//! /// The geometric mean of positive values.
//! struct GeoMean;
//!
//! impl AggregateFunction for GeoMean {
//!     fn update(&self, acc: &mut Acc, value: Number) {
//!         acc.f += value.as_f64().ln();
//!     }
//!     fn merge(&self, acc: &mut Acc, other: &Acc) {
//!         acc.f += other.f;
//!     }
//!     fn finish(&self, acc: &Acc) -> Number {
//!         Number::Float((acc.f / acc.n as f64).exp())
//!     }
//! }
//!
//! udf::register_aggregate("geomean", DataType::Float64, GeoMean).unwrap();
//! ```
//!
//! Then `geomean(price)` is an aggregate in SQL and in a job file's `aggregate:` list,
//! with `FILTER (WHERE ...)` (rows it refuses are not folded in). Nulls are skipped.
//! Integer and timestamp arguments arrive as [`Number::Int`] (milliseconds), floats and
//! decimals as [`Number::Float`]. It takes no `DISTINCT`. A GROUP BY over an updating
//! result (another GROUP BY's changelog) takes values back: only a function whose
//! `retracts` says it can (its `retract` undoes an `update`, and its state is sums that
//! `merge` adds) may aggregate one; others are refused at planning.
//!
//! This module knows nothing of jobs, operators or state.

use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, AsArray, StringArray, StringBuilder};
use arrow::datatypes::Field;
use arrow::datatypes::{DataType, Int64Type, TimeUnit, TimestampMillisecondType};
use datafusion::logical_expr::{
    AggregateUDF, ColumnarValue, ScalarUDF, Signature, SimpleAggregateUDF, Volatility, create_udf,
};
use datafusion::prelude::SessionContext;

pub use crate::window::accumulator::Acc;

/// Functions registered by the program, installed in every expression compiler.
static REGISTERED: Mutex<Vec<ScalarUDF>> = Mutex::new(Vec::new());

/// Aggregate functions registered by the program (each lives as long as the process).
static AGGREGATES: Mutex<Vec<&'static AggregateUdf>> = Mutex::new(Vec::new());

/// A value an aggregate function folds in or returns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer (timestamps in milliseconds).
    Int(i64),
    /// A float.
    Float(f64),
}

impl Number {
    /// The value as a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }

    /// The value as an integer (a float truncated toward zero, saturating).
    pub fn as_i64(self) -> i64 {
        match self {
            Number::Int(i) => i,
            Number::Float(f) => f as i64,
        }
    }
}

/// What an aggregate function registered in Rust computes (see the module docs).
pub trait AggregateFunction: Send + Sync + 'static {
    /// Folds one non-null value into `acc` (`acc.n` is counted by Sluice afterwards).
    fn update(&self, acc: &mut Acc, value: Number);
    /// Merges the partial state `other` (of at least one value) into `acc`.
    fn merge(&self, acc: &mut Acc, other: &Acc);
    /// The result of a state of at least one value.
    fn finish(&self, acc: &Acc) -> Number;
    /// Whether [`retract`](Self::retract) takes a value back, so that the function may
    /// aggregate an updating result. Such a function's state must merge by adding `i`
    /// and `f` (sums), as a partial state may then hold values taken away.
    fn retracts(&self) -> bool {
        false
    }
    /// Takes one non-null value folded in before back out of `acc` (`acc.n` is counted
    /// by Sluice); called only when [`retracts`](Self::retracts) says so.
    fn retract(&self, acc: &mut Acc, value: Number) {
        let _ = (acc, value);
    }
}

/// A registered aggregate function: its name, result type and computation.
pub struct AggregateUdf {
    /// The name calls use (lowercase).
    pub name: String,
    /// The result type: Int64 or Float64.
    pub returns: DataType,
    /// The computation.
    pub function: Box<dyn AggregateFunction>,
}

impl std::fmt::Debug for AggregateUdf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(..) -> {}", self.name, self.returns)
    }
}

impl PartialEq for AggregateUdf {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for AggregateUdf {}

/// Makes the aggregate function `name(x)` callable from every job's aggregates in this
/// process, returning `returns` (Int64 or Float64); a later registration of the same
/// name replaces the earlier one. Errors name what is wrong with the registration.
pub fn register_aggregate(
    name: &str,
    returns: DataType,
    function: impl AggregateFunction,
) -> Result<(), String> {
    let name = name.to_ascii_lowercase();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "aggregate function name `{name}`: use letters, digits and `_`"
        ));
    }
    if !matches!(returns, DataType::Int64 | DataType::Float64) {
        return Err(format!(
            "aggregate function `{name}` returns {returns}; it may return Int64 or Float64"
        ));
    }
    if sluice_common::aggregate_names::BUILT_IN.contains(&name.as_str()) {
        return Err(format!("`{name}` is a built-in aggregate function"));
    }
    let udf: &'static AggregateUdf = Box::leak(Box::new(AggregateUdf {
        name: name.clone(),
        returns,
        function: Box::new(function),
    }));
    let mut registered = AGGREGATES.lock().unwrap_or_else(|e| e.into_inner());
    registered.retain(|f| f.name != name);
    registered.push(udf);
    sluice_common::aggregate_names::register(&name);
    Ok(())
}

/// The registered aggregate function `name` (any case), if there is one.
pub(crate) fn registered_aggregate(name: &str) -> Option<&'static AggregateUdf> {
    let registered = AGGREGATES.lock().unwrap_or_else(|e| e.into_inner());
    registered
        .iter()
        .find(|f| f.name.eq_ignore_ascii_case(name))
        .copied()
}

/// Makes `udf` callable from every job's expressions in this process (a later
/// registration of the same name replaces the earlier one, and built-ins).
pub fn register_scalar(udf: ScalarUDF) {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    registered.retain(|f| f.name() != udf.name());
    registered.push(udf);
}

/// A scalar function `name(args...) -> returns` computed by `f` over whole columns
/// (every argument as an array of the batch's length). `f`'s error fails the job with
/// the message, prefixed by the function's name.
pub fn scalar_function(
    name: &str,
    args: Vec<DataType>,
    returns: DataType,
    f: impl Fn(&[ArrayRef]) -> Result<ArrayRef, String> + Send + Sync + 'static,
) -> ScalarUDF {
    let label = name.to_owned();
    create_udf(
        name,
        args,
        returns,
        Volatility::Immutable,
        Arc::new(move |values: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(values)?;
            f(&arrays).map(ColumnarValue::Array).map_err(|message| {
                datafusion::error::DataFusionError::Execution(format!("{label}: {message}"))
            })
        }),
    )
}

/// Installs Flink's built-ins and the registered functions into `ctx`.
pub(crate) fn install(ctx: &SessionContext) {
    for udf in builtins() {
        ctx.register_udf(udf);
    }
    let registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    for udf in registered.iter() {
        ctx.register_udf(udf.clone());
    }
    // DataFusion only parses and types the calls (one argument of any type, checked by
    // `AggregateCall::compile`); Sluice's accumulators compute them.
    let aggregates = AGGREGATES.lock().unwrap_or_else(|e| e.into_inner());
    for udf in aggregates.iter() {
        let state = Field::new("state", DataType::Float64, true);
        ctx.register_udaf(AggregateUDF::from(SimpleAggregateUDF::new_with_signature(
            &udf.name,
            Signature::any(1, Volatility::Immutable),
            udf.returns.clone(),
            Arc::new(|_| {
                datafusion::common::not_impl_err!(
                    "aggregate functions registered in Rust run in Sluice's operators"
                )
            }),
            vec![Arc::new(state)],
        )));
    }
}

/// Flink functions Nexmark's queries call that DataFusion lacks or spells otherwise.
fn builtins() -> Vec<ScalarUDF> {
    let ts = DataType::Timestamp(TimeUnit::Millisecond, None);
    vec![
        // REGEXP_EXTRACT(str, regex, group): the group of the first match, or null.
        scalar_function(
            "regexp_extract",
            vec![DataType::Utf8, DataType::Utf8, DataType::Int64],
            DataType::Utf8,
            regexp_extract,
        ),
        // SPLIT_INDEX(str, separator, i): the i-th (from 0) piece, or null.
        scalar_function(
            "split_index",
            vec![DataType::Utf8, DataType::Utf8, DataType::Int64],
            DataType::Utf8,
            split_index,
        ),
        // DATE_FORMAT(timestamp, 'yyyy-MM-dd HH:mm'): Flink's (Java's) pattern letters,
        // which replaces DataFusion's `date_format` alias of `to_char` (strftime's).
        scalar_function(
            "date_format",
            vec![ts.clone(), DataType::Utf8],
            DataType::Utf8,
            date_format,
        ),
        // HOUR(timestamp): the hour of the day, 0 to 23.
        scalar_function("hour", vec![ts], DataType::Int64, hour),
        // MOD(a, b): the remainder of a / b with a's sign (SQL's and Java's `%`); null
        // when b is 0.
        scalar_function(
            "mod",
            vec![DataType::Int64, DataType::Int64],
            DataType::Int64,
            modulo,
        ),
    ]
}

fn regexp_extract(args: &[ArrayRef]) -> Result<ArrayRef, String> {
    let (text, pattern) = (args[0].as_string::<i32>(), args[1].as_string::<i32>());
    let group = args[2].as_primitive::<Int64Type>();
    let mut compiled: Option<(String, regex::Regex)> = None;
    let mut out = StringBuilder::with_capacity(text.len(), text.len() * 8);
    for i in 0..text.len() {
        if text.is_null(i) || pattern.is_null(i) || group.is_null(i) {
            out.append_null();
            continue;
        }
        let p = pattern.value(i);
        if compiled.as_ref().is_none_or(|(text, _)| text != p) {
            let re = regex::Regex::new(p).map_err(|e| format!("bad regular expression: {e}"))?;
            compiled = Some((p.to_owned(), re));
        }
        let Some((_, re)) = &compiled else {
            continue;
        };
        let g = usize::try_from(group.value(i)).ok();
        let found = re
            .captures(text.value(i))
            .and_then(|c| g.and_then(|g| c.get(g)));
        out.append_option(found.map(|m| m.as_str()));
    }
    Ok(Arc::new(out.finish()))
}

fn split_index(args: &[ArrayRef]) -> Result<ArrayRef, String> {
    let (text, sep) = (args[0].as_string::<i32>(), args[1].as_string::<i32>());
    let index = args[2].as_primitive::<Int64Type>();
    let pieces: StringArray = (0..text.len())
        .map(|i| {
            if text.is_null(i) || sep.is_null(i) || index.is_null(i) || sep.value(i).is_empty() {
                return None;
            }
            let n = usize::try_from(index.value(i)).ok()?;
            text.value(i).split(sep.value(i)).nth(n)
        })
        .collect();
    Ok(Arc::new(pieces))
}

fn date_format(args: &[ArrayRef]) -> Result<ArrayRef, String> {
    let ts = args[0].as_primitive::<TimestampMillisecondType>();
    let pattern = args[1].as_string::<i32>();
    let mut compiled: Option<(String, String)> = None;
    let mut out = StringBuilder::with_capacity(ts.len(), ts.len() * 16);
    for i in 0..ts.len() {
        if ts.is_null(i) || pattern.is_null(i) {
            out.append_null();
            continue;
        }
        let p = pattern.value(i);
        if compiled.as_ref().is_none_or(|(java, _)| java != p) {
            compiled = Some((p.to_owned(), java_to_strftime(p)?));
        }
        let Some((_, format)) = &compiled else {
            continue;
        };
        let at = chrono::DateTime::from_timestamp_millis(ts.value(i))
            .ok_or_else(|| format!("timestamp {} ms is out of range", ts.value(i)))?;
        out.append_value(at.naive_utc().format(format).to_string());
    }
    Ok(Arc::new(out.finish()))
}

fn hour(args: &[ArrayRef]) -> Result<ArrayRef, String> {
    let ts = args[0].as_primitive::<TimestampMillisecondType>();
    let hours: arrow::array::Int64Array = ts
        .iter()
        .map(|t| t.map(|ms| ms.rem_euclid(86_400_000) / 3_600_000))
        .collect();
    Ok(Arc::new(hours))
}

fn modulo(args: &[ArrayRef]) -> Result<ArrayRef, String> {
    let (a, b) = (
        args[0].as_primitive::<Int64Type>(),
        args[1].as_primitive::<Int64Type>(),
    );
    let out: arrow::array::Int64Array = a
        .iter()
        .zip(b.iter())
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => a.checked_rem(b),
            _ => None,
        })
        .collect();
    Ok(Arc::new(out))
}

/// A Java date pattern (`yyyy-MM-dd HH:mm:ss.SSS`) as strftime, refusing letters it
/// does not know; text in single quotes is literal.
fn java_to_strftime(java: &str) -> Result<String, String> {
    let mut out = String::new();
    let chars: Vec<char> = java.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let run = chars[i..].iter().take_while(|&&d| d == c).count();
        match c {
            '\'' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&d| d == '\'')
                    .ok_or_else(|| format!("unclosed quote in date pattern `{java}`"))?;
                let literal: String = chars[i + 1..i + 1 + end].iter().collect();
                out.push_str(&if literal.is_empty() {
                    "'".to_owned()
                } else {
                    literal
                });
                i += end + 2;
                continue;
            }
            'y' if run == 2 => out.push_str("%y"),
            'y' => out.push_str("%Y"),
            'M' if run >= 4 => out.push_str("%B"),
            'M' if run == 3 => out.push_str("%b"),
            'M' => out.push_str("%m"),
            'd' => out.push_str("%d"),
            'H' => out.push_str("%H"),
            'h' => out.push_str("%I"),
            'm' => out.push_str("%M"),
            's' => out.push_str("%S"),
            'S' if matches!(run, 3 | 6 | 9) => out.push_str(&format!("%{run}f")),
            'S' => {
                return Err(format!(
                    "date pattern `{java}`: fractions of a second are SSS, SSSSSS or SSSSSSSSS"
                ));
            }
            'a' => out.push_str("%p"),
            'E' if run >= 4 => out.push_str("%A"),
            'E' => out.push_str("%a"),
            c if c.is_ascii_alphabetic() => {
                return Err(format!(
                    "date pattern letter `{c}` in `{java}` is not supported (yyyy MM dd HH hh \
                     mm ss SSS a E are)"
                ));
            }
            '%' => out.push_str("%%"),
            c => out.push(c),
        }
        i += if c.is_ascii_alphabetic() { run } else { 1 };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, TimestampMillisecondArray};

    use super::*;

    fn strings(values: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(values.to_vec()))
    }

    fn ints(v: i64, n: usize) -> ArrayRef {
        Arc::new(Int64Array::from(vec![v; n]))
    }

    fn texts(a: &ArrayRef) -> Vec<Option<String>> {
        a.as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_owned))
            .collect()
    }

    #[test]
    fn regexp_extract_takes_a_group_or_null() {
        let urls = strings(&[
            Some("https://x/item.htm?query=1&channel_id=7"),
            Some("https://x/item.htm?query=1"),
            None,
        ]);
        let re = strings(&[Some("(&|^)channel_id=([^&]*)"); 3]);
        let out = regexp_extract(&[urls, re, ints(2, 3)]).unwrap();
        assert_eq!(texts(&out), vec![Some("7".into()), None, None]);
        let bad = regexp_extract(&[strings(&[Some("a")]), strings(&[Some("(")]), ints(1, 1)]);
        assert!(bad.unwrap_err().contains("bad regular expression"));
    }

    #[test]
    fn mod_keeps_the_dividends_sign_and_is_null_for_zero() {
        let a: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![7, -7, 5, 3]));
        let b: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![3, 3, 0, i64::MAX]));
        let got = modulo(&[a, b]).unwrap();
        let got = got.as_primitive::<Int64Type>();
        assert_eq!(
            got.iter().collect::<Vec<_>>(),
            vec![Some(1), Some(-1), None, Some(3)]
        );
    }

    #[test]
    fn split_index_counts_from_zero() {
        let url = strings(&[Some("https://www.nexmark.com/apple/item.htm"), Some("a")]);
        let out = split_index(&[url, strings(&[Some("/"); 2]), ints(3, 2)]).unwrap();
        assert_eq!(texts(&out), vec![Some("apple".into()), None]);
    }

    #[test]
    fn date_format_speaks_java_patterns() {
        let ts: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![1_436_918_400_123]));
        let out = date_format(&[ts.clone(), strings(&[Some("yyyy-MM-dd HH:mm:ss.SSS")])]).unwrap();
        assert_eq!(texts(&out), vec![Some("2015-07-15 00:00:00.123".into())]);
        let out = date_format(&[ts.clone(), strings(&[Some("HH'h'mm")])]).unwrap();
        assert_eq!(texts(&out), vec![Some("00h00".into())]);
        let hours = hour(&[Arc::new(TimestampMillisecondArray::from(vec![
            1_436_918_400_123 + 13 * 3_600_000,
            -1,
        ]))])
        .unwrap();
        assert_eq!(
            hours.as_primitive::<Int64Type>().values().to_vec(),
            vec![13, 23]
        );
        let err = date_format(&[ts, strings(&[Some("yyyy-ww")])]).unwrap_err();
        assert!(err.contains("letter `w`"), "{err}");
    }
}
