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
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
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
    /// Sellers of category 10 in three states: auctions joined with persons (a regular
    /// join; the source events are the auctions and persons).
    Q3,
    /// The highest bid of every 10 s window in Flink's form: bids joined with each
    /// window's maximum price (a regular join with a time condition).
    Q7Join,
    /// Persons who opened an auction in the window they registered in: both grouped per
    /// 10 s window, then joined (the source events are the persons and auctions).
    Q8,
    /// Every bid on a category 10 auction with the auction's columns (a regular join;
    /// the source events are the bids and auctions).
    Q20,
    /// Average closing price per category: bids joined with their open auctions, the
    /// highest bid per auction, averaged per category (an aggregate over a changelog).
    /// SQL only.
    Q4,
    /// Flink's q5: each window's bid count per auction joined with the window's highest
    /// count (a join of two updating results). SQL only.
    Q5Hottest,
    /// Each seller's average selling price over their last 10 closed auctions: q4's
    /// highest bid per auction, a Top-N per seller over that changelog, averaged (an
    /// aggregate over a Top-N over an aggregate over a join). SQL only.
    Q6,
    /// The winning bid of each auction: bids joined with their open auctions, the highest
    /// per auction (a Top-N over a join). SQL only.
    Q9,
    /// Every bid written to CSV files partitioned by day and minute (`--out`, or a
    /// temporary directory). SQL only.
    Q10,
    /// Bids per bidder in 10 s processing-time windows. SQL only.
    Q12,
    /// Every bid joined with a 10,000-row side table (a processing-time lookup join).
    /// SQL only.
    Q13,
    /// Daily bids, bidders and auctions per channel and price band. SQL only.
    Q16,
    /// Each bid's channel id, from its channel or its URL (CASE, REGEXP_EXTRACT). SQL only.
    Q21,
    /// The first three directories of each bid's URL (SPLIT_INDEX). SQL only.
    Q22,
    /// Every bid of its auction's first 10 seconds: an interval join of bids and
    /// auctions on their event times, rows kept only while they can match. SQL only.
    IntervalJoin,
    /// Every bid with its auction where the auction is of category 10 and the bid is over
    /// its reserve, or padded with nulls: a regular LEFT JOIN whose ON holds conditions
    /// on both sides (an updating result). SQL only.
    LeftJoinCondition,
    /// Bids on auctions of category 10: `auction IN (SELECT id FROM auction ...)`, a
    /// semi join. SQL only.
    SemiIn,
    /// Big bids and every auction as one stream: UNION ALL of two tables' queries. SQL
    /// only.
    UnionAll,
    /// Per auction with at least 50 bids, the mean price and the spread between highest
    /// and lowest: expressions over aggregates and HAVING (an updating result). SQL only.
    Having,
    /// Each bid with its auction's bid count and highest price over the 10 seconds up to
    /// it: an OVER aggregate with a RANGE frame. SQL only.
    Over,
}

impl Query {
    /// Whether the query is written only in SQL: it has no YAML twin to compare with.
    fn sql_only(self) -> bool {
        matches!(
            self,
            Query::Q4
                | Query::Q5Hottest
                | Query::Q6
                | Query::Q9
                | Query::Q10
                | Query::Q12
                | Query::Q13
                | Query::Q16
                | Query::Q21
                | Query::Q22
                | Query::IntervalJoin
                | Query::LeftJoinCondition
                | Query::SemiIn
                | Query::UnionAll
                | Query::Having
                | Query::Over
        )
    }

    /// The columns a query's bid table computes besides the CSV's.
    fn bid_columns(self) -> &'static str {
        match self {
            Query::Q12 | Query::Q13 => "p_time AS PROCTIME(), ",
            _ => "",
        }
    }
}

