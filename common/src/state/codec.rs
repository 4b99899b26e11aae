//! How typed state values (and map keys) become bytes.
//!
//! Integers, floats and booleans encode order-preservingly (big-endian, signed integers
//! with the sign bit flipped, floats in IEEE total order), so a `MapState<i64, _>` lists
//! its entries in numeric order. Strings and byte strings encode as their raw bytes, since
//! a value's decode sees exactly its own bytes. Composites (tuples) length-prefix every
//! part but the last (`u32` BE), which keeps tuples of strings unambiguous but orders
//! variable-length parts by length first. `Option<T>` is a tag byte then `T`.
//!
//! The encodings are part of the on-disk format of state.

use bytes::Bytes;

/// A type that can be stored in keyed state.
pub trait StateCodec: Sized + Send + Sync {
    /// Appends the encoding of `self` to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Decodes a value from exactly `bytes`.
    fn decode(bytes: &[u8]) -> Result<Self, String>;
}

fn fixed<const N: usize>(bytes: &[u8], what: &str) -> Result<[u8; N], String> {
    bytes
        .try_into()
        .map_err(|_| format!("{what} needs {N} bytes, got {}", bytes.len()))
}

const SIGN64: u64 = 1 << 63;
const SIGN32: u32 = 1 << 31;

impl StateCodec for i64 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&((*self as u64) ^ SIGN64).to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok((u64::from_be_bytes(fixed(bytes, "i64")?) ^ SIGN64) as i64)
    }
}

impl StateCodec for u64 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(u64::from_be_bytes(fixed(bytes, "u64")?))
    }
}

impl StateCodec for i32 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&((*self as u32) ^ SIGN32).to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok((u32::from_be_bytes(fixed(bytes, "i32")?) ^ SIGN32) as i32)
    }
}

impl StateCodec for u32 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(u32::from_be_bytes(fixed(bytes, "u32")?))
    }
}

impl StateCodec for f64 {
    fn encode(&self, out: &mut Vec<u8>) {
        let bits = self.to_bits();
        // Negative floats flip every bit, others only the sign: unsigned byte order then
        // matches IEEE total order.
        let ordered = if bits & SIGN64 != 0 {
            !bits
        } else {
            bits ^ SIGN64
        };
        out.extend_from_slice(&ordered.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let ordered = u64::from_be_bytes(fixed(bytes, "f64")?);
        let bits = if ordered & SIGN64 != 0 {
            ordered ^ SIGN64
        } else {
            !ordered
        };
        Ok(f64::from_bits(bits))
    }
}

impl StateCodec for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        match bytes {
            [0] => Ok(false),
            [1] => Ok(true),
            _ => Err(format!("bool must be one byte 0 or 1, got {bytes:?}")),
        }
    }
}

impl StateCodec for () {
    fn encode(&self, _out: &mut Vec<u8>) {}
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            Ok(())
        } else {
            Err(format!("unit must be empty, got {} bytes", bytes.len()))
        }
    }
}

impl StateCodec for String {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|e| format!("string is not UTF-8: {e}"))
    }
}

impl StateCodec for Vec<u8> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(bytes.to_vec())
    }
}

impl StateCodec for Bytes {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(Bytes::copy_from_slice(bytes))
    }
}

impl<T: StateCodec> StateCodec for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode(out);
            }
        }
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        match bytes.split_first() {
            Some((0, [])) => Ok(None),
            Some((1, rest)) => T::decode(rest).map(Some),
            _ => Err(format!("bad option tag in {} bytes", bytes.len())),
        }
    }
}

/// Appends `v` behind a `u32` BE length.
fn encode_prefixed<T: StateCodec>(v: &T, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    v.encode(out);
    let len = u32::try_from(out.len() - at - 4).expect("tuple part longer than u32::MAX bytes");
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// Splits a length-prefixed part off the front of `bytes`.
fn split_prefixed(bytes: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let (len, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or_else(|| format!("tuple part length needs 4 bytes, got {}", bytes.len()))?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Err(format!(
            "tuple part of {len} bytes overruns the {} left",
            rest.len()
        ));
    }
    Ok(rest.split_at(len))
}

impl<A: StateCodec, B: StateCodec> StateCodec for (A, B) {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_prefixed(&self.0, out);
        self.1.encode(out);
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (a, rest) = split_prefixed(bytes)?;
        Ok((A::decode(a)?, B::decode(rest)?))
    }
}

impl<A: StateCodec, B: StateCodec, C: StateCodec> StateCodec for (A, B, C) {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_prefixed(&self.0, out);
        encode_prefixed(&self.1, out);
        self.2.encode(out);
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let (a, rest) = split_prefixed(bytes)?;
        let (b, rest) = split_prefixed(rest)?;
        Ok((A::decode(a)?, B::decode(b)?, C::decode(rest)?))
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;

    use super::*;

    fn enc<T: StateCodec>(v: &T) -> Vec<u8> {
        let mut out = Vec::new();
        v.encode(&mut out);
        out
    }

    fn round_trip<T: StateCodec + PartialEq + Debug>(v: T) {
        assert_eq!(T::decode(&enc(&v)).unwrap(), v);
    }

    #[test]
    fn scalars_round_trip() {
        for v in [i64::MIN, -1, 0, 1, i64::MAX] {
            round_trip(v);
        }
        for v in [i32::MIN, -1, 0, i32::MAX] {
            round_trip(v);
        }
        round_trip(u64::MAX);
        round_trip(7u32);
        for v in [f64::NEG_INFINITY, -1.5, -0.0, 0.0, 2.5, f64::MAX] {
            round_trip(v);
        }
        assert!(f64::decode(&enc(&f64::NAN)).unwrap().is_nan());
        round_trip(true);
        round_trip(false);
        round_trip(());
        round_trip(String::from("héllo"));
        round_trip(vec![0u8, 255]);
        round_trip(Bytes::from_static(b"\x00\xff"));
    }

    #[test]
    fn composites_round_trip() {
        round_trip((String::from("a"), String::from("bc")));
        round_trip((String::new(), String::from("x")));
        round_trip((String::from("ab"), 5i64, String::from("")));
        round_trip(Some(3i64));
        round_trip(None::<i64>);
        round_trip(Some(None::<String>));
        round_trip((Some(String::from("k")), None::<i64>));
    }

    #[test]
    fn tuples_of_strings_are_unambiguous() {
        assert_ne!(
            enc(&(String::from("a"), String::from("bc"))),
            enc(&(String::from("ab"), String::from("c")))
        );
    }

    #[test]
    fn numbers_encode_in_order() {
        let ints = [i64::MIN, -1000, -1, 0, 1, 1000, i64::MAX];
        for w in ints.windows(2) {
            assert!(enc(&w[0]) < enc(&w[1]), "{w:?}");
        }
        let floats = [f64::NEG_INFINITY, -2.0, -0.5, 0.0, 0.5, 2.0, f64::INFINITY];
        for w in floats.windows(2) {
            assert!(enc(&w[0]) < enc(&w[1]), "{w:?}");
        }
        assert!(enc(&-5i32) < enc(&3i32));
    }

    #[test]
    fn bad_bytes_are_errors() {
        assert!(i64::decode(&[1, 2, 3]).is_err());
        assert!(bool::decode(&[2]).is_err());
        assert!(String::decode(&[0xFF]).is_err());
        assert!(Option::<i64>::decode(&[]).is_err());
        assert!(Option::<i64>::decode(&[0, 1]).is_err());
        assert!(<(String, String)>::decode(&[0, 0, 0, 9, b'a']).is_err());
        assert!(<()>::decode(&[1]).is_err());
    }
}
