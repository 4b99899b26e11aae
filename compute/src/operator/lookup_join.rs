//! `lookup_join`: a processing-time temporal join with a bounded table, as Flink runs
//! `JOIN t FOR SYSTEM_TIME AS OF l.p_time` against a file table (a lookup join).
//!
//! Every subtask is given the whole table before its first record ([`load`]): the task
//! builder reads the table's source to its end. Each input row is then joined with the
//! table's rows of its key, in memory; input rows are not kept, and the operator keeps
//! no keyed state, so it runs chained to its input with no shuffle. The table does not
//! change while the job runs; a restarted task reads it again.
//!
//! Expressions, keys and output columns are compiled as an inner join's
//! ([`JoinOperator`]), with the table as its right side. This module knows nothing of
//! where the table's rows come from.
//!
//! [`load`]: LookupJoinOperator::load

use std::collections::HashMap;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_common::pb;

use super::join::{JoinOperator, key_nulls};
use super::{Operator, Output};
use crate::changelog;
use crate::error::{Error, Result};
use crate::expr::ExprCompiler;
use crate::keys::EncodedKeys;

/// Hashes the table's keys: they come from the job's own data.
type Hasher = foldhash::fast::RandomState;

/// The lookup join of one subtask.
pub struct LookupJoinOperator {
    join: JoinOperator,
    /// The table's rows (in the join's right-side row format) by key.
    table: HashMap<Box<[u8]>, Vec<Bytes>, Hasher>,
    /// Rows loaded, for messages.
    rows: usize,
    encoded: EncodedKeys,
}

impl LookupJoinOperator {
    /// The inner join with the table as its right side that `spec` compiles as.
    pub fn join_spec(spec: &pb::LookupJoinSpec) -> pb::JoinSpec {
        pb::JoinSpec {
            r#type: pb::JoinType::Inner as i32,
            left_alias: spec.left_alias.clone(),
            right_alias: spec.table_alias.clone(),
            left_keys: spec.left_keys.clone(),
            right_keys: spec.table_keys.clone(),
            condition: spec.condition.clone(),
            exprs: spec.exprs.clone(),
            ttl_ms: 0,
            interval: None,
            null_safe: false,
        }
    }

    /// Builds the join of `input` rows with a table of `table` rows (loaded later);
    /// errors are an inner join's, and an updating input is refused.
    pub fn build(
        spec: &pb::LookupJoinSpec,
        input: &SchemaRef,
        table: &SchemaRef,
        compiler: &ExprCompiler,
    ) -> Result<Self> {
        if changelog::is_changelog(input) {
            return Err(Error::Plan(
                "a lookup join needs append-only input, but this one reads an updating result"
                    .into(),
            ));
        }
        if spec.table.is_none() {
            return Err(Error::Plan("a lookup join needs its table".into()));
        }
        let join = JoinOperator::build(&Self::join_spec(spec), input, table, compiler)?;
        Ok(Self {
            join,
            table: HashMap::default(),
            rows: 0,
            encoded: EncodedKeys::default(),
        })
    }

    /// The schema of the batches this operator emits.
    pub fn schema(&self) -> SchemaRef {
        self.join.schema()
    }

    /// Adds rows of the table; a row whose key has a null matches nothing and is left
    /// out.
    pub fn load(&mut self, batch: &RecordBatch) -> Result<()> {
        let (keys, rows) = self.join.side_codecs(1);
        keys.encode(batch, &mut self.encoded)?;
        let converted = rows.convert_columns(batch.columns())?;
        let nulls = key_nulls(batch, keys)?;
        for row in 0..batch.num_rows() {
            if nulls.as_ref().is_some_and(|n| n[row]) {
                continue;
            }
            let key: Box<[u8]> = self.encoded.row(row).into();
            let value = Bytes::copy_from_slice(converted.row(row).data());
            self.table.entry(key).or_default().push(value);
            self.rows += 1;
        }
        Ok(())
    }

    /// Rows of the table loaded so far.
    pub fn table_rows(&self) -> usize {
        self.rows
    }
}

