//! The shard manifest: what a restore of one committed checkpoint needs.
//!
//! A manifest names the latest completely uploaded snapshot (its files, by local name and
//! object path) and every delta uploaded after it, in order. Restoring checkpoint C =
//! open the snapshot, replay the deltas, roll back epochs `> C`. Object paths are
//! relative to the shard's root, so the format knows nothing about buckets or prefixes.
//!
//! ```text
//! "SLMANIF1" [checkpoint u64] [has_snapshot u8] snapshot? [n u32] delta*  [xxh3_64 u64]
//! snapshot = [seq u64] [n u32] ([local str][object str][size u64])*
//! delta    = [seq u64] [bytes u64]
//! str      = [len u32][utf-8]
//! ```
//! All integers big-endian; the checksum covers everything before it.

use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"SLMANIF1";

/// One file of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFile {
    /// The file's name in the RocksDB directory.
    pub local: String,
    /// Its object path, relative to the shard root.
    pub object: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A completely uploaded RocksDB checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRef {
    /// The delta sequence the snapshot was cut at: it holds every delta `<= seq`.
    pub seq: u64,
    /// Its files.
    pub files: Vec<SnapshotFile>,
}

/// A delta object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaRef {
    /// Its sequence number.
    pub seq: u64,
    /// Its size.
    pub bytes: u64,
}

/// The manifest of one committed checkpoint of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The checkpoint.
    pub checkpoint: u64,
    /// The snapshot to start from (none: an empty database).
    pub snapshot: Option<SnapshotRef>,
    /// The deltas to replay after it, in order.
    pub deltas: Vec<DeltaRef>,
}

/// Object path of delta `seq`, relative to the shard root.
pub fn delta_path(seq: u64) -> String {
    format!("deltas/{seq:020}.delta")
}

/// Object path of the manifest of checkpoint `c`, relative to the shard root.
pub fn manifest_path(c: u64) -> String {
    format!("manifests/{c:020}.manifest")
}

/// The number in a `<n:020>.<ext>` file name.
pub fn parse_numbered(name: &str, ext: &str) -> Option<u64> {
    name.strip_suffix(ext)?
        .strip_suffix('.')
        .filter(|n| n.len() == 20)?
        .parse()
        .ok()
}

impl Manifest {
    /// Every object this manifest needs, relative to the shard root.
    pub fn objects(&self) -> impl Iterator<Item = String> + '_ {
        let snap = self
            .snapshot
            .iter()
            .flat_map(|s| s.files.iter().map(|f| f.object.clone()));
        snap.chain(self.deltas.iter().map(|d| delta_path(d.seq)))
    }

    /// Bytes a restore downloads.
    pub fn total_bytes(&self) -> u64 {
        let snap: u64 = self
            .snapshot
            .iter()
            .flat_map(|s| s.files.iter().map(|f| f.size))
            .sum();
        snap + self.deltas.iter().map(|d| d.bytes).sum::<u64>()
    }

    /// The binary form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.checkpoint.to_be_bytes());
        match &self.snapshot {
            None => out.push(0),
            Some(s) => {
                out.push(1);
                out.extend_from_slice(&s.seq.to_be_bytes());
                out.extend_from_slice(&(s.files.len() as u32).to_be_bytes());
                for f in &s.files {
                    put_str(&mut out, &f.local);
                    put_str(&mut out, &f.object);
                    out.extend_from_slice(&f.size.to_be_bytes());
                }
            }
        }
        out.extend_from_slice(&(self.deltas.len() as u32).to_be_bytes());
        for d in &self.deltas {
            out.extend_from_slice(&d.seq.to_be_bytes());
            out.extend_from_slice(&d.bytes.to_be_bytes());
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_be_bytes());
        out
    }

    /// Parses a manifest; `object` names it in errors.
    pub fn decode(bytes: &[u8], object: &str) -> Result<Self> {
        let corrupt = |reason: &str| Error::Corrupt {
            object: object.to_string(),
            reason: reason.to_string(),
        };
        if bytes.len() < MAGIC.len() + 8 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(corrupt("not a shard manifest (bad magic)"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let mut sum_bytes = [0u8; 8];
        sum_bytes.copy_from_slice(sum);
        if xxh3_64(body) != u64::from_be_bytes(sum_bytes) {
            return Err(corrupt("checksum mismatch"));
        }
        let mut r = Reader(&body[MAGIC.len()..]);
        let parsed = (|| {
            let checkpoint = r.u64()?;
            let snapshot = match r.u8()? {
                0 => None,
                1 => {
                    let seq = r.u64()?;
                    let n = r.u32()?;
                    let mut files = Vec::new();
                    for _ in 0..n {
                        files.push(SnapshotFile {
                            local: r.str()?,
                            object: r.str()?,
                            size: r.u64()?,
                        });
                    }
                    Some(SnapshotRef { seq, files })
                }
                _ => return None,
            };
            let n = r.u32()?;
            let mut deltas = Vec::new();
            for _ in 0..n {
                deltas.push(DeltaRef {
                    seq: r.u64()?,
                    bytes: r.u64()?,
                });
            }
            r.0.is_empty().then_some(Manifest {
                checkpoint,
                snapshot,
                deltas,
            })
        })();
        parsed.ok_or_else(|| corrupt("malformed body"))
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_be_bytes)
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_detects_corruption() {
        let m = Manifest {
            checkpoint: 7,
            snapshot: Some(SnapshotRef {
                seq: 3,
                files: vec![SnapshotFile {
                    local: "000012.sst".into(),
                    object: "sst/x-000012.sst".into(),
                    size: 99,
                }],
            }),
            deltas: vec![
                DeltaRef { seq: 4, bytes: 10 },
                DeltaRef { seq: 5, bytes: 1 },
            ],
        };
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes, "m").unwrap(), m);
        assert_eq!(m.total_bytes(), 110);
        assert_eq!(m.objects().count(), 3);
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            let err = Manifest::decode(&bad, "manifests/7").unwrap_err();
            assert!(err.to_string().contains("manifests/7"));
        }
        assert_eq!(
            parse_numbered(&manifest_path(42)[10..], "manifest"),
            Some(42)
        );
        assert_eq!(parse_numbered("12.manifest", "manifest"), None);
    }
}
