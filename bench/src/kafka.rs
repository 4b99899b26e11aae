//! `sluice bench kafka`: the Kafka source's throughput next to a plain librdkafka
//! consumer reading the same topic in the same run.
//!
//! - **topic**: `--topic` (default a fresh one) with `--partitions`; when it holds no
//!   record, `--events` Nexmark bids are written to it as JSON (`sluice kafka produce`'s
//!   writer). Both readers then read every partition from its earliest offset to the
//!   end offset the brokers report when the reader starts.
//! - **rdkafka** (the baseline): one `BaseConsumer` of this process assigned every
//!   partition, polling until each partition reached its end; it counts records and
//!   value bytes and decodes nothing. Timed from assigning to the last record.
//! - **sluice-raw** and **sluice-json**: a job `kafka → blackhole` at `--parallelism`
//!   (in this process, `sluice run`'s embedded cluster), reading the value as one string
//!   column (`format: raw`) or decoding the bids' JSON into four typed columns. Timed as
//!   `sluice run` times a job (planning to end).
//!
//! Runs alternate (`--runs` rounds of baseline, raw, json) so drift on a noisy machine
//! hits all three alike; each prints `kind=.. records=.. seconds=.. records_per_s=..
//! mb_per_s=..`, and the medians end with `ratio_raw=.. ratio_json=..` (Sluice's
//! records/s over the baseline's).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args as ClapArgs;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_common::outln;
use sluice_common::pb;
use sluice_connectors::kafka::admin::{ensure_topic, produce_nexmark};
use sluice_planner::job_spec;

use crate::harness::runtime;
use crate::harness::table::Line;
use crate::{Error, Host, Result};

/// How long one metadata or offsets request may take.
const REQUEST: Duration = Duration::from_secs(10);
/// The longest a broker may hold a fetch in the latency run: tansu answers a fetch only
/// when this expires, even when records are waiting (a real broker answers at once).
const FETCH_WAIT_MS: u64 = 5;

/// Arguments of `sluice bench kafka`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Bootstrap brokers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// The topic to read (filled with `--events` bids when empty); default a fresh one.
    #[arg(long)]
    topic: Option<String>,
    /// Partitions of a topic the benchmark creates.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Bids written to an empty topic.
    #[arg(long, default_value_t = 2_000_000)]
    events: u64,
    /// Subtasks of the Sluice source.
    #[arg(long, default_value_t = 2)]
    parallelism: u32,
    /// Rounds of (baseline, raw, json).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Upper bound of one baseline read.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Also measure end-to-end latency at this many records per second (0: skip).
    #[arg(long, default_value_t = 0)]
    latency_rate: u64,
    /// How long the latency run produces (seconds).
    #[arg(long, default_value_t = 10.0)]
    latency_seconds: f64,
    /// The checkpoint interval of the exactly-once latency run (its records become
    /// visible when their checkpoint's transaction commits).
    #[arg(long, default_value = "1s")]
    eos_checkpoint_interval: String,
}

/// What one read did.
#[derive(Debug, Clone, Copy)]
struct Read {
    records: u64,
    bytes: u64,
    seconds: f64,
}

impl Read {
    fn records_per_s(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }

    fn line(&self, kind: &str) -> Line {
        let line = Line::new()
            .field("kind", kind)
            .field("records", self.records)
            .field("seconds", format!("{:.3}", self.seconds))
            .field("records_per_s", format!("{:.0}", self.records_per_s()));
        match self.bytes {
            0 => line,
            bytes => line.field(
                "mb_per_s",
                format!("{:.1}", bytes as f64 / 1e6 / self.seconds.max(1e-9)),
            ),
        }
    }
}

