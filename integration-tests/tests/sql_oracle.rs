//! The SQL examples checked against an independent engine: each `examples/nexmark/qN.sql`
//! and `examples/sql/*.sql` query runs under `sluice run` on bids from `sluice nexmark gen`, and its rows must
//! equal what DuckDB (installed by scripts/test in a virtual environment) answers for the
//! equivalent batch query over the same CSV files. Windows over a bounded input all fire
//! at its end, so a streaming window query's output is its batch answer; an updating
//! query's changelog, folded in the order written (`+I`/`+U` add a row, `-U`/`-D` take
//! one away), must end as the batch answer. The stateful ones run again on two workers
//! with remote state and a worker killed.

use std::path::Path;
use std::process::Command;

use sluice_integration_tests::{
    Row, assert_same_rows, example_bin, fold_changelog, parse_jsonl, procs, read_jsonl_dir,
    run_sluice, tempdir, workspace_root,
};
use sluice_test_support::rng::rng_from_env;

/// The bid table over CSV files, with the examples' watermark and processing time.
const BID_TABLE: &str = "CREATE TABLE bid (\n  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND,\n  \
p_time AS PROCTIME()\n) \
WITH ('connector' = 'file', 'path' = 'BIDS', 'format' = 'csv', 'schema.auction' = 'int64', \
'schema.bidder' = 'int64', 'schema.price' = 'int64', 'schema.channel' = 'string', \
'schema.url' = 'string', 'schema.date_time' = 'timestamp', 'schema.extra' = 'string');\n";

/// The auction and person tables over CSV files (joined by q3 and q20), and q13's side
/// table.
const OTHER_TABLES: &str = "CREATE TABLE auction (WATERMARK FOR date_time AS date_time - \
INTERVAL '4' SECOND) WITH ('connector' = 'file', 'path' = \
'AUCTIONS', 'format' = 'csv', 'schema.id' = 'int64', 'schema.item_name' = 'string', \
'schema.description' = 'string', 'schema.initial_bid' = 'int64', 'schema.reserve' = 'int64', \
'schema.date_time' = 'timestamp', 'schema.expires' = 'timestamp', 'schema.seller' = 'int64', \
'schema.category' = 'int64', 'schema.extra' = 'string');\n\
CREATE TABLE person (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) WITH \
('connector' = 'file', 'path' = 'PERSONS', 'format' = 'csv', \
'schema.id' = 'int64', 'schema.name' = 'string', 'schema.email_address' = 'string', \
'schema.credit_card' = 'string', 'schema.city' = 'string', 'schema.state' = 'string', \
'schema.date_time' = 'timestamp', 'schema.extra' = 'string');\n\
CREATE TABLE side_input WITH ('connector' = 'file', 'path' = 'SIDE', 'format' = 'csv', \
'schema.key' = 'int64', 'schema.value' = 'string');\n";

