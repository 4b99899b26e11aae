//! `sluice bench exchange`: throughput of the data plane between two worker processes
//! on loopback, next to raw TCP on the same loopback in the same run, and the
//! producer's memory under a slow consumer.
//!
//! - **raw** (the baseline): a sender and a receiver thread of this process move bytes
//!   over one TCP connection on 127.0.0.1 with blocking std sockets, in writes of
//!   `--buffer-bytes`, for `--raw-seconds`: what loopback TCP does with no framing,
//!   encoding or credit. Timed by the sender from connecting until the receiver has
//!   read everything and closed.
//! - **exchange**: a coordinator in this process (`sluice_coordinator`'s, serving the
//!   workers' gRPC API on 127.0.0.1, job records in a temporary directory) and two
//!   `sluice worker --coordinator URL` child processes attached to it; the job is
//!   submitted and deployed through the attach protocol like any other. It is Nexmark
//!   bids (parallelism 1; by default replaying its first `--replay` 64 batches, so that
//!   the generator's cost, about 115 ns a bid on one thread, does not cap what is
//!   measured) into a blackhole sink (parallelism 1) over a rebalance edge,
//!   so placement puts the source on worker 0 and the sink on worker 1 and every batch
//!   crosses the network as Arrow IPC in credit-based buffers of `--buffer-bytes`.
//!   Records and bytes are the source task's records and network bytes out, from the
//!   `metrics` lines the workers print when the job ends (checked against the sink's
//!   records in and the job's status); seconds run from submitting the job, both
//!   workers attached, to its end (scheduling, planning and connecting included,
//!   process start not). CPU seconds are each worker's user + system time then.
//! - **exchange over TLS** (`--tls`): the same job on two fresh workers given a CA and a
//!   certificate made for the run (`SLUICE_TLS_*`), so that their data connection (and
//!   their gRPC with the coordinator) is mutual TLS; `tls_ratio=` is its GB/s over the
//!   plain exchange's.
//! - **slow consumer** (`--slow-consumer 10x`): the same job on two fresh workers with
//!   the sink sleeping after each batch so that it is about that many times slower than
//!   the exchange measured just before; the producer worker's VmRSS is sampled every
//!   `--rss-interval-ms` and printed as a series with its maximum.
//!
//! - **checkpoints under back pressure** (`--slow-consumer 10x --checkpoints`): the slow
//!   job again with a checkpoint every second, three times: aligned, aligned with buffer
//!   debloating (`network: { debloat: 1s }`), unaligned; one `kind=checkpoints mode=..`
//!   line each with the median and largest checkpoint duration (trigger to last
//!   acknowledgement, from the job's status; the final checkpoint taken after the end is
//!   left out) and the in-flight bytes the unaligned ones stored.
//!
//! Output: one `kind=raw|exchange|slow-consumer buffer_bytes=.. records=.. bytes=..
//! seconds=.. gb_per_s=.. records_per_s=..` line per measurement, then `ratio=..`
//! (exchange GB/s over raw GB/s). Every wait is bounded by `--timeout-secs`; the
//! workers are killed when a measurement ends.

use sluice_common::outln;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args as ClapArgs;
use sluice_common::pb;
use sluice_compute::network::NetworkConfig;
use sluice_coordinator::checkpoint::store::ObjectMetadataStore;
use sluice_coordinator::job::JobState;
use sluice_coordinator::service::{self, Coordinator, CoordinatorOptions, SubmitOptions};
use sluice_planner::job_spec;

use crate::harness::process::Workers;
use crate::harness::runtime;
use crate::harness::table::{Line, field};
use crate::harness::tls::TlsFiles;
use crate::{Error, Host, Result};
use sluice_common::process::{cpu_seconds, rss_bytes};