/// Runs `sluice bench kafka`.
///
/// With `--latency-rate R`: a job `kafka → kafka` (`sluice run`, a child process of this
/// binary) copies records from `<topic>-lat-in` to `<topic>-lat-out` while this process
/// produces R records per second for `--latency-seconds`, each carrying the microsecond
/// it was sent, and a reader of the output topic takes the difference when it receives
/// it. Twice: with the at-least-once sink (no checkpoints; read by a consumer) and with
/// the exactly-once sink (checkpoints every `--eos-checkpoint-interval`; a record counts
/// as received when the COMMIT marker of its transaction is read from the log, since
/// tansu shows uncommitted records to `read_committed` consumers). The source's consumer
/// and the readers ask the broker to hold a fetch at most 5 ms, the producer lingers 1
/// ms. Prints `kind=latency delivery=.. rate=.. records=.. lost=.. p50_ms=.. p99_ms=..
/// max_ms=..`.
pub fn run(args: Args, host: &dyn Host) -> Result<()> {
    if args.runs == 0 || args.parallelism == 0 || args.partitions < 1 {
        return Err(Error::usage(
            "--runs, --parallelism and --partitions must be at least 1",
        ));
    }
    let topic = args
        .topic
        .clone()
        .unwrap_or_else(|| format!("sluice-bench-{}", std::process::id()));
    if args.latency_rate > 0 {
        latency(&args, &topic, false)?;
        latency(&args, &topic, true)?;
    }
    fill(&args, &topic)?;
    let mut medians: HashMap<&str, Vec<f64>> = HashMap::new();
    for _ in 0..args.runs {
        let baseline = plain_consumer(&args.brokers, &topic, args.timeout_secs)?;
        outln!("{}", baseline.line("rdkafka"));
        medians
            .entry("rdkafka")
            .or_default()
            .push(baseline.records_per_s());
        for (kind, format) in [("sluice-raw", "raw"), ("sluice-json", "json")] {
            let read = sluice_job(&args, &topic, format, host)?;
            if read.records != baseline.records {
                return Err(Error::failed(format!(
                    "{kind} read {} records, the baseline {}: they must read the same",
                    read.records, baseline.records
                )));
            }
            outln!("{}", read.line(kind));
            medians.entry(kind).or_default().push(read.records_per_s());
        }
    }
    let median = |kind: &str| {
        let mut v = medians.get(kind).cloned().unwrap_or_default();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let base = median("rdkafka");
    outln!(
        "{}",
        Line::new()
            .field("topic", &topic)
            .field("ratio_raw", format!("{:.2}", median("sluice-raw") / base))
            .field("ratio_json", format!("{:.2}", median("sluice-json") / base))
    );
    Ok(())
}

/// Creates the topic when missing and writes the bids when it is empty.
fn fill(args: &Args, topic: &str) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let properties = HashMap::new();
        ensure_topic(&args.brokers, topic, args.partitions, &properties)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        if end_offsets(&args.brokers, topic)?.values().sum::<i64>() > 0 {
            return Ok(());
        }
        let source = pb::NexmarkSource {
            events: args.events,
            ..Default::default()
        };
        let sink = pb::KafkaSink {
            brokers: args.brokers.clone(),
            topic: topic.to_owned(),
            ..Default::default()
        };
        let started = Instant::now();
        let written = produce_nexmark(&source, &sink)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        eprintln!(
            "wrote {written} bids to {topic} in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok::<(), Error>(())
    })
}

fn consumer(brokers: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "sluice-bench")
        .set("enable.auto.commit", "false")
        .create()
        .context("a Kafka consumer")?)
}

/// Each partition's end offset as the brokers report it now.
fn end_offsets(brokers: &str, topic: &str) -> Result<HashMap<i32, i64>> {
    let consumer = consumer(brokers)?;
    let meta = consumer
        .fetch_metadata(Some(topic), REQUEST)
        .context("topic metadata")?;
    let partitions = meta
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>())
        .unwrap_or_default();
    partitions
        .into_iter()
        .map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, REQUEST)
                .context("partition offsets")?;
            Ok((p, high))
        })
        .collect()
}