/// The Nexmark streams a benchmark job reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Bid,
    Auction,
    Person,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Bid => "bid",
            Stream::Auction => "auction",
            Stream::Person => "person",
        }
    }

    /// The CSV columns, as `(name, type)`.
    fn columns(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Stream::Bid => &[
                ("auction", "int64"),
                ("bidder", "int64"),
                ("price", "int64"),
                ("channel", "string"),
                ("url", "string"),
                ("date_time", "timestamp"),
                ("extra", "string"),
            ],
            Stream::Auction => &[
                ("id", "int64"),
                ("item_name", "string"),
                ("description", "string"),
                ("initial_bid", "int64"),
                ("reserve", "int64"),
                ("date_time", "timestamp"),
                ("expires", "timestamp"),
                ("seller", "int64"),
                ("category", "int64"),
                ("extra", "string"),
            ],
            Stream::Person => &[
                ("id", "int64"),
                ("name", "string"),
                ("email_address", "string"),
                ("credit_card", "string"),
                ("city", "string"),
                ("state", "string"),
                ("date_time", "timestamp"),
                ("extra", "string"),
            ],
        }
    }

    /// Events of this stream generated with `bids` bids (46, 3 and 1 of every 50).
    fn events(self, bids: u64) -> u64 {
        match self {
            Stream::Bid => bids,
            Stream::Auction => (bids * 3 / 46).max(1),
            Stream::Person => (bids / 46).max(1),
        }
    }

    /// Where this stream's CSV files are, when the job reads files.
    fn dir<'a>(self, o: &JobOptions<'a>) -> Option<&'a str> {
        match self {
            Stream::Bid => o.input,
            Stream::Auction => o.auctions,
            Stream::Person => o.persons,
        }
    }

    /// The `WITH (...)` options of the stream's SQL table.
    fn sql_options(self, o: &JobOptions) -> String {
        match self.dir(o) {
            None => format!(
                "'connector' = 'nexmark', 'stream' = '{}', 'events' = '{}', 'seed' = '42', \
                 'max_out_of_orderness' = '2s'",
                self.name(),
                self.events(o.events)
            ),
            Some(dir) => {
                let schema: Vec<String> = self
                    .columns()
                    .iter()
                    .map(|(c, t)| format!("'schema.{c}' = '{t}'"))
                    .collect();
                format!(
                    "'connector' = 'file', 'path' = '{}', 'format' = 'csv', {}",
                    dir.replace('\'', "''"),
                    schema.join(", ")
                )
            }
        }
    }

    /// The stream's `source:` body in a job file, each line indented by `indent`.
    fn yaml_source(self, o: &JobOptions, indent: &str) -> String {
        match self.dir(o) {
            None => format!(
                "{indent}nexmark: {{ stream: {}, events: {}, seed: 42, max_out_of_orderness: 2s }}\n",
                self.name(),
                self.events(o.events)
            ),
            Some(dir) => {
                let schema: Vec<String> = self
                    .columns()
                    .iter()
                    .map(|(c, t)| format!("{c}: {t}"))
                    .collect();
                format!(
                    "{indent}file:\n{indent}  path: \"{dir}\"\n{indent}  format: csv\n{indent}  schema: {{ {} }}\n",
                    schema.join(", ")
                )
            }
        }
    }
}

/// The stream a query's job file names as its `source:` (a join's left input).
fn main_stream(query: Query) -> Stream {
    match query {
        Query::Q3 => Stream::Auction,
        Query::Q8 => Stream::Person,
        _ => Stream::Bid,
    }
}

/// The streams a query reads besides its main one (a join's right input).
fn joined_streams(query: Query) -> &'static [Stream] {
    match query {
        Query::Q3 => &[Stream::Person],
        Query::Q8
        | Query::Q20
        | Query::Q4
        | Query::Q6
        | Query::Q9
        | Query::IntervalJoin
        | Query::LeftJoinCondition
        | Query::SemiIn
        | Query::UnionAll => &[Stream::Auction],
        Query::Q7Join => &[Stream::Bid],
        _ => &[],
    }
}

/// Every stream event-time watermark in the benchmark jobs: the same 4 s bound.
const WATERMARK: &str = "{ column: date_time, max_out_of_orderness: 4s }";

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
    /// With --input: read auctions (q3, q8, q20) from CSV files in this directory.
    #[arg(long)]
    auctions: Option<String>,
    /// With --input: read persons (q3, q8) from CSV files in this directory.
    #[arg(long)]
    persons: Option<String>,
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
    /// q10's output directory (default: a temporary directory, removed afterwards).
    #[arg(long)]
    out: Option<String>,
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
    /// A directory of CSV auctions, read with `input`.
    pub auctions: Option<&'a str>,
    /// A directory of CSV persons, read with `input`.
    pub persons: Option<&'a str>,
    /// Where window state lives.
    pub state: StateChoice,
    /// Checkpoint interval (0: none).
    pub checkpoint_ms: u64,
    /// The operator cache per subtask (`None`: the job's default).
    pub cache: Option<u64>,
    /// Watermark alignment's maximum drift (0: none).
    pub max_drift_ms: u64,
    /// Where q10 writes its partitioned files (other queries write to a blackhole).
    pub out: Option<&'a str>,
}

