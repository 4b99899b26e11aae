//! `AggregatingState`: an accumulator per key and namespace, fed by an
//! [`AggregateFunction`].

use std::sync::Arc;

use super::backend::{KeyedStateBackend, WriteOp};
use super::clock::StateClock;
use super::codec::StateCodec;
use super::descriptor::StateDescriptor;
use super::error::StateResult;
use super::handle::StateCore;
use super::scope::KeyScope;

/// How inputs fold into a stored accumulator and how it yields a result (Flink's
/// `AggregateFunction`).
pub trait AggregateFunction: Send + Sync + 'static {
    /// Input values.
    type In: Send;
    /// The stored accumulator.
    type Acc: StateCodec;
    /// The result.
    type Out;
    /// A fresh, empty accumulator.
    fn create(&self) -> Self::Acc;
    /// Folds one input into `acc`.
    fn add(&self, acc: &mut Self::Acc, value: Self::In);
    /// The result of `acc`.
    fn result(&self, acc: &Self::Acc) -> Self::Out;
    /// Folds accumulator `other` into `acc` (session-window merges, two-phase aggregation).
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);
}

/// An accumulator per key and namespace.
pub struct AggregatingState<F> {
    core: Arc<StateCore>,
    function: Arc<F>,
}

impl<F> Clone for AggregatingState<F> {
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
            function: Arc::clone(&self.function),
        }
    }
}

impl<F: AggregateFunction> AggregatingState<F> {
    /// A handle on the state `descriptor` names, stored in `backend`, aggregating with
    /// `function`.
    pub fn new(
        backend: Arc<dyn KeyedStateBackend>,
        descriptor: StateDescriptor,
        clock: Arc<dyn StateClock>,
        function: F,
    ) -> Self {
        Self {
            core: Arc::new(StateCore::new(backend, descriptor, clock)),
            function: Arc::new(function),
        }
    }

    /// The state's descriptor.
    pub fn descriptor(&self) -> &StateDescriptor {
        self.core.descriptor()
    }

    /// The aggregate function.
    pub fn function(&self) -> &F {
        &self.function
    }

    /// The result, or `None` when nothing was added (or it expired).
    pub async fn get(&self, scope: &KeyScope<'_>) -> StateResult<Option<F::Out>> {
        Ok(self
            .get_acc(scope)
            .await?
            .map(|acc| self.function.result(&acc)))
    }

    /// The results of many scopes in one backend read.
    pub async fn get_many(&self, scopes: &[KeyScope<'_>]) -> StateResult<Vec<Option<F::Out>>> {
        let keys = self.core.value_keys_for_read(scopes);
        let accs = self.core.get_values::<F::Acc>(&keys).await?;
        Ok(accs
            .into_iter()
            .map(|acc| acc.map(|acc| self.function.result(&acc)))
            .collect())
    }

    /// The stored accumulator.
    pub async fn get_acc(&self, scope: &KeyScope<'_>) -> StateResult<Option<F::Acc>> {
        let key = self.core.value_key(scope);
        let mut values = self.core.get_values(std::slice::from_ref(&key)).await?;
        Ok(values.pop().flatten())
    }

    /// Folds one input into the accumulator (read, add, write).
    pub async fn add(&self, scope: &KeyScope<'_>, value: F::In) -> StateResult<()> {
        self.add_many(vec![(*scope, value)]).await
    }

    /// Folds many inputs in one backend read and one write; inputs for the same scope are
    /// added in order.
    pub async fn add_many(&self, items: Vec<(KeyScope<'_>, F::In)>) -> StateResult<()> {
        let f = &*self.function;
        self.update_many(items, |acc, v| {
            let mut acc = acc.unwrap_or_else(|| f.create());
            f.add(&mut acc, v);
            acc
        })
        .await
    }

    /// Merges `acc` into the stored accumulator (or stores it when there is none).
    pub async fn merge_acc(&self, scope: &KeyScope<'_>, acc: F::Acc) -> StateResult<()> {
        let f = &*self.function;
        self.update_many(vec![(*scope, acc)], |stored, acc| match stored {
            Some(mut stored) => {
                f.merge(&mut stored, acc);
                stored
            }
            None => acc,
        })
        .await
    }

    /// Removes the accumulator.
    pub async fn clear(&self, scope: &KeyScope<'_>) -> StateResult<()> {
        let key = self.core.value_key(scope);
        self.core.write(vec![WriteOp::Delete { key }]).await
    }

    /// Read-modify-write of many accumulators with `fold(stored, input)`.
    async fn update_many<V>(
        &self,
        items: Vec<(KeyScope<'_>, V)>,
        fold: impl Fn(Option<F::Acc>, V) -> F::Acc,
    ) -> StateResult<()> {
        self.core.fold_many(items, fold).await
    }
}
