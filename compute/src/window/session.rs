//! A key's sessions: encoding in keyed state and merging.

use super::accumulator::{self, ACC_BYTES, Acc};
use crate::element::Timestamp;
use crate::error::{Error, Result};
use crate::expr::aggregate::AggregateCall;

/// One session of one key.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// First record's time.
    pub start: Timestamp,
    /// Last record's time plus the gap (exclusive).
    pub end: Timestamp,
    /// Whether its result was emitted (kept only within allowed lateness).
    pub fired: bool,
    /// One accumulator per aggregate call.
    pub accs: Vec<Acc>,
}

/// Merges `new` into `sessions`, fusing every session it overlaps or touches (as Flink's
/// `TimeWindow::intersects`: records exactly `gap` apart share a session). Returns the
/// index of the resulting session.
pub fn insert(sessions: &mut Vec<Session>, mut new: Session, calls: &[AggregateCall]) -> usize {
    let mut i = 0;
    while i < sessions.len() {
        let s = &sessions[i];
        if s.start <= new.end && new.start <= s.end {
            let s = sessions.swap_remove(i);
            new.start = new.start.min(s.start);
            new.end = new.end.max(s.end);
            for (a, (b, call)) in new.accs.iter_mut().zip(s.accs.iter().zip(calls)) {
                accumulator::merge(call.func, call.arg_kind, a, b);
            }
            new.fired = false;
        } else {
            i += 1;
        }
    }
    sessions.push(new);
    sessions.len() - 1
}

/// Encodes `sessions` as a state value.
pub fn encode(sessions: &[Session], out: &mut Vec<u8>) {
    out.extend_from_slice(&(sessions.len() as u32).to_be_bytes());
    for s in sessions {
        out.extend_from_slice(&s.start.to_be_bytes());
        out.extend_from_slice(&s.end.to_be_bytes());
        out.push(u8::from(s.fired));
        accumulator::encode(&s.accs, out);
    }
}

/// Decodes a state value written by [`encode`] with `naggs` accumulators per session.
pub fn decode(bytes: &[u8], naggs: usize) -> Result<Vec<Session>> {
    let corrupt = || Error::Internal("corrupt session state".into());
    let count = u32::from_be_bytes(
        bytes
            .get(..4)
            .ok_or_else(corrupt)?
            .try_into()
            .map_err(|_| corrupt())?,
    );
    let each = 17 + naggs * ACC_BYTES;
    let mut out = Vec::with_capacity(count as usize);
    let mut pos = 4;
    for _ in 0..count {
        let s = bytes.get(pos..pos + each).ok_or_else(corrupt)?;
        let word = |i: usize| i64::from_be_bytes(s[i..i + 8].try_into().unwrap_or_default());
        let mut accs = Vec::with_capacity(naggs);
        accumulator::decode(&s[17..], naggs, &mut accs)?;
        out.push(Session {
            start: word(0),
            end: word(8),
            fired: s[16] != 0,
            accs,
        });
        pos += each;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start: i64, end: i64) -> Session {
        Session {
            start,
            end,
            fired: false,
            accs: vec![Acc { i: 0, f: 0.0, n: 1 }],
        }
    }

    #[test]
    fn bridging_record_fuses_two_sessions() {
        let calls = vec![];
        let mut list = vec![s(0, 10), s(20, 30)];
        insert(&mut list, s(8, 22), &calls);
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].start, list[0].end), (0, 30));
        let mut buf = Vec::new();
        encode(&list, &mut buf);
        assert_eq!(decode(&buf, 1).unwrap(), list);
    }

    #[test]
    fn touching_sessions_merge() {
        let mut list = vec![s(0, 10)];
        insert(&mut list, s(10, 20), &[]);
        assert_eq!(list.len(), 1);
        insert(&mut list, s(21, 31), &[]);
        assert_eq!(list.len(), 2);
    }
}