/// Reads every partition from its start to its end with one plain consumer.
fn plain_consumer(brokers: &str, topic: &str, timeout_secs: u64) -> Result<Read> {
    let ends = end_offsets(brokers, topic)?;
    let consumer = consumer(brokers)?;
    let mut list = TopicPartitionList::new();
    let mut open = 0usize;
    for (&p, &end) in &ends {
        if end > 0 {
            list.add_partition_offset(topic, p, Offset::Beginning)
                .context("assignment")?;
            open += 1;
        }
    }
    let started = Instant::now();
    consumer.assign(&list).context("assign")?;
    let (mut records, mut bytes) = (0u64, 0u64);
    let deadline = started + Duration::from_secs(timeout_secs);
    while open > 0 {
        if Instant::now() > deadline {
            return Err(Error::failed(format!(
                "the plain consumer did not reach the end within {timeout_secs} s"
            )));
        }
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.context("poll")?;
        let end = ends.get(&message.partition()).copied().unwrap_or(0);
        if message.offset() >= end {
            continue;
        }
        records += 1;
        bytes += message.payload().map_or(0, |p| p.len()) as u64;
        if message.offset() + 1 == end {
            open -= 1;
        }
    }
    Ok(Read {
        records,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs `kafka → blackhole` on Sluice, the values read as `format`.
fn sluice_job(args: &Args, topic: &str, format: &str, host: &dyn Host) -> Result<Read> {
    // Only the value's columns go on, as a plain consumer hands on only values.
    let (schema, columns) = match format {
        "raw" => (String::new(), "[value]"),
        _ => (
            "\n    schema: { auction: int64, bidder: int64, price: int64, date_time: timestamp }"
                .to_owned(),
            "[auction, bidder, price, date_time]",
        ),
    };
    let text = format!(
        "name: bench-kafka\nparallelism: {}\nsource:\n  kafka:\n    brokers: {}\n    \
         topic: {topic}\n    format: {format}{schema}\n    bounded: latest\n\
         pipeline:\n  - select: {columns}\n\
         sink:\n  blackhole: {{}}\n",
        args.parallelism, args.brokers
    );
    let graph =
        job_spec::parse_job("<bench kafka>", &text).map_err(|e| Error::usage(e.to_string()))?;
    let summary = host.run_job(graph, 0)?;
    Ok(Read {
        records: summary.records_in,
        bytes: 0,
        seconds: summary.seconds,
    })
}

/// Measures produce-to-consume latency through a `kafka → kafka` job, its sink exactly
/// once or at least once.
fn latency(args: &Args, topic: &str, exactly_once: bool) -> Result<()> {
    let delivery = if exactly_once {
        "exactly_once"
    } else {
        "at_least_once"
    };
    let (input, output) = (
        format!("{topic}-lat-in-{delivery}"),
        format!("{topic}-lat-out-{delivery}"),
    );
    let checkpoint = if exactly_once {
        format!(
            "checkpoint: {{ interval: {} }}\n",
            args.eos_checkpoint_interval
        )
    } else {
        String::new()
    };
    let rt = runtime()?;
    rt.block_on(async {
        let properties = HashMap::new();
        ensure_topic(&args.brokers, &input, args.partitions, &properties).await?;
        ensure_topic(&args.brokers, &output, 1, &properties).await
    })
    .map_err(|e| anyhow!("{e}"))?;
    let dir = tempfile::tempdir().context("a temporary directory")?;
    let job = dir.path().join("latency.yaml");
    std::fs::write(
        &job,
        format!(
            "name: bench-kafka-latency-{delivery}\nparallelism: {}\n{checkpoint}source:\n  \
             kafka:\n    brokers: {b}\n    topic: {input}\n    start: latest\n    \
             schema: {{ sent_us: int64, n: int64 }}\n    \
             properties: {{ fetch.wait.max.ms: {FETCH_WAIT_MS} }}\n\
             pipeline:\n  - select: [sent_us, n]\n\
             sink:\n  kafka: {{ brokers: {b}, topic: {output}, format: json, \
             delivery: {delivery} }}\n",
            args.parallelism,
            b = args.brokers
        ),
    )
    .context("writing the job")?;
    let log = dir.path().join("job.log");
    let mut child = std::process::Command::new(crate::harness::process::sluice_exe()?)
        .args(["run", job.to_str().context("UTF-8 path")?])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).context("job log")?)
        .spawn()
        .context("starting the job")?;
    let result = measure_latency(args, &input, &output, exactly_once, &log);
    let _ = child.kill();
    let _ = child.wait();
    let (sent, mut latencies) = result?;
    latencies.sort_unstable();
    let ms = |p: f64| crate::harness::timing::percentile(&latencies, p) as f64 / 1000.0;
    outln!(
        "{}",
        Line::new()
            .field("kind", "latency")
            .field("delivery", delivery)
            .field("rate", args.latency_rate)
            .field("records", sent)
            .field("lost", sent.saturating_sub(latencies.len() as u64))
            .field("p50_ms", format!("{:.2}", ms(0.50)))
            .field("p99_ms", format!("{:.2}", ms(0.99)))
            .field("max_ms", format!("{:.2}", ms(1.0)))
    );
    Ok(())
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// Warms the job up until a record comes through, then produces at the rate and
/// collects each record's latency (microseconds).
fn measure_latency(
    args: &Args,
    input: &str,
    output: &str,
    committed: bool,
    log: &Path,
) -> Result<(u64, Vec<i64>)> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "1")
        .create()
        .context("a Kafka producer")?;
    let mut receiver = Receiver::new(&args.brokers, output, committed)?;
    let send = |n: i64| {
        let value = format!(r#"{{"sent_us":{},"n":{n}}}"#, now_us());
        let _ = producer.send(BaseRecord::<(), str>::to(input).payload(&value));
        producer.poll(Duration::ZERO);
    };
    // Warm-up: one record every 100 ms until one arrives (the job has started).
    let deadline = Instant::now() + Duration::from_secs(60);
    'warm: loop {
        if Instant::now() > deadline {
            return Err(Error::failed(format!(
                "no record came through the job within 60 s; its log:\n{}",
                crate::harness::process::log_tail(log, 20)
            )));
        }
        send(-1);
        let until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < until {
            if !receiver.poll()?.is_empty() {
                break 'warm;
            }
        }
    }
    let total = (args.latency_rate as f64 * args.latency_seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / args.latency_rate as f64);
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(total as usize);
    let mut sent = 0u64;
    let drain_until = |sent: u64| started + interval * sent as u32;
    let end = started + Duration::from_secs_f64(args.latency_seconds) + Duration::from_secs(10);
    while Instant::now() < end && (sent < total || (latencies.len() as u64) < total) {
        while sent < total && Instant::now() >= drain_until(sent) {
            send(sent as i64);
            sent += 1;
        }
        let received = receiver.poll()?;
        let at = now_us();
        for value in received {
            let Some(parsed) = std::str::from_utf8(&value).ok().and_then(serde_like::parse) else {
                continue;
            };
            if parsed.n >= 0 {
                latencies.push(at - parsed.sent_us);
            }
        }
    }
    let _ = producer.flush(Duration::from_secs(10));
    Ok((sent, latencies))
}

