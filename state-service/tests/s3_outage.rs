//! Issue 3, "S3 unreachable": while the object store cannot be reached, `Flush` and
//! `Commit` fail with a retryable status (`Unavailable`) within a bounded time, reads and
//! writes keep working locally, and once the store is back the same `Flush` and `Commit`
//! succeed; a fresh node then restores exactly what was committed.
//!
//! A TCP proxy in this test (on 127.0.0.1:0) sits between the state service and the real
//! S3 server (SeaweedFS, from `scripts/test-services.sh start`). Switching it off drops
//! every open connection and either refuses new ones (the listening socket is closed) or
//! blackholes them (accepted, never answered, so only timeouts end the requests).
//!
//! Like `s3.rs`: without `SLUICE_TEST_S3_ENDPOINT` these tests fail, unless
//! `SLUICE_SKIP_S3=1` asks to skip them (loudly).

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use sluice_common::pb::state::{
    CommitRequest, FlushRequest, ShardId, StatusRequest, StatusResponse,
};
use sluice_state_service::ObjectStoreClientConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;
use tonic::Code;

/// Longest any single step of the test may take.
const STEP: Duration = Duration::from_secs(15);
/// Longest a `Flush` or `Commit` may take to fail while the store is unreachable, with
/// the client settings of [`outage_client`].
const FAIL_WITHIN: Duration = Duration::from_secs(10);

/// `fut`, or a panic naming `what` after `limit`.
async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

/// How the proxy treats connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forwards to the upstream.
    On,
    /// Not listening: connections are refused.
    Refuse,
    /// Accepts connections and never answers.
    Blackhole,
}

