//! `sluice bench nexmark`: a Nexmark query end to end, one line of figures.
//!
//! What it measures: events per second (and per core) of a whole job, the query's
//! source, operators and a blackhole sink, with the job's peak resident memory.
//! How: the query runs exactly as `sluice run` would run it (with `--workers N`, across
//! N worker processes as `sluice run --workers N` would; [`Host::run_job`]), reading
//! either the built-in generator or CSV files of bids (`--input`, as written by `sluice
//! nexmark gen --format csv`); seconds run from planning to the end. It compares
//! against nothing in the same run: runs of different queries, parallelisms, state
//! backends and worker counts are compared with each other.
//!
//! Output: `query=.. state=.. source=.. parallelism=.. workers=.. events=.. seconds=..
//! events_per_s=.. events_per_s_per_core=.. peak_rss_mb=.. out=..`.

use clap::{Args as ClapArgs, ValueEnum};
use sluice_common::outln;
use sluice_planner::job_spec;

use crate::harness::table::Line;
use crate::{Error, Host, Result};
use sluice_common::process::self_peak_rss_bytes as peak_rss_bytes;

/// Benchmark queries.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Query {
    /// Pass-through.
    Q0,
    /// Currency conversion (projection).
    Q1,
    /// Filter by auction id.
    Q2,
    /// Bids per auction in 10 s windows sliding by 2 s.
    Q5,
    /// Highest bid per 10 s tumbling window.
    Q7,
    /// Bids per bidder session (10 s gap).
    Q11,
    /// COUNT and SUM of bids per auction in 10 s tumbling windows.
    Tumbling,
    /// Daily bids, bidders and auctions per price band (unbounded GROUP BY, COUNT DISTINCT).
    Q15,
    /// Bid statistics per auction and day (unbounded GROUP BY, a changelog).
    Q17,
    /// The last bid per bidder and auction (ROW_NUMBER deduplication, a changelog).
    Q18,
    /// The 10 highest bids per auction (Top-N, a changelog).
    Q19,
}

/// Arguments of `sluice bench nexmark` (where remote state lives is the [`Host`]'s).
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The query.
    #[arg(long, value_enum)]
    query: Query,
    /// Number of bids (ignored with --input, which reads every file).
    #[arg(long, default_value_t = 10_000_000)]
    events: u64,
    /// Parallelism of the job.
    #[arg(long, default_value_t = 2)]
    parallelism: u32,
    /// Read bids from CSV files in this directory instead of the generator.
    #[arg(long)]
    input: Option<String>,
    /// Where window state lives: `memory`, or `remote` (an embedded state service unless
    /// --state-service names one).
    #[arg(long, value_enum, default_value_t = StateChoice::Memory)]
    state: StateChoice,
    /// Run across this many worker processes under a coordinator in this process, as
    /// `sluice run --workers N` does (0: in this process). With workers the seconds include starting them, and peak_rss_mb (this
    /// process only) is NaN: the workers print theirs in their `metrics` lines.
    #[arg(long, default_value_t = 0)]
    workers: u32,
    /// Take a checkpoint this often (ms; 0: none), so that window state reaches the
    /// backend (without checkpoints it stays in the operators' caches).
    #[arg(long, default_value_t = 0)]
    checkpoint_ms: u64,
    /// Bytes of decoded window state each subtask keeps before spilling (default: the
    /// job's default, 256 MiB).
    #[arg(long, value_parser = sluice_common::byte_size::parse)]
    cache: Option<u64>,
    /// Align the source subtasks' watermarks: none may run more than this many ms of
    /// event time ahead of the slowest (0: no alignment).
    #[arg(long, default_value_t = 0)]
    max_drift_ms: u64,
    /// Write the job in SQL (`CREATE TABLE`, `INSERT INTO ... SELECT`) instead of YAML:
    /// both plan into the same graph, so their figures should agree.
    #[arg(long)]
    sql: bool,
}

/// How a benchmark job is set up, besides its query.
#[derive(Debug, Clone, Copy)]
pub struct JobOptions<'a> {
    /// Generated bids (ignored with `input`).
    pub events: u64,
    /// The job's parallelism.
    pub parallelism: u32,
    /// A directory of CSV bids to read instead of the generator.
    pub input: Option<&'a str>,
    /// Where window state lives.
    pub state: StateChoice,
    /// Checkpoint interval (0: none).
    pub checkpoint_ms: u64,
    /// The operator cache per subtask (`None`: the job's default).
    pub cache: Option<u64>,
    /// Watermark alignment's maximum drift (0: none).
    pub max_drift_ms: u64,
}

/// The state backend of a benchmark run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StateChoice {
    /// In the worker's memory.
    Memory,
    /// In the state service.
    Remote,
}

