//! `ListState`: an append-mostly list per key and namespace.
//!
//! # Layout
//! The list is one backend value, a concatenation of framed elements
//! `[expires_at: i64 BE][len: u32 BE][element]`. Appending is a backend `Merge` of new
//! frames, so `add` never reads. Each element carries its own expiry (as in Flink's TTL
//! list state): `get` skips the expired ones and rewrites the list without them.

use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;

use super::backend::{KeyedStateBackend, WriteOp};
use super::clock::StateClock;
use super::codec::StateCodec;
use super::descriptor::StateDescriptor;
use super::error::StateResult;
use super::handle::StateCore;
use super::scope::KeyScope;
use super::ttl;

/// Bytes in front of each element: expiry and length.
const FRAME_HEADER_LEN: usize = 8 + 4;

/// A list per key and namespace.
pub struct ListState<T> {
    core: Arc<StateCore>,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for ListState<T> {
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
            _value: PhantomData,
        }
    }
}

/// Appends one framed element.
fn push_frame<T: StateCodec>(out: &mut Vec<u8>, expires_at: i64, value: &T) {
    ttl::write_header(out, expires_at);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    value.encode(out);
    let len = u32::try_from(out.len() - at - 4).expect("list element longer than u32::MAX bytes");
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// Splits a stored list into `(expires_at, element bytes)` frames.
fn frames(mut stored: &[u8]) -> Result<Vec<(i64, &[u8])>, String> {
    let mut out = Vec::new();
    while !stored.is_empty() {
        let Some((head, rest)) = stored.split_first_chunk::<FRAME_HEADER_LEN>() else {
            return Err(format!(
                "list element header needs {FRAME_HEADER_LEN} bytes, {} left",
                stored.len()
            ));
        };
        let expires = i64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(head[8..].try_into().expect("4 bytes")) as usize;
        if rest.len() < len {
            return Err(format!(
                "list element of {len} bytes overruns the {} left",
                rest.len()
            ));
        }
        let (element, rest) = rest.split_at(len);
        out.push((expires, element));
        stored = rest;
    }
    Ok(out)
}

impl<T: StateCodec> ListState<T> {
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

    /// Appends one element (no read).
    pub async fn add(&self, scope: &KeyScope<'_>, value: &T) -> StateResult<()> {
        self.add_all(scope, std::slice::from_ref(value)).await
    }

    /// Appends elements in order (one backend merge, no read).
    pub async fn add_all(&self, scope: &KeyScope<'_>, values: &[T]) -> StateResult<()> {
        if values.is_empty() {
            return Ok(());
        }
        let expires = self.core.write_expiry();
        let mut operand = Vec::new();
        for v in values {
            push_frame(&mut operand, expires, v);
        }
        let op = WriteOp::Merge {
            key: self.core.value_key(scope),
            operand: Bytes::from(operand),
        };
        self.core.write(vec![op]).await
    }

    /// Appends one element to each of many lists in one backend write, in order.
    pub async fn add_many(&self, items: &[(KeyScope<'_>, T)]) -> StateResult<()> {
        let expires = self.core.write_expiry();
        let ops = items
            .iter()
            .map(|(scope, v)| {
                let mut operand = Vec::with_capacity(FRAME_HEADER_LEN + 8);
                push_frame(&mut operand, expires, v);
                WriteOp::Merge {
                    key: self.core.value_key(scope),
                    operand: Bytes::from(operand),
                }
            })
            .collect();
        self.core.write(ops).await
    }

    /// The live elements in insertion order; empty when the list is absent.
    pub async fn get(&self, scope: &KeyScope<'_>) -> StateResult<Vec<T>> {
        let key = self.core.value_key(scope);
        let mut lists = self.read(std::slice::from_ref(&key)).await?;
        Ok(lists.pop().unwrap_or_default())
    }

    /// The live elements of many lists in one backend read, in order.
    pub async fn get_many(&self, scopes: &[KeyScope<'_>]) -> StateResult<Vec<Vec<T>>> {
        let keys = self.core.value_keys_for_read(scopes);
        self.read(&keys).await
    }

    /// Replaces the list with `values` (an empty slice clears it).
    pub async fn update(&self, scope: &KeyScope<'_>, values: &[T]) -> StateResult<()> {
        let key = self.core.value_key(scope);
        let op = if values.is_empty() {
            WriteOp::Delete { key }
        } else {
            let expires = self.core.write_expiry();
            let mut value = Vec::new();
            for v in values {
                push_frame(&mut value, expires, v);
            }
            WriteOp::Put {
                key,
                value: Bytes::from(value),
            }
        };
        self.core.write(vec![op]).await
    }

    /// Removes the list.
    pub async fn clear(&self, scope: &KeyScope<'_>) -> StateResult<()> {
        let key = self.core.value_key(scope);
        self.core.write(vec![WriteOp::Delete { key }]).await
    }

    /// Reads lists, dropping expired elements and rewriting the lists that had any (or
    /// all of them under `OnReadAndWrite`, with restarted expiry).
    async fn read(&self, keys: &[Bytes]) -> StateResult<Vec<Vec<T>>> {
        let stored = self.core.get_raw(keys).await?;
        let now = self.core.now();
        let refresh = self.core.read_refresh(now);
        let mut rewrites = Vec::new();
        let mut lists = Vec::with_capacity(keys.len());
        for (key, stored) in keys.iter().zip(stored) {
            let Some(stored) = stored else {
                lists.push(Vec::new());
                continue;
            };
            let frames = frames(&stored).map_err(|m| self.core.decode_error(m))?;
            let mut list = Vec::with_capacity(frames.len());
            let mut kept = Vec::with_capacity(frames.len());
            for &(expires, element) in &frames {
                if !ttl::is_expired(expires, now) {
                    list.push(self.core.decode(element)?);
                    kept.push((expires, element));
                }
            }
            let expired_some = kept.len() < frames.len();
            let refreshed = refresh.filter(|&e| kept.iter().any(|&(old, _)| old < e));
            if expired_some || refreshed.is_some() {
                rewrites.push(rewrite(key, &kept, refreshed, stored.len()));
            }
            lists.push(list);
        }
        self.core.write(rewrites).await?;
        Ok(lists)
    }
}

/// The write that leaves only `kept` frames (with expiry `refreshed` if given).
fn rewrite(key: &[u8], kept: &[(i64, &[u8])], refreshed: Option<i64>, cap: usize) -> WriteOp {
    let key = Bytes::copy_from_slice(key);
    if kept.is_empty() {
        return WriteOp::Delete { key };
    }
    let mut value = Vec::with_capacity(cap);
    for &(expires, element) in kept {
        ttl::write_header(&mut value, refreshed.unwrap_or(expires));
        value.extend_from_slice(&(element.len() as u32).to_be_bytes());
        value.extend_from_slice(element);
    }
    WriteOp::Put {
        key,
        value: Bytes::from(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_reject_truncation() {
        let mut stored = Vec::new();
        push_frame(&mut stored, 5, &String::from("ab"));
        push_frame(&mut stored, ttl::NEVER_EXPIRES, &String::new());
        assert_eq!(
            frames(&stored).unwrap(),
            vec![(5, &b"ab"[..]), (ttl::NEVER_EXPIRES, &b""[..])]
        );
        for cut in 1..stored.len() {
            if cut == FRAME_HEADER_LEN + 2 {
                continue; // a whole first frame
            }
            assert!(frames(&stored[..cut]).is_err(), "cut {cut}");
        }
    }
}
