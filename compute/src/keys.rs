//! Canonical key bytes of Arrow rows, and back (DESIGN §4).
//!
//! [`KeyEncoder`] turns the key columns of every row of a batch into the canonical bytes
//! that `sluice_common::key_group` defines and hashes, in one contiguous buffer, so the
//! hash partitioner and keyed operators agree on keys without per-row allocations.
//! [`decode_keys`] rebuilds key columns from canonical bytes, which is how a window puts
//! its key back into its results.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanBuilder, Float64Builder, Int64Builder,
    StringBuilder,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, SchemaRef};
use arrow::record_batch::RecordBatch;
use sluice_common::key_group;

use crate::error::{Error, Result};

/// How one key column is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Int,
    Float,
    Bool,
    Str,
    Bin,
}

fn kind_of(dt: &DataType) -> Option<KeyKind> {
    use DataType::*;
    Some(match dt {
        Int8
        | Int16
        | Int32
        | Int64
        | UInt8
        | UInt16
        | UInt32
        | UInt64
        | Date32
        | Date64
        | Timestamp(_, _)
        | Time32(_)
        | Time64(_)
        | Duration(_) => KeyKind::Int,
        Float16 | Float32 | Float64 => KeyKind::Float,
        Boolean => KeyKind::Bool,
        Utf8 | LargeUtf8 | Utf8View => KeyKind::Str,
        Binary | LargeBinary | BinaryView => KeyKind::Bin,
        _ => return None,
    })
}

/// Canonical key bytes of each row of one batch.
#[derive(Debug, Default)]
pub struct EncodedKeys {
    data: Vec<u8>,
    offsets: Vec<usize>,
}

impl EncodedKeys {
    /// Row `i`'s canonical bytes.
    #[inline]
    pub fn row(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i]..self.offsets[i + 1]]
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// True when no rows were encoded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Encodes the key columns of batches of one schema.
#[derive(Debug, Clone)]
pub struct KeyEncoder {
    columns: Vec<(usize, KeyKind)>,
    fields: Vec<Field>,
}

impl KeyEncoder {
    /// An encoder for `key_columns` of `schema`; errors name an unknown or unsupported column.
    pub fn new(schema: &SchemaRef, key_columns: &[String]) -> Result<Self> {
        let mut columns = Vec::with_capacity(key_columns.len());
        let mut fields = Vec::with_capacity(key_columns.len());
        for name in key_columns {
            let idx = schema.index_of(name).map_err(|_| {
                let known: Vec<_> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                Error::Plan(format!(
                    "key column `{name}` does not exist; the input has columns {}",
                    known.join(", ")
                ))
            })?;
            let field = schema.field(idx);
            let kind = kind_of(field.data_type()).ok_or_else(|| {
                Error::Plan(format!(
                    "key column `{name}` has type {}, which cannot be a key",
                    field.data_type()
                ))
            })?;
            columns.push((idx, kind));
            fields.push(field.clone());
        }
        Ok(Self { columns, fields })
    }

    /// Whether keys of `other` encode alike for equal values (integers of any width are
    /// one kind, as are strings): what lets two join sides' keys meet.
    pub fn comparable(&self, other: &KeyEncoder) -> bool {
        self.columns.len() == other.columns.len()
            && self
                .columns
                .iter()
                .zip(&other.columns)
                .all(|((_, a), (_, b))| a == b)
    }