fn pipeline(query: Query) -> &'static str {
    match query {
        Query::Q0 => "",
        Query::Q1 => {
            "pipeline:\n  - select: [\"auction\", \"bidder\", \"price * 0.908 AS price\", \"date_time\"]\n"
        }
        Query::Q2 => {
            "pipeline:\n  - filter: \"auction % 123 = 0\"\n  - select: [\"auction\", \"price\"]\n"
        }
        Query::Q5 => {
            "pipeline:\n  - key_by: [auction]\n  - window: { sliding: 10s, slide: 2s }\n    aggregate: [\"count(*) AS bids\"]\n"
        }
        Query::Q7 => {
            "pipeline:\n  - window: { tumbling: 10s }\n    aggregate: [\"max(price) AS top_price\", \"count(*) AS bids\"]\n"
        }
        Query::Q11 => {
            "pipeline:\n  - key_by: [bidder]\n  - window: { session: 10s }\n    aggregate: [\"count(*) AS bids\"]\n"
        }
        Query::Tumbling => {
            "pipeline:\n  - key_by: [auction]\n  - window: { tumbling: 10s }\n    aggregate: [\"count(*) AS bids\", \"sum(price) AS volume\"]\n"
        }
        Query::Q15 => concat!(
            "pipeline:\n",
            "  - select: [\"auction\", \"bidder\", \"price\", \"DATE_FORMAT(date_time, 'yyyy-MM-dd') AS day\"]\n",
            "  - group_by: [day]\n",
            "    aggregate:\n",
            "      - \"count(*) AS total_bids\"\n",
            "      - \"count(*) FILTER (WHERE price < 10000) AS rank1_bids\"\n",
            "      - \"count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids\"\n",
            "      - \"count(*) FILTER (WHERE price >= 1000000) AS rank3_bids\"\n",
            "      - \"count(DISTINCT bidder) AS total_bidders\"\n",
            "      - \"count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders\"\n",
            "      - \"count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders\"\n",
            "      - \"count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders\"\n",
            "      - \"count(DISTINCT auction) AS total_auctions\"\n",
            "      - \"count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions\"\n",
            "      - \"count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions\"\n",
            "      - \"count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions\"\n",
        ),
        Query::Q17 => concat!(
            "pipeline:\n",
            "  - select: [\"auction\", \"price\", \"CAST(date_time AS DATE) AS day\"]\n",
            "  - group_by: [auction, day]\n",
            "    aggregate:\n",
            "      - \"count(*) AS total_bids\"\n",
            "      - \"count(*) FILTER (WHERE price < 10000) AS rank1_bids\"\n",
            "      - \"count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids\"\n",
            "      - \"count(*) FILTER (WHERE price >= 1000000) AS rank3_bids\"\n",
            "      - \"min(price) AS min_price\"\n",
            "      - \"max(price) AS max_price\"\n",
            "      - \"avg(price) AS avg_price\"\n",
            "      - \"sum(price) AS sum_price\"\n",
        ),
        Query::Q18 => {
            "pipeline:\n  - top_n: { partition_by: [bidder, auction], order_by: [\"date_time DESC\"], limit: 1 }\n  - select: [auction, bidder, price, channel, url, date_time, extra]\n"
        }
        Query::Q19 => {
            "pipeline:\n  - top_n: { partition_by: [auction], order_by: [\"price DESC\"], limit: 10, rank_column: rank_number }\n"
        }
    }
}

/// The query's SQL twin: the `SELECT` that plans into [`pipeline`]'s operators.
fn select(query: Query) -> &'static str {
    match query {
        Query::Q0 => "SELECT * FROM bid",
        Query::Q1 => "SELECT auction, bidder, price * 0.908 AS price, date_time FROM bid",
        Query::Q2 => "SELECT auction, price FROM bid WHERE auction % 123 = 0",
        Query::Q5 => {
            "SELECT auction, window_start, window_end, count(*) AS bids \
             FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) \
             GROUP BY auction, window_start, window_end"
        }
        Query::Q7 => {
            "SELECT window_start, window_end, max(price) AS top_price, count(*) AS bids \
             FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) \
             GROUP BY window_start, window_end"
        }
        Query::Q11 => {
            "SELECT bidder, window_start, window_end, count(*) AS bids \
             FROM TABLE(SESSION(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) \
             GROUP BY bidder, window_start, window_end"
        }
        Query::Tumbling => {
            "SELECT auction, window_start, window_end, count(*) AS bids, sum(price) AS volume \
             FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) \
             GROUP BY auction, window_start, window_end"
        }
        Query::Q15 => {
            "SELECT day, count(*) AS total_bids, \
             count(*) FILTER (WHERE price < 10000) AS rank1_bids, \
             count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
             count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, \
             count(DISTINCT bidder) AS total_bidders, \
             count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, \
             count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders, \
             count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, \
             count(DISTINCT auction) AS total_auctions, \
             count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, \
             count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions, \
             count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions \
             FROM (SELECT auction, bidder, price, DATE_FORMAT(date_time, 'yyyy-MM-dd') AS day FROM bid) \
             GROUP BY day"
        }
        Query::Q17 => {
            "SELECT auction, day, count(*) AS total_bids, \
             count(*) FILTER (WHERE price < 10000) AS rank1_bids, \
             count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
             count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, \
             min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, \
             sum(price) AS sum_price \
             FROM (SELECT auction, price, CAST(date_time AS DATE) AS day FROM bid) \
             GROUP BY auction, day"
        }
        Query::Q18 => {
            "SELECT auction, bidder, price, channel, url, date_time, extra FROM (\
             SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) \
             AS rank_number FROM bid) WHERE rank_number <= 1"
        }
        Query::Q19 => {
            "SELECT * FROM (\
             SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) \
             AS rank_number FROM bid) WHERE rank_number <= 10"
        }
    }
}