/// How long the raw receiver waits for its sender, and the workers have to attach.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one blocking read or write of the raw pair.
const RAW_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `sluice bench exchange`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Bytes per network buffer of the exchange, and per write of the raw pair.
    #[arg(long, default_value_t = 32 << 10)]
    buffer_bytes: usize,
    /// Bids the exchange moves.
    #[arg(long, default_value_t = 30_000_000)]
    events: u64,
    /// Rows per source batch.
    #[arg(long, default_value_t = 8192)]
    batch_size: u32,
    /// The source emits its first this many batches over and over (Nexmark's
    /// `repeat_batches`) so that the exchange, not the generator, is measured, as the raw
    /// pair sends premade bytes; 0 generates every bid (then one source thread's
    /// generation and encoding bound the run).
    #[arg(long, default_value_t = 64)]
    replay: u32,
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
    /// With --slow-consumer: also compare checkpoint durations under that back pressure,
    /// aligned, aligned with buffer debloating and unaligned.
    #[arg(long, requires = "slow_consumer")]
    checkpoints: bool,
    /// RSS sampling period of the slow-consumer run.
    #[arg(long, default_value_t = 250)]
    rss_interval_ms: u64,
    /// Also run the exchange over mutual TLS (a CA and certificate made for the run,
    /// given to the workers as `SLUICE_TLS_*`) and print its ratio to the plain one.
    #[arg(long)]
    tls: bool,
    /// Upper bound of one measurement; workers still running then are killed.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
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

    /// `kind=.. buffer_bytes=.. records=.. bytes=.. seconds=.. gb_per_s=..
    /// records_per_s=..`, for more fields to follow.
    fn line(&self, kind: &str, buffer_bytes: usize) -> Line {
        Line::new()
            .field("kind", kind)
            .field("buffer_bytes", buffer_bytes)
            .field("records", self.records)
            .field("bytes", self.bytes)
            .field("seconds", format!("{:.3}", self.seconds))
            .field("gb_per_s", format!("{:.3}", self.gb_per_s()))
            .field("records_per_s", format!("{:.0}", self.records_per_s()))
    }
}

/// Runs `sluice bench exchange`.
pub fn run(args: Args, host: &dyn Host) -> Result<()> {
    if args.buffer_bytes < 64 || args.buffer_bytes > (64 << 20) {
        return Err(Error::usage(
            "--buffer-bytes must be between 64 and 67108864",
        ));
    }
    if !(args.raw_seconds > 0.0 && args.raw_seconds <= 3600.0) {
        return Err(Error::usage("--raw-seconds must be in (0, 3600]"));
    }
    if args.events == 0 || args.batch_size == 0 || args.timeout_secs == 0 {
        return Err(Error::usage(
            "--events, --batch-size and --timeout-secs must be at least 1",
        ));
    }
    let slow_factor = match &args.slow_consumer {
        None => None,
        Some(s) => {
            let f: f64 = s
                .trim_end_matches(['x', 'X'])
                .parse()
                .map_err(|_| Error::usage(format!("--slow-consumer {s}: expected e.g. 10x")))?;
            if !(1.0..=1000.0).contains(&f) {
                return Err(Error::usage("--slow-consumer must be between 1x and 1000x"));
            }
            Some(f)
        }
    };
    let timeout = Duration::from_secs(args.timeout_secs);
    let raw = if args.no_raw {
        None
    } else {
        let m = measure_raw(args.buffer_bytes, args.raw_seconds, timeout)
            .context("the raw TCP pair")?;
        outln!("{}", m.line("raw", args.buffer_bytes));
        Some(m)
    };
    let rt = runtime()?;
    rt.block_on(async {
        let graph = exchange_job(args.events, args.batch_size, 0, args.replay)?;
        let run = run_exchange(graph.clone(), &args, host, None, None).await?;
        let ex = run.measurement()?;
        let line = ex
            .line("exchange", args.buffer_bytes)
            .field("source", source_name(args.replay))
            .field("producer_cpu_s", format!("{:.2}", run.cpu_seconds[0]))
            .field("consumer_cpu_s", format!("{:.2}", run.cpu_seconds[1]));
        outln!("{line}");
        if let Some(raw) = raw {
            outln!(
                "ratio={:.3} (exchange {:.3} GB/s / raw {:.3} GB/s, target >= 0.70 at 32 KiB)",
                ex.gb_per_s() / raw.gb_per_s().max(1e-12),
                ex.gb_per_s(),
                raw.gb_per_s()
            );
        }
        if args.tls {
            let tls = TlsFiles::new()?;
            let run = run_exchange(graph, &args, host, None, Some(&tls)).await;
            drop(tls);
            let run = run?;
            let over_tls = run.measurement()?;
            let line = over_tls
                .line("exchange-tls", args.buffer_bytes)
                .field("source", source_name(args.replay))
                .field("producer_cpu_s", format!("{:.2}", run.cpu_seconds[0]))
                .field("consumer_cpu_s", format!("{:.2}", run.cpu_seconds[1]));
            outln!("{line}");
            outln!(
                "tls_ratio={:.3} (exchange over mutual TLS {:.3} GB/s / plain {:.3} GB/s, same run)",
                over_tls.gb_per_s() / ex.gb_per_s().max(1e-12),
                over_tls.gb_per_s(),
                ex.gb_per_s()
            );
        }
        if let Some(factor) = slow_factor {
            slow_consumer(&args, host, factor, &ex).await?;
        }
        Ok(())
    })
}

