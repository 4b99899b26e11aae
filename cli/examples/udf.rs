//! A `sluice` command with a user-defined function: Nexmark's `count_char(text, ch)`,
//! the number of times `ch` occurs in `text` (its q14). The program registers the
//! function and then is the `sluice` command, so `run`, `worker`, `coordinator` and the
//! worker processes it starts all know it:
//!
//! ```sh
//! cargo run -p sluice-cli --example udf -- run examples/nexmark/q14.sql --workers 2
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use arrow::datatypes::DataType;
use sluice_compute::expr::udf;

fn main() -> ExitCode {
    udf::register_scalar(udf::scalar_function(
        "count_char",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Int64,
        count_char,
    ));
    sluice_cli::main()
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
