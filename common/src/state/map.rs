//! `MapState`: a map of user keys to values per key and namespace.
//!
//! # Layout
//! Each entry is its own backend key:
//! `[key_group][operator][name][key_len][key][ns_len: u32 BE][namespace][user key]`.
//! The namespace is length-prefixed here (unlike single-value states) because the user key
//! follows it: otherwise namespace `a` with user key `b` and namespace `ab` with an empty
//! user key would be the same bytes, and a scan of namespace `a` would see namespace `ab`.
//! Entries of one scope are therefore exactly one prefix, so iteration is one scan and
//! `clear` is one range deletion. Iteration order is the byte order of encoded user keys
//! (numeric for integer keys, see `codec.rs`).

use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;

use super::backend::{KeyedStateBackend, WriteOp};
use super::clock::StateClock;
use super::codec::StateCodec;
use super::descriptor::StateDescriptor;
use super::error::StateResult;
use super::handle::StateCore;
use super::key::prefix_end;
use super::scope::KeyScope;

/// A map per key and namespace.
pub struct MapState<K, V> {
    core: Arc<StateCore>,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for MapState<K, V> {
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
            _types: PhantomData,
        }
    }
}

impl<K: StateCodec, V: StateCodec> MapState<K, V> {
    /// A handle on the state `descriptor` names, stored in `backend`.
    pub fn new(
        backend: Arc<dyn KeyedStateBackend>,
        descriptor: StateDescriptor,
        clock: Arc<dyn StateClock>,
    ) -> Self {
        Self {
            core: Arc::new(StateCore::new(backend, descriptor, clock)),
            _types: PhantomData,
        }
    }

    /// The state's descriptor.
    pub fn descriptor(&self) -> &StateDescriptor {
        self.core.descriptor()
    }

    /// The value under `user_key`, or `None` when absent or expired.
    pub async fn get(&self, scope: &KeyScope<'_>, user_key: &K) -> StateResult<Option<V>> {
        let key = self.core.map_key(scope, user_key);
        let mut values = self.core.get_values(std::slice::from_ref(&key)).await?;
        Ok(values.pop().flatten())
    }

    /// Sets the value under `user_key`.
    pub async fn put(&self, scope: &KeyScope<'_>, user_key: &K, value: &V) -> StateResult<()> {
        let op = WriteOp::Put {
            key: self.core.map_key(scope, user_key),
            value: self.core.encode_value(self.core.write_expiry(), value),
        };
        self.core.write(vec![op]).await
    }

    /// Removes the entry under `user_key`.
    pub async fn remove(&self, scope: &KeyScope<'_>, user_key: &K) -> StateResult<()> {
        let key = self.core.map_key(scope, user_key);
        self.core.write(vec![WriteOp::Delete { key }]).await
    }

    /// Whether a live entry exists under `user_key` (a read: it restarts an
    /// `OnReadAndWrite` TTL).
    pub async fn contains(&self, scope: &KeyScope<'_>, user_key: &K) -> StateResult<bool> {
        let key = self.core.map_key(scope, user_key);
        let (live, followups) = self.core.read_live(std::slice::from_ref(&key)).await?;
        self.core.write(followups).await?;
        Ok(live.first().is_some_and(Option::is_some))
    }

    /// All live entries, ordered by encoded user key.
    pub async fn entries(&self, scope: &KeyScope<'_>) -> StateResult<Vec<(K, V)>> {
        let live = self.scan(scope, None).await?;
        live.into_iter()
            .map(|(k, v)| Ok((self.core.decode(&k)?, self.core.decode(&v)?)))
            .collect()
    }

    /// All live user keys, ordered by their encoding.
    pub async fn keys(&self, scope: &KeyScope<'_>) -> StateResult<Vec<K>> {
        let live = self.scan(scope, None).await?;
        live.into_iter()
            .map(|(k, _)| self.core.decode(&k))
            .collect()
    }

    /// Whether the map has no live entry.
    pub async fn is_empty(&self, scope: &KeyScope<'_>) -> StateResult<bool> {
        Ok(self.scan(scope, Some(1)).await?.is_empty())
    }

    /// Removes every entry of the map (one range deletion).
    pub async fn clear(&self, scope: &KeyScope<'_>) -> StateResult<()> {
        let start = self.core.map_prefix(scope);
        let end = prefix_end(&start);
        let op = WriteOp::DeleteRange {
            start: Bytes::from(start),
            end: Bytes::from(end),
        };
        self.core.write(vec![op]).await
    }

    /// The values of many `(scope, user key)` lookups in one backend read, in order.
    pub async fn get_many(&self, lookups: &[(KeyScope<'_>, K)]) -> StateResult<Vec<Option<V>>> {
        let keys = self.core.map_keys_for_read(lookups);
        self.core.get_values(&keys).await
    }

    /// Sets many entries in one backend write, applied in order.
    pub async fn put_many(&self, items: &[(KeyScope<'_>, K, V)]) -> StateResult<()> {
        let expires = self.core.write_expiry();
        let ops = items
            .iter()
            .map(|(scope, k, v)| WriteOp::Put {
                key: self.core.map_key(scope, k),
                value: self.core.encode_value(expires, v),
            })
            .collect();
        self.core.write(ops).await
    }

    /// Live `(encoded user key, encoded value)` pairs, TTL follow-ups sent.
    async fn scan(
        &self,
        scope: &KeyScope<'_>,
        wanted: Option<usize>,
    ) -> StateResult<Vec<(Bytes, Bytes)>> {
        let prefix = self.core.map_prefix(scope);
        let (live, followups) = self.core.scan_live(&prefix, wanted).await?;
        self.core.write(followups).await?;
        Ok(live)
    }
}
