//! The undo log: for every write of an uncommitted epoch, the state key and the value it
//! had before, so a rollback restores the last committed checkpoint in O(uncommitted
//! writes).
//!
//! Records live in the `undo` column family under `[epoch u64 BE][seq u64 BE]`, so the
//! records of epochs `> C` are one key range and iterating it backwards undoes writes
//! newest first. The value is `[key_len u32 BE][key][0 | 1 previous value]`. Commit of C
//! deletes the range of epochs `<= C`. This module only encodes; the shard applies.

/// Column family of live state.
pub const CF_DEFAULT: &str = "default";
/// Column family of undo records.
pub const CF_UNDO: &str = "undo";
/// Column family of shard metadata.
pub const CF_META: &str = "meta";

/// The undo key of write `seq` of `epoch`.
pub fn key(epoch: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&epoch.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// First undo key of `epoch`.
pub fn epoch_start(epoch: u64) -> [u8; 16] {
    key(epoch, 0)
}

/// Splits an undo key into epoch and sequence.
pub fn decode_key(k: &[u8]) -> Option<(u64, u64)> {
    let epoch = u64::from_be_bytes(k.get(..8)?.try_into().ok()?);
    let seq = u64::from_be_bytes(k.get(8..16)?.try_into().ok()?);
    Some((epoch, seq))
}

/// The undo value: the state key and its previous value.
pub fn value(state_key: &[u8], previous: Option<&[u8]>) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + state_key.len() + 1 + previous.map_or(0, <[u8]>::len));
    v.extend_from_slice(&(state_key.len() as u32).to_be_bytes());
    v.extend_from_slice(state_key);
    match previous {
        Some(p) => {
            v.push(1);
            v.extend_from_slice(p);
        }
        None => v.push(0),
    }
    v
}

/// Splits an undo value into the state key and its previous value.
pub fn decode_value(v: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let len = u32::from_be_bytes(v.get(..4)?.try_into().ok()?) as usize;
    let key = v.get(4..4usize.checked_add(len)?)?;
    let rest = v.get(4 + len..)?;
    match rest.split_first()? {
        (0, []) => Some((key, None)),
        (1, prev) => Some((key, Some(prev))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_orders_by_epoch() {
        assert_eq!(decode_key(&key(5, 9)), Some((5, 9)));
        assert!(key(5, u64::MAX) < key(6, 0));
        let v = value(b"k", Some(b"old"));
        assert_eq!(decode_value(&v), Some((&b"k"[..], Some(&b"old"[..]))));
        let v = value(b"k", None);
        assert_eq!(decode_value(&v), Some((&b"k"[..], None)));
        assert_eq!(decode_value(b"\0\0"), None);
    }
}
