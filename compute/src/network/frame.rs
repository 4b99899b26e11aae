//! The wire format of the data plane: length-prefixed frames.
//!
//! Every frame is `u32 length` (big-endian, counting what follows), a `u8` type and a
//! body. The reader checks the length against the configured maximum *before* it
//! allocates, so a peer cannot make a worker allocate more than one maximal frame.
//! A connection opens with a [`Frame::Hello`] each way (magic, protocol version, worker
//! index); everything else names its channel by [`ChannelId`].
//!
//! This file knows bytes and frame types only: not what a buffer holds, nor credits'
//! meaning.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// `SLCE`: the first bytes of a hello.
pub const MAGIC: u32 = 0x534c_4345;
/// Version of this protocol; a peer with another version is refused.
pub const PROTOCOL_VERSION: u16 = 2;

/// Identifies one channel of a job: the consuming chain, the consuming subtask and the
/// channel index within that subtask's input gate (the producer subtask, 0 for forward).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId {
    /// Consuming chain.
    pub chain: u32,
    /// Consuming subtask.
    pub subtask: u32,
    /// Channel index in the consumer's gate.
    pub channel: u32,
}

impl std::fmt::Display for ChannelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.chain, self.subtask, self.channel)
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Opens a connection.
    Hello {
        /// Must be [`MAGIC`].
        magic: u32,
        /// Must be [`PROTOCOL_VERSION`].
        version: u16,
        /// The sender's worker index.
        worker: u32,
    },
    /// A network buffer of a subpartition's element stream, sent against one credit.
    Buffer {
        /// The channel.
        id: ChannelId,
        /// Finished buffers still queued at the producer after this one.
        backlog: u32,
        /// Up to one buffer of encoded elements.
        data: Bytes,
    },
    /// The consumer grants `credits` more buffers.
    Credit {
        /// The channel.
        id: ChannelId,
        /// How many.
        credits: u32,
    },
    /// A priority event (an unaligned barrier) that overtakes queued buffers; needs no
    /// credit.
    Priority {
        /// The channel.
        id: ChannelId,
        /// Elements of the channel written before the event.
        sequence: u64,
        /// One encoded element.
        data: Bytes,
    },
    /// Keeps an idle connection alive.
    Ping,
    /// The consumer asks for buffers of `bytes` from now on (buffer debloating); at most
    /// the configured buffer size.
    BufferSize {
        /// The channel.
        id: ChannelId,
        /// Bytes per buffer.
        bytes: u32,
    },
}

const HELLO: u8 = 1;
const BUFFER: u8 = 2;
const CREDIT: u8 = 3;
const PRIORITY: u8 = 4;
const PING: u8 = 5;
const BUFFER_SIZE: u8 = 6;

/// What was wrong with bytes read from a peer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Longer than the configured maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLong {
        /// Announced length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A type byte this version does not know.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The body is shorter or longer than its type needs.
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    /// An empty frame.
    #[error("empty frame")]
    Empty,
}