/// Each example and DuckDB's batch query for it, over views `bid`, `auction` and
/// `person` of the same files.
const ORACLE: &[(&str, &str)] = &[
    ("nexmark/q0", "SELECT * FROM bid"),
    (
        "nexmark/q1",
        "SELECT auction, bidder, price * 0.908::DOUBLE AS price_eur, channel, url, date_time, \
         extra FROM bid",
    ),
    (
        "nexmark/q2",
        "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    ),
    // Sliding windows of 10 s every 2 s: the five windows whose start, a multiple of 2 s,
    // lies in (t - 10 s, t].
    (
        "sql/q5-hot-items",
        "WITH s AS (SELECT auction, epoch_ms(date_time) AS t FROM bid), \
         w AS (SELECT auction, t - t % 2000 - k * 2000 AS ws FROM s, range(0, 5) r(k)) \
         SELECT auction, epoch_ms(ws) AS window_start, epoch_ms(ws + 10000) AS window_end, \
         count(*) AS bids FROM w GROUP BY auction, ws",
    ),
    // Cumulating windows of 10 s every 2 s: from the 10 s boundary at or before t, the
    // windows ending 2, 4, .. 10 s after it that end after t.
    (
        "sql/cumulate-channel-volume",
        "WITH s AS (SELECT channel, price, epoch_ms(date_time) AS t FROM bid), \
         b AS (SELECT *, t - ((t % 10000) + 10000) % 10000 AS ws FROM s), \
         w AS (SELECT channel, price, ws, ws + k * 2000 AS we FROM b, range(1, 6) r(k) \
         WHERE ws + k * 2000 > t) \
         SELECT channel, epoch_ms(ws) AS window_start, epoch_ms(we) AS window_end, \
         count(*) AS bids, sum(price) AS volume FROM w GROUP BY channel, ws, we",
    ),
    // FILTER (WHERE ...) keeps a row out of one aggregate; an aggregate with no row left
    // is null, and a null is left out of a JSON row on both sides.
    (
        "sql/price-bands",
        "SELECT channel, time_bucket(INTERVAL 10 SECOND, date_time) AS window_start, \
         time_bucket(INTERVAL 10 SECOND, date_time) + INTERVAL 10 SECOND AS window_end, \
         count(*) AS bids, count(*) FILTER (WHERE price < 10000) AS band1, \
         count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS band2, \
         count(*) FILTER (WHERE price >= 1000000) AS band3, \
         sum(price) FILTER (WHERE price >= 1000000) AS band3_volume, \
         max(price) FILTER (WHERE channel <> 'Google') AS top_price_elsewhere \
         FROM bid GROUP BY ALL",
    ),
    // Sliding windows of 10 s every 5 s: the two windows whose start, a multiple of 5 s,
    // lies in (t - 10 s, t].
    (
        "sql/distinct-bidders",
        "WITH s AS (SELECT channel, bidder, price, epoch_ms(date_time) AS t FROM bid), \
         w AS (SELECT *, t - t % 5000 - k * 5000 AS ws FROM s, range(0, 2) r(k)) \
         SELECT channel, epoch_ms(ws) AS window_start, epoch_ms(ws + 10000) AS window_end, \
         count(*) AS bids, count(DISTINCT bidder) AS bidders, \
         count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS dear_bidders, \
         max(price) AS top_price FROM w GROUP BY channel, ws",
    ),
    // Sessions per bidder: a bid more than 10 s after the bidder's previous one starts a
    // new session (exactly 10 s apart share one, as in Flink); a session ends 10 s after
    // its last bid.
    (
        "nexmark/q11",
        "WITH o AS (SELECT bidder, date_time, epoch_ms(date_time) AS t, \
         lag(epoch_ms(date_time)) OVER (PARTITION BY bidder ORDER BY date_time) AS prev \
         FROM bid), \
         g AS (SELECT *, sum(CASE WHEN prev IS NULL OR t - prev > 10000 THEN 1 ELSE 0 END) \
         OVER (PARTITION BY bidder ORDER BY date_time ROWS UNBOUNDED PRECEDING) AS session \
         FROM o) \
         SELECT bidder, epoch_ms(min(t)) AS window_start, epoch_ms(max(t) + 10000) AS \
         window_end, count(*) AS bids, min(date_time) AS first_bid, max(date_time) AS \
         last_bid FROM g GROUP BY bidder, session",
    ),
    // An unbounded GROUP BY: the final row per auction and day.
    (
        "nexmark/q17",
        "SELECT auction, CAST(date_time AS DATE) AS day, count(*) AS total_bids, \
         count(*) FILTER (WHERE price < 10000) AS rank1_bids, \
         count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
         count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, min(price) AS min_price, \
         max(price) AS max_price, avg(price) AS avg_price, sum(price) AS sum_price \
         FROM bid GROUP BY ALL",
    ),
    (
        "nexmark/q15",
        "SELECT strftime(date_time, '%Y-%m-%d') AS day, count(*) AS total_bids, \
         count(*) FILTER (WHERE price < 10000) AS rank1_bids, \
         count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
         count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, \
         count(DISTINCT bidder) AS total_bidders, \
         count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, \
         count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS \
         rank2_bidders, \
         count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, \
         count(DISTINCT auction) AS total_auctions, \
         count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, \
         count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS \
         rank2_auctions, \
         count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions \
         FROM bid GROUP BY ALL",
    ),
    (
        "nexmark/q16",
        "SELECT channel, strftime(date_time, '%Y-%m-%d') AS day, \
         max(strftime(date_time, '%H:%M')) AS minute, count(*) AS total_bids, \
         count(*) FILTER (WHERE price < 10000) AS rank1_bids, \
         count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids, \
         count(*) FILTER (WHERE price >= 1000000) AS rank3_bids, \
         count(DISTINCT bidder) AS total_bidders, \
         count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders, \
         count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS \
         rank2_bidders, \
         count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders, \
         count(DISTINCT auction) AS total_auctions, \
         count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions, \
         count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS \
         rank2_auctions, \
         count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions \
         FROM bid GROUP BY ALL",
    ),
    // Top-N and deduplication: Sluice breaks ties in the order by the rest of the row,
    // column by column, ascending.
    (
        "nexmark/q18",
        "SELECT auction, bidder, price, channel, url, date_time, extra FROM (SELECT *, \
         row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC, auction, \
         bidder, price, channel, url, date_time, extra) AS rank_number FROM bid) \
         WHERE rank_number <= 1",
    ),
    (
        "nexmark/q19",
        "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price \
         DESC, auction, bidder, price, channel, url, date_time, extra) AS rank_number FROM \
         bid) WHERE rank_number <= 10",
    ),
    // Joins: every pair of rows with equal keys, whichever side came first (q7 and q8 as
    // interval and window joins over the oracle's watermarked tables).
    (
        "nexmark/q7",
        "WITH m AS (SELECT max(price) AS maxprice, time_bucket(INTERVAL 10 SECOND, \
         date_time) + INTERVAL 10 SECOND AS we FROM bid GROUP BY 2) \
         SELECT B.auction, B.price, B.bidder, B.date_time, B.extra FROM bid B JOIN m ON \
         B.price = m.maxprice WHERE B.date_time BETWEEN m.we - INTERVAL 10 SECOND AND m.we",
    ),
    (
        "nexmark/q8",
        "WITH p AS (SELECT DISTINCT id, name, time_bucket(INTERVAL 10 SECOND, date_time) AS \
         starttime FROM person), a AS (SELECT DISTINCT seller, time_bucket(INTERVAL 10 \
         SECOND, date_time) AS starttime FROM auction) \
         SELECT p.id, p.name, epoch_ms(p.starttime) AS starttime FROM p JOIN a ON p.id = \
         a.seller AND p.starttime = a.starttime",
    ),
    (
        "nexmark/q3",
        "SELECT P.name, P.city, P.state, A.id FROM auction AS A JOIN person AS P ON \
         A.seller = P.id WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')",
    ),
    (
        "nexmark/q20",
        "SELECT auction, bidder, price, channel, url, B.date_time, B.extra, item_name, \
         description, initial_bid, reserve, A.date_time AS date_time0, expires, seller, \
         category, A.extra AS extra0 FROM bid AS B JOIN auction AS A ON B.auction = A.id \
         WHERE A.category = 10",
    ),
    // A join of a window aggregate with an updating aggregate: the hot items of each
    // sliding window.
    (
        "nexmark/q5",
        "WITH s AS (SELECT auction, epoch_ms(date_time) AS t FROM bid), \
         w AS (SELECT auction, t - t % 2000 - k * 2000 AS ws FROM s, range(0, 5) r(k)), \
         c AS (SELECT auction, ws, count(*) AS num FROM w GROUP BY auction, ws), \
         m AS (SELECT ws, max(num) AS maxn FROM c GROUP BY ws) \
         SELECT c.auction, c.num FROM c JOIN m ON c.ws = m.ws AND c.num >= m.maxn",
    ),
    // An aggregate over an aggregate's changelog: each auction's highest bid while it
    // was open, averaged per category.
    (
        "nexmark/q4",
        "SELECT category, avg(final) AS avg_price FROM (SELECT max(B.price) AS final, \
         A.category FROM auction A, bid B WHERE A.id = B.auction AND B.date_time BETWEEN \
         A.date_time AND A.expires GROUP BY A.id, A.category) GROUP BY category",
    ),
    // An interval join: each bid of an auction's first 10 seconds.
    (
        "sql/early-bids-interval-join",
        "SELECT A.id AS auction, A.seller, B.bidder, B.price, B.date_time AS bid_time FROM \
         auction A, bid B WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND \
         A.date_time + INTERVAL 10 SECOND",
    ),
    // An outer interval join: each auction outside category 10 with each bid over 1000
    // of its first 10 seconds, or once with nulls.
    (
        "sql/early-bids-left-interval-join",
        "SELECT A.id AS auction, A.seller, B.bidder, B.price, B.date_time AS bid_time FROM \
         auction A LEFT JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time \
         AND A.date_time + INTERVAL 10 SECOND AND B.price > 1000 AND A.category <> 10",
    ),
    // A Top-N over an aggregate's changelog, and an aggregate over the Top-N's: each
    // seller's ten latest-closing auctions, their selling prices averaged.
    (
        "nexmark/q6",
        "SELECT seller, avg(final) AS avg_price FROM (SELECT seller, final, row_number() \
         OVER (PARTITION BY seller ORDER BY expires DESC, id DESC) AS rn FROM (SELECT A.id, \
         A.seller, A.expires, max(B.price) AS final FROM auction A, bid B WHERE A.id = \
         B.auction AND B.date_time BETWEEN A.date_time AND A.expires GROUP BY A.id, \
         A.seller, A.expires)) WHERE rn <= 10 GROUP BY seller",
    ),
    // A Top-N over a join: ties after price and time go by the rest of the row.
    (
        "nexmark/q9",
        "SELECT id, item_name, description, initial_bid, reserve, date_time, expires, \
         seller, category, extra, auction, bidder, price, bid_date_time, bid_extra FROM \
         (SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, B.extra AS \
         bid_extra, row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time, \
         A.id, A.item_name, A.description, A.initial_bid, A.reserve, A.date_time, A.expires, \
         A.seller, A.category, A.extra, B.auction, B.bidder, B.price, B.date_time, B.extra) AS \
         rownum FROM auction A, bid B WHERE A.id = B.auction AND B.date_time BETWEEN \
         A.date_time AND A.expires) WHERE rownum <= 1",
    ),
    // A lookup join: every bid with the side table's row of its key.
    (
        "nexmark/q13",
        "SELECT B.auction, B.bidder, B.price, B.date_time, S.value FROM bid B JOIN \
         side_input S ON B.auction % 10000 = S.key",
    ),
    // A file table partitioned by day and minute: see PARTITIONED.
    (
        "nexmark/q10",
        "SELECT auction, bidder, price, date_time, extra, strftime(date_time, '%Y-%m-%d') AS \
         dt, strftime(date_time, '%H:%M') AS hm FROM bid",
    ),
    // Processing-time windows: see PROCESSING_TIME.
    (
        "nexmark/q12",
        "SELECT bidder, count(*) AS bid_count FROM bid GROUP BY bidder",
    ),
    // An outer join: its changelog folded, each person with each of their auctions, or
    // once with none.
    (
        "sql/oregon-sellers-left-join",
        "SELECT P.id, P.name, A.id AS auction FROM person AS P LEFT JOIN auction AS A ON \
         P.id = A.seller AND A.category = 10 WHERE P.state = 'OR'",
    ),
    // A full join whose ON holds conditions on both sides it keeps.
    (
        "sql/new-sellers-full-join",
        "SELECT P.id, P.state, A.id AS auction, A.category FROM person AS P FULL JOIN \
         auction AS A ON P.id = A.seller AND P.state IN ('OR', 'ID') AND A.date_time < \
         P.date_time + INTERVAL '1' MINUTE",
    ),
    // An outer join of an updating result: rows leaving the Top-N are padded again.
    (
        "sql/hot-auctions-left-join",
        "SELECT A.id, A.category, H.bids FROM auction AS A LEFT JOIN (SELECT auction, bids \
         FROM (SELECT auction, bids, row_number() OVER (ORDER BY bids DESC, auction DESC) \
         AS rownum FROM (SELECT auction, count(*) AS bids FROM bid GROUP BY auction)) WHERE \
         rownum <= 10) AS H ON A.id = H.auction",
    ),
    // Expressions over aggregates, and HAVING (DuckDB's `//` is Flink's `/` of integers).
    (
        "sql/busy-auctions-having",
        "SELECT auction, sum(price) // count(*) AS mean_price, max(price) - min(price) AS \
         spread FROM bid GROUP BY auction HAVING count(*) >= 50",
    ),
    // An OVER aggregate over a RANGE frame (peers of one time in each other's frames).
    (
        "sql/auction-bid-trend-over",
        "SELECT auction, bidder, price, date_time, COUNT(*) OVER recent AS recent_bids, \
         MAX(price) OVER recent AS recent_top, price - AVG(price) OVER recent AS above_mean \
         FROM bid WHERE price > 1000 WINDOW recent AS (PARTITION BY auction ORDER BY \
         date_time RANGE BETWEEN INTERVAL '10' SECOND PRECEDING AND CURRENT ROW)",
    ),
    // EXCEPT: a dedup, then an anti join keyed by every column; its changelog folded.
    (
        "sql/big-bidders-except-sellers",
        "SELECT bidder AS person FROM bid WHERE price > 10000000 EXCEPT SELECT seller FROM \
         auction WHERE category = 10",
    ),
    // UNION ALL of two tables' rows.
    (
        "sql/union-all-activity",
        "SELECT 'bid' AS kind, auction AS id, price AS amount, date_time FROM bid WHERE \
         price > 10000000 UNION ALL SELECT 'auction', id, initial_bid, date_time FROM \
         auction WHERE category = 10",
    ),
    // IN (SELECT ...): a semi join.
    (
        "sql/category-ten-bids-in",
        "SELECT auction, bidder, price FROM bid WHERE price > 5000000 AND auction IN \
         (SELECT id FROM auction WHERE category = 10)",
    ),
    // NOT EXISTS: an anti join, its changelog folded.
    (
        "sql/quiet-auctions-not-exists",
        "SELECT A.id, A.seller, A.reserve FROM auction A WHERE A.category = 10 AND NOT \
         EXISTS (SELECT * FROM bid B WHERE B.auction = A.id AND B.price > 10000000)",
    ),
    // IN over an updating subquery: a semi join counting matches, its changelog folded.
    (
        "sql/hot-auction-bids-in",
        "SELECT auction, bidder, price FROM bid WHERE price > 5000000 AND auction IN \
         (SELECT auction FROM bid GROUP BY auction HAVING count(*) >= 100)",
    ),
    // COUNT(DISTINCT ...) over another GROUP BY's changelog.
    (
        "sql/bid-count-buckets-distinct",
        "SELECT n % 10 AS bucket, count(DISTINCT n) AS counts, count(*) AS auctions FROM \
         (SELECT auction, count(*) AS n FROM bid GROUP BY auction) GROUP BY n % 10",
    ),
    // Flink's REGEXP_EXTRACT and SPLIT_INDEX give null where DuckDB gives ''.
    (
        "nexmark/q21",
        "SELECT auction, bidder, price, channel, CASE WHEN lower(channel) = 'apple' THEN '0' \
         WHEN lower(channel) = 'google' THEN '1' WHEN lower(channel) = 'facebook' THEN '2' \
         WHEN lower(channel) = 'baidu' THEN '3' ELSE nullif(regexp_extract(url, \
         '(&|^)channel_id=([^&]*)', 2), '') END AS channel_id FROM bid WHERE \
         nullif(regexp_extract(url, '(&|^)channel_id=([^&]*)', 2), '') IS NOT NULL OR \
         lower(channel) IN ('apple', 'google', 'facebook', 'baidu')",
    ),
    (
        "nexmark/q22",
        "SELECT auction, bidder, price, channel, nullif(split_part(url, '/', 4), '') AS dir1, \
         nullif(split_part(url, '/', 5), '') AS dir2, nullif(split_part(url, '/', 6), '') AS \
         dir3 FROM bid",
    ),
];

/// Examples windowed in processing time, with their count column: which window a row
/// falls into depends on when it was read, so each key's counts are summed over its
/// windows (each 10 s long, aligned to 10 s) and compared with the batch count.
const PROCESSING_TIME: &[(&str, &str)] = &[("nexmark/q12", "bid_count")];

/// Each key's `count` summed over its windows, after checking each window is 10 s.
fn sum_over_windows(name: &str, count: &str, rows: Vec<Row>) -> Vec<Row> {
    use serde_json::Value;
    let ms = |row: &Row, column: &str| -> i64 {
        let text = row[column]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {column} in {row:?}"));
        let t = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
            .unwrap_or_else(|e| panic!("{name}: {column} `{text}`: {e}"));
        t.and_utc().timestamp_millis()
    };
    let mut totals: std::collections::BTreeMap<String, (Row, i64)> = Default::default();
    for mut row in rows {
        let (start, end) = (ms(&row, "window_start"), ms(&row, "window_end"));
        assert_eq!(
            (end - start, start % 10_000),
            (10_000, 0),
            "{name}: window of {row:?}"
        );
        row.remove("window_start");
        row.remove("window_end");
        let n = row.remove(count).and_then(|v| v.as_i64());
        let n = n.unwrap_or_else(|| panic!("{name}: no integer {count} in {row:?}"));
        let key = serde_json::to_string(&row).unwrap();
        totals.entry(key).or_insert((row, 0)).1 += n;
    }
    totals
        .into_values()
        .map(|(mut row, n)| {
            row.insert(count.to_owned(), Value::from(n));
            row
        })
        .collect()
}

/// Runs `query` in DuckDB over the CSV files `bids/*.csv` and prints JSON lines; nulls
/// are left out of a row, as Sluice's JSON writer leaves them out.
const DUCKDB_SCRIPT: &str = r#"
import datetime, decimal, json, sys
import duckdb
bids, query = sys.argv[1], sys.argv[2]
con = duckdb.connect()
def files(stream):
    return "'" + (bids + "/../" + stream + "/*.csv").replace("'", "''") + "'"
con.execute(
    "CREATE VIEW bid AS SELECT * FROM read_csv(" + files("bids") + ", header = true, columns = {"
    "'auction': 'BIGINT', 'bidder': 'BIGINT', 'price': 'BIGINT', 'channel': 'VARCHAR', "
    "'url': 'VARCHAR', 'date_time': 'TIMESTAMP', 'extra': 'VARCHAR'})"
)
con.execute(
    "CREATE VIEW auction AS SELECT * FROM read_csv(" + files("auctions") + ", header = true, "
    "columns = {'id': 'BIGINT', 'item_name': 'VARCHAR', 'description': 'VARCHAR', "
    "'initial_bid': 'BIGINT', 'reserve': 'BIGINT', 'date_time': 'TIMESTAMP', "
    "'expires': 'TIMESTAMP', 'seller': 'BIGINT', 'category': 'BIGINT', 'extra': 'VARCHAR'})"
)
con.execute(
    "CREATE VIEW side_input AS SELECT * FROM read_csv(" + files("side_input") + ", "
    "header = true, columns = {'key': 'BIGINT', 'value': 'VARCHAR'})"
)
con.execute(
    "CREATE VIEW person AS SELECT * FROM read_csv(" + files("persons") + ", header = true, "
    "columns = {'id': 'BIGINT', 'name': 'VARCHAR', 'email_address': 'VARCHAR', "
    "'credit_card': 'VARCHAR', 'city': 'VARCHAR', 'state': 'VARCHAR', "
    "'date_time': 'TIMESTAMP', 'extra': 'VARCHAR'})"
)
cur = con.execute(query)
names = [d[0] for d in cur.description]
def value(v):
    if isinstance(v, datetime.datetime):
        return v.isoformat(sep="T", timespec="milliseconds")
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v
for row in cur.fetchall():
    print(json.dumps({n: value(v) for n, v in zip(names, row) if v is not None}))
"#;

fn duckdb(python: &str, bids: &Path, query: &str) -> Vec<sluice_integration_tests::Row> {
    let out = Command::new(python)
        .args(["-c", DUCKDB_SCRIPT])
        .arg(bids)
        .arg(query)
        .output()
        .expect("running DuckDB's Python");
    assert!(
        out.status.success(),
        "DuckDB failed on {query}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_jsonl(&String::from_utf8_lossy(&out.stdout), "DuckDB")
}

/// The example's views and INSERT statement (which writes to `output`): everything from
/// the first `CREATE VIEW` (written after the tables) or else the INSERT to the end.
fn example_insert(name: &str) -> String {
    let path = workspace_root().join(format!("examples/{name}.sql"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let at = text
        .find("INSERT INTO output")
        .unwrap_or_else(|| panic!("{}: no `INSERT INTO output`", path.display()));
    let at = text.find("CREATE VIEW").map_or(at, |v| v.min(at));
    text[at..].to_owned()
}

/// Examples whose output table is PARTITIONED BY these columns (a directory per value).
const PARTITIONED: &[(&str, &str)] = &[("nexmark/q10", "dt, hm")];

/// The example's output table: JSON-lines files under `out`, partitioned as the
/// example's own table is.
fn output_table(name: &str, out: &Path) -> String {
    let partitioned = PARTITIONED
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(String::new(), |(_, columns)| {
            format!("PARTITIONED BY ({columns}) ")
        });
    format!(
        "CREATE TABLE output {partitioned}WITH ('connector' = 'file', 'path' = '{}', \
         'format' = 'jsonl');\n",
        out.display()
    )
}

/// The rows example `name` wrote under `out`: of a partitioned table, each directory's
/// rows with the partition values its path names (`hm=00%3A01` is hm `00:01`).
fn example_rows(name: &str, out: &Path) -> Vec<Row> {
    if !PARTITIONED.iter().any(|(n, _)| *n == name) {
        return output_rows(out);
    }
    let mut rows = Vec::new();
    let mut dirs = vec![(out.to_path_buf(), Vec::<(String, String)>::new())];
    while let Some((dir, values)) = dirs.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{name}: reading {}: {e}", dir.display()));
        let mut files = false;
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if let Some((column, value)) = file_name.split_once('=') {
                let mut values = values.clone();
                values.push((unescape(column), unescape(value)));
                dirs.push((entry.path(), values));
            } else if file_name.starts_with("part-") {
                files = true;
            }
        }
        if files {
            for mut row in output_rows(&dir) {
                for (column, value) in &values {
                    row.insert(column.clone(), serde_json::Value::from(value.clone()));
                }
                rows.push(row);
            }
        }
    }
    assert!(
        !rows.is_empty(),
        "{name}: no partition directory holds rows"
    );
    rows
}

/// A path segment's `%XX` escapes decoded.
fn unescape(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).expect("unescaped path segment is UTF-8")
}

/// What a query's output files hold as rows: a changelog folded to its final rows.
fn output_rows(dir: &Path) -> Vec<Row> {
    let rows = read_jsonl_dir(dir);
    if rows.first().is_some_and(|r| r.contains_key("op")) {
        fold_changelog(&rows)
    } else {
        rows
    }
}

/// The events both engines read: `sluice nexmark gen` as CSV, bids in `root/bids`, and
/// the auctions and persons of the same event range in `root/auctions` and
/// `root/persons`. The nexmark connector with the same seed, count and disorder
/// produces the very same events.
fn generate_bids(root: &Path) -> std::path::PathBuf {
    for (stream, dir, events) in [
        ("bid", "bids", EVENTS),
        ("auction", "auctions", AUCTIONS),
        ("person", "persons", PERSONS),
        ("side_input", "side_input", SIDE_INPUT),
    ] {
        run_sluice(
            &[
                "nexmark",
                "gen",
                "--stream",
                stream,
                "--events",
                &events.to_string(),
                "--seed",
                "7",
                "--max-out-of-orderness",
                "2s",
                "--format",
                "csv",
                "--files",
                "2",
                "--out",
                root.join(dir).to_str().unwrap(),
            ],
            root,
        )
        .assert_success();
    }
    root.join("bids")
}

/// Bids, and the auctions and persons generated with them (46, 3 and 1 of every 50
/// events).
const EVENTS: u64 = 60_000;
const AUCTIONS: u64 = 3_900;
const PERSONS: u64 = 1_300;
/// Rows of q13's side table.
const SIDE_INPUT: u64 = 10_000;

/// The tables of every oracle job: bids, auctions and persons over the CSV files.
fn file_tables(root: &Path) -> String {
    let dir = |d: &str| root.join(d).to_str().unwrap().to_owned();
    format!(
        "{}{}",
        BID_TABLE.replace("BIDS", &dir("bids")),
        OTHER_TABLES
            .replace("AUCTIONS", &dir("auctions"))
            .replace("PERSONS", &dir("persons"))
            .replace("SIDE", &dir("side_input"))
    )
}

/// The settings and tables of the jobs run on two workers: remote state, checkpoints
/// every 300 ms, and the nexmark tables throttled so that each stream lasts about 5 s.
fn remote_job_head() -> String {
    format!(
        "SET 'parallelism.default' = '2';\nSET 'state.backend' = 'remote';\n\
         SET 'state.shards' = '4';\nSET 'execution.checkpointing.interval' = '300ms';\n\
         CREATE TABLE bid (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND, \
         p_time AS PROCTIME()) \
         WITH ('connector' = 'nexmark', 'stream' = 'bid', 'events' = '{EVENTS}', \
         'seed' = '7', 'max_out_of_orderness' = '2s', 'max_events_per_second' = '12000');\n\
         CREATE TABLE auction (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) \
         WITH ('connector' = 'nexmark', 'stream' = 'auction', \
         'events' = '{AUCTIONS}', 'seed' = '7', 'max_out_of_orderness' = '2s', \
         'max_events_per_second' = '780');\n\
         CREATE TABLE person (WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND) \
         WITH ('connector' = 'nexmark', 'stream' = 'person', \
         'events' = '{PERSONS}', 'seed' = '7', 'max_out_of_orderness' = '2s', \
         'max_events_per_second' = '260');\n\
         CREATE TABLE side_input WITH ('connector' = 'nexmark', 'stream' = 'side_input', \
         'events' = '{SIDE_INPUT}');\n"
    )
}

fn duckdb_python() -> String {
    std::env::var("SLUICE_TEST_DUCKDB_PYTHON").expect(
        "SLUICE_TEST_DUCKDB_PYTHON is not set: run the tests through scripts/test, which \
         installs DuckDB",
    )
}

/// The oracle's query for example `name`.
/// Whether this run checks example `name`: all of them, or those `SLUICE_SQL_ORACLE_ONLY`
/// names (comma-separated, e.g. `nexmark/q5,sql/price-bands`) when a developer sets it.
fn selected(name: &str) -> bool {
    match std::env::var("SLUICE_SQL_ORACLE_ONLY") {
        Ok(only) => only.split(',').any(|n| n.trim() == name),
        Err(_) => true,
    }
}

/// The examples that call functions registered by `cli/examples/udf.rs`.
const NEEDS_UDF_PROGRAM: &[&str] = &["nexmark/q14", "sql/geomean-price"];

fn batch_query(name: &str) -> &'static str {
    ORACLE
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, q)| *q)
        .unwrap_or_else(|| panic!("examples/{name}.sql has no DuckDB query in this test"))
}

