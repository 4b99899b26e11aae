//! The delta format: the writes (and rollbacks) a shard received, in order, as one
//! checksummed object per flush; and the local spool file they are appended to as they
//! arrive, so an epoch's writes are never held in memory.
//!
//! ```text
//! file   = "SLDELTA1" frame*
//! frame  = [len u32 BE][xxh3_64(payload) u64 BE][payload]
//! payload= [tag u8][epoch u64 BE][a_len u32 BE][a][b_len u32 BE][b]
//! ```
//! Tags: 0 put (a key, b value), 1 delete (a key), 2 merge (a key, b operand),
//! 3 delete-range (a start, b end, empty = end of shard), 4 rollback (epoch = the
//! checkpoint rolled back to). A restore replays the records in order through the same
//! code path as live writes. This module knows nothing of RocksDB or the object store.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sluice_common::state::WriteOp;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};

/// First bytes of every delta.
const MAGIC: &[u8; 8] = b"SLDELTA1";
/// Frame header: length and checksum.
const FRAME_HEADER: usize = 4 + 8;

/// What a write does to the state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sets the key.
    Put(Bytes, Bytes),
    /// Removes the key.
    Delete(Bytes),
    /// Appends to the key's value.
    Merge(Bytes, Bytes),
    /// Removes `[start, end)`; an empty end is the end of the shard.
    DeleteRange(Bytes, Bytes),
}

impl From<Op> for WriteOp {
    fn from(op: Op) -> Self {
        match op {
            Op::Put(key, value) => WriteOp::Put { key, value },
            Op::Delete(key) => WriteOp::Delete { key },
            Op::Merge(key, operand) => WriteOp::Merge { key, operand },
            Op::DeleteRange(start, end) => WriteOp::DeleteRange { start, end },
        }
    }
}

impl From<WriteOp> for Op {
    fn from(op: WriteOp) -> Self {
        match op {
            WriteOp::Put { key, value } => Op::Put(key, value),
            WriteOp::Delete { key } => Op::Delete(key),
            WriteOp::Merge { key, operand } => Op::Merge(key, operand),
            WriteOp::DeleteRange { start, end } => Op::DeleteRange(start, end),
        }
    }
}

/// One record of a delta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A write of an epoch.
    Write {
        /// The epoch it belongs to.
        epoch: u64,
        /// The write.
        op: Op,
    },
    /// The shard was rolled back to this checkpoint here.
    Rollback(u64),
}

impl Record {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Write { epoch, op } => encode_write(*epoch, op, out),
            Record::Rollback(c) => encode_frame(4, *c, &[], &[], out),
        }
    }
}

/// Encodes the record of `op` written in `epoch`.
fn encode_write(epoch: u64, op: &Op, out: &mut Vec<u8>) {
    let (tag, a, b): (u8, &[u8], &[u8]) = match op {
        Op::Put(k, v) => (0, k, v),
        Op::Delete(k) => (1, k, &[]),
        Op::Merge(k, v) => (2, k, v),
        Op::DeleteRange(s, e) => (3, s, e),
    };
    encode_frame(tag, epoch, a, b, out);
}

fn encode_frame(tag: u8, epoch: u64, a: &[u8], b: &[u8], out: &mut Vec<u8>) {
    let payload_len = 1 + 8 + 4 + a.len() + 4 + b.len();
    let start = out.len();
    out.reserve(FRAME_HEADER + payload_len);
    out.extend_from_slice(&(payload_len as u32).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out.push(tag);
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(&(a.len() as u32).to_be_bytes());
    out.extend_from_slice(a);
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
    let sum = xxh3_64(&out[start + FRAME_HEADER..]);
    out[start + 4..start + FRAME_HEADER].copy_from_slice(&sum.to_be_bytes());
}

/// Decodes a whole delta; `object` names it in errors.
pub fn decode(bytes: &Bytes, object: &str) -> Result<Vec<Record>> {
    let corrupt = |reason: String| Error::Corrupt {
        object: object.to_string(),
        reason,
    };
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(corrupt("not a delta (bad magic)".into()));
    }
    let mut at = MAGIC.len();
    let mut out = Vec::new();
    while at < bytes.len() {
        let Some(head) = bytes.get(at..at + FRAME_HEADER) else {
            return Err(corrupt(format!("truncated frame header at byte {at}")));
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&head[4..]);
        let body_start = at + FRAME_HEADER;
        let Some(payload) = bytes.get(body_start..body_start.saturating_add(len)) else {
            return Err(corrupt(format!("truncated frame at byte {at}")));
        };
        if xxh3_64(payload) != u64::from_be_bytes(sum) {
            return Err(corrupt(format!("checksum mismatch in frame at byte {at}")));
        }
        let record = decode_payload(&bytes.slice(body_start..body_start + len))
            .ok_or_else(|| corrupt(format!("malformed frame at byte {at}")))?;
        out.push(record);
        at = body_start + len;
    }
    Ok(out)
}

