//! The byte-level backend trait every keyed-state store implements.
//!
//! The trait is shaped for a remote store first: every call is async and batched (many
//! keys per `get_many`, many mutations per `write`), so a client can turn one call into
//! one RPC and an epoch write buffer can absorb `write`s until a barrier. It knows nothing
//! of key layout, codecs or TTL; those live in the typed handles above it.
//!
//! # Ranges
//! Ranges are `[start, end)` in unsigned byte order. An empty `end` means "no upper
//! bound", so the range after an all-`0xFF` prefix is expressible.
//!
//! # Ownership of buffers
//! A backend may keep the `Bytes` it is given (the in-memory one stores them), so writers
//! give each key and value its own allocation instead of slicing one big buffer, which
//! would otherwise stay alive as long as any one of its slices.

use async_trait::async_trait;
use bytes::Bytes;

use super::error::StateResult;

/// One mutation in a [`KeyedStateBackend::write`] batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Sets `key` to `value`.
    Put {
        /// The key.
        key: Bytes,
        /// The new value.
        value: Bytes,
    },
    /// Removes `key` (a no-op when absent).
    Delete {
        /// The key.
        key: Bytes,
    },
    /// Appends `operand` to the value of `key`, or sets it to `operand` when absent
    /// (list state appends framed elements this way without reading).
    Merge {
        /// The key.
        key: Bytes,
        /// The bytes to append.
        operand: Bytes,
    },
    /// Removes every key in `[start, end)`; an empty `end` means no upper bound.
    DeleteRange {
        /// First key removed.
        start: Bytes,
        /// First key kept (exclusive); empty for unbounded.
        end: Bytes,
    },
}

/// A store of byte keys and values, one per subtask (or a client of a shared service).
///
/// Implementations must pass [`conformance::run_all`](super::conformance::run_all).
#[async_trait]
pub trait KeyedStateBackend: Send + Sync + 'static {
    /// The values of `keys`, in the same order, `None` where absent.
    async fn get_many(&self, keys: &[Bytes]) -> StateResult<Vec<Option<Bytes>>>;

    /// Applies `ops` in order; all of them are visible to every later read, none before.
    async fn write(&self, ops: Vec<WriteOp>) -> StateResult<()>;

    /// Up to `limit` entries of `[start, end)` in key order; an empty `end` is unbounded.
    async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: Option<usize>,
    ) -> StateResult<Vec<(Bytes, Bytes)>>;

    /// The value of one key.
    async fn get(&self, key: Bytes) -> StateResult<Option<Bytes>> {
        let mut values = self.get_many(std::slice::from_ref(&key)).await?;
        Ok(values.pop().flatten())
    }
}
