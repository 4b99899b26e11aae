//! One TCP connection between two workers, multiplexing every channel between them.
//!
//! A connection runs over a [`PeerStream`] (plain TCP, or TLS with the cluster's
//! certificates) and opens with a hello each way ([`handshake`]: magic, protocol version,
//! worker index) and then runs three kinds of owned tasks:
//!
//! - the **writer** owns the write half: it sends what the subpartitions' send loops and
//!   the input channels' credit announcements hand it, in vectored writes that send each
//!   buffer from where it is, and pings when idle;
//! - the **reader** owns the read half (read through one buffer, several frames a read)
//!   and the remote input channels: buffers and
//!   priority events go to their channel, credits and buffer sizes to their
//!   subpartition;
//! - one **send loop** per subpartition (`partition::send_loop`).
//!
//! Anything wrong on the wire (a malformed or oversized frame, an unknown channel, a
//! buffer without credit, silence longer than the peer timeout, a reset) closes the
//! connection: the error is logged naming the peer and the problem, and every channel of
//! the connection that has not finished fails, which fails its task. Nothing panics and
//! nothing is allocated beyond one maximal frame.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::network::frame::{
    self, ChannelId, Frame, FrameReader, FrameWriter, MAGIC, PROTOCOL_VERSION,
};
use crate::network::input_channel::RemoteInputChannel;
use crate::network::partition::{Subpartition, send_loop};
use crate::network::transport::PeerStream;

/// Frames the send loops of one connection may queue for its writer: buffers that left
/// their subpartitions and wait for the socket.
pub const WRITER_FRAMES: usize = 64;
/// The reader's buffer (`frame::FrameReader`), besides one maximal frame; the writer
/// sends buffers from where they are and keeps only frame heads.
pub const IO_BUFFER_BYTES: usize = frame::READ_BUFFER_BYTES;

/// Exchanges hellos on a fresh connection; returns the peer's worker index.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    me: u32,
    timeout: Duration,
) -> std::result::Result<u32, String> {
    let mut scratch = BytesMut::new();
    let hello = Frame::Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        worker: me,
    };
    let exchange = async {
        frame::write_frame(stream, &hello, &mut scratch)
            .await
            .map_err(|e| format!("sending hello: {e}"))?;
        stream.flush().await.map_err(|e| e.to_string())?;
        frame::read_frame(stream, 64)
            .await
            .map_err(|e| format!("bad hello: {e}"))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Err(format!("no hello within {timeout:?}")),
        Ok(Err(e)) => Err(e),
        Ok(Ok(None)) => Err("closed before its hello".into()),
        Ok(Ok(Some(Frame::Hello {
            magic,
            version,
            worker,
        }))) => {
            if magic != MAGIC {
                Err(format!("bad magic {magic:#x}: not a sluice worker"))
            } else if version != PROTOCOL_VERSION {
                Err(format!(
                    "protocol version {version}, this worker speaks {PROTOCOL_VERSION}"
                ))
            } else {
                Ok(worker)
            }
        }
        Ok(Ok(Some(other))) => Err(format!("expected a hello, got {other:?}")),
    }
}

/// What one connection carries, registered before it starts.
#[derive(Debug)]
pub struct ConnectionPlan {
    /// `worker 1 (127.0.0.1:4000)`.
    pub peer: String,
    /// Subpartitions this worker sends to the peer.
    pub outputs: Vec<Arc<Subpartition>>,
    /// Channels this worker receives from the peer.
    pub inputs: Vec<RemoteInputChannel>,
    /// Credit announcements of `inputs`.
    pub credit_tx: mpsc::UnboundedSender<Frame>,
    /// Their receiving end, for the writer.
    pub credit_rx: mpsc::UnboundedReceiver<Frame>,
}

impl ConnectionPlan {
    /// An empty plan for the connection to `peer`.
    pub fn new(peer: String) -> Self {
        let (credit_tx, credit_rx) = mpsc::unbounded_channel();
        Self {
            peer,
            outputs: Vec::new(),
            inputs: Vec::new(),
            credit_tx,
            credit_rx,
        }
    }
}

/// Settings a running connection needs.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionSettings {
    /// Largest frame accepted.
    pub max_frame_bytes: usize,
    /// Buffer timeout of the send loops (`None`: producers flush).
    pub buffer_timeout: Option<Duration>,
    /// Silence after which the peer is considered gone.
    pub peer_timeout: Duration,
}

/// Starts the tasks of one connection in `tasks`. `stop` turning true tells the writer
/// that this worker's tasks are done: it sends what is left and closes its half.
pub fn start(
    stream: PeerStream,
    plan: ConnectionPlan,
    settings: ConnectionSettings,
    stop: watch::Receiver<bool>,
    tasks: &mut JoinSet<Result<()>>,
) {
    match stream {
        // Owned halves of a socket need no lock between reader and writer.
        PeerStream::Plain(tcp) => {
            let (rd, wr) = tcp.into_split();
            start_halves(rd, wr, plan, settings, stop, tasks);
        }
        PeerStream::Tls(tls) => {
            let (rd, wr) = tokio::io::split(*tls);
            start_halves(rd, wr, plan, settings, stop, tasks);
        }
    }
}

