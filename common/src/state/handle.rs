//! What every typed state handle shares: the backend, the clock, the descriptor, and the
//! key building and TTL-aware reading on top of them.
//!
//! Reads go through [`StateCore::read_live`] / [`StateCore::scan_live`], which drop
//! expired values and collect the follow-up writes (deleting what expired, restarting
//! the TTL of what was read under `OnReadAndWrite`). Plain getters send those follow-ups
//! at once; read-modify-write paths drop them because their own write supersedes them.
//!
//! Handles assume per-key serial access (DESIGN §7: the async execution model orders the
//! accesses of one key), so a follow-up write cannot race a write of the same key.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::backend::{KeyedStateBackend, WriteOp};
use super::clock::StateClock;
use super::codec::StateCodec;
use super::descriptor::StateDescriptor;
use super::error::{StateError, StateResult};
use super::key::{encode_state_part, encode_user_key_part, prefix_end};
use super::scope::KeyScope;
use super::ttl;

/// The shared inside of a typed handle; handles hold it in an `Arc` so cloning is cheap.
pub(crate) struct StateCore {
    backend: Arc<dyn KeyedStateBackend>,
    clock: Arc<dyn StateClock>,
    descriptor: StateDescriptor,
    /// `[operator_id][name_len][name]`, encoded once instead of per key.
    state_part: Vec<u8>,
}

impl StateCore {
    pub(crate) fn new(
        backend: Arc<dyn KeyedStateBackend>,
        descriptor: StateDescriptor,
        clock: Arc<dyn StateClock>,
    ) -> Self {
        let mut state_part = Vec::new();
        encode_state_part(
            &mut state_part,
            descriptor.operator_id,
            descriptor.name.as_bytes(),
        );
        Self {
            backend,
            clock,
            descriptor,
            state_part,
        }
    }

    pub(crate) fn descriptor(&self) -> &StateDescriptor {
        &self.descriptor
    }

    /// The expiry timestamp for a value written now.
    pub(crate) fn write_expiry(&self) -> i64 {
        match &self.descriptor.ttl {
            None => ttl::NEVER_EXPIRES,
            Some(t) => ttl::expires_at(Some(t), self.clock.now_ms()),
        }
    }

    pub(crate) fn now(&self) -> i64 {
        // A state without TTL can have nothing expire unless an earlier run wrote with
        // TTL; reading the clock anyway keeps that case right at the cost of one call.
        self.clock.now_ms()
    }

    // ---- keys ----

    fn key_len(&self, scope: &KeyScope<'_>, extra: usize) -> usize {
        2 + self.state_part.len() + 4 + scope.key.len() + extra
    }

    /// Appends `[kg][state part][key_len][key]`.
    fn write_key_head(&self, out: &mut Vec<u8>, scope: &KeyScope<'_>) {
        out.extend_from_slice(&scope.key_group.to_be_bytes());
        out.extend_from_slice(&self.state_part);
        encode_user_key_part(out, scope.key);
    }

    /// Appends the key of a single-value state (value, list, reducing, aggregating).
    fn write_value_key(&self, out: &mut Vec<u8>, scope: &KeyScope<'_>) {
        self.write_key_head(out, scope);
        out.extend_from_slice(scope.namespace);
    }

    /// The key of a single-value state, in its own allocation (safe to write).
    pub(crate) fn value_key(&self, scope: &KeyScope<'_>) -> Bytes {
        let mut out = Vec::with_capacity(self.key_len(scope, scope.namespace.len()));
        self.write_value_key(&mut out, scope);
        Bytes::from(out)
    }

    /// The keys of many scopes, slices of one buffer: for reads, not for writes (see
    /// "Ownership of buffers" in `backend.rs`).
    pub(crate) fn value_keys_for_read(&self, scopes: &[KeyScope<'_>]) -> Vec<Bytes> {
        let total = scopes
            .iter()
            .map(|s| self.key_len(s, s.namespace.len()))
            .sum();
        let mut buf = Vec::with_capacity(total);
        let mut ends = Vec::with_capacity(scopes.len());
        for s in scopes {
            self.write_value_key(&mut buf, s);
            ends.push(buf.len());
        }
        split_at_ends(Bytes::from(buf), &ends)
    }

    /// Appends `[kg][state part][key_len][key][ns_len: u32 BE][ns]`, the prefix of every
    /// map entry of `scope`. The namespace is length-prefixed so that namespace `a` with
    /// user key `b...` cannot collide with namespace `ab`.
    fn write_map_prefix(&self, out: &mut Vec<u8>, scope: &KeyScope<'_>) {
        self.write_key_head(out, scope);
        encode_user_key_part(out, scope.namespace);
    }

    /// The prefix of every map entry of `scope`.
    pub(crate) fn map_prefix(&self, scope: &KeyScope<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.key_len(scope, 4 + scope.namespace.len()));
        self.write_map_prefix(&mut out, scope);
        out
    }

