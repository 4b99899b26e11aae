//! The byte layout of a state key (DESIGN §4).
//!
//! ```text
//! [key_group: u16 BE][operator_id: u32 BE][name_len: u16 BE][name][key_len: u32 BE][key][namespace]
//! ```
//!
//! The key group leads so that all state of a key-group range is one byte range (a shard,
//! a rescale and a discard are range operations); the length prefixes make every
//! `(key group, operator, state, key)` tuple a prefix that no other tuple's keys share, so
//! "every namespace of this key" is a prefix scan. The namespace runs to the end of the
//! key and is opaque here: map state puts its user key after a length-prefixed namespace
//! (see `map.rs`).
//!
//! The layout is part of the on-disk format of state.

use std::ops::Range;

use bytes::Bytes;

use super::error::{StateError, StateResult};

/// Bytes before the state name: key group and operator id.
const HEAD_LEN: usize = 2 + 4;

/// The parts of a decoded state key, borrowed from the key bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodedKey<'a> {
    /// The key group the key belongs to.
    pub key_group: u16,
    /// The operator that owns the state.
    pub operator_id: u32,
    /// The state's name (UTF-8 when written through the typed API).
    pub state_name: &'a [u8],
    /// The user key's canonical bytes.
    pub key: &'a [u8],
    /// Everything after the key: the namespace, and for map state the user key too.
    pub namespace: &'a [u8],
}

/// Length in bytes of the encoded key for these parts.
pub fn encoded_key_len(state_name: &[u8], key: &[u8], namespace: &[u8]) -> usize {
    HEAD_LEN + 2 + state_name.len() + 4 + key.len() + namespace.len()
}

/// Appends `[operator_id][name_len][name]`, the part of a key that is fixed per state.
///
/// # Panics
/// If the name is longer than `u16::MAX` bytes (a programming error in the descriptor).
pub fn encode_state_part(out: &mut Vec<u8>, operator_id: u32, state_name: &[u8]) {
    let name_len = u16::try_from(state_name.len()).unwrap_or_else(|_| {
        panic!(
            "state name is {} bytes; at most {} are allowed",
            state_name.len(),
            u16::MAX
        )
    });
    out.extend_from_slice(&operator_id.to_be_bytes());
    out.extend_from_slice(&name_len.to_be_bytes());
    out.extend_from_slice(state_name);
}

/// Appends `[key_len][key]`.
///
/// # Panics
/// If the key is longer than `u32::MAX` bytes.
pub fn encode_user_key_part(out: &mut Vec<u8>, key: &[u8]) {
    let key_len = u32::try_from(key.len()).expect("state key longer than u32::MAX bytes");
    out.extend_from_slice(&key_len.to_be_bytes());
    out.extend_from_slice(key);
}

/// Appends the full state key to `out`, so batches can build many keys in one buffer.
pub fn encode_key_into(
    out: &mut Vec<u8>,
    key_group: u16,
    operator_id: u32,
    state_name: &[u8],
    key: &[u8],
    namespace: &[u8],
) {
    out.reserve(encoded_key_len(state_name, key, namespace));
    out.extend_from_slice(&key_group.to_be_bytes());
    encode_state_part(out, operator_id, state_name);
    encode_user_key_part(out, key);
    out.extend_from_slice(namespace);
}

/// The full state key of `(key_group, operator_id, state_name, key, namespace)`.
pub fn encode_key(
    key_group: u16,
    operator_id: u32,
    state_name: &[u8],
    key: &[u8],
    namespace: &[u8],
) -> Bytes {
    let mut out = Vec::with_capacity(encoded_key_len(state_name, key, namespace));
    encode_key_into(&mut out, key_group, operator_id, state_name, key, namespace);
    Bytes::from(out)
}

/// The prefix shared by every namespace of `(key_group, operator_id, state_name, key)`.
pub fn key_prefix(key_group: u16, operator_id: u32, state_name: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_key_len(state_name, key, &[]));
    encode_key_into(&mut out, key_group, operator_id, state_name, key, &[]);
    out
}

/// The smallest byte string greater than every string that starts with `prefix`, as an
/// exclusive scan end. Empty when there is none (the prefix is all `0xFF`): backends read
/// an empty end as "no upper bound".
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b != 0xFF) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => Vec::new(),
    }
}