fn start_halves<R, W>(
    rd: R,
    wr: W,
    plan: ConnectionPlan,
    settings: ConnectionSettings,
    stop: watch::Receiver<bool>,
    tasks: &mut JoinSet<Result<()>>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let ConnectionPlan {
        peer,
        outputs,
        inputs,
        credit_tx,
        credit_rx,
    } = plan;
    drop(credit_tx);
    let (frames_tx, frames_rx) = mpsc::channel(WRITER_FRAMES);
    for part in &outputs {
        tasks.spawn(send_loop(
            part.clone(),
            frames_tx.clone(),
            settings.buffer_timeout,
        ));
    }
    drop(frames_tx);
    for input in &inputs {
        input.credit().open();
    }
    let out_map: HashMap<ChannelId, Arc<Subpartition>> =
        outputs.iter().map(|p| (p.id(), p.clone())).collect();
    let in_map: HashMap<ChannelId, RemoteInputChannel> =
        inputs.into_iter().map(|c| (c.id(), c)).collect();
    tasks.spawn(write_loop(
        wr,
        frames_rx,
        credit_rx,
        stop,
        peer.clone(),
        outputs,
        settings.peer_timeout,
    ));
    tasks.spawn(read_loop(rd, in_map, out_map, peer, settings));
}

async fn write_loop<W: AsyncWrite + Unpin>(
    wr: W,
    mut frames: mpsc::Receiver<Frame>,
    mut credits: mpsc::UnboundedReceiver<Frame>,
    mut stop: watch::Receiver<bool>,
    peer: String,
    outputs: Vec<Arc<Subpartition>>,
    peer_timeout: Duration,
) -> Result<()> {
    let mut wr = FrameWriter::new(wr);
    let ping_every = (peer_timeout / 4).max(Duration::from_millis(50));
    let mut frames_open = true;
    let mut stopped = *stop.borrow();
    let result: std::io::Result<()> = async {
        loop {
            if !frames_open && stopped {
                // Everything sent: close our half; the peer reads to the end.
                while let Ok(f) = credits.try_recv() {
                    wr.push(&f).await?;
                }
                wr.shutdown().await?;
                return Ok(());
            }
            let frame = tokio::select! {
                biased;
                Some(f) = credits.recv() => f,
                f = frames.recv(), if frames_open => match f {
                    Some(f) => f,
                    None => {
                        frames_open = false;
                        continue;
                    }
                },
                changed = stop.changed(), if !stopped => {
                    stopped = changed.is_err() || *stop.borrow();
                    continue;
                }
                _ = tokio::time::sleep(ping_every) => Frame::Ping,
            };
            wr.push(&frame).await?;
            if frames.is_empty() && credits.is_empty() {
                wr.flush().await?;
            }
        }
    }
    .await;
    result.map_err(|e| {
        let message = format!("sending failed: {e}");
        tracing::error!(peer = %peer, "data connection closed: {message}");
        for part in &outputs {
            part.fail(message.clone());
        }
        Error::Network {
            peer: peer.clone(),
            message,
        }
    })
}

async fn read_loop<R: AsyncRead + Unpin>(
    rd: R,
    mut inputs: HashMap<ChannelId, RemoteInputChannel>,
    outputs: HashMap<ChannelId, Arc<Subpartition>>,
    peer: String,
    settings: ConnectionSettings,
) -> Result<()> {
    let mut rd = FrameReader::new(rd, settings.max_frame_bytes);
    let result: std::result::Result<(), String> = async {
        loop {
            let frame = match tokio::time::timeout(settings.peer_timeout, rd.next()).await
            {
                Err(_) => {
                    return Err(format!(
                        "no frame for {:?}: the peer is gone or stuck",
                        settings.peer_timeout
                    ));
                }
                Ok(Err(e)) => return Err(e.to_string()),
                Ok(Ok(None)) => {
                    let open = inputs.values().filter(|c| !c.is_finished()).count();
                    let unsent = outputs.values().filter(|p| !p.is_done()).count();
                    if open == 0 && unsent == 0 {
                        return Ok(());
                    }
                    return Err(format!(
                        "connection closed with {open} input and {unsent} output channels unfinished"
                    ));
                }
                Ok(Ok(Some(f))) => f,
            };
            match frame {
                Frame::Buffer { id, backlog, data } => match inputs.get_mut(&id) {
                    Some(ch) => ch.on_buffer(backlog, &data)?,
                    None => return Err(format!("buffer for unknown channel {id}")),
                },
                Frame::Priority { id, sequence, data } => match inputs.get_mut(&id) {
                    Some(ch) => ch.on_priority(sequence, &data)?,
                    None => return Err(format!("priority event for unknown channel {id}")),
                },
                Frame::Credit { id, credits } => match outputs.get(&id) {
                    Some(p) => p.add_credit(credits),
                    None => return Err(format!("credit for unknown channel {id}")),
                },
                Frame::BufferSize { id, bytes } => match outputs.get(&id) {
                    Some(p) => p.set_buffer_bytes(bytes as usize)?,
                    None => return Err(format!("buffer size for unknown channel {id}")),
                },
                Frame::Ping => {}
                Frame::Hello { .. } => return Err("a second hello".into()),
            }
        }
    }
    .await;
    result.map_err(|message| {
        tracing::error!(peer = %peer, "data connection closed: {message}");
        for ch in inputs.values() {
            ch.fail(Error::Network {
                peer: peer.clone(),
                message: message.clone(),
            });
        }
        for part in outputs.values() {
            part.fail(format!("the connection failed: {message}"));
        }
        Error::Network { peer, message }
    })
}