/// The state backend of a benchmark run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StateChoice {
    /// In the worker's memory.
    Memory,
    /// In the state service.
    Remote,
}

fn pipeline(query: Query, o: &JobOptions) -> String {
    let right = |stream: Stream, pipeline: &str| {
        format!(
            "      right:\n        source:\n{}        watermark: {WATERMARK}\n{pipeline}",
            stream.yaml_source(o, "          ")
        )
    };
    match query {
        Query::Q3 => format!(
            "pipeline:\n  - filter: \"category = 10\"\n  - join:\n{}      left_keys: [seller]\n      \
             right_keys: [id]\n      left_alias: A\n      right_alias: P\n      \
             select: [P.name, P.city, P.state, A.id]\n",
            right(
                Stream::Person,
                "        pipeline:\n          - filter: \"state = 'OR' OR state = 'ID' OR state = 'CA'\"\n"
            )
        ),
        Query::Q20 => format!(
            "pipeline:\n  - join:\n{}      left_keys: [auction]\n      right_keys: [id]\n      \
             left_alias: B\n      right_alias: A\n      select: [auction, bidder, price, \
             channel, url, B.date_time, B.extra, item_name, description, initial_bid, reserve, \
             A.date_time, expires, seller, category, A.extra]\n",
            right(
                Stream::Auction,
                "        pipeline:\n          - filter: \"category = 10\"\n"
            )
        ),
        Query::Q7Join => format!(
            "pipeline:\n  - join:\n{}      left_keys: [price]\n      right_keys: [maxprice]\n      \
             left_alias: B\n      right_alias: B1\n      condition: \"B.date_time BETWEEN \
             B1.date_time - INTERVAL '10' SECOND AND B1.date_time\"\n      select: [B.auction, \
             B.price, B.bidder, B.date_time, B.extra]\n      interval: {{ left: date_time, \
             right: date_time, lower: -10s, upper: 0s }}\n",
            right(
                Stream::Bid,
                "        pipeline:\n          - window: { tumbling: 10s }\n            \
                 aggregate: [\"MAX(price) AS maxprice\"]\n          - select: [maxprice, \
                 \"window_end AS date_time\"]\n"
            )
        ),
        Query::Q8 => format!(
            "pipeline:\n  - key_by: [id, name]\n  - window: {{ tumbling: 10s }}\n    \
             aggregate: [\"count(*) AS sluice_group_rows\"]\n  - select: [id, name, \
             \"window_start AS starttime\", \"window_end AS endtime\"]\n  - join:\n{}      \
             left_keys: [id, starttime, endtime]\n      right_keys: [seller, starttime, endtime]\n      \
             left_alias: P\n      right_alias: A\n      select: [P.id, P.name, P.starttime]\n      \
             interval: {{ left: endtime, right: endtime, lower: 0s, upper: 0s }}\n",
            right(
                Stream::Auction,
                "        pipeline:\n          - key_by: [seller]\n          - window: { tumbling: 10s }\n            \
                 aggregate: [\"count(*) AS sluice_group_rows\"]\n          - select: [seller, \
                 \"window_start AS starttime\", \"window_end AS endtime\"]\n"
            )
        ),
        other => fixed_pipeline(other).to_owned(),
    }
}

