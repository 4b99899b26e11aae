//! The state an operator holds: named tables of rows keyed by (key group, key,
//! namespace), over its subtask's backend.
//!
//! A [`StateTable`] fixes the operator and the state name, so an operator only ever
//! names a key group, its key's canonical bytes and a namespace (a window, a timer),
//! and builds the layout of DESIGN §4 through [`key`](super::key). Reads and writes are
//! batched as the backend's are; scans run over one key group, which is how a subtask
//! finds what it owns after a restore at any parallelism. The table knows nothing of
//! epochs: the runtime seals them.

use std::sync::Arc;

use bytes::Bytes;

use super::backend::{KeyedStateBackend, WriteOp};
use super::error::{StateError, StateResult};
use super::key::{decode_key, encode_key, encode_state_part, key_prefix, prefix_end};

/// One named table of one operator's keyed state.
#[derive(Clone)]
pub struct StateTable {
    backend: Arc<dyn KeyedStateBackend>,
    operator_id: u32,
    name: Bytes,
}

impl std::fmt::Debug for StateTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateTable")
            .field("operator_id", &self.operator_id)
            .field("name", &String::from_utf8_lossy(&self.name))
            .finish()
    }
}

/// A row of a table, as a scan returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The key group.
    pub key_group: u16,
    /// The key's canonical bytes.
    pub key: Bytes,
    /// The namespace.
    pub namespace: Bytes,
    /// The value.
    pub value: Bytes,
}

impl StateTable {
    /// Table `name` of operator `operator_id` in `backend`.
    pub fn new(backend: Arc<dyn KeyedStateBackend>, operator_id: u32, name: &'static str) -> Self {
        Self {
            backend,
            operator_id,
            name: Bytes::from_static(name.as_bytes()),
        }
    }

    /// Partition `part` of this table: a table named as this one followed by `part`, so
    /// that a partition's rows of a key group are one byte range, which
    /// [`delete_group`](Self::delete_group) drops in one operation whatever their keys.
    pub fn partition(&self, part: &[u8]) -> StateTable {
        Self {
            backend: self.backend.clone(),
            operator_id: self.operator_id,
            name: Bytes::from([&self.name[..], part].concat()),
        }
    }

    /// The names (`part`s) of this table's partitions with `part_len`-byte names that
    /// have rows in `key_group`, in byte order: one read per partition found, however
    /// many rows each holds.
    pub async fn partitions(&self, key_group: u16, part_len: usize) -> StateResult<Vec<Bytes>> {
        let name_len = self.name.len() + part_len;
        let mut prefix = key_group.to_be_bytes().to_vec();
        let name_len16 = u16::try_from(name_len).map_err(|_| {
            StateError::Internal(format!("a partition name of {name_len} bytes is too long"))
        })?;
        prefix.extend_from_slice(&self.operator_id.to_be_bytes());
        prefix.extend_from_slice(&name_len16.to_be_bytes());
        prefix.extend_from_slice(&self.name);
        let end = prefix_end(&prefix);
        let mut from = prefix.clone();
        let mut parts = Vec::new();
        loop {
            let Some((state_key, _)) = self.backend.scan(&from, &end, Some(1)).await?.pop() else {
                return Ok(parts);
            };
            let k = decode_key(&state_key)?;
            let part = k.state_name.get(self.name.len()..).unwrap_or_default();
            parts.push(Bytes::copy_from_slice(part));
            // Past every key of this partition: its `(group, operator, name)` prefix ends.
            let mut done = key_group.to_be_bytes().to_vec();
            encode_state_part(&mut done, self.operator_id, k.state_name);
            from = prefix_end(&done);
            if from.is_empty() {
                return Ok(parts);
            }
        }
    }

    /// The operation removing every row of this table in `key_group`.
    pub fn delete_group(&self, key_group: u16) -> WriteOp {
        let mut prefix = key_group.to_be_bytes().to_vec();
        encode_state_part(&mut prefix, self.operator_id, &self.name);
        let end = prefix_end(&prefix);
        WriteOp::DeleteRange {
            start: Bytes::from(prefix),
            end: Bytes::from(end),
        }
    }