    /// The key columns' fields, in key order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Encodes every row of `batch` into `out` (reusing its buffers).
    pub fn encode(&self, batch: &RecordBatch, out: &mut EncodedKeys) -> Result<()> {
        let n = batch.num_rows();
        out.data.clear();
        out.offsets.clear();
        out.offsets.reserve(n + 1);
        if self.columns.is_empty() {
            out.offsets.resize(n + 1, 0);
            return Ok(());
        }
        // Widen each column once, then write row by row so a row's parts are adjacent.
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|&(i, kind)| widen(batch.column(i), kind))
            .collect::<Result<_>>()?;
        let columns: Vec<Column<'_>> = arrays
            .iter()
            .zip(&self.columns)
            .map(|(a, &(_, kind))| match kind {
                KeyKind::Int => Column::Int(a.as_primitive::<Int64Type>()),
                KeyKind::Float => Column::Float(a.as_primitive::<Float64Type>()),
                KeyKind::Bool => Column::Bool(a.as_boolean()),
                KeyKind::Str => Column::Str(a.as_string::<i32>()),
                KeyKind::Bin => Column::Bin(a.as_binary::<i32>()),
            })
            .collect();
        out.offsets.push(0);
        if let [Column::Int(ints)] = columns.as_slice()
            && ints.null_count() == 0
        {
            // One integer key without nulls, the common case: fixed-width rows.
            out.data.reserve(n * 9);
            for &v in ints.values() {
                out.data.push(1);
                out.data.extend_from_slice(&v.to_be_bytes());
                out.offsets.push(out.data.len());
            }
            return Ok(());
        }
        for row in 0..n {
            for column in &columns {
                match column {
                    Column::Int(a) => {
                        key_group::push_i64(&mut out.data, a.is_valid(row).then(|| a.value(row)))
                    }
                    Column::Float(a) => {
                        key_group::push_f64(&mut out.data, a.is_valid(row).then(|| a.value(row)))
                    }
                    Column::Bool(a) => {
                        key_group::push_bool(&mut out.data, a.is_valid(row).then(|| a.value(row)))
                    }
                    Column::Str(a) => key_group::push_bytes(
                        &mut out.data,
                        a.is_valid(row).then(|| a.value(row).as_bytes()),
                    ),
                    Column::Bin(a) => {
                        key_group::push_bytes(&mut out.data, a.is_valid(row).then(|| a.value(row)))
                    }
                }
            }
            out.offsets.push(out.data.len());
        }
        Ok(())
    }
}