/// What the exchange's source does, for its output line.
fn source_name(replay: u32) -> String {
    match replay {
        0 => "nexmark".into(),
        n => format!("replay-{n}-batches"),
    }
}

// ---------------------------------------------------------------------------------
// Raw TCP pair

/// Sends from this thread to a receiver thread over one loopback connection for
/// `seconds`; the bytes received, timed by the sender.
fn measure_raw(
    buffer_bytes: usize,
    seconds: f64,
    timeout: Duration,
) -> anyhow::Result<Measurement> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind")?;
    let addr = listener.local_addr().context("listener address")?;
    let receiver = std::thread::Builder::new()
        .name("raw-receiver".into())
        .spawn(move || receive(listener, buffer_bytes, timeout))
        .context("starting the receiver thread")?;
    // A failed sender drops its connection, so the receiver ends too.
    let sent = send(addr, buffer_bytes, seconds, timeout).context("the sender");
    let received = receiver
        .join()
        .map_err(|_| anyhow!("the receiver thread panicked"))?
        .context("the receiver");
    let (sent_bytes, seconds) = sent?;
    let bytes = received?;
    if bytes != sent_bytes {
        bail!("the receiver got {bytes} bytes, the sender sent {sent_bytes}");
    }
    Ok(Measurement {
        records: 0,
        bytes,
        seconds,
    })
}

/// Accepts one connection and reads it to the end (or the timeout); the bytes read.
/// Closes the connection when done, which tells the sender everything arrived.
fn receive(listener: TcpListener, buffer_bytes: usize, timeout: Duration) -> anyhow::Result<u64> {
    listener.set_nonblocking(true).context("listener")?;
    let accept_deadline = Instant::now() + START_TIMEOUT;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > accept_deadline {
                    bail!("no sender connected within {START_TIMEOUT:?}");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e).context("accept"),
        }
    };
    stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(Some(RAW_IO_TIMEOUT)))
        .context("socket")?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; buffer_bytes];
    let mut total: u64 = 0;
    loop {
        let n = stream.read(&mut buf).context("read")?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
        if Instant::now() > deadline {
            bail!("still receiving after {timeout:?}");
        }
    }
}

/// Connects to `addr` and writes `buffer_bytes` at a time for `seconds`, then waits for
/// the receiver to close; the bytes sent and the seconds from connecting to that close
/// (the receiver's own clock would start at accept, which a loaded machine may delay
/// while the first bytes already sit in the socket buffer).
fn send(
    addr: SocketAddr,
    buffer_bytes: usize,
    seconds: f64,
    timeout: Duration,
) -> anyhow::Result<(u64, f64)> {
    let mut stream = TcpStream::connect(addr).context("connect")?;
    stream
        .set_write_timeout(Some(RAW_IO_TIMEOUT))
        .and_then(|_| stream.set_read_timeout(Some(RAW_IO_TIMEOUT)))
        .context("socket")?;
    let buf: Vec<u8> = (0..buffer_bytes).map(|i| (i % 251) as u8).collect();
    let start = Instant::now();
    let run_for = Duration::from_secs_f64(seconds).min(timeout);
    // A bound on the count as well as on time: 1 TiB.
    let max_writes = (1u64 << 40) / buffer_bytes as u64;
    let mut writes = 0u64;
    while writes < max_writes && start.elapsed() < run_for {
        stream.write_all(&buf).context("write")?;
        writes += 1;
    }
    stream.shutdown(Shutdown::Write).context("shutdown")?;
    let n = stream
        .read(&mut [0u8; 1])
        .context("waiting for the receiver to close")?;
    if n != 0 {
        bail!("the receiver sent data");
    }
    Ok((writes * buffer_bytes as u64, start.elapsed().as_secs_f64()))
}

