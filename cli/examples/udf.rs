//! A `sluice` command with user-defined functions: Nexmark's `count_char(text, ch)`, the
//! number of times `ch` occurs in `text` (its q14), and the aggregate `geomean(x)`, the
//! geometric mean of positive values. The program registers the functions and then is
//! the `sluice` command, so `run`, `worker`, `coordinator` and the worker processes it
//! starts all know them:
//!
//! ```sh
//! cargo run -p sluice-cli --example udf -- run examples/nexmark/q14.sql --workers 2
//! cargo run -p sluice-cli --example udf -- run examples/sql/geomean-price.sql
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use arrow::datatypes::DataType;
use sluice_compute::expr::udf::{self, Acc, AggregateFunction, Number};

fn main() -> ExitCode {
    udf::register_scalar(udf::scalar_function(
        "count_char",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Int64,
        count_char,
    ));
    if let Err(e) = udf::register_aggregate("geomean", DataType::Float64, GeoMean) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    sluice_cli::main()
}

/// The geometric mean of positive values: the mean of their logarithms (in `acc.f`)
/// raised again. A value of 0 or less makes it NaN, as DuckDB's `geomean` does.
struct GeoMean;

impl AggregateFunction for GeoMean {
    fn update(&self, acc: &mut Acc, value: Number) {
        acc.f += value.as_f64().ln();
    }

    fn merge(&self, acc: &mut Acc, other: &Acc) {
        acc.f += other.f;
    }

    fn finish(&self, acc: &Acc) -> Number {
        Number::Float((acc.f / acc.n as f64).exp())
    }

    // Its state is a sum of logarithms: a value leaves it as it came in.
    fn retracts(&self) -> bool {
        true
    }

    fn retract(&self, acc: &mut Acc, value: Number) {
        acc.f -= value.as_f64().ln();
    }
}

fn count_char(args: &[ArrayRef]) -> Result<ArrayRef, String> {
    let (text, ch) = (args[0].as_string::<i32>(), args[1].as_string::<i32>());
    let mut counts = Vec::with_capacity(text.len());
    for i in 0..text.len() {
        if text.is_null(i) || ch.is_null(i) {
            counts.push(None);
            continue;
        }
        let mut chars = ch.value(i).chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            return Err(format!(
                "the second argument must be one character, found {:?}",
                ch.value(i)
            ));
        };
        counts.push(Some(
            text.value(i).chars().filter(|&t| t == c).count() as i64
        ));
    }
    Ok(Arc::new(Int64Array::from(counts)))
}