/// The pipeline of a query over bids alone.
fn fixed_pipeline(query: Query) -> &'static str {
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
        // The joins are built by `pipeline`; SQL-only queries never reach a job file.
        Query::Q3 | Query::Q7Join | Query::Q8 | Query::Q20 => "",
        Query::Q4
        | Query::Q5Hottest
        | Query::Q6
        | Query::Q9
        | Query::Q10
        | Query::Q12
        | Query::Q13
        | Query::Q16
        | Query::Q21
        | Query::Q22
        | Query::IntervalJoin
        | Query::LeftJoinCondition
        | Query::SemiIn
        | Query::UnionAll
        | Query::Having
        | Query::Over => "",
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
        Query::Q3 => {
            "SELECT P.name, P.city, P.state, A.id FROM auction AS A JOIN person AS P \
             ON A.seller = P.id WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' \
             OR P.state = 'CA')"
        }
        Query::Q20 => {
            "SELECT auction, bidder, price, channel, url, B.date_time, B.extra, item_name, \
             description, initial_bid, reserve, A.date_time, expires, seller, category, \
             A.extra FROM bid AS B JOIN auction AS A ON B.auction = A.id WHERE A.category = 10"
        }
        Query::Q7Join => {
            "SELECT B.auction, B.price, B.bidder, B.date_time, B.extra FROM bid B JOIN (\
             SELECT MAX(price) AS maxprice, window_end AS date_time \
             FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) \
             GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice \
             WHERE B.date_time BETWEEN B1.date_time - INTERVAL '10' SECOND AND B1.date_time"
        }
        Query::Q8 => {
            "SELECT P.id, P.name, P.starttime FROM (\
             SELECT id, name, window_start AS starttime, window_end AS endtime \
             FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) \
             GROUP BY id, name, window_start, window_end) P JOIN (\
             SELECT seller, window_start AS starttime, window_end AS endtime \
             FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) \
             GROUP BY seller, window_start, window_end) A \
             ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"
        }
        Query::Q4 => {
            "SELECT Q.category, AVG(Q.final) AS avg_price FROM (\
             SELECT MAX(B.price) AS final, A.category FROM auction A, bid B \
             WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires \
             GROUP BY A.id, A.category) Q GROUP BY Q.category"
        }
        Query::Q5Hottest => {
            "SELECT AuctionBids.auction, AuctionBids.num FROM (\
             SELECT auction, COUNT(*) AS num, window_start AS starttime, window_end AS endtime \
             FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) \
             GROUP BY auction, window_start, window_end) AS AuctionBids JOIN (\
             SELECT MAX(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM (\
             SELECT COUNT(*) AS num, window_start AS starttime, window_end AS endtime \
             FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) \
             GROUP BY auction, window_start, window_end) AS CountBids \
             GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids \
             ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime \
             AND AuctionBids.num >= MaxBids.maxn"
        }
        Query::Q6 => {
            "SELECT seller, AVG(final) AS avg_price FROM (\
             SELECT seller, final, ROW_NUMBER() OVER (PARTITION BY seller \
             ORDER BY expires DESC, id DESC) AS rn FROM (\
             SELECT A.id, A.seller, A.expires, MAX(B.price) AS final FROM auction A, bid B \
             WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires \
             GROUP BY A.id, A.seller, A.expires)) WHERE rn <= 10 GROUP BY seller"
        }
        Query::Q9 => {
            "SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, \
             category, extra, auction, bidder, price, bid_date_time, bid_extra FROM (\
             SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, \
             B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY A.id \
             ORDER BY B.price DESC, B.date_time ASC) AS rownum FROM auction A, bid B \
             WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires) \
             WHERE rownum <= 1"
        }
        Query::Q10 => {
            "SELECT auction, bidder, price, date_time, extra, \
             DATE_FORMAT(date_time, 'yyyy-MM-dd') AS dt, DATE_FORMAT(date_time, 'HH:mm') AS hm \
             FROM bid"
        }
        Query::Q12 => {
            "SELECT bidder, COUNT(*) AS bid_count, window_start, window_end \
             FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(p_time), INTERVAL '10' SECOND)) \
             GROUP BY bidder, window_start, window_end"
        }
        Query::Q13 => {
            "SELECT B.auction, B.bidder, B.price, B.date_time, S.`value` FROM bid B \
             JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S ON MOD(B.auction, 10000) = S.key"
        }
        Query::Q16 => {
            "SELECT channel, day, DATE_FORMAT(last_bid, 'HH:mm') AS minute, total_bids, \
             rank1_bids, rank2_bids, rank3_bids, total_bidders, rank1_bidders, rank2_bidders, \
             rank3_bidders, total_auctions, rank1_auctions, rank2_auctions, rank3_auctions FROM (\
             SELECT channel, DATE_FORMAT(date_time, 'yyyy-MM-dd') AS day, \
             MAX(date_time) AS last_bid, count(*) AS total_bids, \
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
             FROM bid GROUP BY channel, DATE_FORMAT(date_time, 'yyyy-MM-dd'))"
        }
        Query::Q21 => {
            "SELECT auction, bidder, price, channel, CASE \
             WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1' \
             WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3' \
             ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id FROM bid \
             WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL \
             OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')"
        }
        Query::Q22 => {
            "SELECT auction, bidder, price, channel, SPLIT_INDEX(url, '/', 3) AS dir1, \
             SPLIT_INDEX(url, '/', 4) AS dir2, SPLIT_INDEX(url, '/', 5) AS dir3 FROM bid"
        }
        Query::IntervalJoin => {
            "SELECT A.id AS auction, A.seller, B.bidder, B.price, B.date_time AS bid_time \
             FROM auction A, bid B WHERE A.id = B.auction \
             AND B.date_time BETWEEN A.date_time AND A.date_time + INTERVAL '10' SECOND"
        }
        Query::LeftJoinCondition => {
            "SELECT B.auction, B.bidder, B.price, A.seller, A.reserve FROM bid B \
             LEFT JOIN auction A ON B.auction = A.id AND A.category = 10 AND B.price > A.reserve"
        }
        Query::SemiIn => {
            "SELECT auction, bidder, price, date_time FROM bid \
             WHERE auction IN (SELECT id FROM auction WHERE category = 10)"
        }
        Query::UnionAll => {
            "SELECT auction AS id, price AS amount, date_time FROM bid WHERE price > 1000 \
             UNION ALL SELECT id, initial_bid, date_time FROM auction"
        }
        Query::Having => {
            "SELECT auction, SUM(price) / COUNT(*) AS mean_price, \
             MAX(price) - MIN(price) AS spread FROM bid GROUP BY auction HAVING COUNT(*) >= 50"
        }
        Query::Over => {
            "SELECT auction, bidder, price, date_time, COUNT(*) OVER w AS recent_bids, \
             MAX(price) OVER w AS recent_top FROM bid WINDOW w AS (PARTITION BY auction \
             ORDER BY date_time RANGE BETWEEN INTERVAL '10' SECOND PRECEDING AND CURRENT ROW)"
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
    for stream in [Stream::Bid, Stream::Auction, Stream::Person] {
        if stream != Stream::Bid && o.input.is_some() && stream.dir(o).is_none() {
            // Only bids were given: the table cannot be read.
            continue;
        }
        let computed = match stream {
            Stream::Bid => query.bid_columns(),
            _ => "",
        };
        text.push_str(&format!(
            "CREATE TABLE {} ({computed}WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) \
             WITH ({});\n",
            stream.name(),
            stream.sql_options(o)
        ));
    }
    match query {
        // Flink's q13 reads a file of 10,000 rows; the generator's side_input stream
        // holds the same rows.
        Query::Q13 => text.push_str(
            "CREATE TABLE side_input WITH ('connector' = 'nexmark', 'stream' = 'side_input', \
             'events' = '10000');\n",
        ),
        Query::Q10 => {
            let out = o
                .out
                .ok_or_else(|| Error::usage("q10 writes files: give their directory with --out"))?;
            text.push_str(&format!(
                "CREATE TABLE output PARTITIONED BY (dt, hm) WITH ('connector' = 'file', \
                 'path' = '{}', 'format' = 'csv');\n",
                out.replace('\'', "''")
            ));
        }
        _ => {}
    }
    if query != Query::Q10 {
        text.push_str("CREATE TABLE output WITH ('connector' = 'blackhole');\n");
    }
    text.push_str(&format!("INSERT INTO output {};\n", select(query)));
    Ok(text)
}