/// A key column, downcast once per batch.
enum Column<'a> {
    Int(&'a arrow::array::Int64Array),
    Float(&'a arrow::array::Float64Array),
    Bool(&'a arrow::array::BooleanArray),
    Str(&'a arrow::array::StringArray),
    Bin(&'a arrow::array::BinaryArray),
}

fn widen(array: &ArrayRef, kind: KeyKind) -> Result<ArrayRef> {
    let target = match kind {
        KeyKind::Int => DataType::Int64,
        KeyKind::Float => DataType::Float64,
        KeyKind::Bool => return Ok(array.clone()),
        KeyKind::Str => DataType::Utf8,
        KeyKind::Bin => DataType::Binary,
    };
    if array.data_type() == &target {
        Ok(array.clone())
    } else {
        Ok(cast(array, &target)?)
    }
}

/// Rebuilds key columns (typed as `fields`) from canonical key bytes.
pub fn decode_keys<'a>(
    fields: &[Field],
    keys: impl ExactSizeIterator<Item = &'a [u8]> + Clone,
) -> Result<Vec<ArrayRef>> {
    let mut columns = Vec::with_capacity(fields.len());
    let n = keys.len();
    let mut positions = vec![0usize; n];
    for field in fields {
        let kind = kind_of(field.data_type())
            .ok_or_else(|| Error::Internal(format!("key type {}", field.data_type())))?;
        let corrupt = || Error::Internal(format!("corrupt key bytes for column {}", field.name()));
        let array: ArrayRef = match kind {
            KeyKind::Int | KeyKind::Float => {
                let mut ints = Int64Builder::with_capacity(n);
                let mut floats = Float64Builder::with_capacity(n);
                for (key, pos) in keys.clone().zip(positions.iter_mut()) {
                    let (present, value) = read_fixed(key, pos, 8).ok_or_else(corrupt)?;
                    let bits = value.map(|v| u64::from_be_bytes(v.try_into().unwrap_or([0; 8])));
                    let _ = present;
                    match kind {
                        KeyKind::Int => ints.append_option(bits.map(|b| b as i64)),
                        _ => floats.append_option(bits.map(f64::from_bits)),
                    }
                }
                let wide: ArrayRef = if kind == KeyKind::Int {
                    Arc::new(ints.finish())
                } else {
                    Arc::new(floats.finish())
                };
                cast(&wide, field.data_type())?
            }
            KeyKind::Bool => {
                let mut b = BooleanBuilder::with_capacity(n);
                for (key, pos) in keys.clone().zip(positions.iter_mut()) {
                    let (_, value) = read_fixed(key, pos, 1).ok_or_else(corrupt)?;
                    b.append_option(value.map(|v| v[0] != 0));
                }
                Arc::new(b.finish())
            }
            KeyKind::Str | KeyKind::Bin => {
                let mut strings = StringBuilder::new();
                let mut binaries = BinaryBuilder::new();
                for (key, pos) in keys.clone().zip(positions.iter_mut()) {
                    let value = read_var(key, pos).ok_or_else(corrupt)?;
                    if kind == KeyKind::Str {
                        let s = value
                            .map(std::str::from_utf8)
                            .transpose()
                            .map_err(|_| corrupt())?;
                        strings.append_option(s);
                    } else {
                        binaries.append_option(value);
                    }
                }
                let wide: ArrayRef = if kind == KeyKind::Str {
                    Arc::new(strings.finish())
                } else {
                    Arc::new(binaries.finish())
                };
                cast(&wide, field.data_type())?
            }
        };
        columns.push(array);
    }
    Ok(columns)
}

fn read_fixed<'k>(
    key: &'k [u8],
    pos: &mut usize,
    width: usize,
) -> Option<(bool, Option<&'k [u8]>)> {
    let tag = *key.get(*pos)?;
    *pos += 1;
    if tag == 0 {
        return Some((false, None));
    }
    let v = key.get(*pos..*pos + width)?;
    *pos += width;
    Some((true, Some(v)))
}

fn read_var<'k>(key: &'k [u8], pos: &mut usize) -> Option<Option<&'k [u8]>> {
    let tag = *key.get(*pos)?;
    *pos += 1;
    if tag == 0 {
        return Some(None);
    }
    let len = u32::from_be_bytes(key.get(*pos..*pos + 4)?.try_into().ok()?) as usize;
    *pos += 4;
    let v = key.get(*pos..*pos + len)?;
    *pos += len;
    Some(Some(v))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int32Array, StringArray};
    use arrow::datatypes::Schema;

    use super::*;

    #[test]
    fn round_trips_mixed_keys_with_nulls() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int32Array::from(vec![Some(1), None, Some(-7)])),
                Arc::new(StringArray::from(vec![Some("x"), Some(""), None])),
            ],
        )
        .unwrap();
        let enc = KeyEncoder::new(&schema, &["s".into(), "a".into()]).unwrap();
        let mut keys = EncodedKeys::default();
        enc.encode(&batch, &mut keys).unwrap();
        assert_eq!(keys.len(), 3);
        let cols = decode_keys(enc.fields(), (0..3).map(|i| keys.row(i))).unwrap();
        assert_eq!(cols[0].as_ref(), batch.column(1).as_ref());
        assert_eq!(cols[1].as_ref(), batch.column(0).as_ref());
    }

    #[test]
    fn int32_and_int64_keys_agree() {
        // The canonical encoding widens integers, so the same value lands in the same group.
        let s32 = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        let s64 = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let b32 =
            RecordBatch::try_new(s32.clone(), vec![Arc::new(Int32Array::from(vec![5]))]).unwrap();
        let b64 = RecordBatch::try_new(
            s64.clone(),
            vec![Arc::new(arrow::array::Int64Array::from(vec![5i64]))],
        )
        .unwrap();
        let (mut k1, mut k2) = (EncodedKeys::default(), EncodedKeys::default());
        KeyEncoder::new(&s32, &["k".into()])
            .unwrap()
            .encode(&b32, &mut k1)
            .unwrap();
        KeyEncoder::new(&s64, &["k".into()])
            .unwrap()
            .encode(&b64, &mut k2)
            .unwrap();
        assert_eq!(k1.row(0), k2.row(0));
    }

    #[test]
    fn unknown_column_names_the_column() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let err = KeyEncoder::new(&schema, &["b".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`b`") && err.contains("a"), "{err}");
    }
}
