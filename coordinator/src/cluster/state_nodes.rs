//! The state nodes that registered with this coordinator (`sluice state-service
//! --coordinator URL`): where each serves, its budget, its open shards and their sizes,
//! and when it was last heard from. A node whose stream ends or that misses heartbeats
//! is dropped from the list.
//!
//! It knows nothing of jobs: a job's actor asks it for the live nodes when it connects
//! the job to its state, and placement (`sluice_common::state::placement`) decides over
//! them; it is also what `sluice cluster` and `GET /v1/state-nodes` show.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_common::pb::cluster as pbc;
use sluice_common::state::placement::{LiveStateNode, OpenShard};

/// A registered state node, as the REST API shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StateNodeView {
    /// Its name.
    pub node_id: String,
    /// `http://host:port` of its state service.
    pub endpoint: String,
    /// Its process id.
    pub pid: u32,
    /// Its memory budget.
    pub memory_bytes: u64,
    /// Its disk cache.
    pub disk_cache_bytes: u64,
    /// Resident memory at its last heartbeat.
    pub rss_bytes: u64,
    /// Its open shards at its last heartbeat.
    pub shards: Vec<ShardView>,
    /// Milliseconds since it was last heard from.
    pub last_seen_ms: u64,
    /// Drained (`sluice cluster drain`): no shard is placed on it any more.
    pub draining: bool,
}

/// One open shard of a state node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ShardView {
    /// The job whose state it holds.
    pub job_id: String,
    /// Its key groups, `start-end` (end exclusive).
    pub key_groups: String,
    /// Approximate bytes of its data.
    pub bytes: u64,
    /// The newest checkpoint it committed.
    pub committed_checkpoint: u64,
}

struct Entry {
    view: StateNodeView,
    last_seen: Instant,
    /// Which registration of the name this is: a stale stream's end must not drop a
    /// node that registered again.
    generation: u64,
    /// Its open shards at its last heartbeat, as placement reads them.
    open: Vec<OpenShard>,
    /// Its object store's URL (empty: not said).
    object_store: String,
}

/// The registered state nodes.
pub struct StateNodes {
    nodes: Mutex<BTreeMap<String, Entry>>,
    timeout: Duration,
    /// The last registration's generation.
    generations: AtomicU64,
    /// When a node last joined (a name not registered before it, or registered again
    /// after it was lost), until a rebalance takes it.
    joined: Mutex<Option<Instant>>,
}

impl StateNodes {
    /// Nodes silent for `timeout` are dropped.
    pub fn new(timeout: Duration) -> Self {
        Self {
            nodes: Mutex::new(BTreeMap::new()),
            timeout,
            generations: AtomicU64::new(0),
            joined: Mutex::new(None),
        }
    }

