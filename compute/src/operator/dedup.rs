//! `dedup`: the first record of every distinct key passes; later records with a key
//! already seen are dropped.
//!
//! # State
//! One table, `seen`: a row per key ever seen (an empty value) under the key's group.
//! Per batch the distinct keys of the batch are looked up in one read; a row passes when
//! its key is absent from the table and first in the batch, and the new keys go back in
//! one write. The table grows with the number of distinct keys, as Flink's deduplication
//! without a state TTL does.
//!
//! This operator is the proof of the state seam: it declares a table and reads and
//! writes it. Checkpoints, restores and rescales reach it through the runtime, which
//! seals its epochs; it has no barrier code of its own.

use std::collections::HashMap;

use arrow::array::UInt32Array;
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::key_group::key_group_of;
use sluice_common::pb;
use sluice_common::state::{StateTable, WriteOp};

use super::{Operator, OperatorContext, Output};
use crate::error::{Error, Result};
use crate::keys::{EncodedKeys, KeyEncoder};

const SEEN_STATE: &str = "seen";

/// Hashes short keys of one batch: keys come from the job's own data.
type Hasher = foldhash::fast::RandomState;

/// The dedup operator of one subtask.
pub struct DedupOperator {
    key_encoder: KeyEncoder,
    keys: EncodedKeys,
    seen: Option<StateTable>,
    max_parallelism: u32,
}

impl DedupOperator {
    /// Builds the operator over `input`; errors name a key column it lacks.
    pub fn build(spec: &pb::DedupSpec, input: &SchemaRef) -> Result<Self> {
        if spec.key_columns.is_empty() {
            return Err(Error::Plan("dedup needs at least one key column".into()));
        }
        Ok(Self {
            key_encoder: KeyEncoder::new(input, &spec.key_columns)?,
            keys: EncodedKeys::default(),
            seen: None,
            max_parallelism: sluice_common::DEFAULT_MAX_PARALLELISM,
        })
    }
}

#[async_trait]
impl Operator for DedupOperator {
    async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.max_parallelism = ctx.max_parallelism;
        self.seen = Some(ctx.keyed_state()?.table(SEEN_STATE));
        Ok(())
    }

    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let seen = self
            .seen
            .as_ref()
            .ok_or_else(|| Error::Internal("dedup used before `open`".into()))?;
        self.key_encoder.encode(&batch, &mut self.keys)?;
        // The first row of each distinct key in the batch.
        let mut first: HashMap<&[u8], u32, Hasher> = HashMap::default();
        let mut order: Vec<(&[u8], u32)> = Vec::new();
        for row in 0..batch.num_rows() {
            let key = self.keys.row(row);
            first.entry(key).or_insert_with(|| {
                order.push((key, row as u32));
                row as u32
            });
        }
        let state_keys: Vec<Bytes> = order
            .iter()
            .map(|(key, _)| seen.key(key_group_of(key, self.max_parallelism), key, &[]))
            .collect();
        let stored = seen.get_many(&state_keys).await?;
        let mut rows = Vec::new();
        let mut ops = Vec::new();
        for ((value, state_key), (_, row)) in stored.into_iter().zip(state_keys).zip(&order) {
            if value.is_none() {
                rows.push(*row);
                ops.push(WriteOp::Put {
                    key: state_key,
                    value: Bytes::new(),
                });
            }
        }
        seen.write(ops).await?;
        if rows.len() == batch.num_rows() {
            out.batch(batch);
        } else if !rows.is_empty() {
            rows.sort_unstable();
            out.batch(take_record_batch(&batch, &UInt32Array::from(rows))?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use sluice_common::key_group::key_group_range;
    use sluice_common::state::{MemoryStateStore, StateStore};

    use super::*;
    use crate::element::StreamElement;
    use crate::keyed::OperatorState;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]))
    }

    fn batch(rows: &[(i64, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    async fn dedup(
        store: Arc<dyn StateStore>,
        subtask: u32,
        parallelism: u32,
    ) -> (DedupOperator, OperatorState) {
        let spec = pb::DedupSpec {
            key_columns: vec!["k".into()],
        };
        let mut op = DedupOperator::build(&spec, &schema()).unwrap();
        let groups = key_group_range(128, parallelism, subtask);
        let state = OperatorState::new(store, 3, groups, 1, true);
        let ctx = OperatorContext {
            node_id: 3,
            node_name: "dedup".into(),
            subtask: subtask as usize,
            parallelism: parallelism as usize,
            max_parallelism: 128,
            state: Some(state.clone()),
        };
        op.open(&ctx).await.unwrap();
        (op, state)
    }

    fn values(out: &Output) -> Vec<(i64, i64)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let (k, v) = (
                    b.column(0).as_primitive::<Int64Type>(),
                    b.column(1).as_primitive::<Int64Type>(),
                );
                rows.extend((0..b.num_rows()).map(|r| (k.value(r), v.value(r))));
            }
        }
        rows
    }

    #[tokio::test]
    async fn only_the_first_record_of_a_key_passes() {
        let (mut op, _) = dedup(Arc::new(MemoryStateStore::new(false)), 0, 1).await;
        let mut out = Output::default();
        op.process_batch(batch(&[(1, 10), (2, 20), (1, 11)]), &mut out)
            .await
            .unwrap();
        op.process_batch(batch(&[(2, 21), (3, 30), (3, 31)]), &mut out)
            .await
            .unwrap();
        op.process_batch(batch(&[(1, 12)]), &mut out).await.unwrap();
        assert_eq!(values(&out), vec![(1, 10), (2, 20), (3, 30)]);
    }

    #[tokio::test]
    async fn keys_seen_before_a_restore_stay_seen_at_another_parallelism() {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new(true));
        let (mut op, state) = dedup(store.clone(), 0, 1).await;
        op.process_batch(batch(&[(1, 10), (2, 20)]), &mut Output::default())
            .await
            .unwrap();
        state.seal(1).await.unwrap();
        store.commit(1, &[1]).await.unwrap();
        // After the checkpoint, then lost.
        op.process_batch(batch(&[(3, 30)]), &mut Output::default())
            .await
            .unwrap();
        drop(op);
        store.restore(1, 2).await.unwrap();
        let mut out = Output::default();
        for subtask in 0..3 {
            let (mut op, _) = dedup(store.clone(), subtask, 3).await;
            let mine: Vec<_> = [(1, 11), (2, 21), (3, 31)]
                .into_iter()
                .filter(|(k, _)| {
                    let mut key = Vec::new();
                    sluice_common::key_group::push_i64(&mut key, Some(*k));
                    key_group_range(128, 3, subtask).contains(&u32::from(key_group_of(&key, 128)))
                })
                .collect();
            if !mine.is_empty() {
                op.process_batch(batch(&mine), &mut out).await.unwrap();
            }
        }
        assert_eq!(
            values(&out),
            vec![(3, 31)],
            "3 was seen only after the checkpoint"
        );
    }
}