/// The job file text of a benchmark run.
pub fn job_text(query: Query, o: &JobOptions) -> Result<String> {
    if query.sql_only() {
        return Err(Error::usage(format!(
            "{} is written in SQL only (it has no job file twin): add --sql",
            query_name(query)
        )));
    }
    let JobOptions {
        parallelism,
        state,
        checkpoint_ms,
        cache,
        max_drift_ms,
        ..
    } = *o;
    let source = main_stream(query).yaml_source(o, "  ");
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
    Ok(format!(
        "name: bench-{q:?}\nparallelism: {parallelism}\nstate: {{ backend: {state}{cache} }}\n{checkpoint}source:\n{source}watermark: {{ column: date_time, max_out_of_orderness: 4s{alignment} }}\n{p}sink:\n  blackhole: {{}}\n",
        q = query,
        p = pipeline(query, o)
    ))
}

/// The query's name as `--query` takes it.
fn query_name(query: Query) -> String {
    query
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_else(|| format!("{query:?}"))
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
        auctions: args.auctions.as_deref(),
        persons: args.persons.as_deref(),
        state: args.state,
        checkpoint_ms: args.checkpoint_ms,
        cache: args.cache,
        max_drift_ms: args.max_drift_ms,
        out: None,
    };
    // q10's files go to --out, or to a directory removed when the run ends.
    let scratch =
        match (&args.out, args.query) {
            (None, Query::Q10) => Some(tempfile::tempdir().map_err(|e| {
                Error::usage(format!("cannot make a directory for q10's files: {e}"))
            })?),
            _ => None,
        };
    let scratch_path = scratch
        .as_ref()
        .map(|d| d.path().to_string_lossy().into_owned());
    let options = JobOptions {
        out: args.out.as_deref().or(scratch_path.as_deref()),
        ..options
    };
    if options.input.is_some() {
        for stream in std::iter::once(main_stream(args.query))
            .chain(joined_streams(args.query).iter().copied())
        {
            if stream.dir(&options).is_none() {
                return Err(Error::usage(format!(
                    "{:?} reads {}s: with --input, give their CSV directory with --{}s",
                    args.query,
                    stream.name(),
                    stream.name()
                )));
            }
        }
    } else if options.auctions.is_some() || options.persons.is_some() {
        return Err(Error::usage(
            "--auctions and --persons go with --input (CSV bids); without it every stream \
             is generated",
        ));
    }
    let graph = if args.sql {
        let text = sql_text(args.query, &options)?;
        sluice_planner::sql::parse_sql_job("<bench>.sql", &text)
    } else {
        job_spec::parse_job("<bench>", &job_text(args.query, &options)?)
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
            if q.sql_only() {
                continue;
            }
            for input in [None, Some("/tmp/bids")] {
                for max_drift_ms in [0, 2000] {
                    let text = job_text(
                        *q,
                        &JobOptions {
                            events: 10,
                            parallelism: 2,
                            input,
                            auctions: input.map(|_| "/tmp/auctions"),
                            persons: input.map(|_| "/tmp/persons"),
                            state: StateChoice::Remote,
                            checkpoint_ms: 0,
                            cache: None,
                            max_drift_ms,
                            out: None,
                        },
                    )
                    .unwrap();
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
                Some(Kind::Join(j)) => j
                    .exprs
                    .iter_mut()
                    .chain(j.condition.as_mut())
                    .for_each(|e| e.location = None),
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
                        auctions: input.map(|_| "/tmp/auctions"),
                        persons: input.map(|_| "/tmp/persons"),
                        state,
                        checkpoint_ms,
                        cache,
                        max_drift_ms: 0,
                        out: Some("/tmp/q10's files"),
                    };
                    let sql = sql_text(*q, &o).unwrap();
                    let from_sql = sluice_planner::sql::parse_sql_job("<bench>.sql", &sql)
                        .unwrap_or_else(|e| panic!("{q:?}: {e}\n{sql}"));
                    if q.sql_only() {
                        let e = job_text(*q, &o).unwrap_err().to_string();
                        assert!(e.contains("add --sql"), "{e}");
                        continue;
                    }
                    let yaml = job_text(*q, &o).unwrap();
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
            auctions: None,
            persons: None,
            state: StateChoice::Memory,
            checkpoint_ms: 0,
            cache: None,
            max_drift_ms: 5,
            out: None,
        };
        assert!(sql_text(Query::Q0, &drift).is_err());
        let no_out = JobOptions {
            max_drift_ms: 0,
            ..drift
        };
        let e = sql_text(Query::Q10, &no_out).unwrap_err().to_string();
        assert!(e.contains("--out"), "{e}");
    }
}