impl Frame {
    /// Appends the encoded frame (length prefix included) to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        if let Some(payload) = self.encode_head(out) {
            out.put_slice(payload);
        }
    }

    /// Appends the frame's length prefix, type and fixed fields to `out`, and returns
    /// the payload that must follow them on the wire (a buffer's or priority event's
    /// bytes), so that a writer can send it from where it is instead of copying it.
    pub fn encode_head(&self, out: &mut BytesMut) -> Option<&Bytes> {
        let start = out.len();
        out.put_u32(0);
        let payload = match self {
            Frame::Hello {
                magic,
                version,
                worker,
            } => {
                out.put_u8(HELLO);
                out.put_u32(*magic);
                out.put_u16(*version);
                out.put_u32(*worker);
                None
            }
            Frame::Buffer { id, backlog, data } => {
                out.put_u8(BUFFER);
                put_id(out, id);
                out.put_u32(*backlog);
                Some(data)
            }
            Frame::Credit { id, credits } => {
                out.put_u8(CREDIT);
                put_id(out, id);
                out.put_u32(*credits);
                None
            }
            Frame::Priority { id, sequence, data } => {
                out.put_u8(PRIORITY);
                put_id(out, id);
                out.put_u64(*sequence);
                Some(data)
            }
            Frame::Ping => {
                out.put_u8(PING);
                None
            }
            Frame::BufferSize { id, bytes } => {
                out.put_u8(BUFFER_SIZE);
                put_id(out, id);
                out.put_u32(*bytes);
                None
            }
        };
        let len = (out.len() - start - 4 + payload.map_or(0, |p| p.len())) as u32;
        out[start..start + 4].copy_from_slice(&len.to_be_bytes());
        payload
    }

    /// Decodes one frame body (after the length prefix).
    pub fn decode(mut body: Bytes) -> Result<Frame, FrameError> {
        if body.is_empty() {
            return Err(FrameError::Empty);
        }
        let kind = body.get_u8();
        let need = |body: &Bytes, n: usize, what: &'static str| {
            if body.len() < n {
                Err(FrameError::Malformed(what))
            } else {
                Ok(())
            }
        };
        match kind {
            HELLO => {
                if body.len() != 10 {
                    return Err(FrameError::Malformed("hello"));
                }
                Ok(Frame::Hello {
                    magic: body.get_u32(),
                    version: body.get_u16(),
                    worker: body.get_u32(),
                })
            }
            BUFFER => {
                need(&body, 16, "buffer")?;
                let id = get_id(&mut body);
                let backlog = body.get_u32();
                Ok(Frame::Buffer {
                    id,
                    backlog,
                    data: body,
                })
            }
            CREDIT => {
                if body.len() != 16 {
                    return Err(FrameError::Malformed("credit"));
                }
                Ok(Frame::Credit {
                    id: get_id(&mut body),
                    credits: body.get_u32(),
                })
            }
            PRIORITY => {
                need(&body, 20, "priority")?;
                let id = get_id(&mut body);
                let sequence = body.get_u64();
                Ok(Frame::Priority {
                    id,
                    sequence,
                    data: body,
                })
            }
            PING if body.is_empty() => Ok(Frame::Ping),
            PING => Err(FrameError::Malformed("ping")),
            BUFFER_SIZE => {
                if body.len() != 16 {
                    return Err(FrameError::Malformed("buffer size"));
                }
                Ok(Frame::BufferSize {
                    id: get_id(&mut body),
                    bytes: body.get_u32(),
                })
            }
            other => Err(FrameError::UnknownType(other)),
        }
    }
}

fn put_id(out: &mut BytesMut, id: &ChannelId) {
    out.put_u32(id.chain);
    out.put_u32(id.subtask);
    out.put_u32(id.channel);
}

fn get_id(body: &mut Bytes) -> ChannelId {
    ChannelId {
        chain: body.get_u32(),
        subtask: body.get_u32(),
        channel: body.get_u32(),
    }
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The socket failed or closed mid-frame.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something invalid.
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Reads one frame; `Ok(None)` on a clean end of stream between frames. Allocates at
/// most `max_len` bytes.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_len: usize,
) -> Result<Option<Frame>, ReadError> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max_len {
        return Err(FrameError::TooLong { len, max: max_len }.into());
    }
    // Read into spare capacity: zero-filling every frame first cost ~7% of a consumer's
    // CPU (perf, `sluice bench exchange`).
    let mut body = BytesMut::with_capacity(len);
    while body.len() < len {
        let want = (len - body.len()) as u64;
        if (&mut *reader).take(want).read_buf(&mut body).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(Some(Frame::decode(body.freeze())?))
}

/// Writes one frame (unflushed).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &Frame,
    scratch: &mut BytesMut,
) -> std::io::Result<()> {
    scratch.clear();
    frame.encode(scratch);
    writer.write_all(scratch).await
}