/// Reads a delta file record by record (a restore replays big deltas without holding
/// them in memory); errors name `object`.
pub struct FileReader {
    file: std::io::BufReader<File>,
    object: String,
    at: u64,
    size: u64,
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader")
            .field("object", &self.object)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

impl FileReader {
    /// Opens the delta at `path` and checks its magic.
    pub fn open(path: &Path, object: &str) -> Result<Self> {
        use std::io::Read;
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut file = std::io::BufReader::with_capacity(256 << 10, file);
        let mut magic = [0u8; MAGIC.len()];
        if file.read_exact(&mut magic).is_err() || &magic != MAGIC {
            return Err(Error::Corrupt {
                object: object.to_string(),
                reason: "not a delta (bad magic)".into(),
            });
        }
        Ok(Self {
            file,
            object: object.to_string(),
            at: MAGIC.len() as u64,
            size,
        })
    }

    fn corrupt(&self, reason: String) -> Error {
        Error::Corrupt {
            object: self.object.clone(),
            reason,
        }
    }

    /// The next record, `None` at the end.
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        use std::io::Read;
        let at = self.at;
        let mut head = [0u8; FRAME_HEADER];
        let mut got = 0;
        while got < FRAME_HEADER {
            match self.file.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.corrupt(format!("reading byte {at}: {e}"))),
            }
        }
        if got == 0 {
            return Ok(None);
        }
        if got < FRAME_HEADER {
            return Err(self.corrupt(format!("truncated frame header at byte {at}")));
        }
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&head[4..]);
        if at + (FRAME_HEADER + len) as u64 > self.size {
            return Err(self.corrupt(format!("truncated frame at byte {at}")));
        }
        let mut payload = vec![0u8; len];
        self.file
            .read_exact(&mut payload)
            .map_err(|_| self.corrupt(format!("truncated frame at byte {at}")))?;
        if xxh3_64(&payload) != u64::from_be_bytes(sum) {
            return Err(self.corrupt(format!("checksum mismatch in frame at byte {at}")));
        }
        let record = decode_payload(&Bytes::from(payload))
            .ok_or_else(|| self.corrupt(format!("malformed frame at byte {at}")))?;
        self.at += (FRAME_HEADER + len) as u64;
        Ok(Some(record))
    }
}

fn decode_payload(p: &Bytes) -> Option<Record> {
    let tag = *p.first()?;
    let epoch = u64::from_be_bytes(p.get(1..9)?.try_into().ok()?);
    let a_len = u32::from_be_bytes(p.get(9..13)?.try_into().ok()?) as usize;
    let a_end = 13usize.checked_add(a_len)?;
    let a = p.slice(13..a_end.min(p.len()));
    if a.len() != a_len {
        return None;
    }
    let b_len = u32::from_be_bytes(p.get(a_end..a_end + 4)?.try_into().ok()?) as usize;
    let b_start = a_end + 4;
    if p.len() != b_start.checked_add(b_len)? {
        return None;
    }
    let b = p.slice(b_start..);
    let op = match tag {
        0 => Op::Put(a, b),
        1 => Op::Delete(a),
        2 => Op::Merge(a, b),
        3 => Op::DeleteRange(a, b),
        4 => return Some(Record::Rollback(epoch)),
        _ => return None,
    };
    Some(Record::Write { epoch, op })
}

/// The local file a shard's records are appended to until the next flush cuts it.
pub struct Spool {
    path: PathBuf,
    file: BufWriter<File>,
    buf: Vec<u8>,
    records: u64,
    bytes: u64,
    max_epoch: u64,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("path", &self.path)
            .field("records", &self.records)
            .finish()
    }
}

/// A spool file that was cut and waits for upload.
#[derive(Clone, Debug)]
pub struct CutSpool {
    /// The local file.
    pub path: PathBuf,
    /// Bytes in it.
    pub bytes: u64,
    /// Highest epoch of a write in it (0: none).
    pub max_epoch: u64,
}

