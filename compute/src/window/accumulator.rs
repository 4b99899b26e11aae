//! Incremental aggregate state: one fixed-size [`Acc`] per aggregate per window.
//!
//! A window keeps, per key and window, one `Acc` for each aggregate call. Rows of a batch
//! are first folded into partial accumulators (vectorized argument evaluation, one pass
//! over the rows), then merged into what keyed state holds, so state is touched once per
//! distinct key and window per batch rather than once per record. Every `Acc` encodes to
//! exactly [`ACC_BYTES`] bytes, which keeps state values small and fixed-size.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit};
use arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};
use crate::expr::aggregate::{AggFunc, AggregateCall, ArgKind};
use crate::expr::udf::{AggregateUdf, Number};

/// Bytes of one encoded [`Acc`].
pub const ACC_BYTES: usize = 24;

/// Running state of one aggregate: an integer, a float and a count, used per function.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Acc {
    /// Integer sum, min or max.
    pub i: i64,
    /// Float sum, min or max.
    pub f: f64,
    /// Values seen (rows for `count(*)`).
    pub n: i64,
}

/// An aggregate call's argument evaluated on one batch.
#[derive(Debug)]
pub enum ArgValues {
    /// `count(*)`: no argument.
    None,
    /// Integer or timestamp values.
    Int(Int64Array),
    /// Float values.
    Float(Float64Array),
}