    /// Whether a node joined at least `settle` ago and no rebalance took that yet (the
    /// answer is given once per join, or run of joins within `settle`).
    pub fn joined_before(&self, settle: Duration) -> bool {
        let mut joined = self.joined.lock().unwrap_or_else(|p| p.into_inner());
        if joined.is_some_and(|at| at.elapsed() >= settle) {
            *joined = None;
            return true;
        }
        false
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `reg` (replacing an earlier registration of the same name, a node
    /// that restarted); returns the registration's generation, or why it is refused: an
    /// address another node registered, or an object store other than the registered
    /// nodes' (shards move between nodes through it).
    pub fn attach(&self, reg: &pbc::StateNodeRegister) -> Result<u64, String> {
        // One lock for the checks and the insert: two nodes registering at once cannot
        // both pass them.
        let mut nodes = self.lock();
        for e in nodes.values().filter(|e| e.view.node_id != reg.node_id) {
            if e.view.endpoint == reg.endpoint {
                return Err(format!(
                    "state node `{}` claims {}, where node `{}` is registered: give each \
                     node its own address (--listen, --advertise)",
                    reg.node_id, reg.endpoint, e.view.node_id
                ));
            }
            if !reg.object_store.is_empty()
                && !e.object_store.is_empty()
                && e.object_store != reg.object_store
            {
                return Err(format!(
                    "state node `{}` keeps its shards in {}, and node `{}` in {}: every \
                     state node of a cluster must use one object store (shards move \
                     between nodes through it)",
                    reg.node_id, reg.object_store, e.view.node_id, e.object_store
                ));
            }
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let view = StateNodeView {
            node_id: reg.node_id.clone(),
            endpoint: reg.endpoint.clone(),
            pid: reg.pid,
            memory_bytes: reg.memory_bytes,
            disk_cache_bytes: reg.disk_cache_bytes,
            rss_bytes: 0,
            shards: Vec::new(),
            last_seen_ms: 0,
            // A drained node that restarts stays drained: draining is by name.
            draining: nodes.get(&reg.node_id).is_some_and(|e| e.view.draining),
        };
        let replaced = nodes
            .insert(
                reg.node_id.clone(),
                Entry {
                    view,
                    last_seen: Instant::now(),
                    generation,
                    open: Vec::new(),
                    object_store: reg.object_store.clone(),
                },
            )
            .is_some();
        drop(nodes);
        if replaced {
            tracing::warn!(node = %reg.node_id, "state node registered again: the earlier registration is replaced");
        } else {
            *self.joined.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        Ok(generation)
    }

    /// A heartbeat of registration `generation` of `node`.
    pub fn heartbeat(&self, node: &str, generation: u64, hb: &pbc::StateNodeHeartbeat) {
        let mut nodes = self.lock();
        let Some(e) = nodes.get_mut(node).filter(|e| e.generation == generation) else {
            return;
        };
        e.last_seen = Instant::now();
        e.view.rss_bytes = hb.rss_bytes;
        e.open = hb
            .shards
            .iter()
            .map(|s| OpenShard {
                job_id: s.job_id.clone(),
                key_groups: s.key_group_start..s.key_group_end,
                bytes: s.bytes,
                committed_checkpoint: s.committed_checkpoint,
            })
            .collect();
        e.view.shards = hb
            .shards
            .iter()
            .map(|s| ShardView {
                job_id: s.job_id.clone(),
                key_groups: format!("{}-{}", s.key_group_start, s.key_group_end),
                bytes: s.bytes,
                committed_checkpoint: s.committed_checkpoint,
            })
            .collect();
    }

    /// Takes `node` out of placement (its shards move at the jobs' next placement);
    /// returns its endpoint, or an error naming the registered nodes.
    pub fn drain(&self, node: &str) -> Result<String, String> {
        let mut nodes = self.lock();
        match nodes.get_mut(node) {
            Some(e) => {
                e.view.draining = true;
                Ok(e.view.endpoint.clone())
            }
            None => Err(format!(
                "no state node `{node}` is registered (registered: {})",
                nodes.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The nodes alive now (drained ones marked), with the shards each reported open,
    /// for placement.
    pub fn live(&self) -> Vec<LiveStateNode> {
        self.lock()
            .values()
            .filter(|e| e.last_seen.elapsed() < self.timeout)
            .map(|e| LiveStateNode {
                node_id: e.view.node_id.clone(),
                endpoint: e.view.endpoint.clone(),
                shards: e.open.clone(),
                draining: e.view.draining,
            })
            .collect()
    }

    /// Registration `generation` of `node` ended (its stream closed or broke).
    pub fn lost(&self, node: &str, generation: u64, reason: &str) {
        let mut nodes = self.lock();
        if nodes.get(node).is_some_and(|e| e.generation == generation) {
            nodes.remove(node);
            tracing::warn!(node, "state node gone: {reason}");
        }
    }

    /// Drops the nodes that missed their heartbeats.
    pub fn reap(&self) {
        let timeout = self.timeout;
        self.lock().retain(|node, e| {
            let alive = e.last_seen.elapsed() < timeout;
            if !alive {
                tracing::warn!(node = %node, "state node gone: no heartbeat for {timeout:?}");
            }
            alive
        });
    }

    /// The registered nodes, by name.
    pub fn view(&self) -> Vec<StateNodeView> {
        self.lock()
            .values()
            .map(|e| StateNodeView {
                last_seen_ms: e.last_seen.elapsed().as_millis() as u64,
                ..e.view.clone()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(node: &str) -> pbc::StateNodeRegister {
        pbc::StateNodeRegister {
            protocol_version: 2,
            node_id: node.into(),
            endpoint: format!("http://{node}:7071"),
            pid: 7,
            memory_bytes: 1 << 30,
            disk_cache_bytes: 4 << 30,
            object_store: "s3://state/prod".into(),
        }
    }

    #[test]
    fn nodes_register_report_their_shards_and_go_when_their_stream_ends_or_they_fall_silent() {
        let nodes = StateNodes::new(Duration::from_millis(50));
        let a = nodes.attach(&reg("a")).unwrap();
        nodes.attach(&reg("b")).unwrap();
        nodes.heartbeat(
            "a",
            a,
            &pbc::StateNodeHeartbeat {
                rss_bytes: 5,
                shards: vec![pbc::ShardLoad {
                    job_id: "j".into(),
                    key_group_start: 0,
                    key_group_end: 64,
                    bytes: 100,
                    committed_checkpoint: 3,
                }],
            },
        );
        let view = nodes.view();
        assert_eq!(view.len(), 2);
        assert_eq!(view[0].shards[0].key_groups, "0-64");
        assert_eq!(view[0].rss_bytes, 5);
        let live = nodes.live();
        assert_eq!(live[0].endpoint, "http://a:7071");
        assert_eq!(live[0].shards[0].key_groups, 0..64);
        assert_eq!(nodes.drain("a"), Ok("http://a:7071".to_owned()));
        assert!(
            nodes.live()[0].draining,
            "a drained node takes no placement"
        );
        assert!(nodes.view()[0].draining);
        let err = nodes.drain("x").unwrap_err();
        assert!(
            err.contains("no state node `x`") && err.contains("a, b"),
            "{err}"
        );
        // a restarts: its old stream's end must not drop the new registration.
        let a2 = nodes.attach(&reg("a")).unwrap();
        nodes.lost("a", a, "old stream closed");
        assert_eq!(nodes.view().len(), 2);
        nodes.lost("a", a2, "closed");
        assert_eq!(nodes.view().len(), 1);
        // Another node on b's address, or on another object store, is refused.
        let err = nodes
            .attach(&pbc::StateNodeRegister {
                endpoint: "http://b:7071".into(),
                ..reg("c")
            })
            .unwrap_err();
        assert!(
            err.contains("claims http://b:7071") && err.contains("node `b`"),
            "{err}"
        );
        let err = nodes
            .attach(&pbc::StateNodeRegister {
                object_store: "s3://other".into(),
                ..reg("c")
            })
            .unwrap_err();
        assert!(
            err.contains("one object store") && err.contains("s3://other"),
            "{err}"
        );
        std::thread::sleep(Duration::from_millis(60));
        nodes.reap();
        assert!(nodes.view().is_empty(), "b fell silent");
    }
}
