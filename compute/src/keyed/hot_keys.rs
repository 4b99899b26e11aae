//! The keys a keyed subtask sees most often, estimated from sampled batches: what
//! `sluice doctor` names when one subtask of a `key_by` takes most of the records.
//!
//! Every [`SAMPLE_EVERY`]th batch, up to [`ROWS_PER_SAMPLE`] of its encoded keys go
//! through a Space-Saving summary of [`COUNTERS`] counters (Metwally et al.): a tracked
//! key counts up; an untracked one takes over the smallest counter, plus one. A key
//! that makes up a share `s` of the sampled rows is tracked with a count of at least
//! `s` of them once `s` exceeds one over the number of counters. Keys are formatted
//! (`auction=7`) only when asked for.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::keys::EncodedKeys;

/// One batch in this many is sampled.
pub const SAMPLE_EVERY: u64 = 16;
/// Rows of a sampled batch that count.
pub const ROWS_PER_SAMPLE: usize = 1024;
/// Keys tracked.
pub const COUNTERS: usize = 16;

/// Turns an encoded key into text for people.
pub type KeyFormat = Box<dyn Fn(&[u8]) -> String + Send + Sync>;

/// Names keys encoded from `fields` as `name=value, ...`.
pub fn key_format(fields: Vec<arrow::datatypes::Field>) -> KeyFormat {
    Box::new(move |key| {
        let Ok(arrays) = crate::keys::decode_keys(&fields, std::iter::once(key)) else {
            return "(undecodable key)".into();
        };
        fields
            .iter()
            .zip(&arrays)
            .map(|(f, a)| {
                let v = arrow::util::display::array_value_to_string(a, 0)
                    .unwrap_or_else(|_| "?".into());
                format!("{}={v}", f.name())
            })
            .collect::<Vec<_>>()
            .join(", ")
    })
}

#[derive(Default)]
struct Summary {
    counters: Vec<(Vec<u8>, u64)>,
    sampled: u64,
}

/// The hottest keys of one keyed subtask.
pub struct HotKeys {
    batches: AtomicU64,
    summary: Mutex<Summary>,
    format: KeyFormat,
}

impl std::fmt::Debug for HotKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotKeys").finish_non_exhaustive()
    }
}

impl HotKeys {
    /// An empty summary whose keys `format` names.
    pub fn new(format: KeyFormat) -> Self {
        Self {
            batches: AtomicU64::new(0),
            summary: Mutex::default(),
            format,
        }
    }

    /// Takes note of a batch's keys (one batch in [`SAMPLE_EVERY`]).
    pub fn observe(&self, keys: &EncodedKeys) {
        if !self
            .batches
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SAMPLE_EVERY)
        {
            return;
        }
        let mut s = self.summary.lock().unwrap_or_else(|e| e.into_inner());
        let n = keys.len();
        let step = n.div_ceil(ROWS_PER_SAMPLE).max(1);
        for i in (0..n).step_by(step) {
            let key = keys.row(i);
            s.sampled += 1;
            if let Some(c) = s.counters.iter_mut().find(|(k, _)| k.as_slice() == key) {
                c.1 += 1;
            } else if s.counters.len() < COUNTERS {
                s.counters.push((key.to_vec(), 1));
            } else if let Some(min) = s.counters.iter_mut().min_by_key(|(_, c)| *c) {
                min.0.clear();
                min.0.extend_from_slice(key);
                min.1 += 1;
            }
        }
    }

    /// The `n` hottest keys with their estimated share of the records, hottest first.
    pub fn top(&self, n: usize) -> Vec<(String, f64)> {
        let s = self.summary.lock().unwrap_or_else(|e| e.into_inner());
        if s.sampled == 0 {
            return Vec::new();
        }
        let mut counters: Vec<&(Vec<u8>, u64)> = s.counters.iter().collect();
        counters.sort_by_key(|c| std::cmp::Reverse(c.1));
        counters
            .into_iter()
            .take(n)
            .map(|(k, c)| ((self.format)(k), *c as f64 / s.sampled as f64))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::*;
    use crate::keys::KeyEncoder;

    #[test]
    fn a_key_taking_most_records_comes_first_with_its_share() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "auction",
            DataType::Int64,
            false,
        )]));
        let encoder = KeyEncoder::new(&schema, &["auction".to_string()]).unwrap();
        let hot = HotKeys::new(key_format(encoder.fields().to_vec()));
        // 60% of the records are auction 7, the rest spread over 1000 others.
        let mut keys = crate::keys::EncodedKeys::default();
        for b in 0..(SAMPLE_EVERY * 20) as i64 {
            let values: Vec<i64> = (0..2000i64)
                .map(|i| {
                    if i % 5 < 3 {
                        7
                    } else {
                        1000 + (i * 7 + b) % 1000
                    }
                })
                .collect();
            let batch =
                RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(values))])
                    .unwrap();
            encoder.encode(&batch, &mut keys).unwrap();
            hot.observe(&keys);
        }
        let top = hot.top(3);
        assert_eq!(top[0].0, "auction=7", "{top:?}");
        assert!((top[0].1 - 0.6).abs() < 0.05, "{top:?}");
        assert!(top[1].1 < 0.2, "{top:?}");
    }

    #[test]
    fn nothing_sampled_names_nothing() {
        let hot = HotKeys::new(Box::new(|_| String::new()));
        assert!(hot.top(3).is_empty());
    }
}
