//! Which state node holds each shard of a job: the coordinator's decision, made when an
//! attempt connects to the job's state, over the nodes registered with it.
//!
//! A shard stays where it is while its node lives (its node has it open, warm); a shard
//! whose node is gone, or that no node holds yet, goes to the node with the fewest shards
//! (then the fewest bytes, then by name), so that the job's shards spread over the nodes
//! and a lost node's shards spread over the survivors. Moving a shard is reopening it on
//! its new node from the object store at the checkpoint the attempt restores: no node
//! copies anything to another.
//!
//! It knows no gRPC and no coordinator: the nodes come in as [`LiveStateNode`]s.

use std::collections::BTreeMap;
use std::ops::Range;

/// A state node that is registered and heartbeating, as placement sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveStateNode {
    /// Its name.
    pub node_id: String,
    /// `http://host:port` of its state service.
    pub endpoint: String,
    /// The shards it reported open at its last heartbeat.
    pub shards: Vec<OpenShard>,
    /// Drained: it takes no shard (the copies it still has open are closed).
    pub draining: bool,
}

/// A shard a node has open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenShard {
    /// The job whose state it is.
    pub job_id: String,
    /// Its key groups.
    pub key_groups: Range<u32>,
    /// Approximate bytes of its data.
    pub bytes: u64,
    /// The newest checkpoint it committed.
    pub committed_checkpoint: u64,
}

/// Where each shard of a job goes: an endpoint per range of `shards`, in order.
///
/// `previous` is where shards were (the last attempt's placement, or a checkpoint's),
/// by key-group range; a shard stays there while that node is live, or else where a live
/// node reports it open. With `balance`, a node keeps at most its even share of the
/// job's shards (rounded up) and the rest move to the least loaded nodes: what a node
/// that joined gets. Errors when no node is live.
pub fn place(
    job_id: &str,
    shards: &[Range<u32>],
    nodes: &[LiveStateNode],
    previous: &[(Range<u32>, String)],
    balance: bool,
) -> Result<Vec<String>, String> {
    let usable: Vec<LiveStateNode> = nodes.iter().filter(|n| !n.draining).cloned().collect();
    let nodes = &usable[..];
    if nodes.is_empty() {
        return Err("no state node that is not drained is registered with the coordinator".into());
    }
    // Load per live endpoint: (shards, bytes) of every job but this one, plus what this
    // placement gives it.
    let mut load: BTreeMap<&str, (usize, u64, &str)> = nodes
        .iter()
        .map(|n| {
            let others = n.shards.iter().filter(|s| s.job_id != job_id);
            let (count, bytes) = others.fold((0, 0), |(c, b), s| (c + 1, b + s.bytes));
            (n.endpoint.as_str(), (count, bytes, n.node_id.as_str()))
        })
        .collect();
    let live = |e: &str| load.contains_key(e);
    let mut placed: Vec<Option<String>> = shards
        .iter()
        .map(|range| {
            let was = previous
                .iter()
                .find(|(r, e)| r == range && live(e))
                .map(|(_, e)| e.clone());
            was.or_else(|| {
                // The node that has it open at the newest checkpoint.
                nodes
                    .iter()
                    .filter_map(|n| {
                        let s = n
                            .shards
                            .iter()
                            .find(|s| s.job_id == job_id && s.key_groups == *range)?;
                        Some((s.committed_checkpoint, &n.endpoint))
                    })
                    .max_by_key(|(c, _)| *c)
                    .map(|(_, e)| e.clone())
            })
        })
        .collect();
    let share = shards.len().div_ceil(nodes.len());
    let mut kept: BTreeMap<String, usize> = BTreeMap::new();
    for (endpoint, range) in placed.iter_mut().zip(shards) {
        if let Some(e) = endpoint.as_ref() {
            let n = kept.entry(e.clone()).or_default();
            if balance && *n >= share {
                *endpoint = None;
                continue;
            }
            *n += 1;
            if let Some(l) = load.get_mut(e.as_str()) {
                l.0 += 1;
                l.1 += bytes_of(nodes, job_id, range);
            }
        }
    }
    for (slot, range) in placed.iter_mut().zip(shards) {
        if slot.is_some() {
            continue;
        }
        let (&endpoint, l) = load
            .iter_mut()
            .min_by_key(|(_, (count, bytes, id))| (*count, *bytes, *id))
            .expect("at least one node");
        l.0 += 1;
        l.1 += bytes_of(nodes, job_id, range);
        *slot = Some(endpoint.to_owned());
    }
    Ok(placed.into_iter().flatten().collect())
}