    /// The state key of `(key_group, key, namespace)` in this table.
    pub fn key(&self, key_group: u16, key: &[u8], namespace: &[u8]) -> Bytes {
        encode_key(key_group, self.operator_id, &self.name, key, namespace)
    }

    /// The values of `keys` (built by [`key`](Self::key)), in order, `None` where absent.
    pub async fn get_many(&self, keys: &[Bytes]) -> StateResult<Vec<Option<Bytes>>> {
        self.backend.get_many(keys).await
    }

    /// Applies `ops` (on keys of this table) in order.
    pub async fn write(&self, ops: Vec<WriteOp>) -> StateResult<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.backend.write(ops).await
    }

    /// How many batches' reads to keep in flight (see
    /// [`KeyedStateBackend::pipelined_reads`]).
    pub fn pipelined_reads(&self) -> usize {
        self.backend.pipelined_reads()
    }

    /// Every row of this table in `key_group`, in key order, read `page` rows per call.
    pub async fn scan_group(&self, key_group: u16, page: usize) -> StateResult<Vec<Row>> {
        let mut prefix = key_group.to_be_bytes().to_vec();
        encode_state_part(&mut prefix, self.operator_id, &self.name);
        self.scan_prefix(prefix, page).await
    }

    /// Every row of `key` in `key_group` (any namespace), in namespace order.
    pub async fn scan_key(&self, key_group: u16, key: &[u8], page: usize) -> StateResult<Vec<Row>> {
        let prefix = key_prefix(key_group, self.operator_id, &self.name, key);
        self.scan_prefix(prefix, page).await
    }

    /// The first `n` rows of one key, in namespace order: one read, however many rows
    /// the key has.
    pub async fn first_of_key(
        &self,
        key_group: u16,
        key: &[u8],
        n: usize,
    ) -> StateResult<Vec<Row>> {
        let prefix = key_prefix(key_group, self.operator_id, &self.name, key);
        let end = prefix_end(&prefix);
        let entries = self.backend.scan(&prefix, &end, Some(n.max(1))).await?;
        entries
            .iter()
            .map(|(state_key, value)| self.row(state_key, value))
            .collect()
    }

    /// The operation removing every row of `key` in `key_group` (any namespace).
    pub fn delete_key(&self, key_group: u16, key: &[u8]) -> WriteOp {
        let prefix = key_prefix(key_group, self.operator_id, &self.name, key);
        let end = prefix_end(&prefix);
        WriteOp::DeleteRange {
            start: Bytes::from(prefix),
            end: Bytes::from(end),
        }
    }

    /// A scanned entry as a row of this table.
    fn row(&self, state_key: &[u8], value: &Bytes) -> StateResult<Row> {
        let k = decode_key(state_key)?;
        if k.operator_id != self.operator_id || k.state_name != &self.name[..] {
            return Err(StateError::Internal(format!(
                "a scan of state `{}` returned a key of another state",
                String::from_utf8_lossy(&self.name)
            )));
        }
        Ok(Row {
            key_group: k.key_group,
            key: Bytes::copy_from_slice(k.key),
            namespace: Bytes::copy_from_slice(k.namespace),
            value: value.clone(),
        })
    }

    async fn scan_prefix(&self, prefix: Vec<u8>, page: usize) -> StateResult<Vec<Row>> {
        let end = prefix_end(&prefix);
        let mut from = prefix;
        let mut rows = Vec::new();
        let page = page.max(1);
        loop {
            let entries = self.backend.scan(&from, &end, Some(page)).await?;
            for (state_key, value) in &entries {
                rows.push(self.row(state_key, value)?);
            }
            match entries.last() {
                // The smallest key after the last one read.
                Some((last, _)) if entries.len() == page => from = [&last[..], &[0]].concat(),
                _ => return Ok(rows),
            }
        }
    }
}
