//! Keys and key groups (DESIGN §4).
//!
//! A key's *canonical bytes* are hashed with XXH3-64 (seed 0); its key group is
//! `hash % max_parallelism`. Subtask `i` of `p` owns the key groups
//! `[i * max / p, (i + 1) * max / p)`, as in Flink's `KeyGroupRangeAssignment`, so a
//! subtask's groups are one contiguous range and a rescale moves range boundaries only.
//!
//! Canonical bytes of a key made of several columns are the concatenation, column by
//! column, of: a tag byte (`0` null, `1` present), then for integers the 8-byte
//! big-endian two's complement of the value widened to 64 bits, for floats the 8-byte
//! big-endian IEEE-754 bits (with `-0.0` folded to `0.0`), for booleans one byte, for
//! strings and binaries a 4-byte big-endian length and the bytes. The encoding is part of
//! the on-disk format of state: changing it re-homes every key.

use std::ops::Range;

use xxhash_rust::xxh3::xxh3_64;

/// Hash of a key's canonical bytes.
pub fn key_hash(canonical: &[u8]) -> u64 {
    xxh3_64(canonical)
}

/// The key group of a key's canonical bytes.
pub fn key_group_of(canonical: &[u8], max_parallelism: u32) -> u16 {
    (key_hash(canonical) % u64::from(max_parallelism.max(1))) as u16
}

/// The key groups subtask `index` of `parallelism` owns: the integers in the real
/// interval `[index * max / p, (index + 1) * max / p)`, i.e. both ends rounded up.
pub fn key_group_range(max_parallelism: u32, parallelism: u32, index: u32) -> Range<u32> {
    let max = u64::from(max_parallelism.max(1));
    let p = u64::from(parallelism.max(1));
    let i = u64::from(index);
    (((i * max).div_ceil(p)) as u32)..((((i + 1) * max).div_ceil(p)) as u32)
}

/// The subtask that owns `key_group` when a node runs with `parallelism`.
pub fn subtask_for_key_group(max_parallelism: u32, parallelism: u32, key_group: u16) -> u32 {
    (u64::from(key_group) * u64::from(parallelism.max(1)) / u64::from(max_parallelism.max(1)))
        as u32
}

/// Appends the canonical bytes of an integer key part.
pub fn push_i64(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// Appends the canonical bytes of a float key part.
pub fn push_f64(out: &mut Vec<u8>, v: Option<f64>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            let v = if v == 0.0 { 0.0 } else { v };
            out.extend_from_slice(&v.to_bits().to_be_bytes());
        }
    }
}

/// Appends the canonical bytes of a boolean key part.
pub fn push_bool(out: &mut Vec<u8>, v: Option<bool>) {
    match v {
        None => out.push(0),
        Some(v) => out.extend_from_slice(&[1, u8::from(v)]),
    }
}

/// Appends the canonical bytes of a string or binary key part.
pub fn push_bytes(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_all_groups_without_overlap() {
        for max in [1u32, 7, 128, 1000] {
            for p in 1..=max.min(17) {
                let mut next = 0;
                for i in 0..p {
                    let r = key_group_range(max, p, i);
                    assert_eq!(r.start, next, "max {max} p {p} i {i}");
                    for kg in r.clone() {
                        assert_eq!(subtask_for_key_group(max, p, kg as u16), i, "kg {kg}");
                    }
                    next = r.end;
                }
                assert_eq!(next, max);
            }
        }
    }

    #[test]
    fn hash_is_stable() {
        // Pinned: state written by one version must be found by the next.
        let mut k = Vec::new();
        push_i64(&mut k, Some(1000));
        assert_eq!(key_hash(&k), xxh3_64(&[1, 0, 0, 0, 0, 0, 0, 3, 232]));
        assert_eq!(key_group_of(&k, 128), (xxh3_64(&k) % 128) as u16);
    }

    #[test]
    fn negative_zero_is_zero() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        push_f64(&mut a, Some(0.0));
        push_f64(&mut b, Some(-0.0));
        assert_eq!(a, b);
    }
}