    /// The key of one map entry, in its own allocation.
    pub(crate) fn map_key<K: StateCodec>(&self, scope: &KeyScope<'_>, user_key: &K) -> Bytes {
        let mut out = Vec::with_capacity(self.key_len(scope, 4 + scope.namespace.len() + 8));
        self.write_map_prefix(&mut out, scope);
        user_key.encode(&mut out);
        Bytes::from(out)
    }

    /// Keys of many map entries, slices of one buffer (for reads).
    pub(crate) fn map_keys_for_read<K: StateCodec>(
        &self,
        lookups: &[(KeyScope<'_>, K)],
    ) -> Vec<Bytes> {
        let mut buf = Vec::new();
        let mut ends = Vec::with_capacity(lookups.len());
        for (scope, k) in lookups {
            self.write_map_prefix(&mut buf, scope);
            k.encode(&mut buf);
            ends.push(buf.len());
        }
        split_at_ends(Bytes::from(buf), &ends)
    }

    // ---- values ----

    /// `[expires_at][encoded value]` in its own allocation.
    pub(crate) fn encode_value<T: StateCodec>(&self, expires_at: i64, value: &T) -> Bytes {
        let mut out = Vec::with_capacity(ttl::HEADER_LEN + 8);
        ttl::write_header(&mut out, expires_at);
        value.encode(&mut out);
        Bytes::from(out)
    }

    pub(crate) fn decode<T: StateCodec>(&self, bytes: &[u8]) -> StateResult<T> {
        T::decode(bytes).map_err(|message| self.decode_error(message))
    }

    pub(crate) fn decode_error(&self, message: String) -> StateError {
        StateError::Decode {
            state: self.descriptor.name.clone(),
            message,
        }
    }

    /// Whether reads under this state's TTL restart it; if so, the new expiry.
    /// Read-modify-write of many values in one read and one write: each item is folded
    /// into its scope's stored value with `fold(stored, item)`, items of the same scope in
    /// order. Reducing and aggregating state both update this way.
    pub(crate) async fn fold_many<A: StateCodec, V>(
        &self,
        items: Vec<(KeyScope<'_>, V)>,
        fold: impl Fn(Option<A>, V) -> A,
    ) -> StateResult<()> {
        let scopes: Vec<KeyScope<'_>> = items.iter().map(|(s, _)| *s).collect();
        let keys = self.value_keys_for_read(&scopes);
        // TTL follow-ups are dropped: the write below replaces every value read.
        let (mut current, _superseded) = self.read_values::<A>(&keys).await?;
        let first = first_occurrences(&keys);
        for ((_, value), &slot) in items.into_iter().zip(&first) {
            current[slot] = Some(fold(current[slot].take(), value));
        }
        let expires = self.write_expiry();
        let ops = first
            .iter()
            .enumerate()
            .filter(|&(i, &slot)| i == slot)
            .filter_map(|(i, _)| {
                current[i].as_ref().map(|acc| WriteOp::Put {
                    key: Bytes::copy_from_slice(&keys[i]),
                    value: self.encode_value(expires, acc),
                })
            })
            .collect();
        self.write(ops).await
    }

    pub(crate) fn read_refresh(&self, now: i64) -> Option<i64> {
        ttl::refreshes_on_read(self.descriptor.ttl.as_ref())
            .then(|| ttl::expires_at(self.descriptor.ttl.as_ref(), now))
    }

    /// Judges one stored value read at `now`: its live payload (a zero-copy slice), or
    /// `None` with a deletion queued when it has expired.
    fn judge(
        &self,
        key: &[u8],
        stored: Bytes,
        now: i64,
        refresh: Option<i64>,
        followups: &mut Vec<WriteOp>,
    ) -> StateResult<Option<Bytes>> {
        let (expires, payload) = ttl::unwrap(&stored).map_err(|m| self.decode_error(m))?;
        if ttl::is_expired(expires, now) {
            followups.push(WriteOp::Delete {
                key: Bytes::copy_from_slice(key),
            });
            return Ok(None);
        }
        if let Some(new_expiry) = refresh.filter(|&e| e > expires) {
            followups.push(WriteOp::Put {
                key: Bytes::copy_from_slice(key),
                value: Bytes::from(ttl::wrap(new_expiry, payload)),
            });
        }
        Ok(Some(stored.slice(ttl::HEADER_LEN..)))
    }

    /// The stored bytes at `keys`, TTL headers and all.
    pub(crate) async fn get_raw(&self, keys: &[Bytes]) -> StateResult<Vec<Option<Bytes>>> {
        let stored = self.backend.get_many(keys).await?;
        if stored.len() != keys.len() {
            return Err(StateError::Internal(format!(
                "get_many of {} keys returned {} values",
                keys.len(),
                stored.len()
            )));
        }
        Ok(stored)
    }

    /// The live payloads (header stripped) at `keys`, and the follow-up writes TTL asks for.
    pub(crate) async fn read_live(
        &self,
        keys: &[Bytes],
    ) -> StateResult<(Vec<Option<Bytes>>, Vec<WriteOp>)> {
        let stored = self.get_raw(keys).await?;
        let now = self.now();
        let refresh = self.read_refresh(now);
        let mut followups = Vec::new();
        let mut live = Vec::with_capacity(keys.len());
        for (key, value) in keys.iter().zip(stored) {
            live.push(match value {
                None => None,
                Some(v) => self.judge(key, v, now, refresh, &mut followups)?,
            });
        }
        Ok((live, followups))
    }

    /// Decoded live values at `keys`, with follow-ups still to send.
    pub(crate) async fn read_values<T: StateCodec>(
        &self,
        keys: &[Bytes],
    ) -> StateResult<(Vec<Option<T>>, Vec<WriteOp>)> {
        let (live, followups) = self.read_live(keys).await?;
        let values = live
            .into_iter()
            .map(|p| p.map(|p| self.decode(&p)).transpose())
            .collect::<StateResult<_>>()?;
        Ok((values, followups))
    }

    /// Decoded live values at `keys`, follow-ups sent.
    pub(crate) async fn get_values<T: StateCodec>(
        &self,
        keys: &[Bytes],
    ) -> StateResult<Vec<Option<T>>> {
        let (values, followups) = self.read_values(keys).await?;
        self.write(followups).await?;
        Ok(values)
    }

    /// Live entries under `prefix` as `(user key suffix, payload)`, with follow-ups still to
    /// send. Reads pages of `page` entries until `wanted` live ones are found (or all).
    pub(crate) async fn scan_live(
        &self,
        prefix: &[u8],
        wanted: Option<usize>,
    ) -> StateResult<(Vec<(Bytes, Bytes)>, Vec<WriteOp>)> {
        let end = prefix_end(prefix);
        let now = self.now();
        let refresh = self.read_refresh(now);
        let mut followups = Vec::new();
        let mut live = Vec::new();
        let mut start = prefix.to_vec();
        // Without a target, one unlimited scan; with one, pages that grow so that a run
        // of expired entries costs few round trips.
        let mut page = wanted.map(|w| w.max(16));
        loop {
            let entries = self.backend.scan(&start, &end, page).await?;
            let exhausted = page.is_none_or(|p| entries.len() < p);
            if let Some((last, _)) = entries.last() {
                start.clear();
                start.extend_from_slice(last);
                start.push(0); // the least key after `last`
            }
            for (key, value) in entries {
                if !key.starts_with(prefix) {
                    return Err(StateError::Internal(format!(
                        "scan of a prefix returned a key outside it ({} bytes)",
                        key.len()
                    )));
                }
                if let Some(payload) = self.judge(&key, value, now, refresh, &mut followups)? {
                    live.push((key.slice(prefix.len()..), payload));
                }
            }
            if exhausted || wanted.is_some_and(|w| live.len() >= w) {
                break;
            }
            page = page.map(|p| p.saturating_mul(4));
        }
        Ok((live, followups))
    }

    /// Writes `ops` (TTL follow-ups or mutations), skipping the round trip when empty.
    pub(crate) async fn write(&self, ops: Vec<WriteOp>) -> StateResult<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.backend.write(ops).await
    }
}

/// Slices `buf` at the end offsets `ends` (zero-copy).
fn split_at_ends(buf: Bytes, ends: &[usize]) -> Vec<Bytes> {
    let mut start = 0;
    ends.iter()
        .map(|&end| {
            let b = buf.slice(start..end);
            start = end;
            b
        })
        .collect()
}

/// For each position, the first position holding an equal key: read-modify-write batches
/// fold repeated keys into the first one so that later updates see earlier ones.
pub(crate) fn first_occurrences(keys: &[Bytes]) -> Vec<usize> {
    let mut first: HashMap<&[u8], usize> = HashMap::with_capacity(keys.len());
    keys.iter()
        .enumerate()
        .map(|(i, k)| *first.entry(&k[..]).or_insert(i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::key::{encode_key, key_prefix};
    use crate::state::{ManualClock, MemoryStateBackend};

    fn core() -> StateCore {
        StateCore::new(
            Arc::new(MemoryStateBackend::new()),
            StateDescriptor::new(9, "s"),
            Arc::new(ManualClock::new(0)),
        )
    }

    #[test]
    fn value_keys_follow_the_design_layout() {
        let c = core();
        let scopes = [
            KeyScope::new(1, b"k1", b"ns"),
            KeyScope::new(2, b"", b""),
            KeyScope::new(3, b"key3", b"\x00"),
        ];
        let keys = c.value_keys_for_read(&scopes);
        for (s, k) in scopes.iter().zip(&keys) {
            assert_eq!(k, &encode_key(s.key_group, 9, b"s", s.key, s.namespace));
            assert_eq!(k, &c.value_key(s));
        }
    }

    #[test]
    fn map_keys_nest_a_length_prefixed_namespace() {
        let c = core();
        let scope = KeyScope::new(1, b"k", b"ns");
        let k = c.map_key(&scope, &5u32);
        let mut expected = key_prefix(1, 9, b"s", b"k");
        expected.extend_from_slice(&[0, 0, 0, 2, b'n', b's', 0, 0, 0, 5]);
        assert_eq!(&k[..], &expected[..]);
        assert!(k.starts_with(&c.map_prefix(&scope)));
        assert_eq!(c.map_keys_for_read(&[(scope, 5u32)]), vec![k]);
    }

    /// Operators run handles inside spawned tasks, so every future must be `Send`.
    #[tokio::test]
    async fn handle_futures_are_send() {
        use crate::state::{
            AggregatingState, ListState, MapState, ReducingState, SystemClock, ValueState,
        };
        let backend: Arc<dyn KeyedStateBackend> = Arc::new(MemoryStateBackend::new());
        let clock: Arc<dyn StateClock> = Arc::new(SystemClock);
        let d = |name: &str| StateDescriptor::new(1, name);
        let value = ValueState::<i64>::new(backend.clone(), d("v"), clock.clone());
        let map = MapState::<String, i64>::new(backend.clone(), d("m"), clock.clone());
        let list = ListState::<i64>::new(backend.clone(), d("l"), clock.clone());
        let sum = ReducingState::new(backend.clone(), d("r"), clock.clone(), |a: i64, b| a + b);
        let count = AggregatingState::new(backend, d("a"), clock, Count);
        let task = tokio::spawn(async move {
            let s = KeyScope::keyed(0, b"k");
            value.set_many(&[(s, 1)]).await.unwrap();
            map.put(&s, &"x".into(), &2).await.unwrap();
            list.add(&s, &3).await.unwrap();
            sum.add_many(vec![(s, 4)]).await.unwrap();
            count.add(&s, ()).await.unwrap();
            (
                value.get(&s).await.unwrap(),
                map.entries(&s).await.unwrap(),
                list.get(&s).await.unwrap(),
                sum.get(&s).await.unwrap(),
                count.get(&s).await.unwrap(),
            )
        });
        let got = task.await.unwrap();
        assert_eq!(
            got,
            (Some(1), vec![("x".into(), 2)], vec![3], Some(4), Some(1))
        );
    }

    struct Count;

    impl crate::state::AggregateFunction for Count {
        type In = ();
        type Acc = u64;
        type Out = u64;
        fn create(&self) -> u64 {
            0
        }
        fn add(&self, acc: &mut u64, _: ()) {
            *acc += 1;
        }
        fn result(&self, acc: &u64) -> u64 {
            *acc
        }
        fn merge(&self, acc: &mut u64, other: u64) {
            *acc += other;
        }
    }

    #[test]
    fn first_occurrences_point_back() {
        let keys: Vec<Bytes> = ["a", "b", "a", "c", "b"]
            .iter()
            .map(|s| Bytes::from_static(s.as_bytes()))
            .collect();
        assert_eq!(first_occurrences(&keys), vec![0, 1, 0, 3, 1]);
    }
}
