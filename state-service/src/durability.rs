//! What of a shard is in the object store, and the view of a shard that the modules
//! uploading and collecting its objects work on.
//!
//! `Durability` is the shard's record of its uploaded deltas, snapshots and manifests
//! (behind the shard's async durability lock). `ShardObjects` is what snapshots
//! (`snapshot.rs`) and garbage collection (`gc.rs`) need of a shard: where its objects
//! are and which SST files it uploaded. `shard.rs` implements it, so those modules never
//! import the shard: imports go one way, shard -> snapshot, gc -> durability.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use object_store::path::Path as ObjectPath;

use crate::delta::CutSpool;
use crate::manifest::{DeltaRef, Manifest, SnapshotRef};
use crate::shard_id::ShardKey;
use crate::store::{Durable, child};

/// SST files of a database already uploaded: local name -> (object, size).
pub type UploadedSsts = HashMap<String, (String, u64)>;

/// What of the shard is in the object store; behind an async lock held across uploads.
#[derive(Default)]
pub(crate) struct Durability {
    /// Cut deltas waiting for upload, oldest first.
    pub(crate) pending: VecDeque<(u64, CutSpool)>,
    /// Uploaded deltas after the latest complete snapshot.
    pub(crate) chain: Vec<DeltaRef>,
    /// The latest completely uploaded snapshot.
    pub(crate) snapshot: Option<SnapshotRef>,
    /// Objects of the snapshot being uploaded now (relative paths).
    pub(crate) snapshot_in_progress: Option<HashSet<String>>,
    /// Handle of the last uploaded delta.
    pub(crate) last_handle: String,
    /// Bytes uploaded as deltas by this instance.
    pub(crate) durable_bytes: u64,
    /// Manifests written or read, by checkpoint.
    pub(crate) manifests: BTreeMap<u64, Manifest>,
}

/// A shard as the modules that upload and collect its objects see it.
pub(crate) trait ShardObjects: Send + Sync + 'static {
    /// The shard, for messages.
    fn id(&self) -> &ShardKey;
    /// The object store.
    fn durable(&self) -> &Durable;
    /// The shard's root in the object store.
    fn root(&self) -> &ObjectPath;
    /// SST files of this opening of the shard already uploaded.
    fn uploaded_sst(&self) -> &Mutex<UploadedSsts>;

    /// The shard's object `rel` (relative to its root).
    fn object(&self, rel: &str) -> ObjectPath {
        child(self.root(), rel)
    }
}
