//! `sluice bench exchange`: throughput of the data plane between two worker processes
//! on loopback, next to a plain TCP sender/receiver pair measured in the same run.
//!
//! - **raw**: two child processes of this binary (hidden `--role raw-recv` and
//!   `--role raw-send`) move bytes over one TCP connection on 127.0.0.1 in writes of
//!   `--buffer-bytes` for `--raw-seconds`, timed by the sender from connecting until
//!   the receiver has read everything and closed.
//! - **exchange**: two `sluice worker` child processes under a small driver here (the
//!   same control protocol as `sluice run --workers 2`; this one keeps the workers' pids
//!   and per-task reports). The job is Nexmark bids (parallelism 1) into a blackhole
//!   sink (parallelism 1) over a rebalance edge, so placement puts the source on worker
//!   0 and the sink on worker 1 and every batch crosses the network as Arrow IPC in
//!   credit-based buffers. Records and bytes are the source task's records and network
//!   bytes out (checked against the sink's records in); seconds run from sending the
//!   deployments to the last report (planning and connecting included, process start
//!   not).
//! - **slow consumer** (`--slow-consumer 10x`): the same job with the sink sleeping
//!   after each batch so that it is about that many times slower than the exchange
//!   measured just before; the producer worker's VmRSS is sampled every
//!   `--rss-interval-ms` and printed as a series with its maximum.
//!
//! Output: one `kind=raw|exchange|slow-consumer buffer_bytes=.. records=.. bytes=..
//! seconds=.. gb_per_s=.. records_per_s=..` line per measurement, then `ratio=..`
//! (exchange GB/s over raw GB/s). Every wait is bounded by `--timeout-secs`; children
//! are killed when this command returns.

use std::io::{BufReader, Read, Seek, Write};
use std::net::{TcpListener as StdListener, TcpStream as StdStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use sluice_common::job_spec;
use sluice_common::pb;
use sluice_common::pb::cluster as pbc;
use sluice_compute::cluster::control::{self, CONTROL_VERSION};
use sluice_compute::network::NetworkConfig;
use tokio::io::AsyncBufReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

use crate::output::outln;
use crate::{Failure, runtime};

/// How long children have to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A role of a child process of this benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Accept one connection on 127.0.0.1, read to EOF, print what arrived.
    RawRecv,
    /// Connect to `--addr` and write for `--raw-seconds`.
    RawSend,
}

/// Arguments of `sluice bench exchange`.
#[derive(Args)]
pub struct ExchangeBenchArgs {
    /// Bytes per network buffer of the exchange, and per write of the raw pair.
    #[arg(long, default_value_t = 32 << 10)]
    buffer_bytes: usize,
    /// Bids the exchange moves.
    #[arg(long, default_value_t = 30_000_000)]
    events: u64,
    /// Rows per source batch.
    #[arg(long, default_value_t = 8192)]
    batch_size: u32,
    /// How long the raw pair sends (seconds).
    #[arg(long, default_value_t = 6.0)]
    raw_seconds: f64,
    /// Skip the raw TCP pair (no ratio then).
    #[arg(long)]
    no_raw: bool,
    /// Also run a consumer this many times slower than the producer (`10x` or `10`) and
    /// print the producer worker's RSS over time.
    #[arg(long)]
    slow_consumer: Option<String>,
    /// Roughly how long the slow-consumer run lasts (seconds).
    #[arg(long, default_value_t = 10.0)]
    slow_seconds: f64,
    /// RSS sampling period of the slow-consumer run.
    #[arg(long, default_value_t = 250)]
    rss_interval_ms: u64,
    /// Upper bound of one measurement; children still running then are killed.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Internal: the role of a child process.
    #[arg(long, value_enum, hide = true)]
    role: Option<Role>,
    /// Internal: the receiver's address (raw-send).
    #[arg(long, hide = true)]
    addr: Option<String>,
}

/// What one measurement moved.
#[derive(Debug, Clone, Copy)]
struct Measurement {
    records: u64,
    bytes: u64,
    seconds: f64,
}

