//! Garbage collection of a shard's objects after a commit.
//!
//! Kept: every object a retained checkpoint's manifest names, the latest complete
//! snapshot and the one being uploaded, the deltas uploaded since, and every delta newer
//! than all of those (it may be in flight). Deleted: manifests of checkpoints older than
//! the oldest retained one, and every other delta, SST and snapshot file. Deleting is
//! best effort: what fails now is collected at a later commit.
//!
//! It works on the shard's `ShardObjects` and `Durability`, never on the shard itself.

use std::collections::HashSet;

use crate::durability::{Durability, ShardObjects};
use crate::error::Result;
use crate::lock::lock;
use crate::manifest::{Manifest, delta_path, manifest_path, parse_numbered};

/// Collects the objects of `shard` that the checkpoints `keep` do not need; `d` is the
/// shard's durable state, its lock held by the caller.
pub(crate) async fn collect(
    shard: &impl ShardObjects,
    d: &mut Durability,
    keep: &[u64],
) -> Result<()> {
    let Some(&oldest) = keep.iter().min() else {
        return Ok(());
    };
    let keep: HashSet<u64> = keep.iter().copied().collect();
    let mut needed: HashSet<String> = HashSet::new();
    for &c in &keep {
        if let std::collections::btree_map::Entry::Vacant(slot) = d.manifests.entry(c) {
            let location = shard.object(&manifest_path(c));
            match shard.durable().get(&location).await {
                Ok(bytes) => {
                    slot.insert(Manifest::decode(&bytes, location.as_ref())?);
                }
                // A retained checkpoint this shard never committed: nothing to keep.
                Err(crate::error::Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        if let Some(m) = d.manifests.get(&c) {
            needed.extend(m.objects());
        }
    }
    if let Some(s) = &d.snapshot {
        needed.extend(s.files.iter().map(|f| f.object.clone()));
    }
    if let Some(p) = &d.snapshot_in_progress {
        needed.extend(p.iter().cloned());
    }
    needed.extend(d.chain.iter().map(|x| delta_path(x.seq)));
    let newest_known = d
        .chain
        .iter()
        .map(|x| x.seq)
        .chain(d.snapshot.iter().map(|s| s.seq))
        .chain(
            d.manifests
                .values()
                .flat_map(|m| m.deltas.iter().map(|x| x.seq)),
        )
        .max()
        .unwrap_or(0);

    let root = shard.root().clone();
    let mut deleted = 0usize;
    for location in shard.durable().list(&root).await? {
        let Some(rel) = location.prefix_match(&root).map(|parts| {
            parts
                .map(|p| p.as_ref().to_string())
                .collect::<Vec<_>>()
                .join("/")
        }) else {
            continue;
        };
        let name = rel.rsplit('/').next().unwrap_or_default();
        let delete = if rel.starts_with("manifests/") {
            parse_numbered(name, "manifest").is_some_and(|c| c < oldest && !keep.contains(&c))
        } else if rel.starts_with("deltas/") {
            parse_numbered(name, "delta")
                .is_some_and(|s| s < newest_known && !needed.contains(&rel))
        } else if rel.starts_with("sst/") || rel.starts_with("snapshots/") {
            !needed.contains(&rel)
        } else {
            false
        };
        if delete {
            shard.durable().delete(&location).await?;
            deleted += 1;
            if rel.starts_with("manifests/")
                && let Some(c) = parse_numbered(name, "manifest")
            {
                d.manifests.remove(&c);
            }
            if rel.starts_with("sst/") {
                lock(shard.uploaded_sst()).retain(|_, (object, _)| *object != rel);
            }
        }
    }
    d.manifests.retain(|c, _| keep.contains(c) || *c >= oldest);
    tracing::debug!("collected {deleted} objects of {}", shard.id());
    Ok(())
}