/// The SQL job of a benchmark run: the same source, state, checkpoints and blackhole as
/// [`job_text`], so the two plan into one graph. SQL has no watermark alignment.
pub fn sql_text(query: Query, o: &JobOptions) -> Result<String> {
    if o.max_drift_ms > 0 {
        return Err(Error::usage(
            "--max-drift-ms has no SQL setting; leave it out with --sql",
        ));
    }
    let mut text = format!(
        "SET 'pipeline.name' = 'bench-{query:?}';\nSET 'parallelism.default' = '{}';\n",
        o.parallelism
    );
    if o.state == StateChoice::Remote {
        text.push_str("SET 'state.backend' = 'remote';\n");
    }
    if let Some(b) = o.cache {
        text.push_str(&format!("SET 'state.cache' = '{b}B';\n"));
    }
    if o.checkpoint_ms > 0 {
        text.push_str(&format!(
            "SET 'execution.checkpointing.interval' = '{}ms';\n",
            o.checkpoint_ms
        ));
    }
    let source = match o.input {
        None => format!(
            "'connector' = 'nexmark', 'stream' = 'bid', 'events' = '{}', 'seed' = '42', \
             'max_out_of_orderness' = '2s'",
            o.events
        ),
        Some(dir) => format!(
            "'connector' = 'file', 'path' = '{}', 'format' = 'csv', 'schema.auction' = 'int64', \
             'schema.bidder' = 'int64', 'schema.price' = 'int64', 'schema.channel' = 'string', \
             'schema.url' = 'string', 'schema.date_time' = 'timestamp', 'schema.extra' = 'string'",
            dir.replace('\'', "''")
        ),
    };
    text.push_str(&format!(
        "CREATE TABLE bid (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) \
         WITH ({source});\nCREATE TABLE output WITH ('connector' = 'blackhole');\n\
         INSERT INTO output {};\n",
        select(query)
    ));
    Ok(text)
}

/// The job file text of a benchmark run.
pub fn job_text(query: Query, o: &JobOptions) -> String {
    let JobOptions {
        events,
        parallelism,
        input,
        state,
        checkpoint_ms,
        cache,
        max_drift_ms,
    } = *o;
    let source = match input {
        None => format!(
            "  nexmark: {{ stream: bid, events: {events}, seed: 42, max_out_of_orderness: 2s }}\n"
        ),
        Some(dir) => format!(
            "  file:\n    path: \"{dir}\"\n    format: csv\n    schema: {{ auction: int64, bidder: int64, price: int64, channel: string, url: string, date_time: timestamp, extra: string }}\n"
        ),
    };
    let state = match state {
        StateChoice::Memory => "memory",
        StateChoice::Remote => "remote",
    };
    let cache = cache.map(|b| format!(", cache: {b}B")).unwrap_or_default();
    let checkpoint = match checkpoint_ms {
        0 => String::new(),
        ms => format!("checkpoint: {{ interval: {ms}ms }}\n"),
    };
    let alignment = match max_drift_ms {
        0 => String::new(),
        ms => format!(", alignment: {{ max_drift: {ms}ms }}"),
    };
    format!(
        "name: bench-{q:?}\nparallelism: {parallelism}\nstate: {{ backend: {state}{cache} }}\n{checkpoint}source:\n{source}watermark: {{ column: date_time, max_out_of_orderness: 4s{alignment} }}\n{p}sink:\n  blackhole: {{}}\n",
        q = query,
        p = pipeline(query)
    )
}