// ---------------------------------------------------------------------------------
// Exchange between two worker processes

/// Bids at parallelism 1 into a blackhole at parallelism 1 over a rebalance edge.
fn exchange_job(events: u64, batch_size: u32, delay_ms: u64, replay: u32) -> Result<pb::JobGraph> {
    exchange_job_with(events, batch_size, delay_ms, replay, "")
}

/// [`exchange_job`] with more top-level settings (`extra`: YAML lines).
fn exchange_job_with(
    events: u64,
    batch_size: u32,
    delay_ms: u64,
    replay: u32,
    extra: &str,
) -> Result<pb::JobGraph> {
    let text = format!(
        "name: bench-exchange\nparallelism: 1\n{extra}source:\n  nexmark: {{ stream: bid, events: {events}, seed: 42, repeat_batches: {replay} }}\n  batch_size: {batch_size}\nsink:\n  blackhole: {{ delay_per_batch: {delay_ms}ms }}\n"
    );
    let mut graph =
        job_spec::parse_job("<bench exchange>", &text).map_err(|e| Error::usage(e.to_string()))?;
    // The YAML would chain source and sink (forward between equal parallelisms); a
    // rebalance edge cuts them into two chains, which round-robin placement puts on
    // workers 0 and 1.
    if graph.edges.len() != 1 {
        return Err(Error::failed(format!(
            "the exchange job has {} edges, expected 1",
            graph.edges.len()
        )));
    }
    graph.edges[0].partitioning = pb::Partitioning::Rebalance as i32;
    Ok(graph)
}

/// One task's figures from the last `metrics` line a worker printed for it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TaskFigures {
    /// The worker's index in the deployment.
    worker: u32,
    task: String,
    records_in: u64,
    records_out: u64,
    bytes_out: u64,
}

impl TaskFigures {
    /// The figures of a `metrics worker=.. task=.. ..` line; `None` for other lines.
    fn parse(line: &str) -> Option<Self> {
        if !line.starts_with("metrics ") {
            return None;
        }
        Some(Self {
            worker: field(line, "worker")?,
            task: field(line, "task")?,
            records_in: field(line, "records_in")?,
            records_out: field(line, "records_out")?,
            bytes_out: field(line, "bytes_out")?,
        })
    }
}

/// Every task's figures in a worker's log, the last line per task winning.
fn task_figures(log: &Path) -> anyhow::Result<Vec<TaskFigures>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let mut tasks: Vec<TaskFigures> = Vec::new();
    for t in text.lines().filter_map(TaskFigures::parse) {
        match tasks.iter_mut().find(|o| o.task == t.task) {
            Some(old) => *old = t,
            None => tasks.push(t),
        }
    }
    Ok(tasks)
}

/// What a run of the exchange job produced.
struct ExchangeRun {
    /// The producer's (worker 0) tasks and the consumer's (worker 1).
    tasks: [Vec<TaskFigures>; 2],
    /// Records the job's sources read, from its status.
    status_records_in: u64,
    seconds: f64,
    /// (ms since submission, producer VmRSS kB, consumer VmRSS kB)
    rss: Vec<(u64, u64, u64)>,
    /// CPU seconds (user + system) of the producer and the consumer when the job ended.
    cpu_seconds: [f64; 2],
    /// (duration ms, channel-state bytes) of each completed checkpoint, oldest first.
    checkpoints: Vec<(u64, u64)>,
}

