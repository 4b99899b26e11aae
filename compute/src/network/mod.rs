//! The data plane between worker processes: credit-based flow control over TCP
//! (DESIGN §6, Flink's model).
//!
//! A producer subtask writes into a result partition with one subpartition per
//! consumer channel; a consumer's input gate has one channel per producer subtask.
//! Channels between tasks of one worker stay in `crate::queue` (same bounds, no
//! network); channels between workers travel over one TCP connection per worker pair.
//!
//! - [`frame`]: the wire format (length-prefixed frames, hello with protocol version).
//! - [`codec`]: elements as bytes; batches as Arrow IPC; reassembly across buffers.
//! - [`partition`]: the producer's subpartition: buffers, backlog, flushing, blocking.
//! - [`credit`]: the consumer's credit: exclusive and floating buffers.
//! - [`input_channel`]: the consumer's remote channel: buffers to elements for the gate.
//! - [`connection`]: one connection's reader, writer and send loops; failure handling.
//! - [`environment`]: a worker's listener, its connections to every peer, and the
//!   registry that wires channels to connections before they start.
//! - [`transport`]: the stream under a connection: plain TCP, or mutual TLS with the
//!   cluster's certificates.
//!
//! This module knows channels, buffers and peers; it does not know operators, plans or
//! which subtask runs where (the caller says).

pub mod codec;
pub mod connection;
pub mod credit;
pub mod environment;
pub mod frame;
pub mod input_channel;
pub mod partition;
pub mod transport;

use std::time::Duration;

use sluice_common::pb::cluster as pbc;

/// Settings of the data plane.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// Bytes per network buffer.
    pub buffer_bytes: usize,
    /// Buffers each remote input channel owns.
    pub exclusive_buffers: u32,
    /// Buffers each input gate shares among its remote channels.
    pub floating_buffers: u32,
    /// A partly filled buffer is sent after this long.
    pub buffer_timeout: Duration,
    /// Send every batch at once (buffer timeout 0).
    pub flush_every_batch: bool,
    /// Largest frame a peer may send.
    pub max_frame_bytes: usize,
    /// Finished buffers a subpartition queues before its producer blocks.
    pub subpartition_buffers: usize,
    /// Silence after which a peer is considered gone.
    pub peer_timeout: Duration,
    /// How long to wait for every peer to connect.
    pub connect_timeout: Duration,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            buffer_bytes: 32 << 10,
            exclusive_buffers: 2,
            // Floating buffers and the producer's queue cover the time a buffer and its
            // credit take to cross two processes' schedulers: with Flink's 8 and 4 here,
            // q5 across two workers on 2 cores left the sources back-pressured half
            // the time while their consumers idled (0.74-0.78 of one process); with 16
            // and 16, 0.92-0.93 (`sluice bench nexmark --query q5 --workers 1|2`).
            floating_buffers: 16,
            buffer_timeout: Duration::from_millis(100),
            flush_every_batch: false,
            max_frame_bytes: (32 << 10) + 64,
            subpartition_buffers: 16,
            peer_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(30),
        }
    }
}

impl NetworkConfig {
    /// The settings `pb` asks for (zeros mean defaults).
    pub fn from_proto(pb: Option<&pbc::NetworkConfig>) -> Self {
        let mut c = Self::default();
        let Some(pb) = pb else { return c };
        if pb.buffer_bytes > 0 {
            c.buffer_bytes = pb.buffer_bytes as usize;
        }
        if pb.exclusive_buffers > 0 {
            c.exclusive_buffers = pb.exclusive_buffers;
        }
        if pb.floating_buffers > 0 {
            c.floating_buffers = pb.floating_buffers;
        }
        if pb.buffer_timeout_ms > 0 {
            c.buffer_timeout = Duration::from_millis(pb.buffer_timeout_ms);
        }
        c.flush_every_batch = pb.flush_every_batch;
        c.max_frame_bytes = match pb.max_frame_bytes {
            0 => c.buffer_bytes + 64,
            n => n as usize,
        };
        if pb.subpartition_buffers > 0 {
            c.subpartition_buffers = pb.subpartition_buffers as usize;
        }
        if pb.peer_timeout_ms > 0 {
            c.peer_timeout = Duration::from_millis(pb.peer_timeout_ms);
        }
        c
    }

    /// As a message.
    pub fn to_proto(&self) -> pbc::NetworkConfig {
        pbc::NetworkConfig {
            buffer_bytes: self.buffer_bytes as u32,
            exclusive_buffers: self.exclusive_buffers,
            floating_buffers: self.floating_buffers,
            buffer_timeout_ms: self.buffer_timeout.as_millis() as u64,
            flush_every_batch: self.flush_every_batch,
            max_frame_bytes: self.max_frame_bytes as u32,
            subpartition_buffers: self.subpartition_buffers as u32,
            peer_timeout_ms: self.peer_timeout.as_millis() as u64,
        }
    }
}