impl Measurement {
    fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e9 / self.seconds.max(1e-9)
    }

    fn records_per_s(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }

    fn line(&self, kind: &str, buffer_bytes: usize) -> String {
        format!(
            "kind={kind} buffer_bytes={buffer_bytes} records={} bytes={} seconds={:.3} gb_per_s={:.3} records_per_s={:.0}",
            self.records,
            self.bytes,
            self.seconds,
            self.gb_per_s(),
            self.records_per_s()
        )
    }
}

fn fail(message: impl Into<String>) -> Failure {
    Failure::from(anyhow::anyhow!("{}", message.into()))
}

/// Runs `sluice bench exchange` (or one of its child roles).
pub fn bench(args: ExchangeBenchArgs) -> Result<(), Failure> {
    if args.buffer_bytes < 64 || args.buffer_bytes > (64 << 20) {
        return Err(Failure::usage(
            "--buffer-bytes must be between 64 and 67108864",
        ));
    }
    if !(args.raw_seconds > 0.0 && args.raw_seconds <= 3600.0) {
        return Err(Failure::usage("--raw-seconds must be in (0, 3600]"));
    }
    if args.events == 0 || args.batch_size == 0 || args.timeout_secs == 0 {
        return Err(Failure::usage(
            "--events, --batch-size and --timeout-secs must be at least 1",
        ));
    }
    let timeout = Duration::from_secs(args.timeout_secs);
    match args.role {
        Some(Role::RawRecv) => return raw_recv(args.buffer_bytes, timeout),
        Some(Role::RawSend) => {
            let addr = args
                .addr
                .as_deref()
                .ok_or_else(|| Failure::usage("--role raw-send needs --addr"))?;
            return raw_send(addr, args.buffer_bytes, args.raw_seconds, timeout);
        }
        None => {}
    }
    let slow_factor = match &args.slow_consumer {
        None => None,
        Some(s) => {
            let f: f64 = s
                .trim_end_matches(['x', 'X'])
                .parse()
                .map_err(|_| Failure::usage(format!("--slow-consumer {s}: expected e.g. 10x")))?;
            if !(1.0..=1000.0).contains(&f) {
                return Err(Failure::usage(
                    "--slow-consumer must be between 1x and 1000x",
                ));
            }
            Some(f)
        }
    };
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find sluice: {e}")))?;
    let rt = runtime()?;
    rt.block_on(async {
        let raw = if args.no_raw {
            None
        } else {
            let m = measure_raw(&exe, &args, timeout).await?;
            outln!("{}", m.line("raw", args.buffer_bytes));
            Some(m)
        };
        let graph = exchange_job(args.events, args.batch_size, 0)?;
        let run = run_exchange(&exe, graph, &args, None).await?;
        let ex = run.measurement()?;
        outln!(
            "{} producer_cpu_s={:.2} consumer_cpu_s={:.2}",
            ex.line("exchange", args.buffer_bytes),
            run.cpu_seconds[0],
            run.cpu_seconds[1]
        );
        if let Some(raw) = raw {
            outln!(
                "ratio={:.3} (exchange {:.3} GB/s / raw {:.3} GB/s, target >= 0.70 at 32 KiB)",
                ex.gb_per_s() / raw.gb_per_s().max(1e-12),
                ex.gb_per_s(),
                raw.gb_per_s()
            );
        }
        if let Some(factor) = slow_factor {
            slow_consumer(&exe, &args, factor, &ex).await?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------
// Raw TCP pair

/// Starts a receiver and a sender child; the receiver's count is the measurement.
async fn measure_raw(
    exe: &Path,
    args: &ExchangeBenchArgs,
    timeout: Duration,
) -> Result<Measurement, Failure> {
    let common = |role: &str| {
        let mut c = Command::new(exe);
        c.args([
            "bench",
            "exchange",
            "--role",
            role,
            "--buffer-bytes",
            &args.buffer_bytes.to_string(),
            "--raw-seconds",
            &args.raw_seconds.to_string(),
            "--timeout-secs",
            &args.timeout_secs.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
        c
    };
    let mut recv = common("raw-recv")
        .spawn()
        .map_err(|e| fail(format!("cannot start the raw receiver: {e}")))?;
    let mut recv_out = tokio::io::BufReader::new(
        recv.stdout
            .take()
            .ok_or_else(|| fail("raw receiver has no stdout"))?,
    );
    let mut line = String::new();
    tokio::time::timeout(START_TIMEOUT, recv_out.read_line(&mut line))
        .await
        .map_err(|_| fail("the raw receiver did not start in time"))?
        .map_err(|e| fail(format!("reading the raw receiver: {e}")))?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .ok_or_else(|| fail(format!("unexpected line from the raw receiver: {line:?}")))?
        .to_owned();
    let mut send = common("raw-send")
        .args(["--addr", &addr])
        .spawn()
        .map_err(|e| fail(format!("cannot start the raw sender: {e}")))?;
    let mut send_out = tokio::io::BufReader::new(
        send.stdout
            .take()
            .ok_or_else(|| fail("raw sender has no stdout"))?,
    );
    let deadline = Instant::now() + timeout;
    let mut received = String::new();
    let mut sent = String::new();
    for (name, out, line) in [
        ("receiver", &mut recv_out, &mut received),
        ("sender", &mut send_out, &mut sent),
    ] {
        tokio::time::timeout_at(deadline.into(), out.read_line(line))
            .await
            .map_err(|_| fail(format!("the raw pair did not finish within {timeout:?}")))?
            .map_err(|e| fail(format!("reading the raw {name}: {e}")))?;
    }
    for (name, child) in [("receiver", &mut recv), ("sender", &mut send)] {
        let status = tokio::time::timeout_at(deadline.into(), child.wait())
            .await
            .map_err(|_| fail(format!("the raw {name} did not exit in time")))?
            .map_err(|e| fail(format!("waiting for the raw {name}: {e}")))?;
        if !status.success() {
            return Err(fail(format!("the raw {name} failed ({status})")));
        }
    }
    let bad =
        |who: &str, line: &str| fail(format!("unexpected result from the raw {who}: {line:?}"));
    let bytes: u64 = field(&received, "bytes").ok_or_else(|| bad("receiver", &received))?;
    let sent_bytes: u64 = field(&sent, "bytes").ok_or_else(|| bad("sender", &sent))?;
    if bytes != sent_bytes {
        return Err(fail(format!(
            "the raw receiver got {bytes} bytes, the sender sent {sent_bytes}"
        )));
    }
    // The sender's clock: from connecting until the receiver had read everything and
    // closed (the receiver's own clock starts at accept, which a loaded machine may
    // delay while the first bytes already sit in the socket buffer).
    let seconds: f64 = field(&sent, "seconds").ok_or_else(|| bad("sender", &sent))?;
    Ok(Measurement {
        records: 0,
        bytes,
        seconds,
    })
}

/// The value of `key=value` in a line of `key=value` words.
fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn io_fail(what: &str, e: std::io::Error) -> Failure {
    fail(format!("{what}: {e}"))
}

/// Child: accept one connection, read until EOF (or the timeout), print the count.
fn raw_recv(buffer_bytes: usize, timeout: Duration) -> Result<(), Failure> {
    let listener = StdListener::bind("127.0.0.1:0").map_err(|e| io_fail("bind", e))?;
    let addr = listener.local_addr().map_err(|e| io_fail("address", e))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening {addr}")
        .and_then(|_| out.flush())
        .map_err(|e| io_fail("stdout", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| io_fail("listener", e))?;
    let accept_deadline = Instant::now() + START_TIMEOUT;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > accept_deadline {
                    return Err(fail("no sender connected in time"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io_fail("accept", e)),
        }
    };
    stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(Some(Duration::from_secs(30))))
        .map_err(|e| io_fail("socket", e))?;
    let start = Instant::now();
    let deadline = start + timeout;
    let mut buf = vec![0u8; buffer_bytes];
    let mut total: u64 = 0;
    loop {
        let n = stream.read(&mut buf).map_err(|e| io_fail("read", e))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if Instant::now() > deadline {
            return Err(fail(format!("still receiving after {timeout:?}")));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    writeln!(out, "received bytes={total} seconds={seconds:.6}")
        .and_then(|_| out.flush())
        .map_err(|e| io_fail("stdout", e))?;
    Ok(())
}

/// Child: write `buffer_bytes` at a time for `seconds`, then close.
fn raw_send(
    addr: &str,
    buffer_bytes: usize,
    seconds: f64,
    timeout: Duration,
) -> Result<(), Failure> {
    let mut stream = StdStream::connect(addr).map_err(|e| io_fail("connect", e))?;
    stream
        .set_write_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| io_fail("socket", e))?;
    let buf: Vec<u8> = (0..buffer_bytes).map(|i| (i % 251) as u8).collect();
    let start = Instant::now();
    let run_for = Duration::from_secs_f64(seconds).min(timeout);
    // A bound on the count as well as on time: 1 TiB.
    let max_writes = (1u64 << 40) / buffer_bytes as u64;
    let mut writes = 0u64;
    while writes < max_writes && start.elapsed() < run_for {
        stream.write_all(&buf).map_err(|e| io_fail("write", e))?;
        writes += 1;
    }
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| io_fail("shutdown", e))?;
    // Wait for the receiver to close (it has read everything by then).
    let mut b = [0u8; 1];
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| io_fail("socket", e))?;
    let n = stream
        .read(&mut b)
        .map_err(|e| io_fail("waiting for the receiver to close", e))?;
    if n != 0 {
        return Err(fail("the receiver sent data"));
    }
    let seconds = start.elapsed().as_secs_f64();
    let total = writes * buffer_bytes as u64;
    let mut out = std::io::stdout().lock();
    writeln!(out, "sent bytes={total} seconds={seconds:.6}")
        .and_then(|_| out.flush())
        .map_err(|e| io_fail("stdout", e))?;
    Ok(())
}

// ---------------------------------------------------------------------------------
// Exchange between two worker processes

/// Bids at parallelism 1 into a blackhole at parallelism 1 over a rebalance edge.
fn exchange_job(events: u64, batch_size: u32, delay_ms: u64) -> Result<pb::JobGraph, Failure> {
    let text = format!(
        "name: bench-exchange\nparallelism: 1\nsource:\n  nexmark: {{ stream: bid, events: {events}, seed: 42 }}\n  batch_size: {batch_size}\nsink:\n  blackhole: {{ delay_per_batch: {delay_ms}ms }}\n"
    );
    let mut graph = job_spec::parse_job("<bench exchange>", &text)
        .map_err(|e| Failure::usage(e.to_string()))?;
    // The YAML would chain source and sink (forward between equal parallelisms); a
    // rebalance edge cuts them into two chains, which round-robin placement puts on
    // workers 0 and 1.
    if graph.edges.len() != 1 {
        return Err(fail(format!(
            "the exchange job has {} edges, expected 1",
            graph.edges.len()
        )));
    }
    graph.edges[0].partitioning = pb::Partitioning::Rebalance as i32;
    Ok(graph)
}

/// What a run of the exchange job produced.
struct ExchangeRun {
    reports: Vec<pbc::Report>,
    seconds: f64,
    /// (ms since deployment, producer VmRSS kB, consumer VmRSS kB)
    rss: Vec<(u64, u64, u64)>,
    /// CPU seconds (user + system) of the producer and consumer workers, sampled every
    /// 250 ms while they ran: the last sample before they exited.
    cpu_seconds: [f64; 2],
}

impl ExchangeRun {
    /// The source's records and network bytes out, checked against the sink.
    fn measurement(&self) -> Result<Measurement, Failure> {
        let [producer, consumer] = self.reports.as_slice() else {
            return Err(fail("expected two worker reports"));
        };
        let source = producer
            .tasks
            .iter()
            .max_by_key(|t| t.bytes_out)
            .ok_or_else(|| fail("worker 0 reported no task"))?;
        let sink = consumer
            .tasks
            .iter()
            .max_by_key(|t| t.records_in)
            .ok_or_else(|| fail("worker 1 reported no task"))?;
        if sink.records_in != source.records_out {
            return Err(fail(format!(
                "the sink ({}) received {} records, the source ({}) sent {}",
                sink.task, sink.records_in, source.task, source.records_out
            )));
        }
        if source.bytes_out == 0 {
            return Err(fail(format!(
                "the source task ({}) sent no bytes over the network; is it on another worker than the sink?",
                source.task
            )));
        }
        Ok(Measurement {
            records: source.records_out,
            bytes: source.bytes_out,
            seconds: self.seconds,
        })
    }
}

/// A worker child and the file holding its stderr.
struct WorkerChild {
    child: Child,
    pid: u32,
    stderr: std::fs::File,
}

impl WorkerChild {
    /// The last lines the worker wrote to stderr.
    fn stderr_tail(&mut self) -> String {
        let mut text = String::new();
        if self.stderr.rewind().is_ok() {
            let _ = BufReader::new(&self.stderr).read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(10);
        lines[from..].join("\n")
    }
}

fn vm_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse().ok())
        })
        .unwrap_or(0)
}

/// Runs `graph` on two worker processes; with `sample_rss`, samples their VmRSS.
async fn run_exchange(
    exe: &PathBuf,
    graph: pb::JobGraph,
    args: &ExchangeBenchArgs,
    sample_rss: Option<Duration>,
) -> Result<ExchangeRun, Failure> {
    const N: usize = 2;
    let timeout = Duration::from_secs(args.timeout_secs);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| io_fail("cannot listen for workers", e))?;
    let control_addr = listener
        .local_addr()
        .map_err(|e| io_fail("control address", e))?
        .to_string();
    let mut workers: Vec<WorkerChild> = Vec::with_capacity(N);
    for _ in 0..N {
        let stderr = tempfile::tempfile().map_err(|e| io_fail("temporary file", e))?;
        let child = Command::new(exe)
            .args([
                "worker",
                "--listen",
                "127.0.0.1:0",
                "--control",
                &control_addr,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                stderr
                    .try_clone()
                    .map_err(|e| io_fail("temporary file", e))?,
            )
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| io_fail("cannot start a worker", e))?;
        let pid = child.id().unwrap_or(0);
        workers.push(WorkerChild { child, pid, stderr });
    }
    let result = drive(&listener, &mut workers, graph, args, timeout, sample_rss).await;
    if result.is_err() {
        for w in &mut workers {
            let _ = w.child.start_kill();
        }
    }
    for w in &mut workers {
        if tokio::time::timeout(Duration::from_secs(10), w.child.wait())
            .await
            .is_err()
        {
            let _ = w.child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), w.child.wait()).await;
        }
    }
    match result {
        Ok(run) => Ok(run),
        Err((i, message)) => {
            let tail = match i {
                Some(i) => format!(
                    "\n--- worker {i} stderr (last lines) ---\n{}",
                    workers[i].stderr_tail()
                ),
                None => String::new(),
            };
            Err(fail(format!("{message}{tail}")))
        }
    }
}