/// Reads the latency run's output topic: a consumer, or the committed records of its log.
enum Receiver {
    Consumer(Box<BaseConsumer>),
    Committed(
        tokio::runtime::Runtime,
        Box<sluice_connectors::kafka::txn::committed::CommittedReader>,
    ),
}

impl Receiver {
    fn new(brokers: &str, topic: &str, committed: bool) -> Result<Self> {
        if committed {
            let rt = runtime()?;
            let mut reader = rt
                .block_on(
                    sluice_connectors::kafka::txn::committed::CommittedReader::connect(
                        brokers, topic, 1,
                    ),
                )
                .map_err(|e| anyhow!("{e}"))?;
            reader.max_wait = Duration::from_millis(FETCH_WAIT_MS);
            // Skip what earlier runs left.
            rt.block_on(reader.poll()).map_err(|e| anyhow!("{e}"))?;
            return Ok(Receiver::Committed(rt, Box::new(reader)));
        }
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "sluice-bench")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", FETCH_WAIT_MS.to_string())
            .create()
            .context("a Kafka consumer")?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, 0, Offset::End)
            .context("assignment")?;
        consumer.assign(&list).context("assign")?;
        Ok(Receiver::Consumer(Box::new(consumer)))
    }

    /// The values that arrived since the last call (waiting briefly).
    fn poll(&mut self) -> Result<Vec<Vec<u8>>> {
        match self {
            Receiver::Consumer(c) => Ok(c
                .poll(Duration::from_micros(200))
                .and_then(|m| m.ok())
                .and_then(|m| m.payload().map(<[u8]>::to_vec))
                .into_iter()
                .collect()),
            Receiver::Committed(rt, reader) => Ok(rt
                .block_on(reader.poll())
                .map_err(|e| anyhow!("{e}"))?
                .into_iter()
                .map(|b| b.to_vec())
                .collect()),
        }
    }
}

/// The two numbers of a latency record, read without a JSON library.
mod serde_like {
    pub struct Sent {
        pub sent_us: i64,
        pub n: i64,
    }

    fn field(value: &str, name: &str) -> Option<i64> {
        let at = value.find(&format!("\"{name}\":"))? + name.len() + 3;
        let rest = &value[at..];
        let end = rest
            .find(|c: char| c != '-' && !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    }

    pub fn parse(value: &str) -> Option<Sent> {
        Some(Sent {
            sent_us: field(value, "sent_us")?,
            n: field(value, "n")?,
        })
    }
}