/// The `[start, end)` byte bounds holding all state of the key groups in `range`.
///
/// The end is empty (unbounded) when the range reaches past key group `u16::MAX`.
pub fn key_group_range_bounds(range: Range<u32>) -> (Vec<u8>, Vec<u8>) {
    let max_group = u32::from(u16::MAX);
    if range.start >= range.end || range.start > max_group {
        // No key group: an empty `[x, x)` (not two empty vectors, which mean "everything").
        return (vec![0, 0], vec![0, 0]);
    }
    let start = (range.start as u16).to_be_bytes().to_vec();
    let end = if range.end > max_group {
        Vec::new()
    } else {
        (range.end as u16).to_be_bytes().to_vec()
    };
    (start, end)
}

/// Splits a state key into its parts.
pub fn decode_key(bytes: &[u8]) -> StateResult<DecodedKey<'_>> {
    fn take<'a>(rest: &mut &'a [u8], n: usize, what: &str) -> StateResult<&'a [u8]> {
        if rest.len() < n {
            return Err(StateError::MalformedKey(format!(
                "{what} needs {n} bytes, {} left",
                rest.len()
            )));
        }
        let (head, tail) = rest.split_at(n);
        *rest = tail;
        Ok(head)
    }
    let mut rest = bytes;
    let key_group = u16::from_be_bytes(take(&mut rest, 2, "key group")?.try_into().unwrap());
    let operator_id = u32::from_be_bytes(take(&mut rest, 4, "operator id")?.try_into().unwrap());
    let name_len = u16::from_be_bytes(take(&mut rest, 2, "name length")?.try_into().unwrap());
    let state_name = take(&mut rest, usize::from(name_len), "state name")?;
    let key_len = u32::from_be_bytes(take(&mut rest, 4, "key length")?.try_into().unwrap());
    let key = take(&mut rest, key_len as usize, "key")?;
    Ok(DecodedKey {
        key_group,
        operator_id,
        state_name,
        key,
        namespace: rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_pinned() {
        let k = encode_key(0x0102, 0x0A0B0C0D, b"st", b"key", b"ns");
        assert_eq!(
            &k[..],
            &[
                1, 2, // key group
                0x0A, 0x0B, 0x0C, 0x0D, // operator
                0, 2, b's', b't', // state name
                0, 0, 0, 3, b'k', b'e', b'y', // key
                b'n', b's', // namespace
            ]
        );
        assert_eq!(k.len(), encoded_key_len(b"st", b"key", b"ns"));
    }

    #[test]
    fn decode_round_trips() {
        let k = encode_key(7, 42, b"count", &[0, 255, 0], b"\x00window");
        let d = decode_key(&k).unwrap();
        assert_eq!(
            d,
            DecodedKey {
                key_group: 7,
                operator_id: 42,
                state_name: b"count",
                key: &[0, 255, 0],
                namespace: b"\x00window",
            }
        );
    }

    #[test]
    fn decode_rejects_truncated_keys() {
        let k = encode_key(7, 42, b"count", b"abc", b"");
        for cut in 0..k.len() {
            assert!(
                matches!(decode_key(&k[..cut]), Err(StateError::MalformedKey(_))),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn prefix_covers_namespaces_and_not_longer_keys() {
        let p = key_prefix(3, 1, b"s", b"ab");
        let end = prefix_end(&p);
        let inside = encode_key(3, 1, b"s", b"ab", b"any namespace");
        let other = encode_key(3, 1, b"s", b"abc", b"");
        assert!(inside.starts_with(&p));
        assert!(inside[..] < end[..]);
        assert!(!other.starts_with(&p));
    }

    #[test]
    fn prefix_end_carries_and_saturates() {
        assert_eq!(prefix_end(&[1, 2, 3]), vec![1, 2, 4]);
        assert_eq!(prefix_end(&[1, 0xFF, 0xFF]), vec![2]);
        assert_eq!(prefix_end(&[0xFF, 0xFF]), Vec::<u8>::new());
        assert_eq!(prefix_end(&[]), Vec::<u8>::new());
    }

    #[test]
    fn key_group_bounds_are_byte_ranges() {
        let (s, e) = key_group_range_bounds(4..8);
        for kg in 0u16..12 {
            let k = encode_key(kg, u32::MAX, &[0xFF; 3], &[0xFF; 5], &[0xFF; 9]);
            let inside = k[..] >= s[..] && k[..] < e[..];
            assert_eq!(inside, (4..8).contains(&kg), "kg {kg}");
        }
        let (s, e) = key_group_range_bounds(65_000..65_536);
        assert_eq!(s, 65_000u16.to_be_bytes().to_vec());
        assert!(e.is_empty(), "the last group's range is unbounded above");
        let (s, e) = key_group_range_bounds(5..5);
        assert_eq!(s, e, "an empty range is an empty byte range");
    }
}
