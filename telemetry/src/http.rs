//! How every role's HTTP endpoints (the coordinator's REST API, `GET /metrics`) take
//! connections: at most [`Limits::max_connections`] at once (more wait in the listen
//! backlog), and a client has [`Limits::header_read_timeout`] to send a request's
//! headers, also the next request on a kept-alive connection. Without these, anyone who
//! reaches the port could hold any number of connections open with half-sent requests
//! (2,000 were held for 35 s against `axum::serve`).
//!
//! It knows nothing of what the router serves.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Bounds of one HTTP server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time a client has to send a request's headers.
    pub header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on `listener` within `limits`, until the future is dropped. A failed
/// accept (out of file descriptors, say) is logged and the server goes on.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits) {
    serve_tls(listener, router, limits, None).await;
}

/// [`serve`], over TLS with `tls`: a client that does not complete the handshake within
/// [`Limits::header_read_timeout`] (plain HTTP, a stranger, a certificate the server's
/// CA did not sign) is dropped, logged, without a request served.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("accepting an HTTP connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Handlers that must know who calls (a joining worker's address) read it here.
        let service = TowerToHyperService::new(
            router
                .clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
        );
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            // A client that breaks off or times out ends its connection; nothing to report.
            match acceptor {
                None => {
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(tls)) => {
                            let _ = http.serve_connection(TokioIo::new(tls), service).await;
                        }
                        Ok(Err(e)) => tracing::info!("refused a TLS connection from {peer}: {e}"),
                        Err(_) => tracing::info!(
                            "refused a TLS connection from {peer}: no handshake in time"
                        ),
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use axum::routing::get;

    use super::*;

    async fn server(limits: Limits) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/ping", get(|| async { "pong" }));
        (addr, tokio::spawn(serve(listener, router, limits)))
    }

    /// What the server sent before closing, or `None` if it sent nothing within `wait`.
    fn read_for(stream: &mut std::net::TcpStream, wait: Duration) -> Option<String> {
        stream.set_read_timeout(Some(wait)).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.ends_with(b"pong") {
                        return Some(String::from_utf8_lossy(&got).into_owned());
                    }
                }
                Err(_) if got.is_empty() => return None,
                Err(_) => return Some(String::from_utf8_lossy(&got).into_owned()),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_half_sent_request_is_dropped_after_the_header_timeout() {
        let (addr, _server) = server(Limits {
            max_connections: 4,
            header_read_timeout: Duration::from_millis(300),
        })
        .await;
        let closed = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n").unwrap();
            read_for(&mut s, Duration::from_secs(10))
        })
        .await
        .unwrap();
        assert!(
            closed.is_some_and(|text| !text.contains("pong")),
            "the server must close a connection whose headers never end"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_beyond_the_limit_wait_for_one_to_end() {
        let (addr, _server) = server(Limits {
            max_connections: 1,
            header_read_timeout: Duration::from_secs(30),
        })
        .await;
        tokio::task::spawn_blocking(move || {
            let hog = std::net::TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            assert_eq!(
                read_for(&mut s, Duration::from_millis(300)),
                None,
                "the second connection waits while the first holds the only slot"
            );
            drop(hog);
            let answer = read_for(&mut s, Duration::from_secs(10)).unwrap_or_default();
            assert!(
                answer.contains("200 OK") && answer.ends_with("pong"),
                "{answer}"
            );
        })
        .await
        .unwrap();
    }
}
