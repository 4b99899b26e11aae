//! The byte stream under a data connection: plain TCP, or TLS over it when the worker
//! has the cluster's identity (`SLUICE_TLS_*`, `sluice_common::tls`). TLS here is
//! mutual: the connecting worker checks the peer's certificate against the address it
//! dialled, the accepting worker requires a certificate the cluster's CA signed, so a
//! process without one can neither send a worker data nor receive any.
//!
//! This module opens streams; it must not know frames, channels or what runs over them.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use sluice_common::tls::ClusterTls;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The TLS settings of this worker's data connections, both directions.
#[derive(Clone)]
pub struct DataTls {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for DataTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataTls")
    }
}

impl DataTls {
    /// Data connections presenting `tls`'s certificate and trusting only its CA.
    ///
    /// # Errors
    /// Certificates or a key rustls cannot use.
    pub fn new(tls: &ClusterTls) -> Result<Self, String> {
        Ok(Self {
            connector: TlsConnector::from(tls.rustls_client()?),
            acceptor: TlsAcceptor::from(tls.rustls_server()?),
        })
    }

    /// The settings of this process's cluster identity, if it has one.
    ///
    /// # Errors
    /// As [`DataTls::new`].
    pub fn of_process() -> Result<Option<Arc<Self>>, String> {
        sluice_common::tls::cluster_tls()
            .map(|tls| Self::new(tls).map(Arc::new))
            .transpose()
    }
}

/// A data connection's stream.
#[derive(Debug)]
pub enum PeerStream {
    /// Plain TCP: split into owned halves, no lock between reader and writer.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

/// Opens the stream of a connection this worker made to `addr` (`host:port`).
///
/// # Errors
/// The TLS handshake failed (the peer's certificate not of the cluster's CA or not for
/// `addr`'s host, our certificate refused); the error says why.
pub async fn connect(
    stream: TcpStream,
    addr: &str,
    tls: Option<&DataTls>,
) -> Result<PeerStream, String> {
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return Ok(PeerStream::Plain(stream));
    };
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| format!("`{host}` is not a name TLS can check: {e}"))?;
    let stream = tls
        .connector
        .connect(name, stream)
        .await
        .map_err(|e| format!("TLS: {}", sluice_common::tls::with_causes(&e)))?;
    Ok(PeerStream::Tls(Box::new(stream.into())))
}

/// Opens the stream of a connection this worker accepted.
///
/// # Errors
/// The TLS handshake failed (plaintext, no client certificate, one of another CA).
pub async fn accept(stream: TcpStream, tls: Option<&DataTls>) -> Result<PeerStream, String> {
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return Ok(PeerStream::Plain(stream));
    };
    let stream = tls
        .acceptor
        .accept(stream)
        .await
        .map_err(|e| format!("TLS: {}", sluice_common::tls::with_causes(&e)))?;
    Ok(PeerStream::Tls(Box::new(stream.into())))
}

impl AsyncRead for PeerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            PeerStream::Plain(s) => s.is_write_vectored(),
            PeerStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::network::NetworkConfig;
    use crate::network::environment::connect_peers;

    /// A host identity for 127.0.0.1: one of a CA made now, or `cluster`'s.
    fn identity(cluster: Option<&[String; 3]>) -> ([String; 3], DataTls) {
        let pem = match cluster {
            Some(c) => c.clone(),
            None => sluice_common::tls::ephemeral_identity(&["127.0.0.1"]).unwrap(),
        };
        let [ca, cert, key] = pem.clone().map(String::into_bytes);
        let tls = DataTls::new(&ClusterTls::from_pem(ca, cert, key).unwrap()).unwrap();
        (pem, tls)
    }

    fn config() -> NetworkConfig {
        NetworkConfig {
            connect_timeout: Duration::from_secs(3),
            ..NetworkConfig::default()
        }
    }

    async fn listeners() -> ([TcpListener; 2], Vec<String>) {
        let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peers = [&a, &b]
            .map(|l| l.local_addr().unwrap().to_string())
            .to_vec();
        ([a, b], peers)
    }

    fn only(mut streams: HashMap<u32, PeerStream>, peer: u32) -> PeerStream {
        let stream = streams.remove(&peer).expect("a stream to the peer");
        assert!(matches!(stream, PeerStream::Tls(_)), "{stream:?}");
        stream
    }

    #[tokio::test]
    async fn workers_talk_over_mutual_tls_and_a_plaintext_stranger_is_refused() {
        let (pem, tls0) = identity(None);
        let (_, tls1) = identity(Some(&pem));
        let ([l0, l1], peers) = listeners().await;
        // A stranger reaches worker 1's port first and speaks plain frames.
        let mut stranger = tokio::net::TcpStream::connect(&peers[1]).await.unwrap();
        stranger.write_all(b"\0\0\0\x0chello sluice").await.unwrap();
        let config = config();
        let (s0, s1) = tokio::join!(
            connect_peers(&l0, 0, &peers, &config, Some(&tls0)),
            connect_peers(&l1, 1, &peers, &config, Some(&tls1)),
        );
        let (mut s0, mut s1) = (only(s0.unwrap(), 1), only(s1.unwrap(), 0));
        s0.write_all(b"over tls").await.unwrap();
        s0.flush().await.unwrap();
        let mut got = [0u8; 8];
        s1.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"over tls");
        // The stranger got no hello, only the end of its connection.
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stranger.read_to_end(&mut rest)).await;
        assert!(!rest.windows(4).any(|w| w == b"SLCE"), "{rest:?}");
    }

    #[tokio::test]
    async fn a_peer_of_another_ca_is_named_on_both_sides() {
        let (_, good) = identity(None);
        let (_, foreign) = identity(None);
        let ([l0, l1], peers) = listeners().await;
        let config = config();
        let (s0, s1) = tokio::join!(
            connect_peers(&l0, 0, &peers, &config, Some(&foreign)),
            connect_peers(&l1, 1, &peers, &config, Some(&good)),
        );
        let dialler = s0.unwrap_err().to_string();
        assert!(
            dialler.contains(&format!("worker 1 ({})", peers[1])),
            "{dialler}"
        );
        assert!(dialler.contains("invalid peer certificate"), "{dialler}");
        // The accepting worker refused it and says so when its wait ends.
        let acceptor = s1.unwrap_err().to_string();
        assert!(acceptor.contains("refused meanwhile"), "{acceptor}");
        assert!(acceptor.contains("TLS"), "{acceptor}");
    }
}
