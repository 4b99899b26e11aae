//! A worker's data plane: its listener, one connection per peer, and the registry that
//! wires channels to connections before they start.
//!
//! Worker `i` connects to every peer `j > i` and accepts from every `j < i`, so each
//! pair has exactly one connection. A peer this worker connects to that fails its hello
//! (wrong magic, wrong version, another worker index) fails the worker with a message
//! naming the address and the problem; an incoming connection that fails its hello is
//! refused and logged and the worker goes on waiting for its peers (anyone who reaches
//! the port can send bytes; a stranger must not fail a job). With the cluster's TLS
//! identity every connection is mutual TLS first (`transport`): a peer whose certificate
//! fails is named like a bad hello, a stranger without one is refused like one. Every
//! wait here is bounded by the connect timeout, whose error lists what was refused
//! meanwhile.
//!
//! [`NetworkBuilder`] collects, while tasks are built, which subpartitions go to which
//! peer and which remote input channels come from it; [`NetworkBuilder::start`] starts
//! every connection's tasks, owned by the returned [`RunningNetwork`] (aborted when it
//! is dropped). [`RunningNetwork::finish`] waits for everything to be sent and for each
//! peer to close its end.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::network::NetworkConfig;
use crate::network::codec::DEFAULT_MAX_ELEMENT_BYTES;
use crate::network::connection::{self, ConnectionPlan, ConnectionSettings};
use crate::network::credit::{CreditStats, FloatingPool, InputCredit};
use crate::network::frame::ChannelId;
use crate::network::input_channel::RemoteInputChannel;
use crate::network::partition::{Subpartition, SubpartitionStats, SubpartitionWriter};
use crate::network::transport::{self, DataTls, PeerStream};
use crate::queue::Inlet;

fn peer_name(index: u32, addr: &str) -> String {
    format!("worker {index} ({addr})")
}