#[test]
fn every_sql_example_equals_duckdbs_answer_over_the_same_bids() {
    let python = duckdb_python();
    let dir = tempdir();
    let root = dir.path();
    let bids = generate_bids(root);
    // Every example has a batch query here, but those calling functions only a program
    // that registers them knows (`user_defined_functions_run_in_worker_processes`).
    let mut examples = Vec::new();
    for dir in ["nexmark", "sql"] {
        for entry in std::fs::read_dir(workspace_root().join("examples").join(dir))
            .unwrap()
            .flatten()
        {
            if let Some(stem) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".sql"))
            {
                examples.push(format!("{dir}/{stem}"));
            }
        }
    }
    assert!(examples.len() > 20, "{examples:?}");
    for name in examples
        .iter()
        .filter(|n| !NEEDS_UDF_PROGRAM.contains(&n.as_str()))
    {
        batch_query(name);
    }
    for (name, batch) in ORACLE.iter().filter(|(n, _)| selected(n)) {
        let out = root.join("out").join(name);
        let job = root.join(format!("{}.sql", name.replace('/', "-")));
        std::fs::write(
            &job,
            format!(
                "SET 'parallelism.default' = '2';\n{}{}{}",
                file_tables(root),
                output_table(name, &out),
                example_insert(name)
            ),
        )
        .unwrap();
        run_sluice(&["run", job.to_str().unwrap(), "-q"], root).assert_success();
        let mut streamed = example_rows(name, &out);
        if let Some((_, count)) = PROCESSING_TIME.iter().find(|(n, _)| n == name) {
            streamed = sum_over_windows(name, count, streamed);
        }
        let expected = duckdb(&python, &bids, batch);
        assert!(!expected.is_empty(), "{name}: DuckDB found no rows");
        assert_same_rows(
            &format!("{name}: sluice run against DuckDB"),
            &streamed,
            &expected,
        );
        eprintln!("{name}: {} rows, equal to DuckDB's", streamed.len());
    }
}

