//! The epoch write buffer: mutations a subtask made since it last shipped them.
//!
//! Writes between two barriers stay here, one entry per key holding the key's latest
//! pending mutation, so a key written a thousand times in an epoch costs one operation
//! on the wire. The buffer is shipped to the state service at the barrier (or earlier,
//! when it outgrows its budget; the writes still belong to the open epoch and stay
//! uncommitted until the checkpoint completes). Reads consult it first, so a subtask
//! always reads its own writes. It is a [`NetWrites`], the structure the state service
//! holds an uncommitted epoch in: a range delete drops the entries it covers (only
//! looking at the key groups it spans) and is merged with the ranges already deleted, so
//! a window dropping a pane in every key group costs one small map operation per group,
//! not a pass over the buffer; a ship sends the ranges before the entries.
//!
//! It knows nothing of the network beyond the wire form of an entry.

use bytes::Bytes;
use sluice_common::pb::state as pb;
pub use sluice_common::state::net_writes::{Entry, Lookup, NetWrites};

/// The open epoch's writes.
pub type EpochBuffer = NetWrites;

/// The wire form of one pending mutation.
pub fn to_wire(key: Bytes, entry: Entry) -> pb::WriteOp {
    let (kind, value) = match entry {
        Entry::Put(v) => (pb::write_op::Kind::Put, v),
        Entry::Delete => (pb::write_op::Kind::Delete, Bytes::new()),
        Entry::Merge(m) => (pb::write_op::Kind::Merge, m),
    };
    pb::WriteOp {
        kind: kind as i32,
        key,
        value,
        end: Bytes::new(),
    }
}

/// The wire form of the delete of `[start, end)` (an empty end: unbounded).
pub fn range_to_wire(start: Bytes, end: Bytes) -> pb::WriteOp {
    pb::WriteOp {
        kind: pb::write_op::Kind::DeleteRange as i32,
        key: start,
        value: Bytes::new(),
        end,
    }
}
