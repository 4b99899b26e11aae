//! `ReducingState`: one value per key and namespace, folded with a reduce function.

use std::marker::PhantomData;
use std::sync::Arc;

use super::backend::{KeyedStateBackend, WriteOp};
use super::clock::StateClock;
use super::codec::StateCodec;
use super::descriptor::StateDescriptor;
use super::error::StateResult;
use super::handle::StateCore;
use super::scope::KeyScope;

/// A value per key and namespace that `add` folds new values into with `F`.
pub struct ReducingState<T, F> {
    core: Arc<StateCore>,
    reduce: Arc<F>,
    _value: PhantomData<fn() -> T>,
}

impl<T, F> Clone for ReducingState<T, F> {
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
            reduce: Arc::clone(&self.reduce),
            _value: PhantomData,
        }
    }
}

impl<T, F> ReducingState<T, F>
where
    T: StateCodec,
    F: Fn(T, T) -> T + Send + Sync + 'static,
{
    /// A handle on the state `descriptor` names, stored in `backend`, folding with `reduce`.
    pub fn new(
        backend: Arc<dyn KeyedStateBackend>,
        descriptor: StateDescriptor,
        clock: Arc<dyn StateClock>,
        reduce: F,
    ) -> Self {
        Self {
            core: Arc::new(StateCore::new(backend, descriptor, clock)),
            reduce: Arc::new(reduce),
            _value: PhantomData,
        }
    }

    /// The state's descriptor.
    pub fn descriptor(&self) -> &StateDescriptor {
        self.core.descriptor()
    }

    /// The folded value, or `None` when nothing was added (or it expired).
    pub async fn get(&self, scope: &KeyScope<'_>) -> StateResult<Option<T>> {
        let key = self.core.value_key(scope);
        let mut values = self.core.get_values(std::slice::from_ref(&key)).await?;
        Ok(values.pop().flatten())
    }

    /// The folded values of many scopes in one backend read.
    pub async fn get_many(&self, scopes: &[KeyScope<'_>]) -> StateResult<Vec<Option<T>>> {
        let keys = self.core.value_keys_for_read(scopes);
        self.core.get_values(&keys).await
    }

    /// Folds `value` into the state (read, reduce, write).
    pub async fn add(&self, scope: &KeyScope<'_>, value: T) -> StateResult<()> {
        self.add_many(vec![(*scope, value)]).await
    }

    /// Folds many values in one backend read and one write; values for the same scope are
    /// folded in order.
    pub async fn add_many(&self, items: Vec<(KeyScope<'_>, T)>) -> StateResult<()> {
        let reduce = &self.reduce;
        let fold = |stored: Option<T>, value: T| match stored {
            Some(acc) => reduce(acc, value),
            None => value,
        };
        self.core.fold_many(items, fold).await
    }

    /// Removes the value.
    pub async fn clear(&self, scope: &KeyScope<'_>) -> StateResult<()> {
        let key = self.core.value_key(scope);
        self.core.write(vec![WriteOp::Delete { key }]).await
    }
}