/// Connects this worker (`me`) to every other worker of `peers` (data addresses by
/// worker index), over TLS with `tls`.
pub async fn connect_peers(
    listener: &TcpListener,
    me: u32,
    peers: &[String],
    config: &NetworkConfig,
    tls: Option<&DataTls>,
) -> Result<HashMap<u32, PeerStream>> {
    let deadline = Instant::now() + config.connect_timeout;
    let hello_timeout = Duration::from_secs(10).min(config.connect_timeout);
    let n = peers.len() as u32;
    let outgoing = async {
        let mut out = HashMap::new();
        for j in (me + 1)..n {
            let addr = &peers[j as usize];
            let stream = loop {
                match TcpStream::connect(addr.as_str()).await {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(Error::Network {
                            peer: peer_name(j, addr),
                            message: format!("cannot connect: {e}"),
                        });
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            let opened = async {
                let mut stream =
                    within(hello_timeout, transport::connect(stream, addr, tls)).await?;
                let got = connection::handshake(&mut stream, me, hello_timeout).await?;
                Ok::<_, String>((stream, got))
            };
            let (stream, got) = opened.await.map_err(|message| Error::Network {
                peer: peer_name(j, addr),
                message,
            })?;
            if got != j {
                return Err(Error::Network {
                    peer: peer_name(j, addr),
                    message: format!("answered as worker {got}"),
                });
            }
            out.insert(j, stream);
        }
        Ok::<_, Error>(out)
    };
    // Handshakes run side by side, so a stranger that connects and says nothing does not
    // hold up the peers; a bad handshake is refused and logged, never fatal: anyone who
    // can reach the port can send one (the connect timeout still bounds the wait, and
    // its error names what was refused).
    let incoming = async {
        let mut got: HashMap<u32, PeerStream> = HashMap::new();
        let mut handshakes = JoinSet::new();
        let mut refused: Vec<String> = Vec::new();
        while (got.len() as u32) < me {
            tokio::select! {
                accepted = tokio::time::timeout_at(deadline.into(), listener.accept()) => {
                    match accepted {
                        Err(_) => {
                            let missing: Vec<String> = (0..me)
                                .filter(|j| !got.contains_key(j))
                                .map(|j| peer_name(j, &peers[j as usize]))
                                .collect();
                            let mut message =
                                format!("did not connect within {:?}", config.connect_timeout);
                            if !refused.is_empty() {
                                message.push_str(&format!(
                                    "; refused meanwhile: {}",
                                    refused.join("; ")
                                ));
                            }
                            return Err(Error::Network {
                                peer: missing.join(", "),
                                message,
                            });
                        }
                        Ok(Err(e)) => {
                            return Err(Error::Network {
                                peer: "listener".into(),
                                message: format!("accept failed: {e}"),
                            });
                        }
                        Ok(Ok((stream, addr))) => {
                            let tls = tls.cloned();
                            handshakes.spawn(async move {
                                let opened = async {
                                    let mut stream =
                                        within(hello_timeout, transport::accept(stream, tls.as_ref())).await?;
                                    let index = connection::handshake(&mut stream, me, hello_timeout).await?;
                                    Ok::<_, String>((stream, index))
                                };
                                (addr, opened.await)
                            });
                        }
                    }
                }
                Some(joined) = handshakes.join_next(), if !handshakes.is_empty() => {
                    let Ok((addr, r)) = joined else { continue };
                    let problem = match r {
                        Err(message) => message,
                        Ok((_, index)) if index >= me || got.contains_key(&index) => {
                            format!("claims to be worker {index}, which is not expected here")
                        }
                        Ok((stream, index)) => {
                            got.insert(index, stream);
                            continue;
                        }
                    };
                    tracing::warn!(peer = %addr, "refused a data connection: {problem}");
                    if refused.len() < 8 {
                        refused.push(format!("{addr}: {problem}"));
                    }
                }
            }
        }
        Ok::<_, Error>(got)
    };
    let (out, inc) = tokio::try_join!(outgoing, incoming)?;
    let mut all = out;
    all.extend(inc);
    Ok(all)
}

/// `opening`, or an error once `limit` has passed (a TLS handshake the peer never
/// finishes).
async fn within<T>(
    limit: Duration,
    opening: impl std::future::Future<Output = std::result::Result<T, String>>,
) -> std::result::Result<T, String> {
    tokio::time::timeout(limit, opening)
        .await
        .map_err(|_| format!("no TLS handshake within {limit:?}"))?
}

/// Live figures of this worker's remote channels, for metrics.
#[derive(Debug, Default, Clone)]
pub struct NetworkProbes {
    /// Subpartitions by producing task name.
    pub outputs: Vec<(String, Arc<Subpartition>)>,
    /// Input credits by consuming task name.
    pub inputs: Vec<(String, Arc<InputCredit>)>,
}

impl NetworkProbes {
    /// Sums over the subpartitions of `task`.
    pub fn output_stats(&self, task: &str) -> SubpartitionStats {
        let mut s = SubpartitionStats::default();
        for (_, p) in self.outputs.iter().filter(|(t, _)| t == task) {
            let x = p.stats();
            s.buffers += x.buffers;
            s.credit += x.credit;
            s.bytes_out += x.bytes_out;
        }
        s
    }

    /// Sums over the input channels of `task` (the largest buffer size of them).
    pub fn input_stats(&self, task: &str) -> CreditStats {
        let mut s = CreditStats::default();
        for (_, c) in self.inputs.iter().filter(|(t, _)| t == task) {
            let x = c.stats();
            s.in_use += x.in_use;
            s.announced += x.announced;
            s.backlog += x.backlog;
            s.held_bytes += x.held_bytes;
            s.buffer_bytes = s.buffer_bytes.max(x.buffer_bytes);
        }
        s
    }
}

/// Collects the remote channels of this worker's tasks before the connections start.
#[derive(Debug)]
pub struct NetworkBuilder {
    config: NetworkConfig,
    peers: Vec<String>,
    plans: HashMap<u32, ConnectionPlan>,
    probes: NetworkProbes,
    /// Floating pools (one per input gate) that serve a remote channel.
    remote_gates: HashSet<usize>,
}

/// The most memory a worker's remote channels may hold: every buffer their settings let
/// them own. (Beside them: an element in reassembly, up to one per input channel, and
/// the overdraft of an element a subpartition finishes beyond its queue, up to one per
/// output channel; its full buffers are mostly slices of the batch's own Arrow buffers.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkMemory {
    /// Remote input channels, each with its exclusive buffers.
    pub inputs: usize,
    /// Input gates with a remote channel, each with its floating buffers.
    pub gates: usize,
    /// Subpartitions (remote output channels): queued buffers and a partial one each.
    pub outputs: usize,
    /// Connections: each a queue of frames for its writer and a write buffer.
    pub connections: usize,
    /// All of it, in bytes.
    pub bytes: u64,
}

impl NetworkMemory {
    /// The bound for these channels under `config`.
    pub fn of(
        config: &NetworkConfig,
        inputs: usize,
        gates: usize,
        outputs: usize,
        connections: usize,
    ) -> Self {
        let buffers = inputs * config.exclusive_buffers as usize
            + gates * config.floating_buffers as usize
            + outputs * (config.subpartition_buffers + 1)
            + connections * connection::WRITER_FRAMES;
        let bytes = buffers as u64 * config.buffer_bytes as u64
            + (connections * connection::IO_BUFFER_BYTES) as u64;
        Self {
            inputs,
            gates,
            outputs,
            connections,
            bytes,
        }
    }

    /// Fails, naming what takes the memory, when it exceeds `budget` bytes (0: no
    /// limit).
    pub fn check(&self, config: &NetworkConfig, budget: u64) -> Result<()> {
        if budget == 0 || self.bytes <= budget {
            return Ok(());
        }
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
        Err(Error::Plan(format!(
            "this worker's part of the job needs {} of network buffers, more than its \
             network memory ({}, `sluice worker --network-memory`): {} remote input \
             channels x {} exclusive buffers, {} input gates x {} floating, {} output \
             subpartitions x {} queued, {} connections x {} frames, at {} KiB per buffer; \
             give workers more network memory, run fewer subtasks per worker (more \
             workers or a lower parallelism), or use smaller buffers",
            mib(self.bytes),
            mib(budget),
            self.inputs,
            config.exclusive_buffers,
            self.gates,
            config.floating_buffers,
            self.outputs,
            config.subpartition_buffers + 1,
            self.connections,
            connection::WRITER_FRAMES,
            config.buffer_bytes >> 10,
        )))
    }
}

impl NetworkBuilder {
    /// A builder for a worker among `peers`.
    pub fn new(config: NetworkConfig, peers: Vec<String>) -> Self {
        Self {
            config,
            peers,
            plans: HashMap::new(),
            probes: NetworkProbes::default(),
            remote_gates: HashSet::new(),
        }
    }

    /// Fails when the channels registered so far may hold more than `budget` bytes (0:
    /// no limit); otherwise what they may hold.
    pub fn check_memory(&self, budget: u64) -> Result<NetworkMemory> {
        let need = self.memory();
        need.check(&self.config, budget)?;
        Ok(need)
    }

    /// The most memory the channels registered so far may hold, once connected.
    pub fn memory(&self) -> NetworkMemory {
        let (inputs, outputs) = self.plans.values().fold((0, 0), |(i, o), p| {
            (i + p.inputs.len(), o + p.outputs.len())
        });
        NetworkMemory::of(
            &self.config,
            inputs,
            self.remote_gates.len(),
            outputs,
            self.peers.len().saturating_sub(1),
        )
    }

    fn plan(&mut self, peer: u32) -> &mut ConnectionPlan {
        let name = peer_name(peer, self.peers.get(peer as usize).map_or("?", |s| s));
        self.plans
            .entry(peer)
            .or_insert_with(|| ConnectionPlan::new(name))
    }

    /// A floating-buffer pool for one input gate.
    pub fn floating_pool(&self) -> Arc<FloatingPool> {
        FloatingPool::new(self.config.floating_buffers)
    }

    /// The producer end of channel `id`, whose consumer runs on worker `peer`.
    pub fn output(&mut self, task: &str, peer: u32, id: ChannelId) -> SubpartitionWriter {
        let (bytes, cap, flush) = (
            self.config.buffer_bytes,
            self.config.subpartition_buffers,
            self.config.flush_every_batch,
        );
        let plan = self.plan(peer);
        let part = Subpartition::new(id, plan.peer.clone(), bytes, cap);
        plan.outputs.push(part.clone());
        self.probes.outputs.push((task.to_owned(), part.clone()));
        SubpartitionWriter::new(part, flush)
    }

    /// The consumer end of channel `id` (fed into `inlet`), whose producer runs on
    /// worker `peer`; returns its credit, which bounds the channel.
    pub fn input(
        &mut self,
        task: &str,
        peer: u32,
        id: ChannelId,
        inlet: Inlet,
        pool: &Arc<FloatingPool>,
    ) -> Arc<InputCredit> {
        let (exclusive, buffer_bytes) = (self.config.exclusive_buffers, self.config.buffer_bytes);
        self.remote_gates.insert(Arc::as_ptr(pool) as usize);
        let plan = self.plan(peer);
        let credit = Arc::new(InputCredit::new(
            id,
            exclusive,
            buffer_bytes,
            pool.clone(),
            plan.credit_tx.clone(),
        ));
        plan.inputs.push(RemoteInputChannel::new(
            id,
            credit.clone(),
            inlet,
            DEFAULT_MAX_ELEMENT_BYTES,
        ));
        self.probes.inputs.push((task.to_owned(), credit.clone()));
        credit
    }

    /// Live figures of the channels registered so far.
    pub fn probes(&self) -> NetworkProbes {
        self.probes.clone()
    }

    /// Starts every connection over `streams` (by peer index).
    pub fn start(self, mut streams: HashMap<u32, PeerStream>) -> Result<RunningNetwork> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let settings = ConnectionSettings {
            max_frame_bytes: self.config.max_frame_bytes,
            buffer_timeout: (!self.config.flush_every_batch).then_some(self.config.buffer_timeout),
            peer_timeout: self.config.peer_timeout,
        };
        let mut tasks = JoinSet::new();
        let mut plans = self.plans;
        for (peer, stream) in streams.drain() {
            let plan = plans.remove(&peer).unwrap_or_else(|| {
                ConnectionPlan::new(peer_name(peer, &self.peers[peer as usize]))
            });
            connection::start(stream, plan, settings, stop_rx.clone(), &mut tasks);
        }
        if let Some((peer, _)) = plans.into_iter().next() {
            return Err(Error::Internal(format!(
                "channels registered for worker {peer}, which has no connection"
            )));
        }
        Ok(RunningNetwork {
            tasks,
            stop: stop_tx,
        })
    }
}

