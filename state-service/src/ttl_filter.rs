//! The RocksDB compaction filter that drops expired TTL state.
//!
//! `OpenShard` names the states whose values carry the expiry header
//! (`sluice_common::state::ttl`): a VALUE state's value is dropped once its header has
//! expired, a LIST state's value once every frame has. Values of other states, and values
//! that do not parse, are kept. The set of states is shared with the shard so a later
//! `OpenShard` can extend it without reopening RocksDB. Reads do not consult this module:
//! the client's typed state handles check expiry on read.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rocksdb::compaction_filter::Decision;
use sluice_common::pb::state::{TtlState, ttl_state};
use sluice_common::state::{key, ttl};

/// How a TTL state stores its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlKind {
    /// `[expires_at][payload]`.
    Value,
    /// Frames `[expires_at][len][element]`.
    List,
}

/// The TTL states of one shard, by `(operator, state name)`.
#[derive(Clone, Debug, Default)]
pub struct TtlStates(Arc<RwLock<TtlMap>>);

/// TTL states by `(operator, state name)`.
type TtlMap = HashMap<(u32, Vec<u8>), TtlKind>;

impl TtlStates {
    /// Adds (or updates) the states of a request.
    pub fn extend(&self, states: &[TtlState]) {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        for s in states {
            let kind = match s.kind() {
                ttl_state::Kind::Value => TtlKind::Value,
                ttl_state::Kind::List => TtlKind::List,
            };
            map.insert((s.operator_id, s.state_name.to_vec()), kind);
        }
    }

    /// Whether compaction keeps `key`'s `value` at `now_ms`.
    pub fn decide(&self, key: &[u8], value: &[u8], now_ms: i64) -> Decision {
        let Ok(decoded) = key::decode_key(key) else {
            return Decision::Keep;
        };
        let kind = {
            let map = self.0.read().unwrap_or_else(|p| p.into_inner());
            if map.is_empty() {
                return Decision::Keep;
            }
            map.get(&(decoded.operator_id, decoded.state_name.to_vec()))
                .copied()
        };
        let expired = match kind {
            None => false,
            Some(TtlKind::Value) => {
                matches!(ttl::unwrap(value), Ok((at, _)) if ttl::is_expired(at, now_ms))
            }
            Some(TtlKind::List) => list_all_expired(value, now_ms),
        };
        if expired {
            Decision::Remove
        } else {
            Decision::Keep
        }
    }
}

/// Whether every frame of a list has expired (false when it does not parse or is empty).
fn list_all_expired(mut stored: &[u8], now_ms: i64) -> bool {
    if stored.is_empty() {
        return false;
    }
    while !stored.is_empty() {
        let Some((head, rest)) = stored.split_first_chunk::<12>() else {
            return false;
        };
        let mut at = [0u8; 8];
        at.copy_from_slice(&head[..8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&head[8..]);
        let len = u32::from_be_bytes(len) as usize;
        if rest.len() < len || !ttl::is_expired(i64::from_be_bytes(at), now_ms) {
            return false;
        }
        stored = &rest[len..];
    }
    true
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(at: i64, e: &[u8]) -> Vec<u8> {
        let mut v = at.to_be_bytes().to_vec();
        v.extend_from_slice(&(e.len() as u32).to_be_bytes());
        v.extend_from_slice(e);
        v
    }

    #[test]
    fn drops_only_expired_ttl_values() {
        let t = TtlStates::default();
        t.extend(&[
            TtlState {
                operator_id: 1,
                state_name: "v".into(),
                kind: ttl_state::Kind::Value as i32,
            },
            TtlState {
                operator_id: 1,
                state_name: "l".into(),
                kind: ttl_state::Kind::List as i32,
            },
        ]);
        let kv = key::encode_key(0, 1, b"v", b"k", b"");
        let kl = key::encode_key(0, 1, b"l", b"k", b"");
        let other = key::encode_key(0, 2, b"v", b"k", b"");
        let old = ttl::wrap(100, b"x");
        let new = ttl::wrap(300, b"x");
        assert!(matches!(t.decide(&kv, &old, 200), Decision::Remove));
        assert!(matches!(t.decide(&kv, &new, 200), Decision::Keep));
        assert!(matches!(t.decide(&other, &old, 200), Decision::Keep));
        assert!(matches!(t.decide(b"junk", &old, 200), Decision::Keep));
        let mut list = frame(100, b"a");
        list.extend(frame(150, b"b"));
        assert!(matches!(t.decide(&kl, &list, 200), Decision::Remove));
        list.extend(frame(300, b"c"));
        assert!(matches!(t.decide(&kl, &list, 200), Decision::Keep));
        assert!(matches!(t.decide(&kl, &[1, 2, 3], 200), Decision::Keep));
    }
}
