//! One connection to one broker, speaking the Kafka protocol through `kafka-protocol`'s
//! message types: a request goes out, its response comes back, one at a time.
//!
//! It knows frames and versions, not transactions; every wait is bounded by a timeout
//! and a response larger than [`MAX_RESPONSE`] is refused instead of allocated.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use sluice_compute::error::{Error, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What an error says when the broker closed the connection instead of answering.
pub const CLOSED_IN_ANSWER: &str = "closed the connection in answer to";

/// The largest response a broker may send before the connection is failed.
pub const MAX_RESPONSE: usize = 64 << 20;

/// A connection to the broker at `addr`.
#[derive(Debug)]
pub struct Connection {
    addr: String,
    stream: TcpStream,
    correlation: i32,
    timeout: Duration,
    client_id: StrBytes,
}

impl Connection {
    /// Connects to `addr` (`host:port`) within `timeout`, which also bounds every request.
    pub async fn connect(addr: &str, client_id: &str, timeout: Duration) -> Result<Self> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                Error::External(format!(
                    "Kafka broker `{addr}` did not accept a connection within {timeout:?}"
                ))
            })?
            .map_err(|e| {
                Error::External(format!("cannot connect to Kafka broker `{addr}`: {e}"))
            })?;
        stream.set_nodelay(true).ok();
        Ok(Self {
            addr: addr.to_string(),
            stream,
            correlation: 0,
            timeout,
            client_id: StrBytes::from_string(client_id.to_string()),
        })
    }

    /// The broker's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `request` as `version` and decodes its response.
    pub async fn call<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response> {
        self.correlation = self.correlation.wrapping_add(1);
        let correlation = self.correlation;
        let frame = encode(request, version, correlation, &self.client_id)
            .map_err(|e| self.protocol(R::KEY, format!("cannot encode the request: {e}")))?;
        let exchange = async {
            self.stream.write_all(&frame).await?;
            let len = self.stream.read_i32().await?;
            if len < 0 || len as usize > MAX_RESPONSE {
                return Err(std::io::Error::other(format!("a response of {len} bytes")));
            }
            let mut body = vec![0u8; len as usize];
            self.stream.read_exact(&mut body).await?;
            Ok(Bytes::from(body))
        };
        let body = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                Error::External(format!(
                    "Kafka broker `{}` did not answer {} within {:?}",
                    self.addr,
                    api_name(R::KEY),
                    self.timeout
                ))
            })?
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::External(format!(
                        "Kafka broker `{}` {CLOSED_IN_ANSWER} {}",
                        self.addr,
                        api_name(R::KEY)
                    ))
                } else {
                    Error::External(format!(
                        "Kafka broker `{}` failed during {}: {e}",
                        self.addr,
                        api_name(R::KEY)
                    ))
                }
            })?;
        decode::<R>(body, version, correlation).map_err(|e| self.protocol(R::KEY, e))
    }

    fn protocol(&self, key: i16, what: impl std::fmt::Display) -> Error {
        Error::External(format!(
            "Kafka broker `{}`: {} {what}",
            self.addr,
            api_name(key)
        ))
    }
}

/// The length-prefixed frame of one request.
fn encode<R: Request>(
    request: &R,
    version: i16,
    correlation: i32,
    client_id: &StrBytes,
) -> anyhow::Result<BytesMut> {
    let mut header = RequestHeader::default();
    header.request_api_key = R::KEY;
    header.request_api_version = version;
    header.correlation_id = correlation;
    header.client_id = Some(client_id.clone());
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header.encode(&mut buf, R::header_version(version))?;
    request.encode(&mut buf, version)?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

/// A response body (without its length) as `R`'s response.
fn decode<R: Request>(
    mut body: Bytes,
    version: i16,
    correlation: i32,
) -> Result<R::Response, String> {
    let header = ResponseHeader::decode(&mut body, R::Response::header_version(version))
        .map_err(|e| format!("answered with an unreadable header: {e}"))?;
    if header.correlation_id != correlation {
        return Err(format!(
            "answered request {} when {correlation} was asked",
            header.correlation_id
        ));
    }
    R::Response::decode(&mut body, version).map_err(|e| format!("answered unreadably: {e}"))
}

/// A request's name as Kafka's documentation spells it.
pub fn api_name(key: i16) -> String {
    kafka_protocol::messages::ApiKey::try_from(key)
        .map(|k| format!("{k:?}"))
        .unwrap_or_else(|_| format!("API {key}"))
}