/// Bytes a [`FrameReader`] asks of its socket per read, at least.
pub const READ_BUFFER_BYTES: usize = 256 << 10;

/// Reads frames through one read buffer: a read takes whatever the socket holds, often
/// several frames, and each frame's body is cut out of the buffer without a copy (a read
/// per frame and a read per length prefix cost a system call each). The buffer holds at
/// most [`READ_BUFFER_BYTES`] beyond one maximal frame. Cancel-safe: what was read stays
/// in the buffer.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_len: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Frames of `inner` of at most `max_len` bytes.
    pub fn new(inner: R, max_len: usize) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
            max_len,
        }
    }

    /// The next frame; `Ok(None)` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<Frame>, ReadError> {
        loop {
            let missing = if self.buf.len() >= 4 {
                let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if len > self.max_len {
                    return Err(FrameError::TooLong {
                        len,
                        max: self.max_len,
                    }
                    .into());
                }
                if self.buf.len() >= 4 + len {
                    let mut frame = self.buf.split_to(4 + len);
                    frame.advance(4);
                    return Ok(Some(Frame::decode(frame.freeze())?));
                }
                4 + len - self.buf.len()
            } else {
                4 - self.buf.len()
            };
            self.buf.reserve(missing.max(READ_BUFFER_BYTES));
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
        }
    }
}

/// Bytes of frames [`FrameWriter::push`] queues before it writes them.
const WRITE_BATCH_BYTES: usize = 256 << 10;
/// Frames it queues at most (a vectored write takes at most 1,024 slices).
const WRITE_BATCH_FRAMES: usize = 256;