impl Spool {
    /// Creates (truncates) a spool file at `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        let mut file = BufWriter::with_capacity(256 << 10, file);
        file.write_all(MAGIC).map_err(|e| Error::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            buf: Vec::new(),
            records: 0,
            bytes: MAGIC.len() as u64,
            max_epoch: 0,
        })
    }

    /// Appends a record.
    pub fn append(&mut self, record: &Record) -> Result<()> {
        self.buf.clear();
        record.encode(&mut self.buf);
        if let Record::Write { epoch, .. } = record {
            self.max_epoch = self.max_epoch.max(*epoch);
        }
        self.write_buf()
    }

    /// Appends the record of `op` written in `epoch` (as `append` of a
    /// [`Record::Write`], without building one).
    pub fn append_write(&mut self, epoch: u64, op: &Op) -> Result<()> {
        self.buf.clear();
        encode_write(epoch, op, &mut self.buf);
        self.max_epoch = self.max_epoch.max(epoch);
        self.write_buf()
    }

    fn write_buf(&mut self) -> Result<()> {
        self.file
            .write_all(&self.buf)
            .map_err(|e| Error::io(&self.path, e))?;
        self.records += 1;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Finishes the file, moves it to `to` and starts a new spool at the old path.
    pub fn cut(&mut self, to: &Path) -> Result<CutSpool> {
        self.file.flush().map_err(|e| Error::io(&self.path, e))?;
        std::fs::rename(&self.path, to).map_err(|e| Error::io(to, e))?;
        let cut = CutSpool {
            path: to.to_path_buf(),
            bytes: self.bytes,
            max_epoch: self.max_epoch,
        };
        *self = Spool::create(&self.path)?;
        Ok(cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn spool_round_trips_and_corruption_names_the_object() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::create(&dir.path().join("spool")).unwrap();
        let records = vec![
            Record::Write {
                epoch: 3,
                op: Op::Put(b("k"), b("v")),
            },
            Record::Write {
                epoch: 3,
                op: Op::Delete(b("k")),
            },
            Record::Rollback(2),
            Record::Write {
                epoch: 4,
                op: Op::Merge(b("k"), b("")),
            },
            Record::Write {
                epoch: 4,
                op: Op::DeleteRange(b("a"), b("")),
            },
        ];
        for r in &records {
            spool.append(r).unwrap();
        }
        let cut = spool.cut(&dir.path().join("cut")).unwrap();
        assert!(spool.is_empty());
        assert_eq!(cut.max_epoch, 4);
        let bytes = Bytes::from(std::fs::read(&cut.path).unwrap());
        assert_eq!(bytes.len() as u64, cut.bytes);
        assert_eq!(decode(&bytes, "d").unwrap(), records);
        for at in [0, 9, 20, bytes.len() - 1] {
            let mut bad = bytes.to_vec();
            bad[at] ^= 0x40;
            let err = decode(&Bytes::from(bad), "x/0001.delta").unwrap_err();
            assert!(err.to_string().contains("x/0001.delta"), "{err}");
        }
        // A truncated delta is an error, unless it ends exactly between frames (then it
        // is a prefix of the records; uploads are whole objects, so this is for safety).
        for cut_at in MAGIC.len() + 1..bytes.len() {
            if let Ok(prefix) = decode(&bytes.slice(..cut_at), "d") {
                assert!(prefix.len() < records.len() && records.starts_with(&prefix));
            }
        }
        // The file reader reads the same records, and the same damage is an error.
        let read_all = |data: &[u8]| -> Result<Vec<Record>> {
            let path = dir.path().join("read");
            std::fs::write(&path, data).unwrap();
            let mut reader = FileReader::open(&path, "x/0001.delta")?;
            let mut out = Vec::new();
            while let Some(r) = reader.next_record()? {
                out.push(r);
            }
            Ok(out)
        };
        assert_eq!(read_all(&bytes).unwrap(), records);
        for at in [0, 9, 20, bytes.len() - 1] {
            let mut bad = bytes.to_vec();
            bad[at] ^= 0x40;
            let err = read_all(&bad).unwrap_err();
            assert!(err.to_string().contains("x/0001.delta"), "{err}");
        }
        for cut_at in MAGIC.len() + 1..bytes.len() {
            if let Ok(prefix) = read_all(&bytes[..cut_at]) {
                assert!(prefix.len() < records.len() && records.starts_with(&prefix));
            }
        }
        // A frame claiming more bytes than the file holds is not allocated.
        let mut huge = bytes[..MAGIC.len()].to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        huge.extend_from_slice(&[0; 8]);
        assert!(read_all(&huge).is_err());
    }
}