type DriveError = (Option<usize>, String);

/// Hellos, deployments, reports; the workers' control connections stay open until the
/// caller has waited for the workers to exit.
async fn drive(
    listener: &TcpListener,
    workers: &mut [WorkerChild],
    graph: pb::JobGraph,
    args: &ExchangeBenchArgs,
    timeout: Duration,
    sample_rss: Option<Duration>,
) -> Result<ExchangeRun, DriveError> {
    let n = workers.len();
    let pids: Vec<u32> = workers.iter().map(|w| w.pid).collect();
    let mut conns: Vec<Option<(TcpStream, String)>> = (0..n).map(|_| None).collect();
    let deadline = Instant::now() + START_TIMEOUT;
    while conns.iter().any(Option::is_none) {
        let accepted = tokio::select! {
            a = tokio::time::timeout_at(deadline.into(), listener.accept()) => a,
            (i, status) = wait_any(workers) => {
                return Err((Some(i), format!("worker {i} exited ({status}) before saying hello")));
            }
        };
        let (mut stream, _) = match accepted {
            Err(_) => {
                return Err((
                    None,
                    format!("workers did not start within {START_TIMEOUT:?}"),
                ));
            }
            Ok(Err(e)) => return Err((None, format!("accepting a worker: {e}"))),
            Ok(Ok(s)) => s,
        };
        let hello: Option<pbc::Hello> =
            tokio::time::timeout_at(deadline.into(), control::read_message(&mut stream))
                .await
                .map_err(|_| (None, "a worker did not say hello in time".to_owned()))?
                .map_err(|e| (None, format!("bad hello from a worker: {e}")))?;
        let Some(hello) = hello else { continue };
        if hello.protocol_version != CONTROL_VERSION {
            return Err((
                None,
                format!(
                    "a worker speaks control protocol {}, expected {CONTROL_VERSION}",
                    hello.protocol_version
                ),
            ));
        }
        match pids.iter().position(|&p| p == hello.pid) {
            Some(i) if conns[i].is_none() => conns[i] = Some((stream, hello.data_address)),
            _ => return Err((None, format!("unexpected hello from pid {}", hello.pid))),
        }
    }
    let conns: Vec<(TcpStream, String)> = conns.into_iter().flatten().collect();
    let peers: Vec<String> = conns.iter().map(|(_, a)| a.clone()).collect();
    let mut network = NetworkConfig {
        buffer_bytes: args.buffer_bytes,
        ..NetworkConfig::default()
    };
    network.max_frame_bytes = network.buffer_bytes + 64;

    let start = Instant::now();
    let deadline = start + timeout;
    let mut waits: JoinSet<(usize, Result<pbc::Report, String>, TcpStream)> = JoinSet::new();
    for (i, (mut stream, _)) in conns.into_iter().enumerate() {
        let deployment = pbc::Deployment {
            job: Some(graph.clone()),
            worker_index: i as u32,
            peers: peers.clone(),
            network: Some(network.to_proto()),
            metrics_interval_ms: 0,
            ..Default::default()
        };
        control::write_message(&mut stream, &deployment)
            .await
            .map_err(|e| (Some(i), format!("deploying to worker {i}: {e}")))?;
        waits.spawn(async move {
            let got = control::read_message::<_, pbc::Report>(&mut stream).await;
            let r = match got {
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err("closed its control connection before reporting".to_owned()),
                Err(e) => Err(format!("control connection failed: {e}")),
            };
            (i, r, stream)
        });
    }
    let mut reports: Vec<Option<pbc::Report>> = (0..n).map(|_| None).collect();
    // Held until the caller waited for the workers (closing early would make a worker
    // that has not exited yet take it for a lost driver).
    let mut held = Vec::with_capacity(n);
    let mut rss = Vec::new();
    let mut cpu = [0u64; 2];
    let mut tick = tokio::time::interval(sample_rss.unwrap_or(Duration::from_millis(250)));
    let mut seconds = 0.0;
    while reports.iter().any(Option::is_none) {
        tokio::select! {
            joined = waits.join_next() => {
                let Some(joined) = joined else { break };
                let (i, r, stream) = joined.map_err(|e| (None, format!("driver task: {e}")))?;
                held.push(stream);
                match r {
                    Ok(report) if report.error.is_empty() => {
                        reports[i] = Some(report);
                        seconds = start.elapsed().as_secs_f64();
                    }
                    Ok(report) => return Err((Some(i), format!("worker {i} (pid {}): {}", pids[i], report.error))),
                    Err(e) => return Err((Some(i), format!("worker {i} (pid {}): {e}", pids[i]))),
                }
            }
            (i, status) = wait_any(workers) => {
                if reports[i].is_none() {
                    return Err((Some(i), format!("worker {i} (pid {}) exited ({status}) before reporting", pids[i])));
                }
            }
            _ = tick.tick() => {
                // CPU time of each worker as last seen alive (a lower bound near the end).
                for (c, &pid) in cpu.iter_mut().zip(&pids) {
                    if let Some(ticks) = cpu_ticks(pid) {
                        *c = ticks;
                    }
                }
                if sample_rss.is_some() {
                    rss.push((start.elapsed().as_millis() as u64, vm_rss_kb(pids[0]), vm_rss_kb(pids[1])));
                }
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                return Err((None, format!("the exchange did not finish within {timeout:?}")));
            }
        }
    }
    drop(held);
    Ok(ExchangeRun {
        reports: reports.into_iter().flatten().collect(),
        seconds,
        rss,
        cpu_seconds: cpu.map(|t| t as f64 / 100.0),
    })
}