#[async_trait]
impl Operator for LookupJoinOperator {
    async fn process_batch(&mut self, batch: RecordBatch, out: &mut Output) -> Result<()> {
        let (keys, _) = self.join.side_codecs(0);
        keys.encode(&batch, &mut self.encoded)?;
        let nulls = key_nulls(&batch, keys)?;
        let mut this: Vec<u32> = Vec::new();
        let mut other: Vec<Bytes> = Vec::new();
        for row in 0..batch.num_rows() {
            if nulls.as_ref().is_some_and(|n| n[row]) {
                continue;
            }
            if let Some(matches) = self.table.get(self.encoded.row(row)) {
                for m in matches {
                    this.push(row as u32);
                    other.push(m.clone());
                }
            }
        }
        if this.is_empty() {
            return Ok(());
        }
        let joined = self.join.inner_pairs(&batch, this, &other)?;
        if joined.num_rows() > 0 {
            out.batch(joined);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;
    use crate::element::StreamElement;

    fn bids() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("auction", DataType::Int64, true),
            Field::new("price", DataType::Int64, false),
        ]))
    }

    fn table() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("key", DataType::Int64, true),
            Field::new("value", DataType::Utf8, false),
        ]))
    }

    fn spec(condition: Option<&str>) -> pb::LookupJoinSpec {
        let expr = |sql: &str| pb::Expr {
            sql: sql.into(),
            location: None,
        };
        pb::LookupJoinSpec {
            table: Some(pb::SourceSpec::default()),
            left_alias: "b".into(),
            table_alias: "s".into(),
            left_keys: vec!["auction".into()],
            table_keys: vec!["key".into()],
            condition: condition.map(expr),
            exprs: vec![expr("b.auction"), expr("b.price"), expr("s.value")],
        }
    }

    fn rows(out: &Output) -> Vec<(i64, i64, String)> {
        let mut rows = Vec::new();
        for e in &out.main {
            if let StreamElement::Batch(b) = e {
                let a = b.column(0).as_primitive::<Int64Type>();
                let p = b.column(1).as_primitive::<Int64Type>();
                let v = b.column(2).as_string::<i32>();
                rows.extend(
                    (0..b.num_rows()).map(|r| (a.value(r), p.value(r), v.value(r).to_owned())),
                );
            }
        }
        rows.sort();
        rows
    }

    #[tokio::test]
    async fn each_row_meets_the_tables_rows_of_its_key_and_is_not_kept() {
        let mut op =
            LookupJoinOperator::build(&spec(None), &bids(), &table(), &ExprCompiler::new())
                .unwrap();
        op.load(
            &RecordBatch::try_new(
                table(),
                vec![
                    Arc::new(Int64Array::from(vec![Some(1), Some(2), Some(2), None])),
                    Arc::new(StringArray::from(vec!["one", "two", "deux", "none"])),
                ],
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(op.table_rows(), 3, "the null key is left out");
        let mut out = Output::default();
        let batch = RecordBatch::try_new(
            bids(),
            vec![
                Arc::new(Int64Array::from(vec![Some(2), Some(3), None, Some(1)])),
                Arc::new(Int64Array::from(vec![10, 20, 30, 40])),
            ],
        )
        .unwrap();
        op.process_batch(batch.clone(), &mut out).await.unwrap();
        assert_eq!(
            rows(&out),
            vec![
                (1, 40, "one".to_owned()),
                (2, 10, "deux".to_owned()),
                (2, 10, "two".to_owned())
            ]
        );
        // Nothing of the first batch was kept: the same batch joins the same way again.
        let mut again = Output::default();
        op.process_batch(batch, &mut again).await.unwrap();
        assert_eq!(rows(&again), rows(&out));
    }

    #[tokio::test]
    async fn the_condition_filters_pairs_and_mistakes_are_named() {
        let mut op = LookupJoinOperator::build(
            &spec(Some("b.price > 15")),
            &bids(),
            &table(),
            &ExprCompiler::new(),
        )
        .unwrap();
        op.load(
            &RecordBatch::try_new(
                table(),
                vec![
                    Arc::new(Int64Array::from(vec![1])),
                    Arc::new(StringArray::from(vec!["one"])),
                ],
            )
            .unwrap(),
        )
        .unwrap();
        let mut out = Output::default();
        let batch = RecordBatch::try_new(
            bids(),
            vec![
                Arc::new(Int64Array::from(vec![1, 1])),
                Arc::new(Int64Array::from(vec![10, 20])),
            ],
        )
        .unwrap();
        op.process_batch(batch, &mut out).await.unwrap();
        assert_eq!(rows(&out), vec![(1, 20, "one".to_owned())]);

        let mut bad = spec(None);
        bad.table_keys = vec!["value".into()];
        let err = LookupJoinOperator::build(&bad, &bids(), &table(), &ExprCompiler::new())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("cannot be equal"), "{err}");
    }
}