/// The stateful examples again across two worker processes with remote state and
/// checkpoints, a worker killed mid-run (the source throttled to last about 5 s): the
/// recovered run's rows still equal DuckDB's.
#[test]
fn stateful_sql_examples_survive_a_worker_kill_with_remote_state() {
    let python = duckdb_python();
    let dir = tempdir();
    let root = dir.path();
    let bids = generate_bids(root);
    let mut rng = rng_from_env("SLUICE_SQL_KILL_SEED", 0x5e55_10e5);
    for name in [
        "sql/q5-hot-items",
        "nexmark/q11",
        "sql/price-bands",
        "sql/distinct-bidders",
        "sql/cumulate-channel-volume",
        "nexmark/q15",
        "nexmark/q16",
        "nexmark/q17",
        "nexmark/q18",
        "nexmark/q19",
        "nexmark/q3",
        "nexmark/q4",
        "nexmark/q5",
        "nexmark/q6",
        "sql/early-bids-interval-join",
        "sql/early-bids-left-interval-join",
        "nexmark/q9",
        "nexmark/q10",
        "nexmark/q13",
        "nexmark/q7",
        "nexmark/q8",
        "nexmark/q20",
        "sql/oregon-sellers-left-join",
        "sql/new-sellers-full-join",
        "sql/hot-auctions-left-join",
        "sql/busy-auctions-having",
        "sql/union-all-activity",
        "sql/category-ten-bids-in",
        "sql/quiet-auctions-not-exists",
        "sql/hot-auction-bids-in",
        "sql/bid-count-buckets-distinct",
        "sql/auction-bid-trend-over",
        "sql/big-bidders-except-sellers",
    ]
    .into_iter()
    .filter(|n| selected(n))
    {
        let out = root.join("killed").join(name);
        let job = root.join(format!("killed-{}.sql", name.replace('/', "-")));
        std::fs::write(
            &job,
            format!(
                "{}{}{}",
                remote_job_head(),
                output_table(name, &out),
                example_insert(name)
            ),
        )
        .unwrap();
        procs::run_with_kills(root, &job, 1, &mut |n| rng.below(n));
        let expected = duckdb(&python, &bids, batch_query(name));
        assert_same_rows(
            &format!("{name}: two workers, remote state, a worker killed, against DuckDB"),
            &example_rows(name, &out),
            &expected,
        );
        eprintln!("{name}: equal to DuckDB's after a worker kill");
    }
}