/// The bytes of `job_id`'s shard `range` as any node last reported them.
fn bytes_of(nodes: &[LiveStateNode], job_id: &str, range: &Range<u32>) -> u64 {
    nodes
        .iter()
        .flat_map(|n| &n.shards)
        .filter(|s| s.job_id == job_id && s.key_groups == *range)
        .map(|s| s.bytes)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, shards: Vec<OpenShard>) -> LiveStateNode {
        LiveStateNode {
            node_id: id.into(),
            endpoint: format!("http://{id}"),
            shards,
            draining: false,
        }
    }

    fn open(job: &str, r: Range<u32>, bytes: u64, committed: u64) -> OpenShard {
        OpenShard {
            job_id: job.into(),
            key_groups: r,
            bytes,
            committed_checkpoint: committed,
        }
    }

    fn ranges(n: u32) -> Vec<Range<u32>> {
        (0..n).map(|i| i * 16..(i + 1) * 16).collect()
    }

    fn count(placed: &[String], endpoint: &str) -> usize {
        placed.iter().filter(|e| *e == endpoint).count()
    }

    #[test]
    fn a_new_job_spreads_its_shards_over_the_nodes_by_count_and_size() {
        let nodes = [
            node("a", vec![open("other", 0..64, 1 << 30, 1)]),
            node("b", vec![]),
            node("c", vec![]),
        ];
        let placed = place("j", &ranges(8), &nodes, &[], false).unwrap();
        assert_eq!(placed.len(), 8);
        assert_eq!(count(&placed, "http://b"), 3);
        assert_eq!(count(&placed, "http://c"), 3);
        assert_eq!(count(&placed, "http://a"), 2, "a already holds a shard");
    }

    #[test]
    fn shards_stay_on_live_nodes_and_a_lost_nodes_shards_spread_over_the_survivors() {
        let shards = ranges(6);
        let previous: Vec<(Range<u32>, String)> = shards
            .iter()
            .zip(["a", "b", "c", "a", "b", "c"])
            .map(|(r, n)| (r.clone(), format!("http://{n}")))
            .collect();
        let drained = LiveStateNode {
            draining: true,
            ..node("b", vec![])
        };
        let nodes = [node("a", vec![]), drained, node("c", vec![])];
        let placed = place("j", &shards, &nodes, &previous, false).unwrap();
        assert!(!placed.contains(&"http://b".to_owned()), "b is drained");
        assert_eq!(placed[0], "http://a");
        assert_eq!(placed[2], "http://c");
        assert_eq!(placed[3], "http://a");
        assert_eq!(placed[5], "http://c");
        assert_ne!(
            placed[1], placed[4],
            "b's two shards go to different survivors"
        );
    }

    #[test]
    fn balancing_moves_a_nodes_shards_beyond_its_share_to_a_node_that_joined() {
        let shards = ranges(6);
        let previous: Vec<(Range<u32>, String)> = shards
            .iter()
            .zip(["a", "b", "a", "b", "a", "b"])
            .map(|(r, n)| (r.clone(), format!("http://{n}")))
            .collect();
        let nodes = [node("a", vec![]), node("b", vec![]), node("d", vec![])];
        let sticky = place("j", &shards, &nodes, &previous, false).unwrap();
        assert_eq!(
            count(&sticky, "http://d"),
            0,
            "without balancing nothing moves"
        );
        let placed = place("j", &shards, &nodes, &previous, true).unwrap();
        for n in ["http://a", "http://b", "http://d"] {
            assert_eq!(count(&placed, n), 2, "{placed:?}");
        }
        let moved = placed.iter().zip(&sticky).filter(|(a, b)| a != b).count();
        assert_eq!(moved, 2, "only what d takes moves: {placed:?}");
    }

    #[test]
    fn without_a_previous_placement_a_shard_goes_where_it_is_open_at_the_newest_checkpoint() {
        let shards = ranges(2);
        let nodes = [
            node("a", vec![open("j", 0..16, 10, 4)]),
            node("b", vec![open("j", 0..16, 10, 7)]),
        ];
        let placed = place("j", &shards, &nodes, &[], false).unwrap();
        assert_eq!(placed[0], "http://b");
        assert_eq!(placed[1], "http://a", "the other shard balances");
        let err = place("j", &shards, &[], &[], false).unwrap_err();
        assert!(err.contains("no state node"), "{err}");
    }
}