impl ExchangeRun {
    /// The source's records and network bytes out, checked against the sink and the
    /// job's status.
    fn measurement(&self) -> anyhow::Result<Measurement> {
        let [producer, consumer] = &self.tasks;
        let source = producer
            .iter()
            .max_by_key(|t| t.bytes_out)
            .ok_or_else(|| anyhow!("worker 0 printed no task metrics"))?;
        let sink = consumer
            .iter()
            .max_by_key(|t| t.records_in)
            .ok_or_else(|| anyhow!("worker 1 printed no task metrics"))?;
        if sink.records_in != source.records_out {
            bail!(
                "the sink ({}) received {} records, the source ({}) sent {}",
                sink.task,
                sink.records_in,
                source.task,
                source.records_out
            );
        }
        if self.status_records_in != source.records_out {
            bail!(
                "the job's status says its sources read {} records, the source task ({}) sent {}",
                self.status_records_in,
                source.task,
                source.records_out
            );
        }
        if source.bytes_out == 0 {
            bail!(
                "the source task ({}) sent no bytes over the network; is it on another worker than the sink?",
                source.task
            );
        }
        Ok(Measurement {
            records: source.records_out,
            bytes: source.bytes_out,
            seconds: self.seconds,
        })
    }
}

/// Runs `graph` under a coordinator in this process on two fresh worker processes, over
/// mutual TLS with `tls`; with `sample_rss`, samples their VmRSS that often.
async fn run_exchange(
    graph: pb::JobGraph,
    args: &Args,
    host: &dyn Host,
    sample_rss: Option<Duration>,
    tls: Option<&TlsFiles>,
) -> anyhow::Result<ExchangeRun> {
    let dir = tempfile::Builder::new()
        .prefix("sluice-bench-exchange-")
        .tempdir()
        .context("temporary directory")?;
    let store = ObjectMetadataStore::from_url(&format!("file://{}", dir.path().display()))
        .context("the coordinator's store")?;
    let (listener, addr) = service::bind("127.0.0.1:0", "workers")
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let mut network = NetworkConfig {
        buffer_bytes: args.buffer_bytes,
        ..NetworkConfig::default()
    };
    network.max_frame_bytes = network.buffer_bytes + 64;
    let coordinator = Coordinator::new(CoordinatorOptions {
        store: Arc::new(store),
        state: None,
        // The benchmark starts the two workers itself; one that dies fails the job.
        launcher: None,
        heartbeat_interval: Duration::from_millis(500),
        heartbeat_timeout: Duration::from_secs(5),
        master: host.master_config(2, &network, 0),
    });
    let server = coordinator.serve_workers(listener);
    // Dropped (killed) before `dir`, which holds their logs, is removed.
    let scheme = sluice_common::tls::scheme();
    let workers = Workers::new(format!("{scheme}://{addr}"), dir.path())?
        .with_env(tls.map(TlsFiles::env).unwrap_or_default());
    let timeout = Duration::from_secs(args.timeout_secs);
    let run = drive(&coordinator, &workers, graph, timeout, sample_rss).await;
    server.abort();
    run.map_err(|e| anyhow!("{e:#}{}", workers.log_tails()))
}