/// Several INSERTs in one job read their table once, and each writes what it would
/// write as a job of its own: three examples (a sliding window, an unbounded aggregate
/// and a Top-N) as one job on two worker processes with remote state, a worker killed
/// mid-run, each equal DuckDB's answer.
#[test]
fn several_inserts_share_their_source_and_each_equals_duckdb() {
    let python = duckdb_python();
    let dir = tempdir();
    let root = dir.path();
    let bids = generate_bids(root);
    let names = ["sql/q5-hot-items", "nexmark/q17", "nexmark/q19"];
    let mut text = remote_job_head();
    for (i, name) in names.iter().enumerate() {
        text.push_str(&format!(
            "CREATE TABLE output_{i} WITH ('connector' = 'file', 'path' = '{}', 'format' = \
             'jsonl');\n{}\n",
            root.join("out").join(name).display(),
            example_insert(name).replace("INSERT INTO output", &format!("INSERT INTO output_{i}"))
        ));
    }
    let job = root.join("several.sql");
    std::fs::write(&job, &text).unwrap();
    let explained = run_sluice(&["explain", job.to_str().unwrap()], root);
    explained.assert_success();
    assert_eq!(
        explained.stdout.matches("source: nexmark bid").count(),
        1,
        "one source for the three INSERTs:\n{}",
        explained.stdout
    );
    let mut rng = rng_from_env("SLUICE_SQL_KILL_SEED", 0x5e55_10e6);
    procs::run_with_kills(root, &job, 1, &mut |n| rng.below(n));
    for name in names {
        let expected = duckdb(&python, &bids, batch_query(name));
        assert_same_rows(
            &format!("{name} as one of three INSERTs, a worker killed, against DuckDB"),
            &output_rows(&root.join("out").join(name)),
            &expected,
        );
        eprintln!("{name}: equal to DuckDB's as one of three INSERTs");
    }
}

