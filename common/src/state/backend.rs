//! The byte-level backend trait: one subtask's keyed state, and its epochs.
//!
//! The trait is shaped for a remote store first: every call is async and batched (many
//! keys per `get_many`, many mutations per `write`), so a client can turn one call into
//! one RPC and an epoch write buffer can absorb `write`s until a barrier. It knows nothing
//! of key layout; the [`StateTable`](super::StateTable)s operators hold build the keys.
//!
//! # Epochs
//! Every write belongs to the backend's open epoch. The task runtime, never the operator,
//! ends an epoch: when checkpoint barrier `N` has passed the operator it calls
//! [`seal_epoch(N)`](KeyedStateBackend::seal_epoch), after which everything written so
//! far is part of checkpoint `N` (durable as far as the backend can make it) and later
//! writes belong to `N + 1`; when checkpoint `N` completed job-wide it calls
//! [`notify_committed(N)`](KeyedStateBackend::notify_committed). Going back to a
//! checkpoint is a job-wide act, done on the job's [`StateStore`](super::StateStore)
//! before the subtasks of the next attempt open.
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

    /// Ends epoch `epoch` (a checkpoint's barrier passed the operator): every write so far
    /// belongs to checkpoint `epoch` and is durable when this returns; later writes belong
    /// to `epoch + 1`.
    async fn seal_epoch(&self, epoch: u64) -> StateResult<()>;

    /// Ends epoch `epoch` like [`seal_epoch`](Self::seal_epoch) but returns as soon as
    /// later writes belong to `epoch + 1`, without waiting for durability, which
    /// [`await_durable`](Self::await_durable) then waits for: the task goes on processing
    /// while the epoch ships. By default it seals (durable when it returns).
    async fn cut_epoch(&self, epoch: u64) -> StateResult<()> {
        self.seal_epoch(epoch).await
    }

    /// Completes when epoch `epoch`, ended by [`cut_epoch`](Self::cut_epoch), is durable
    /// (by default at once: the default `cut_epoch` already waited).
    async fn await_durable(&self, _epoch: u64) -> StateResult<()> {
        Ok(())
    }

    /// The epoch writes now belong to.
    fn open_epoch(&self) -> u64;

    /// Checkpoint `epoch` completed job-wide: what only a rollback to an earlier one
    /// needed may go.
    async fn notify_committed(&self, _epoch: u64) -> StateResult<()> {
        Ok(())
    }

    /// How many batches' reads an operator should keep in flight to hide their latency
    /// (0: reads answer at once, and overlapping them only adds work).
    fn pipelined_reads(&self) -> usize {
        0
    }

    /// The value of one key.
    async fn get(&self, key: Bytes) -> StateResult<Option<Bytes>> {
        let mut values = self.get_many(std::slice::from_ref(&key)).await?;
        Ok(values.pop().flatten())
    }
}