/// Runs `sluice bench nexmark`.
pub fn run(args: Args, host: &dyn Host) -> Result<()> {
    if args.parallelism == 0 {
        return Err(Error::usage("--parallelism must be at least 1"));
    }
    let options = JobOptions {
        events: args.events,
        parallelism: args.parallelism,
        input: args.input.as_deref(),
        state: args.state,
        checkpoint_ms: args.checkpoint_ms,
        cache: args.cache,
        max_drift_ms: args.max_drift_ms,
    };
    let graph = if args.sql {
        let text = sql_text(args.query, &options)?;
        sluice_planner::sql::parse_sql_job("<bench>.sql", &text)
    } else {
        job_spec::parse_job("<bench>", &job_text(args.query, &options))
    }
    .map_err(|e| Error::usage(e.to_string()))?;
    let s = host.run_job(graph, args.workers)?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let eps = s.records_in as f64 / s.seconds.max(1e-9);
    let rss_mb = match args.workers {
        0 => peak_rss_bytes()
            .map(|b| b as f64 / (1 << 20) as f64)
            .unwrap_or(f64::NAN),
        _ => f64::NAN,
    };
    let source = if args.input.is_some() {
        "csv"
    } else {
        "generator"
    };
    let line = Line::new()
        .field("query", format!("{:?}", args.query))
        .field("language", if args.sql { "sql" } else { "yaml" })
        .field("state", format!("{:?}", args.state))
        .field("source", source)
        .field("parallelism", args.parallelism)
        .field("workers", args.workers)
        .field("max_drift_ms", args.max_drift_ms)
        .field("events", s.records_in)
        .field("seconds", format!("{:.3}", s.seconds))
        .field("events_per_s", format!("{eps:.0}"))
        .field(
            "events_per_s_per_core",
            format!("{:.0}", eps / cores as f64),
        )
        .field("peak_rss_mb", format!("{rss_mb:.1}"))
        .field("out", s.records_out);
    outln!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_is_a_valid_job() {
        for q in Query::value_variants() {
            for input in [None, Some("/tmp/bids")] {
                for max_drift_ms in [0, 2000] {
                    let text = job_text(
                        *q,
                        &JobOptions {
                            events: 10,
                            parallelism: 2,
                            input,
                            state: StateChoice::Remote,
                            checkpoint_ms: 0,
                            cache: None,
                            max_drift_ms,
                        },
                    );
                    job_spec::parse_job("<bench>", &text)
                        .unwrap_or_else(|e| panic!("{q:?}: {e}\n{text}"));
                }
            }
        }
    }

    /// The graph without the places its parts were written, which differ between the
    /// two languages.
    fn unplaced(mut g: sluice_common::pb::JobGraph) -> sluice_common::pb::JobGraph {
        use sluice_common::pb::node::Kind;
        g.origin_file.clear();
        g.name.clear();
        for n in &mut g.nodes {
            n.location = None;
            match n.kind.as_mut() {
                Some(Kind::Filter(f)) => f.predicate.iter_mut().for_each(|e| e.location = None),
                Some(Kind::Select(s)) => s.exprs.iter_mut().for_each(|e| e.location = None),
                Some(Kind::Window(w)) => w.aggregates.iter_mut().for_each(|e| e.location = None),
                Some(Kind::Aggregate(a)) => a.aggregates.iter_mut().for_each(|e| e.location = None),
                _ => {}
            }
        }
        g
    }

    #[test]
    fn every_query_in_sql_plans_into_its_yaml_graph() {
        for q in Query::value_variants() {
            for input in [None, Some("/tmp/it's bids")] {
                for (state, checkpoint_ms, cache) in [
                    (StateChoice::Memory, 0, None),
                    (StateChoice::Remote, 1000, Some(64 << 20)),
                ] {
                    let o = JobOptions {
                        events: 10,
                        parallelism: 2,
                        input,
                        state,
                        checkpoint_ms,
                        cache,
                        max_drift_ms: 0,
                    };
                    let sql = sql_text(*q, &o).unwrap();
                    let from_sql = sluice_planner::sql::parse_sql_job("<bench>.sql", &sql)
                        .unwrap_or_else(|e| panic!("{q:?}: {e}\n{sql}"));
                    let yaml = job_text(*q, &o);
                    let from_yaml = job_spec::parse_job("<bench>", &yaml).unwrap();
                    assert_eq!(
                        unplaced(from_sql),
                        unplaced(from_yaml),
                        "{q:?}:\n{sql}\n{yaml}"
                    );
                }
            }
        }
        let drift = JobOptions {
            events: 10,
            parallelism: 2,
            input: None,
            state: StateChoice::Memory,
            checkpoint_ms: 0,
            cache: None,
            max_drift_ms: 5,
        };
        assert!(sql_text(Query::Q0, &drift).is_err());
    }
}