/// Runs `job` with the program `cli/examples/udf.rs` on two worker processes, after
/// checking that the plain `sluice` names `function` as unknown.
fn run_with_udf_program(job: &Path, root: &Path, function: &str) {
    let plain = run_sluice(&["explain", job.to_str().unwrap()], root);
    assert_eq!(plain.code, Some(2), "{}", plain.stderr);
    assert!(
        plain
            .stderr
            .contains(&format!("Invalid function '{function}'")),
        "{}",
        plain.stderr
    );
    let run = Command::new(example_bin("udf"))
        .args(["run", job.to_str().unwrap(), "--workers", "2", "-q"])
        .current_dir(root)
        .output()
        .expect("running the udf example");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Nexmark q14 calls `count_char`, a scalar function, and `sql/geomean-price` the
/// aggregate `geomean` in a window, both registered in Rust by the program
/// `cli/examples/udf.rs`, which is then the `sluice` command: their runs on two worker
/// processes (started from the same executable) equal DuckDB's answers, and the plain
/// `sluice` names the unknown function where it is called.
#[test]
fn user_defined_functions_run_in_worker_processes() {
    let python = duckdb_python();
    let dir = tempdir();
    let root = dir.path();
    let bids = generate_bids(root);
    let out = root.join("out").join("q14");
    let job = root.join("q14.sql");
    let example = workspace_root().join("examples/nexmark/q14.sql");
    let text = std::fs::read_to_string(&example).expect("reading the q14 example");
    let insert = &text[text.find("INSERT INTO output").expect("q14 has an INSERT")..];
    std::fs::write(
        &job,
        format!(
            "SET 'parallelism.default' = '2';\n{}CREATE TABLE output WITH ('connector' = \
             'file', 'path' = '{}', 'format' = 'jsonl');\n{insert}",
            file_tables(root),
            out.display(),
        ),
    )
    .unwrap();
    run_with_udf_program(&job, root, "count_char");
    let expected = duckdb(
        &python,
        &bids,
        "SELECT auction, bidder, 0.908 * price AS price, CASE WHEN hour(date_time) >= 8 AND \
         hour(date_time) <= 18 THEN 'dayTime' WHEN hour(date_time) <= 6 OR hour(date_time) \
         >= 20 THEN 'nightTime' ELSE 'otherTime' END AS bid_time_type, date_time, extra, \
         length(extra) - length(replace(extra, 'c', '')) AS c_counts FROM bid WHERE \
         0.908 * price > 1000000 AND 0.908 * price < 50000000",
    );
    assert!(!expected.is_empty());
    assert_same_rows(
        "q14 with count_char on two workers against DuckDB",
        &read_jsonl_dir(&out),
        &expected,
    );

    let name = "sql/geomean-price";
    let out = root.join("out").join(name);
    let job = root.join("geomean.sql");
    std::fs::write(
        &job,
        format!(
            "SET 'parallelism.default' = '2';\n{}{}{}",
            file_tables(root),
            output_table(name, &out),
            example_insert(name)
        ),
    )
    .unwrap();
    run_with_udf_program(&job, root, "geomean");
    // The geometric mean is the exponential of the mean logarithm.
    let expected = duckdb(
        &python,
        &bids,
        "SELECT channel, time_bucket(INTERVAL 10 SECOND, date_time) AS window_start, \
         time_bucket(INTERVAL 10 SECOND, date_time) + INTERVAL 10 SECOND AS window_end, \
         count(*) AS bids, exp(avg(ln(price))) AS typical_price, \
         exp(avg(ln(price)) FILTER (WHERE price >= 1000000)) AS typical_dear_price \
         FROM bid GROUP BY channel, window_start, window_end",
    );
    assert!(!expected.is_empty());
    assert_same_rows(
        "geomean-price with the aggregate geomean on two workers against DuckDB",
        &read_jsonl_dir(&out),
        &expected,
    );

    // Over another GROUP BY's changelog: geomean retracts (its state is a sum of
    // logarithms), so as an auction's count changes the old count leaves its bucket.
    let out = root.join("out").join("geomean-of-counts");
    let job = root.join("geomean-of-counts.sql");
    std::fs::write(
        &job,
        format!(
            "SET 'parallelism.default' = '2';\n{}CREATE TABLE output WITH ('connector' = \
             'file', 'path' = '{}', 'format' = 'jsonl');\nINSERT INTO output SELECT n % 10 AS \
             bucket, geomean(n) AS typical FROM (SELECT auction, COUNT(*) AS n FROM bid \
             GROUP BY auction) GROUP BY n % 10;\n",
            file_tables(root),
            out.display(),
        ),
    )
    .unwrap();
    run_with_udf_program(&job, root, "geomean");
    let expected = duckdb(
        &python,
        &bids,
        "SELECT n % 10 AS bucket, exp(avg(ln(n))) AS typical FROM (SELECT auction, \
         count(*) AS n FROM bid GROUP BY auction) GROUP BY n % 10",
    );
    assert!(!expected.is_empty());
    assert_same_rows(
        "geomean over an updating result on two workers against DuckDB",
        &output_rows(&out),
        &expected,
    );
}