/// User + system CPU time of `pid` in clock ticks (100 per second on Linux).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The first worker to exit unsuccessfully, with its status (pending otherwise).
async fn wait_any(workers: &mut [WorkerChild]) -> (usize, String) {
    loop {
        for (i, w) in workers.iter_mut().enumerate() {
            if let Ok(Some(status)) = w.child.try_wait()
                && !status.success()
            {
                return (i, status.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------
// Slow consumer

/// A consumer `factor` times slower than `fast`'s: the sink sleeps after each batch.
async fn slow_consumer(
    exe: &PathBuf,
    args: &ExchangeBenchArgs,
    factor: f64,
    fast: &Measurement,
) -> Result<(), Failure> {
    let batches = fast.records.div_ceil(u64::from(args.batch_size)).max(1);
    let batch_ms = fast.seconds * 1000.0 / batches as f64;
    let delay_ms = ((factor - 1.0) * batch_ms).ceil().max(1.0) as u64;
    // Enough batches to last about --slow-seconds at the slowed pace.
    let slow_batches = ((args.slow_seconds * 1000.0) / (batch_ms + delay_ms as f64)).ceil() as u64;
    let events = (slow_batches.max(4) * u64::from(args.batch_size)).min(args.events);
    let graph = exchange_job(events, args.batch_size, delay_ms)?;
    let interval = Duration::from_millis(args.rss_interval_ms.max(10));
    let run = run_exchange(exe, graph, args, Some(interval)).await?;
    let m = run.measurement()?;
    outln!(
        "{} delay_per_batch_ms={delay_ms} slowdown={:.1}x",
        m.line("slow-consumer", args.buffer_bytes),
        fast.records_per_s() / m.records_per_s().max(1e-9)
    );
    let series: Vec<String> = run.rss.iter().map(|(t, p, _)| format!("{t}:{p}")).collect();
    outln!("producer_rss_kb_series(ms:kB)={}", series.join(","));
    let consumer: Vec<String> = run.rss.iter().map(|(t, _, c)| format!("{t}:{c}")).collect();
    outln!("consumer_rss_kb_series(ms:kB)={}", consumer.join(","));
    let max = run.rss.iter().map(|r| r.1).max().unwrap_or(0);
    let min = run
        .rss
        .iter()
        .map(|r| r.1)
        .filter(|&k| k > 0)
        .min()
        .unwrap_or(0);
    outln!(
        "producer_rss_max_kb={max} producer_rss_min_kb={min} samples={} interval_ms={}",
        run.rss.len(),
        interval.as_millis()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_job_is_two_chains_on_two_workers() {
        let graph = match exchange_job(1000, 100, 5) {
            Ok(g) => g,
            Err(f) => panic!("{}", f.message),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let plan = rt
            .block_on(sluice_compute::plan::plan(graph))
            .expect("plans");
        assert_eq!(plan.chains.len(), 2);
        let placement = sluice_compute::runtime::build::Placement::round_robin(&plan, 2);
        assert_eq!(placement.worker_of(0, 0), 0);
        assert_eq!(placement.worker_of(1, 0), 1);
    }
}