/// The tasks of every connection; aborted when dropped.
#[derive(Debug)]
pub struct RunningNetwork {
    tasks: JoinSet<Result<()>>,
    stop: watch::Sender<bool>,
}

impl RunningNetwork {
    /// This worker's tasks are done: sends what is left, closes each connection once the
    /// peer closed its end too, and returns the first connection error.
    pub async fn finish(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        let mut first = None;
        while let Some(joined) = self.tasks.join_next().await {
            let r = joined.map_err(|e| Error::Internal(format!("a network task panicked: {e}")));
            if let Err(e) = r.and_then(|r| r)
                && first.is_none()
            {
                first = Some(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_memory_bound_counts_every_buffer_the_settings_allow() {
        let config = NetworkConfig::default();
        // 4 remote inputs x 2 + 2 gates x 16 + 4 subpartitions x (16 + 1) + 1 connection
        // x 64 frames = 172 buffers of 32 KiB, and a 256 KiB read buffer.
        let need = NetworkMemory::of(&config, 4, 2, 4, 1);
        assert_eq!(need.bytes, 172 * 32 * 1024 + 256 * 1024);
        need.check(&config, need.bytes).unwrap();
        need.check(&config, 0).unwrap();
        let err = need.check(&config, need.bytes - 1).unwrap_err().to_string();
        assert!(err.contains("needs 5.6 MiB of network buffers"), "{err}");
        assert!(
            err.contains("4 remote input channels x 2 exclusive buffers"),
            "{err}"
        );
        assert!(err.contains("at 32 KiB per buffer"), "{err}");
    }

    #[tokio::test]
    async fn the_builder_counts_its_remote_channels_and_gates() {
        let mut b = NetworkBuilder::new(
            NetworkConfig::default(),
            vec!["a:1".into(), "b:2".into(), "c:3".into()],
        );
        let pool = b.floating_pool();
        let _unused = b.floating_pool();
        for (i, peer) in [1u32, 2, 2].into_iter().enumerate() {
            let (tx, _rx) = crate::queue::input_queue(1, 1024);
            let id = ChannelId {
                chain: 1,
                subtask: 0,
                channel: i as u32,
            };
            let inlet = tx.into_iter().next().unwrap().into_inlet();
            b.input("t", peer, id, inlet, &pool);
        }
        b.output(
            "t",
            1,
            ChannelId {
                chain: 2,
                subtask: 0,
                channel: 0,
            },
        );
        let need = b.memory();
        assert_eq!(
            (need.inputs, need.gates, need.outputs, need.connections),
            (3, 1, 1, 2)
        );
    }
}