/// Starts the workers, waits for both to attach, submits `graph` and waits for its end.
async fn drive(
    coordinator: &Arc<Coordinator>,
    workers: &Workers,
    graph: pb::JobGraph,
    timeout: Duration,
    sample_rss: Option<Duration>,
) -> anyhow::Result<ExchangeRun> {
    workers.start(2)?;
    let attaching = Instant::now();
    while coordinator.workers().len() < 2 {
        if let Some(failed) = workers.failed() {
            bail!("{failed}");
        }
        if attaching.elapsed() > START_TIMEOUT {
            bail!("the workers did not attach within {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let logs = workers.logs();
    let [(pid_a, log_a), (pid_b, log_b)] = logs.as_slice() else {
        bail!("expected two workers, started {}", logs.len());
    };
    let start = Instant::now();
    let id = coordinator
        .submit(
            graph,
            SubmitOptions {
                workers: Some(2),
                ..SubmitOptions::default()
            },
        )
        .await
        .map_err(|e| anyhow!("submitting the exchange job: {e}"))?;
    let deadline = start + timeout;
    let kb = |pid: u32| rss_bytes(pid).unwrap_or(0) / 1024;
    let mut rss = Vec::new();
    // Without sampling the tick's branch is disabled; its period does not matter.
    let mut tick = tokio::time::interval(sample_rss.unwrap_or(Duration::from_secs(1)));
    let wait = coordinator.wait(&id);
    tokio::pin!(wait);
    let status = loop {
        tokio::select! {
            status = &mut wait => break status.map_err(|e| anyhow!("waiting for the exchange job: {e}"))?,
            _ = tick.tick(), if sample_rss.is_some() => {
                rss.push((start.elapsed().as_millis() as u64, kb(*pid_a), kb(*pid_b)));
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                let _ = coordinator.cancel(&id).await;
                bail!("the exchange did not finish within {timeout:?}");
            }
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    // The workers outlive the job: their CPU time is complete now.
    let cpu = [*pid_a, *pid_b].map(|pid| cpu_seconds(pid).unwrap_or(0.0));
    if status.state != JobState::Finished {
        bail!(
            "the exchange job ended {}: {}",
            status.state,
            status.failure.unwrap_or_default()
        );
    }
    // Which process ran which side: the `worker=` index of its metrics lines.
    let (a, b) = (task_figures(log_a)?, task_figures(log_b)?);
    let producer_first = match (a.first(), b.first()) {
        (Some(t), _) if t.worker == 0 => true,
        (_, Some(t)) if t.worker == 0 => false,
        _ => bail!("neither worker printed the metrics of worker 0"),
    };
    let (tasks, cpu_seconds, rss) = if producer_first {
        ([a, b], cpu, rss)
    } else {
        let swapped = rss.into_iter().map(|(t, a, b)| (t, b, a)).collect();
        ([b, a], [cpu[1], cpu[0]], swapped)
    };
    let checkpoints = status
        .checkpoints
        .iter()
        .map(|c| (c.duration_ms, c.channel_state_bytes))
        .collect();
    Ok(ExchangeRun {
        tasks,
        status_records_in: status.records_in,
        seconds,
        rss,
        cpu_seconds,
        checkpoints,
    })
}

// ---------------------------------------------------------------------------------
// Slow consumer

/// A consumer `factor` times slower than `fast`'s: the sink sleeps after each batch.
async fn slow_consumer(
    args: &Args,
    host: &dyn Host,
    factor: f64,
    fast: &Measurement,
) -> anyhow::Result<()> {
    let batches = fast.records.div_ceil(u64::from(args.batch_size)).max(1);
    let batch_ms = fast.seconds * 1000.0 / batches as f64;
    let delay_ms = ((factor - 1.0) * batch_ms).ceil().max(1.0) as u64;
    // Enough batches to last about --slow-seconds at the slowed pace.
    let slow_batches = ((args.slow_seconds * 1000.0) / (batch_ms + delay_ms as f64)).ceil() as u64;
    let events = (slow_batches.max(4) * u64::from(args.batch_size)).min(args.events);
    let graph = exchange_job(events, args.batch_size, delay_ms, args.replay)?;
    let interval = Duration::from_millis(args.rss_interval_ms.max(10));
    let run = run_exchange(graph, args, host, Some(interval), None).await?;
    let m = run.measurement()?;
    let line = m
        .line("slow-consumer", args.buffer_bytes)
        .field("delay_per_batch_ms", delay_ms)
        .field(
            "slowdown",
            format!("{:.1}x", fast.records_per_s() / m.records_per_s().max(1e-9)),
        );
    outln!("{line}");
    let series = |pick: fn(&(u64, u64, u64)) -> u64| -> String {
        let points: Vec<String> = run
            .rss
            .iter()
            .map(|r| format!("{}:{}", r.0, pick(r)))
            .collect();
        points.join(",")
    };
    outln!(
        "{}",
        Line::new().field("producer_rss_kb_series(ms:kB)", series(|r| r.1))
    );
    outln!(
        "{}",
        Line::new().field("consumer_rss_kb_series(ms:kB)", series(|r| r.2))
    );
    let max = run.rss.iter().map(|r| r.1).max().unwrap_or(0);
    let min = run
        .rss
        .iter()
        .map(|r| r.1)
        .filter(|&k| k > 0)
        .min()
        .unwrap_or(0);
    let line = Line::new()
        .field("producer_rss_max_kb", max)
        .field("producer_rss_min_kb", min)
        .field("samples", run.rss.len())
        .field("interval_ms", interval.as_millis());
    outln!("{line}");
    if args.checkpoints {
        let modes = [
            ("aligned", "checkpoint: { interval: 1s, timeout: 120s }\n"),
            (
                "aligned-debloated",
                "checkpoint: { interval: 1s, timeout: 120s }\nnetwork: { debloat: 1s }\n",
            ),
            (
                "unaligned",
                "checkpoint: { interval: 1s, mode: unaligned, timeout: 120s }\n",
            ),
        ];
        for (mode, extra) in modes {
            let graph = exchange_job_with(events, args.batch_size, delay_ms, args.replay, extra)?;
            let run = run_exchange(graph, args, host, None, None).await?;
            outln!("{}", checkpoint_line(mode, &run.checkpoints));
        }
    }
    Ok(())
}

/// `kind=checkpoints mode=.. checkpoints=.. median_ms=.. max_ms=..
/// channel_state_bytes=..` over `checkpoints` (duration ms, channel-state bytes), the
/// last left out: it is taken after the sources ended, with nothing in flight.
fn checkpoint_line(mode: &str, checkpoints: &[(u64, u64)]) -> Line {
    let taken = &checkpoints[..checkpoints.len().saturating_sub(1)];
    let mut durations: Vec<u64> = taken.iter().map(|c| c.0).collect();
    durations.sort_unstable();
    let median = durations.get(durations.len() / 2).copied().unwrap_or(0);
    Line::new()
        .field("kind", "checkpoints")
        .field("mode", mode)
        .field("checkpoints", taken.len())
        .field("median_ms", median)
        .field("max_ms", durations.last().copied().unwrap_or(0))
        .field(
            "channel_state_bytes",
            taken.iter().map(|c| c.1).sum::<u64>(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_job_is_two_chains_on_two_workers() {
        let graph = match exchange_job(1000, 100, 5, 4) {
            Ok(g) => g,
            Err(e) => panic!("{e}"),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let plan = rt
            .block_on(sluice_compute::plan::plan(
                graph,
                sluice_connectors::Builtin::shared(),
            ))
            .expect("plans");
        assert_eq!(plan.chains.len(), 2);
        let placement = sluice_compute::runtime::build::Placement::round_robin(&plan, 2);
        assert_eq!(placement.worker_of(0, 0), 0);
        assert_eq!(placement.worker_of(1, 0), 1);
    }

    #[test]
    fn checkpoint_lines_leave_out_the_final_checkpoint() {
        let line = checkpoint_line("unaligned", &[(900, 10), (100, 30), (500, 20), (5, 0)]);
        assert_eq!(
            line.to_string(),
            "kind=checkpoints mode=unaligned checkpoints=3 median_ms=500 max_ms=900 \
             channel_state_bytes=60"
        );
    }

    #[test]
    fn the_raw_pair_moves_every_byte_it_sends() {
        let m = measure_raw(4096, 0.05, Duration::from_secs(30)).expect("raw pair");
        assert!(m.bytes > 0, "{m:?}");
        assert_eq!(m.bytes % 4096, 0, "whole writes: {m:?}");
        assert!(m.seconds >= 0.05, "{m:?}");
    }

    #[test]
    fn metrics_lines_give_the_last_figures_per_task() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("worker-0.log");
        let line = |records: u64| {
            format!(
                "metrics worker=0 task=source[0] busy_ms_per_s=1 backpressured_ms_per_s=0 idle_ms_per_s=0 \
                 records_in=0 records_out={records} bytes_in=0 bytes_out={} buffers_in_use_in=0 \
                 buffers_in_use_out=0 credits=2 backlog=0 rss_kb=1000",
                records * 10
            )
        };
        let text = format!("{}\nWARN something else\n{}\n", line(5), line(7));
        std::fs::write(&log, text).unwrap();
        let tasks = task_figures(&log).unwrap();
        assert_eq!(
            tasks,
            vec![TaskFigures {
                worker: 0,
                task: "source[0]".into(),
                records_in: 0,
                records_out: 7,
                bytes_out: 70,
            }]
        );
    }
}
