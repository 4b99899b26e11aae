//! The control connection between a driver and a worker: protobuf messages, each
//! prefixed with its length (u32, big-endian), at most [`MAX_MESSAGE_BYTES`] long.

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Version of the control protocol (`Hello.protocol_version`).
pub const CONTROL_VERSION: u32 = 1;

/// Largest control message accepted (a job graph is a few KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Writes `msg` and flushes.
pub async fn write_message<W: AsyncWrite + Unpin, M: Message>(
    w: &mut W,
    msg: &M,
) -> std::io::Result<()> {
    let body = msg.encode_to_vec();
    w.write_all(&(body.len() as u32).to_be_bytes()).await?;
    w.write_all(&body).await?;
    w.flush().await
}

/// Reads one message; `Ok(None)` when the other end closed between messages.
pub async fn read_message<R: AsyncRead + Unpin, M: Message + Default>(
    r: &mut R,
) -> std::io::Result<Option<M>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("control message of {len} bytes exceeds {MAX_MESSAGE_BYTES}"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    M::decode(body.as_slice())
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