/// Evaluates each call's argument on `batch`, converted to the form accumulators read.
pub fn evaluate_args(calls: &[AggregateCall], batch: &RecordBatch) -> Result<Vec<ArgValues>> {
    calls
        .iter()
        .map(|call| {
            let Some(arg) = &call.arg else {
                return Ok(ArgValues::None);
            };
            let values = arg.evaluate(batch)?;
            Ok(match call.arg_kind {
                _ if matches!(call.func, AggFunc::Count) => {
                    // Only validity matters for count(x).
                    let nulls = values.logical_nulls();
                    let ones = Int64Array::new(vec![1i64; values.len()].into(), nulls);
                    ArgValues::Int(ones)
                }
                ArgKind::Int => ArgValues::Int(to_i64(&values)?),
                ArgKind::TimestampMs => {
                    let ms = cast(&values, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
                    ArgValues::Int(to_i64(&ms)?)
                }
                ArgKind::Float => ArgValues::Float(
                    cast(&values, &DataType::Float64)?
                        .as_primitive::<Float64Type>()
                        .clone(),
                ),
            })
        })
        .collect()
}

fn to_i64(values: &ArrayRef) -> Result<Int64Array> {
    Ok(cast(values, &DataType::Int64)?
        .as_primitive::<Int64Type>()
        .clone())
}

/// Folds row `row` of `arg` into `acc` for `func`.
#[inline]
pub fn update(func: AggFunc, acc: &mut Acc, arg: &ArgValues, row: usize) {
    match (func, arg) {
        (AggFunc::CountStar, _) => acc.n += 1,
        (_, ArgValues::None) => {}
        (_, ArgValues::Int(a)) => {
            if a.is_null(row) {
                return;
            }
            let v = a.value(row);
            match func {
                AggFunc::Count => {}
                AggFunc::Udf(udf) => udf.function.update(acc, Number::Int(v)),
                AggFunc::Sum => acc.i = acc.i.wrapping_add(v),
                AggFunc::Avg => acc.f += v as f64,
                AggFunc::Min => acc.i = if acc.n == 0 { v } else { acc.i.min(v) },
                AggFunc::Max => acc.i = if acc.n == 0 { v } else { acc.i.max(v) },
                AggFunc::CountStar => {}
            }
            acc.n += 1;
        }
        (_, ArgValues::Float(a)) => {
            if a.is_null(row) {
                return;
            }
            let v = a.value(row);
            match func {
                AggFunc::Count => {}
                AggFunc::Udf(udf) => udf.function.update(acc, Number::Float(v)),
                AggFunc::Sum | AggFunc::Avg => acc.f += v,
                AggFunc::Min => acc.f = if acc.n == 0 { v } else { acc.f.min(v) },
                AggFunc::Max => acc.f = if acc.n == 0 { v } else { acc.f.max(v) },
                AggFunc::CountStar => {}
            }
            acc.n += 1;
        }
    }
}

/// Merges `other` into `acc` (both for `func` over `kind`).
#[inline]
pub fn merge(func: AggFunc, kind: ArgKind, acc: &mut Acc, other: &Acc) {
    if other.n == 0 {
        return;
    }
    let float = kind == ArgKind::Float;
    match func {
        AggFunc::CountStar | AggFunc::Count => {}
        AggFunc::Udf(udf) => udf.function.merge(acc, other),
        AggFunc::Sum if float => acc.f += other.f,
        AggFunc::Sum => acc.i = acc.i.wrapping_add(other.i),
        AggFunc::Avg => acc.f += other.f,
        AggFunc::Min if float => {
            acc.f = if acc.n == 0 {
                other.f
            } else {
                acc.f.min(other.f)
            }
        }
        AggFunc::Min => {
            acc.i = if acc.n == 0 {
                other.i
            } else {
                acc.i.min(other.i)
            }
        }
        AggFunc::Max if float => {
            acc.f = if acc.n == 0 {
                other.f
            } else {
                acc.f.max(other.f)
            }
        }
        AggFunc::Max => {
            acc.i = if acc.n == 0 {
                other.i
            } else {
                acc.i.max(other.i)
            }
        }
    }
    acc.n += other.n;
}

/// Adds (`sign` 1) or takes away (`sign` -1) row `row` of `arg` for a `count`, `sum`
/// or `avg` over an updating input, where each is a plain sum that can go down again.
#[inline]
pub fn update_signed(func: AggFunc, acc: &mut Acc, arg: &ArgValues, row: usize, sign: i64) {
    match (func, arg) {
        (AggFunc::CountStar, _) => acc.n += sign,
        (_, ArgValues::None) => {}
        (_, ArgValues::Int(a)) => {
            if a.is_null(row) {
                return;
            }
            let v = a.value(row);
            match func {
                AggFunc::Sum => acc.i = acc.i.wrapping_add(v.wrapping_mul(sign)),
                AggFunc::Avg => acc.f += (sign * v) as f64,
                AggFunc::Udf(udf) => udf_signed(udf, acc, Number::Int(v), sign),
                _ => {}
            }
            acc.n += sign;
        }
        (_, ArgValues::Float(a)) => {
            if a.is_null(row) {
                return;
            }
            match func {
                AggFunc::Sum | AggFunc::Avg => acc.f += sign as f64 * a.value(row),
                AggFunc::Udf(udf) => udf_signed(udf, acc, Number::Float(a.value(row)), sign),
                _ => {}
            }
            acc.n += sign;
        }
    }
}

/// A registered function's update (`sign` 1) or retraction (-1) of `value`.
fn udf_signed(udf: &AggregateUdf, acc: &mut Acc, value: Number, sign: i64) {
    match sign > 0 {
        true => udf.function.update(acc, value),
        false => udf.function.retract(acc, value),
    }
}

/// Adds the signed sums of `other` to `acc` (see [`update_signed`]).
#[inline]
pub fn merge_signed(acc: &mut Acc, other: &Acc) {
    acc.i = acc.i.wrapping_add(other.i);
    acc.f += other.f;
    acc.n += other.n;
}

/// Row `row` of `arg` as a `u64` whose unsigned order is the values' order (for keeping
/// values sorted in state); `None` for a null.
#[inline]
pub fn ordered(arg: &ArgValues, row: usize) -> Option<u64> {
    match arg {
        ArgValues::None => None,
        ArgValues::Int(a) => (!a.is_null(row)).then(|| (a.value(row) as u64) ^ (1 << 63)),
        ArgValues::Float(a) => (!a.is_null(row)).then(|| {
            let bits = a.value(row).to_bits();
            if bits >> 63 == 1 {
                !bits
            } else {
                bits | (1 << 63)
            }
        }),
    }
}

/// The value of `acc` (a `min` or `max`) as [`ordered`] writes it.
pub fn ordered_value(acc: &Acc, float: bool) -> u64 {
    if float {
        let bits = acc.f.to_bits();
        if bits >> 63 == 1 {
            !bits
        } else {
            bits | (1 << 63)
        }
    } else {
        (acc.i as u64) ^ (1 << 63)
    }
}

/// Sets the value of `acc` (a `min` or `max`) from its [`ordered`] form.
pub fn set_ordered(acc: &mut Acc, ordered: u64, float: bool) {
    if float {
        let bits = if ordered >> 63 == 1 {
            ordered & !(1 << 63)
        } else {
            !ordered
        };
        acc.f = f64::from_bits(bits);
    } else {
        acc.i = (ordered ^ (1 << 63)) as i64;
    }
}

/// Appends the encoding of `accs` to `out`.
pub fn encode(accs: &[Acc], out: &mut Vec<u8>) {
    for a in accs {
        out.extend_from_slice(&a.i.to_be_bytes());
        out.extend_from_slice(&a.f.to_bits().to_be_bytes());
        out.extend_from_slice(&a.n.to_be_bytes());
    }
}

/// Decodes `count` accumulators from the front of `bytes`.
pub fn decode(bytes: &[u8], count: usize, out: &mut Vec<Acc>) -> Result<()> {
    if bytes.len() < count * ACC_BYTES {
        return Err(Error::Internal(format!(
            "window state holds {} bytes, expected {}",
            bytes.len(),
            count * ACC_BYTES
        )));
    }
    out.extend(bytes.chunks_exact(ACC_BYTES).take(count).map(|c| {
        let word = |i: usize| <[u8; 8]>::try_from(&c[i * 8..i * 8 + 8]).unwrap_or_default();
        Acc {
            i: i64::from_be_bytes(word(0)),
            f: f64::from_bits(u64::from_be_bytes(word(1))),
            n: i64::from_be_bytes(word(2)),
        }
    }));
    Ok(())
}

/// The result column of `call` over the accumulators of several windows.
pub fn finish<'a>(call: &AggregateCall, accs: impl Iterator<Item = &'a Acc>) -> Result<ArrayRef> {
    let float = call.arg_kind == ArgKind::Float;
    let array: ArrayRef = match call.func {
        AggFunc::CountStar | AggFunc::Count => Arc::new(accs.map(|a| a.n).collect::<Int64Array>()),
        AggFunc::Avg => Arc::new(
            accs.map(|a| (a.n > 0).then(|| a.f / a.n as f64))
                .collect::<Float64Array>(),
        ),
        AggFunc::Sum | AggFunc::Min | AggFunc::Max if float => Arc::new(
            accs.map(|a| (a.n > 0).then_some(a.f))
                .collect::<Float64Array>(),
        ),
        AggFunc::Sum | AggFunc::Min | AggFunc::Max => Arc::new(
            accs.map(|a| (a.n > 0).then_some(a.i))
                .collect::<Int64Array>(),
        ),
        AggFunc::Udf(udf) => {
            let results = accs.map(|a| (a.n > 0).then(|| udf.function.finish(a)));
            match udf.returns {
                DataType::Int64 => Arc::new(
                    results
                        .map(|r| r.map(Number::as_i64))
                        .collect::<Int64Array>(),
                ),
                _ => Arc::new(
                    results
                        .map(|r| r.map(Number::as_f64))
                        .collect::<Float64Array>(),
                ),
            }
        }
    };
    if array.data_type() == &call.output_type {
        Ok(array)
    } else {
        Ok(cast(&array, &call.output_type)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partials_merge_to_the_whole() {
        let values = Int64Array::from(vec![Some(5), None, Some(-2), Some(9)]);
        let arg = ArgValues::Int(values);
        for func in [
            AggFunc::Sum,
            AggFunc::Min,
            AggFunc::Max,
            AggFunc::Count,
            AggFunc::Avg,
        ] {
            let mut whole = Acc::default();
            (0..4).for_each(|r| update(func, &mut whole, &arg, r));
            let (mut a, mut b) = (Acc::default(), Acc::default());
            (0..2).for_each(|r| update(func, &mut a, &arg, r));
            (2..4).for_each(|r| update(func, &mut b, &arg, r));
            merge(func, ArgKind::Int, &mut a, &b);
            assert_eq!(a, whole, "{func:?}");
        }
    }

    /// The sum of squares, in `acc.i`.
    struct SumOfSquares;

    impl crate::expr::udf::AggregateFunction for SumOfSquares {
        fn update(&self, acc: &mut Acc, value: Number) {
            acc.i += value.as_i64() * value.as_i64();
        }
        fn merge(&self, acc: &mut Acc, other: &Acc) {
            acc.i += other.i;
        }
        fn finish(&self, acc: &Acc) -> Number {
            Number::Int(acc.i)
        }
        fn retracts(&self) -> bool {
            true
        }
        fn retract(&self, acc: &mut Acc, value: Number) {
            acc.i -= value.as_i64() * value.as_i64();
        }
    }

    #[test]
    fn a_registered_aggregate_folds_merges_and_finishes() {
        use arrow::datatypes::{Field, Schema};
        crate::expr::udf::register_aggregate("sum_sq_test", DataType::Int64, SumOfSquares).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let compiler = crate::expr::ExprCompiler::new();
        let call = AggregateCall::compile(&compiler, "SUM_SQ_TEST(x) AS s", &schema).unwrap();
        assert!(matches!(call.func, AggFunc::Udf(u) if u.name == "sum_sq_test"));
        assert_eq!(call.output_type, DataType::Int64);
        let values = Int64Array::from(vec![Some(3), None, Some(-2), Some(5)]);
        let arg = ArgValues::Int(values);
        let mut whole = Acc::default();
        (0..4).for_each(|r| update(call.func, &mut whole, &arg, r));
        let (mut a, mut b) = (Acc::default(), Acc::default());
        (0..2).for_each(|r| update(call.func, &mut a, &arg, r));
        (2..4).for_each(|r| update(call.func, &mut b, &arg, r));
        merge(call.func, call.arg_kind, &mut a, &b);
        assert_eq!((a, whole.i, whole.n), (whole, 38, 3), "nulls are skipped");
        let empty = Acc::default();
        let out = finish(&call, [whole, empty].iter()).unwrap();
        let out = out.as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(out.iter().collect::<Vec<_>>(), [Some(38), None]);
        for (sql, needle) in [
            ("sum_sq_test(DISTINCT x)", "DISTINCT"),
            (
                "sum_sq_test(CAST(x AS VARCHAR))",
                "cannot compute sum_sq_test",
            ),
        ] {
            let err = AggregateCall::compile(&compiler, sql, &schema).unwrap_err();
            assert!(err.to_string().contains(needle), "{sql}: {err}");
        }
        // Over an updating input a value taken back leaves the state as it came.
        let mut signed = Acc::default();
        (0..4).for_each(|r| update_signed(call.func, &mut signed, &arg, r, 1));
        update_signed(call.func, &mut signed, &arg, 3, -1);
        assert_eq!((signed.i, signed.n), (13, 2));
        let wrong = crate::expr::udf::register_aggregate("bad", DataType::Utf8, SumOfSquares);
        assert!(wrong.unwrap_err().contains("Int64 or Float64"));
    }

    #[test]
    fn ordered_values_sort_as_the_values_and_round_trip() {
        let ints = Int64Array::from(vec![i64::MIN, -5, 0, 3, i64::MAX]);
        let floats = Float64Array::from(vec![f64::NEG_INFINITY, -2.5, -0.0, 0.5, 1e300]);
        for (arg, float) in [
            (ArgValues::Int(ints), false),
            (ArgValues::Float(floats), true),
        ] {
            let keys: Vec<u64> = (0..5).map(|r| ordered(&arg, r).unwrap()).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
            for (r, &k) in keys.iter().enumerate() {
                let mut acc = Acc::default();
                set_ordered(&mut acc, k, float);
                assert_eq!(ordered_value(&acc, float), k, "row {r}");
            }
        }
        assert_eq!(
            ordered(&ArgValues::Int(Int64Array::from(vec![None])), 0),
            None
        );
    }

    #[test]
    fn signed_sums_go_back_down() {
        let arg = ArgValues::Int(Int64Array::from(vec![Some(5), None, Some(7)]));
        let mut acc = Acc::default();
        update_signed(AggFunc::Sum, &mut acc, &arg, 0, 1);
        update_signed(AggFunc::Sum, &mut acc, &arg, 2, 1);
        update_signed(AggFunc::Sum, &mut acc, &arg, 1, -1);
        update_signed(AggFunc::Sum, &mut acc, &arg, 0, -1);
        assert_eq!((acc.i, acc.n), (7, 1));
        let mut whole = Acc::default();
        merge_signed(&mut whole, &acc);
        merge_signed(&mut whole, &acc);
        assert_eq!((whole.i, whole.n), (14, 2));
    }

    #[test]
    fn encoding_round_trips() {
        let accs = [
            Acc {
                i: -3,
                f: 2.5,
                n: 7,
            },
            Acc {
                i: i64::MAX,
                f: -0.0,
                n: 0,
            },
        ];
        let mut buf = Vec::new();
        encode(&accs, &mut buf);
        assert_eq!(buf.len(), 2 * ACC_BYTES);
        let mut back = Vec::new();
        decode(&buf, 2, &mut back).unwrap();
        assert_eq!(back, accs);
        assert!(decode(&buf[..10], 1, &mut back).is_err());
    }
}
