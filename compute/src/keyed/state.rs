//! The keyed state of one operator in one subtask.
//!
//! The task builder gives every operator of a job that keeps keyed state an
//! [`OperatorState`] (through its `OperatorContext`): the job's [`StateStore`], the key
//! groups the subtask owns and the epoch its writes start in. The operator *declares*
//! its state by asking for tables ([`OperatorState::table`]); the first ask opens its
//! subtask backend. The chain holds a clone of the same handle and drives the backend's
//! epochs: sealed after every barrier has passed the operator, sealed at the end of the
//! input, told of completed checkpoints. An operator that never asks for a table has no
//! backend and costs nothing at barriers.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use sluice_common::state::{KeyedStateBackend, StateStore, StateTable};

use crate::error::Result;

/// Completes when an epoch's writes are durable.
pub type Durable = futures::future::BoxFuture<'static, Result<()>>;

/// Bytes of decoded state an operator subtask keeps unless the job says (`state: {
/// cache: ... }`).
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;

/// One operator's keyed state in one subtask.
#[derive(Clone)]
pub struct OperatorState {
    store: Arc<dyn StateStore>,
    operator_id: u32,
    key_groups: Range<u32>,
    first_epoch: u64,
    checkpointed: bool,
    cache_bytes: usize,
    backend: Arc<OnceLock<Arc<dyn KeyedStateBackend>>>,
}

impl std::fmt::Debug for OperatorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorState")
            .field("operator_id", &self.operator_id)
            .field("key_groups", &self.key_groups)
            .field("first_epoch", &self.first_epoch)
            .field("open", &self.backend.get().is_some())
            .finish()
    }
}

impl OperatorState {
    /// The state of operator `operator_id` over `key_groups` of `store`, writing from
    /// epoch `first_epoch`; `checkpointed` when the job takes checkpoints.
    pub fn new(
        store: Arc<dyn StateStore>,
        operator_id: u32,
        key_groups: Range<u32>,
        first_epoch: u64,
        checkpointed: bool,
    ) -> Self {
        Self {
            store,
            operator_id,
            key_groups,
            first_epoch,
            checkpointed,
            cache_bytes: DEFAULT_CACHE_BYTES,
            backend: Arc::new(OnceLock::new()),
        }
    }

    /// The same, with `bytes` for the operator's cache of decoded state.
    pub fn with_cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = bytes.max(1);
        self
    }

    /// Bytes of decoded state the operator may keep in memory before spilling to the
    /// backend.
    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    /// Table `name` of this operator (opening the subtask's backend on first use).
    pub fn table(&self, name: &'static str) -> StateTable {
        let backend = self.backend.get_or_init(|| {
            self.store
                .subtask(self.key_groups.clone(), self.first_epoch)
        });
        StateTable::new(backend.clone(), self.operator_id, name)
    }

    /// Opens the backend for an operator that keeps what it reads and writes in its own
    /// cache, so the backend need not cache values too; call before the first
    /// [`OperatorState::table`] (afterwards the backend is open and this does nothing).
    pub fn open_for_cached_operator(&self) {
        self.backend.get_or_init(|| {
            self.store
                .subtask_for_cached_operator(self.key_groups.clone(), self.first_epoch)
        });
    }

    /// Whether the operator starts from empty state: a job's first attempt, before any
    /// checkpoint, writes from epoch 1 and finds nothing written before it.
    pub fn starts_empty(&self) -> bool {
        self.first_epoch <= 1
    }

    /// The key groups this subtask owns.
    pub fn key_groups(&self) -> Range<u32> {
        self.key_groups.clone()
    }

    /// Whether the job takes checkpoints (so state must be ready to be restored).
    pub fn checkpointed(&self) -> bool {
        self.checkpointed
    }

    /// The backend, once the operator declared a table.
    fn opened(&self) -> Option<&Arc<dyn KeyedStateBackend>> {
        self.backend.get()
    }

    /// Barrier `epoch` has passed the operator: ends the epoch.
    pub(crate) async fn seal(&self, epoch: u64) -> Result<()> {
        if let Some(b) = self.opened() {
            b.seal_epoch(epoch).await?;
        }
        Ok(())
    }

    /// Barrier `epoch` passed the operator: later writes belong to `epoch + 1` at once;
    /// the returned future completes when epoch `epoch` is durable (`None`: no backend,
    /// nothing to wait for).
    pub(crate) async fn cut(&self, epoch: u64) -> Result<Option<Durable>> {
        let Some(b) = self.opened() else {
            return Ok(None);
        };
        b.cut_epoch(epoch).await?;
        let b = Arc::clone(b);
        Ok(Some(Box::pin(async move {
            b.await_durable(epoch).await.map_err(Into::into)
        })))
    }

    /// The input ended: what the operator wrote last becomes durable with the open
    /// epoch. A job that takes checkpoints leaves that to its final checkpoint, which
    /// seals the same epoch after the operators' last writes at its barrier.
    pub(crate) async fn seal_open_epoch(&self) -> Result<()> {
        if self.checkpointed {
            return Ok(());
        }
        if let Some(b) = self.opened() {
            b.seal_epoch(b.open_epoch()).await?;
        }
        Ok(())
    }

    /// Checkpoint `epoch` completed job-wide.
    pub(crate) async fn committed(&self, epoch: u64) -> Result<()> {
        if let Some(b) = self.opened() {
            b.notify_committed(epoch).await?;
        }
        Ok(())
    }
}
