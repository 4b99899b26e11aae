//! `ValueState`: one value per key and namespace.

use std::marker::PhantomData;
use std::sync::Arc;

use super::backend::{KeyedStateBackend, WriteOp};
use super::clock::StateClock;
use super::codec::StateCodec;
use super::descriptor::StateDescriptor;
use super::error::StateResult;
use super::handle::StateCore;
use super::scope::KeyScope;

/// A single value per key and namespace.
pub struct ValueState<T> {
    core: Arc<StateCore>,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for ValueState<T> {
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
            _value: PhantomData,
        }
    }
}

impl<T: StateCodec> ValueState<T> {
    /// A handle on the state `descriptor` names, stored in `backend`.
    pub fn new(
        backend: Arc<dyn KeyedStateBackend>,
        descriptor: StateDescriptor,
        clock: Arc<dyn StateClock>,
    ) -> Self {
        Self {
            core: Arc::new(StateCore::new(backend, descriptor, clock)),
            _value: PhantomData,
        }
    }

    /// The state's descriptor.
    pub fn descriptor(&self) -> &StateDescriptor {
        self.core.descriptor()
    }

    /// The value, or `None` when unset or expired.
    pub async fn get(&self, scope: &KeyScope<'_>) -> StateResult<Option<T>> {
        let key = self.core.value_key(scope);
        let mut values = self.core.get_values(std::slice::from_ref(&key)).await?;
        Ok(values.pop().flatten())
    }

    /// Sets the value.
    pub async fn set(&self, scope: &KeyScope<'_>, value: &T) -> StateResult<()> {
        let op = WriteOp::Put {
            key: self.core.value_key(scope),
            value: self.core.encode_value(self.core.write_expiry(), value),
        };
        self.core.write(vec![op]).await
    }

    /// Removes the value.
    pub async fn clear(&self, scope: &KeyScope<'_>) -> StateResult<()> {
        let key = self.core.value_key(scope);
        self.core.write(vec![WriteOp::Delete { key }]).await
    }

    /// The values of many scopes in one backend read, in order.
    pub async fn get_many(&self, scopes: &[KeyScope<'_>]) -> StateResult<Vec<Option<T>>> {
        let keys = self.core.value_keys_for_read(scopes);
        self.core.get_values(&keys).await
    }

    /// Sets many values in one backend write, applied in order (the last of repeated
    /// scopes wins).
    pub async fn set_many(&self, items: &[(KeyScope<'_>, T)]) -> StateResult<()> {
        let expires = self.core.write_expiry();
        let ops = items
            .iter()
            .map(|(scope, value)| WriteOp::Put {
                key: self.core.value_key(scope),
                value: self.core.encode_value(expires, value),
            })
            .collect();
        self.core.write(ops).await
    }

    /// Removes the values of many scopes in one backend write.
    pub async fn clear_many(&self, scopes: &[KeyScope<'_>]) -> StateResult<()> {
        let ops = scopes
            .iter()
            .map(|scope| WriteOp::Delete {
                key: self.core.value_key(scope),
            })
            .collect();
        self.core.write(ops).await
    }
}