/// Writes frames with vectored writes: each frame's head is encoded into one small
/// buffer and its payload (a network buffer's bytes) sent from where it is, so a buffer
/// is not copied on its way to the socket; frames are written in batches of about
/// [`WRITE_BATCH_BYTES`] or when [`FrameWriter::flush`] is called.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    heads: BytesMut,
    /// Per queued frame: the end of its head in `heads`, and its payload.
    queued: Vec<(usize, Option<Bytes>)>,
    queued_bytes: usize,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer into `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            heads: BytesMut::new(),
            queued: Vec::new(),
            queued_bytes: 0,
        }
    }

    /// Queues `frame`; writes the queue once it holds a batch.
    pub async fn push(&mut self, frame: &Frame) -> std::io::Result<()> {
        let start = self.heads.len();
        let payload = frame.encode_head(&mut self.heads).cloned();
        self.queued_bytes += self.heads.len() - start + payload.as_ref().map_or(0, |p| p.len());
        self.queued.push((self.heads.len(), payload));
        if self.queued_bytes >= WRITE_BATCH_BYTES || self.queued.len() >= WRITE_BATCH_FRAMES {
            self.write_queued().await?;
        }
        Ok(())
    }

    /// Writes everything queued and flushes the stream.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        self.write_queued().await?;
        self.inner.flush().await
    }

    /// Flushes, then shuts the stream's write side down.
    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.flush().await?;
        self.inner.shutdown().await
    }

    async fn write_queued(&mut self) -> std::io::Result<()> {
        if self.queued.is_empty() {
            return Ok(());
        }
        // Heads of frames without a payload are adjacent in `heads`: one slice each run.
        let mut slices: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(self.queued.len() * 2);
        let mut run = 0;
        for (head_end, payload) in &self.queued {
            if let Some(p) = payload.as_ref().filter(|p| !p.is_empty()) {
                slices.push(std::io::IoSlice::new(&self.heads[run..*head_end]));
                slices.push(std::io::IoSlice::new(p));
                run = *head_end;
            }
        }
        if run < self.heads.len() {
            slices.push(std::io::IoSlice::new(&self.heads[run..]));
        }
        let mut rest: &mut [std::io::IoSlice<'_>] = &mut slices;
        while !rest.is_empty() {
            let n = self.inner.write_vectored(rest).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            std::io::IoSlice::advance_slices(&mut rest, n);
        }
        drop(slices);
        self.heads.clear();
        self.queued.clear();
        self.queued_bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: Frame) {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        let body = buf.split_off(4).freeze();
        assert_eq!(
            u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize,
            body.len()
        );
        assert_eq!(Frame::decode(body).unwrap(), frame);
    }

    #[test]
    fn frames_round_trip() {
        let id = ChannelId {
            chain: 1,
            subtask: 2,
            channel: 3,
        };
        round_trip(Frame::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            worker: 7,
        });
        round_trip(Frame::Buffer {
            id,
            backlog: 4,
            data: Bytes::from_static(b"abc"),
        });
        round_trip(Frame::Credit { id, credits: 2 });
        round_trip(Frame::Priority {
            id,
            sequence: 9,
            data: Bytes::from_static(b"x"),
        });
        round_trip(Frame::Ping);
        round_trip(Frame::BufferSize { id, bytes: 4096 });
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        assert_eq!(Frame::decode(Bytes::new()), Err(FrameError::Empty));
        assert_eq!(
            Frame::decode(Bytes::from_static(&[99])),
            Err(FrameError::UnknownType(99))
        );
        assert_eq!(
            Frame::decode(Bytes::from_static(&[CREDIT, 0, 0])),
            Err(FrameError::Malformed("credit"))
        );
        assert_eq!(
            Frame::decode(Bytes::from_static(&[BUFFER, 1])),
            Err(FrameError::Malformed("buffer"))
        );
    }

    #[tokio::test]
    async fn oversized_frames_are_refused_before_allocation() {
        let bytes = [0x7f, 0xff, 0xff, 0xff, 1];
        let err = read_frame(&mut &bytes[..], 1024).await.unwrap_err();
        assert!(
            err.to_string().contains("exceeds the maximum of 1024"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn frames_written_in_batches_are_read_back_whole_whatever_the_reads_return() {
        let id = ChannelId {
            chain: 1,
            subtask: 2,
            channel: 3,
        };
        let frames: Vec<Frame> = (0..600u32)
            .map(|i| match i % 3 {
                0 => Frame::Buffer {
                    id,
                    backlog: i,
                    data: Bytes::from(vec![i as u8; (i as usize * 37) % 5000]),
                },
                1 => Frame::Credit { id, credits: i },
                _ => Frame::Priority {
                    id,
                    sequence: u64::from(i),
                    data: Bytes::from_static(b"barrier"),
                },
            })
            .collect();
        // A pipe of 1 KiB: the writer's vectored writes and the reader's reads both
        // come back short, often in the middle of a frame.
        let (a, b) = tokio::io::duplex(1024);
        let writer = {
            let frames = frames.clone();
            tokio::spawn(async move {
                let mut w = FrameWriter::new(a);
                for f in &frames {
                    w.push(f).await.unwrap();
                }
                w.shutdown().await.unwrap();
            })
        };
        let mut r = FrameReader::new(b, 8192);
        let mut got = Vec::new();
        while let Some(f) = r.next().await.unwrap() {
            got.push(f);
        }
        writer.await.unwrap();
        assert_eq!(got, frames);
    }

    #[tokio::test]
    async fn the_reader_refuses_an_oversized_frame_before_reading_it_and_a_cut_one() {
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(&[0x40, 0, 0, 0, 2]).await.unwrap();
        let mut r = FrameReader::new(b, 1024);
        assert!(matches!(
            r.next().await,
            Err(ReadError::Frame(FrameError::TooLong { .. }))
        ));
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(&[0, 0, 0, 9, 5]).await.unwrap();
        drop(a);
        let mut r = FrameReader::new(b, 1024);
        assert!(matches!(r.next().await, Err(ReadError::Io(_))));
    }
}