/// A TCP proxy to `upstream` that can be switched off and on.
struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Connections forwarded to the upstream so far.
    forwarded: Arc<AtomicU64>,
    /// Connections accepted and held unanswered so far.
    blackholed: Arc<AtomicU64>,
    /// The accept loop; it owns the connections it forwards or holds.
    _task: AbortOnDropHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, rx) = watch::channel(Mode::On);
        let forwarded = Arc::new(AtomicU64::new(0));
        let blackholed = Arc::new(AtomicU64::new(0));
        let task = AbortOnDropHandle::new(tokio::spawn(accept_loop(
            listener,
            addr,
            upstream,
            rx,
            Arc::clone(&forwarded),
            Arc::clone(&blackholed),
        )));
        Self {
            addr,
            mode,
            forwarded,
            blackholed,
            _task: task,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Waits (bounded) until the proxy listens again after `Refuse`.
    async fn wait_listening(&self) {
        within(STEP, "proxy listening again", async {
            while TcpStream::connect(self.addr).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}

async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    upstream: SocketAddr,
    mut rx: watch::Receiver<Mode>,
    forwarded: Arc<AtomicU64>,
    blackholed: Arc<AtomicU64>,
) {
    let mut listener = Some(listener);
    let mut conns = JoinSet::new();
    loop {
        let mode = *rx.borrow_and_update();
        match (mode, listener.as_ref()) {
            (Mode::Refuse, _) => {
                // Closing the listening socket: connection attempts are refused.
                listener = None;
                if rx.changed().await.is_err() {
                    return;
                }
            }
            (_, None) => {
                // Back from `Refuse`: listen on the same address again (bounded).
                let mut tries = 0;
                listener = loop {
                    match TcpListener::bind(addr).await {
                        Ok(l) => break Some(l),
                        Err(_) if tries < 100 => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("proxy cannot listen on {addr} again: {e}"),
                    }
                };
            }
            (_, Some(l)) => {
                tokio::select! {
                    accepted = l.accept() => {
                        let Ok((inbound, _)) = accepted else { continue };
                        while conns.try_join_next().is_some() {}
                        let rx = rx.clone();
                        // The mode now, not when the accept started.
                        if *rx.borrow() == Mode::On {
                            forwarded.fetch_add(1, Ordering::Relaxed);
                            conns.spawn(forward(inbound, upstream, rx));
                        } else {
                            blackholed.fetch_add(1, Ordering::Relaxed);
                            conns.spawn(hold(inbound, rx));
                        }
                    }
                    changed = rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Copies both ways until either side closes or the proxy leaves `On` (then drops
/// both connections).
async fn forward(mut inbound: TcpStream, upstream: SocketAddr, mut rx: watch::Receiver<Mode>) {
    let Ok(Ok(mut outbound)) =
        tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(upstream)).await
    else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = rx.wait_for(|m| *m != Mode::On) => {}
    }
}

/// Keeps a connection open without reading or answering until the mode changes.
async fn hold(inbound: TcpStream, mut rx: watch::Receiver<Mode>) {
    let _ = rx.changed().await;
    drop(inbound);
}

/// Object-store client settings that make an outage visible within a few seconds.
fn outage_client() -> ObjectStoreClientConfig {
    ObjectStoreClientConfig {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        max_retries: 2,
        retry_timeout: Duration::from_secs(2),
    }
}

async fn status(c: &mut Client) -> StatusResponse {
    within(STEP, "Status", c.status(StatusRequest {}))
        .await
        .expect("status")
        .into_inner()
}

/// (committed checkpoint, last durable epoch) of the only shard.
async fn durability(c: &mut Client) -> (u64, u64) {
    let s = status(c).await;
    assert_eq!(s.shards.len(), 1, "{s:?}");
    (
        s.shards[0].committed_checkpoint,
        s.shards[0].last_durable_epoch,
    )
}

/// Asserts that `status` is a retryable failure caused by the object store.
fn assert_unavailable(what: &str, got: Result<impl std::fmt::Debug, tonic::Status>) {
    let status = match got {
        Ok(r) => panic!("{what} succeeded while S3 was unreachable: {r:?}"),
        Err(s) => s,
    };
    assert_eq!(
        status.code(),
        Code::Unavailable,
        "{what} must fail retryably, got: {status:?}"
    );
    assert!(
        status.message().contains("object store unavailable"),
        "{what}: {status:?}"
    );
}

/// `Flush(epoch)` fails with `Unavailable` within [`FAIL_WITHIN`].
async fn flush_fails(c: &mut Client, s: &ShardId, epoch: u64, test: &str) {
    let t = Instant::now();
    let got = within(
        STEP,
        &format!("Flush({epoch}) during the outage"),
        c.flush(FlushRequest {
            fence: 0,
            shard: Some(s.clone()),
            epoch,
        }),
    )
    .await;
    let took = t.elapsed();
    eprintln!("{test}: Flush({epoch}) failed after {took:?}");
    assert_unavailable(&format!("Flush({epoch})"), got);
    assert!(
        took < FAIL_WITHIN,
        "Flush({epoch}) took {took:?} to fail during the outage"
    );
}

/// `Commit(cp)` fails with `Unavailable` within [`FAIL_WITHIN`].
async fn commit_fails(c: &mut Client, s: &ShardId, cp: u64, test: &str) {
    let t = Instant::now();
    let got = within(
        STEP,
        &format!("Commit({cp}) during the outage"),
        c.commit(CommitRequest {
            shard: Some(s.clone()),
            checkpoint_id: cp,
            retained: vec![cp - 1, cp],
        }),
    )
    .await;
    let took = t.elapsed();
    eprintln!("{test}: Commit({cp}) failed after {took:?}");
    assert_unavailable(&format!("Commit({cp})"), got);
    assert!(
        took < FAIL_WITHIN,
        "Commit({cp}) took {took:?} to fail during the outage"
    );
}

/// The scenario of the brief, with the proxy switched off as `off`.
async fn outage_and_recovery(test: &str, off: Mode) {
    let Some(s3) = sluice_test_support::s3::s3_env(test, "S3 outages") else {
        return;
    };
    let (endpoint, bucket, prefix) = (&s3.endpoint, &s3.bucket, &s3.prefix);
    let parsed = url::Url::parse(endpoint).expect("SLUICE_TEST_S3_ENDPOINT is a URL");
    let host = parsed.host_str().expect("endpoint host");
    let port = parsed.port_or_known_default().expect("endpoint port");
    let upstream = tokio::net::lookup_host((host, port))
        .await
        .expect("resolve the S3 endpoint")
        .next()
        .expect("an address for the S3 endpoint");
    let proxy = Proxy::start(upstream).await;
    let via_proxy = format!("s3://{bucket}/{prefix}?endpoint=http://{}", proxy.addr);
    let direct = format!("s3://{bucket}/{prefix}?endpoint={endpoint}");

    let s = shard("job-outage", 0, 8);
    let d1 = tempfile::tempdir().unwrap();
    let mut cfg = config(d1.path(), &via_proxy);
    cfg.object_store_client = outage_client();
    let (node1, mut c) = within(STEP, "starting node 1", start(cfg)).await;

    // 1. Epoch 1, flushed and committed through the proxy.
    assert_eq!(
        within(STEP, "OpenShard", open(&mut c, &s, 0)).await,
        (0, false, 0)
    );
    within(
        STEP,
        "Write(1)",
        write(
            &mut c,
            &s,
            1,
            vec![
                put(0, "a", "1"),
                put(3, "b", "1"),
                put(4, "gone", "1"),
                merge(5, "l", "x"),
            ],
        ),
    )
    .await;
    within(STEP, "Flush(1)", flush(&mut c, &s, 1)).await;
    within(STEP, "Commit(1)", commit(&mut c, &s, 1, vec![1])).await;
    assert_eq!(durability(&mut c).await, (1, 1));
    assert!(
        proxy.forwarded.load(Ordering::Relaxed) > 0,
        "the node did not talk to S3 through the proxy"
    );

    // 2. Epoch 2 written; S3 goes away.
    within(
        STEP,
        "Write(2)",
        write(
            &mut c,
            &s,
            2,
            vec![put(0, "a", "2"), del(4, "gone"), merge(5, "l", "y")],
        ),
    )
    .await;
    proxy.set(off);

    flush_fails(&mut c, &s, 2, test).await;

    // Local service goes on: reads (cache, RocksDB, scans) and writes.
    assert_eq!(
        within(
            STEP,
            "MultiGet during the outage",
            get(&mut c, &s, &[(0, "a"), (3, "b"), (4, "gone"), (5, "l")])
        )
        .await,
        vec![some("2"), some("1"), None, some("xy")]
    );
    assert_eq!(
        within(STEP, "Scan during the outage", scan_all(&mut c, &s, 2))
            .await
            .len(),
        3
    );
    within(
        STEP,
        "Write(2) during the outage",
        write(&mut c, &s, 2, vec![put(6, "late", "L")]),
    )
    .await;

    commit_fails(&mut c, &s, 2, test).await;
    // Nothing of epoch 2 is durable, checkpoint 1 is still the committed one.
    assert_eq!(durability(&mut c).await, (1, 1));
    if off == Mode::Blackhole {
        assert!(
            proxy.blackholed.load(Ordering::Relaxed) > 0,
            "no request reached the blackhole"
        );
    }

    // 3. S3 is back: the same Flush and Commit succeed.
    proxy.set(Mode::On);
    proxy.wait_listening().await;
    within(STEP, "Flush(2) after the outage", flush(&mut c, &s, 2)).await;
    assert_eq!(durability(&mut c).await, (1, 2));

    // Another outage between the flush and the commit: writing the manifest fails.
    proxy.set(off);
    commit_fails(&mut c, &s, 2, test).await;
    assert_eq!(durability(&mut c).await, (1, 2));
    proxy.set(Mode::On);
    proxy.wait_listening().await;
    let manifest = within(
        STEP,
        "Commit(2) after the outage",
        commit(&mut c, &s, 2, vec![1, 2]),
    )
    .await;
    assert!(
        manifest.ends_with("manifests/00000000000000000002.manifest"),
        "{manifest}"
    );
    assert_eq!(durability(&mut c).await, (2, 2));

    // 4. A fresh node, talking to S3 directly, restores checkpoint 2 exactly.
    let d2 = tempfile::tempdir().unwrap();
    let (node2, mut c2) = within(STEP, "starting node 2", start(config(d2.path(), &direct))).await;
    let (cp, restored, bytes) = within(STEP, "OpenShard(2) on node 2", open(&mut c2, &s, 2)).await;
    assert_eq!((cp, restored), (2, true));
    assert!(bytes > 0);
    assert_eq!(
        within(
            STEP,
            "MultiGet on node 2",
            get(
                &mut c2,
                &s,
                &[(0, "a"), (3, "b"), (4, "gone"), (5, "l"), (6, "late")]
            )
        )
        .await,
        vec![some("2"), some("1"), None, some("xy"), some("L")]
    );
    let all = within(STEP, "Scan on node 2", scan_all(&mut c2, &s, 0)).await;
    let expected: Vec<(bytes::Bytes, bytes::Bytes)> = [
        (key(0, "a"), "2"),
        (key(3, "b"), "1"),
        (key(5, "l"), "xy"),
        (key(6, "late"), "L"),
    ]
    .into_iter()
    .map(|(k, v)| (k, bytes::Bytes::from(v)))
    .collect();
    assert_eq!(all, expected, "restored state of checkpoint 2");

    within(STEP, "node 2 shutdown", node2.shutdown())
        .await
        .unwrap();
    within(STEP, "node 1 shutdown", node1.shutdown())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_outage_refused_connections() {
    outage_and_recovery("outage_refused", Mode::Refuse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_outage_blackholed_connections() {
    outage_and_recovery("outage_blackholed", Mode::Blackhole).await;
}
