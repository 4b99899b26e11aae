#!/usr/bin/env python3
"""Runs one of `sluice bench nexmark`'s queries in real Flink SQL (PyFlink's local
MiniCluster, streaming mode) over headerless CSV bids, and prints one line:

  flink q=<q> rows=<N> seconds=<job> events_per_s=<N/job> submit_to_finish_s=..
        jvm_start_s=.. jvm_peak_rss_mb=.. parallelism=..

The queries are the SQL twins of bench/src/nexmark.rs (`select`), with the same
4 s watermark and a blackhole sink, so the two engines run the same statement.
`seconds` is Flink's own net job runtime (JobExecutionResult); jvm_peak_rss_mb the
gateway JVM's VmHWM when the job has finished. Used by scripts/bench-sql-peers; it
follows ../shared/peers/flink/run_q.py, which measures Flink the same way.
"""
import argparse
import os
import sys
import time

T0 = time.time()

BIDS = ("auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
        "date_time TIMESTAMP(3), extra STRING")
AUCTIONS = ("id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, "
            "reserve BIGINT, date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, "
            "category BIGINT, extra STRING")
PERSONS = ("id BIGINT, name STRING, email_address STRING, credit_card STRING, city STRING, "
           "state STRING, date_time TIMESTAMP(3), extra STRING")
WINDOW = "window_start TIMESTAMP(3), window_end TIMESTAMP(3)"
# Nexmark's three price bands (q15, q17): count(<x>) FILTER per band, named rank<i>_<n>.
BANDS = ("count({x}) FILTER (WHERE price < 10000) AS rank1_{n}, "
         "count({x}) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_{n}, "
         "count({x}) FILTER (WHERE price >= 1000000) AS rank3_{n}")

# Each query: its SELECT and the columns of its blackhole sink.
QUERIES = {
    "q0": ("SELECT * FROM bid", BIDS),
    "q1": ("SELECT auction, bidder, price * 0.908 AS price, date_time FROM bid",
           "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), date_time TIMESTAMP(3)"),
    "q2": ("SELECT auction, price FROM bid WHERE auction % 123 = 0",
           "auction BIGINT, price BIGINT"),
    "q5": ("SELECT auction, window_start, window_end, count(*) AS bids "
           "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) "
           "GROUP BY auction, window_start, window_end",
           f"auction BIGINT, {WINDOW}, bids BIGINT"),
    "q7": ("SELECT window_start, window_end, max(price) AS top_price, count(*) AS bids "
           "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
           "GROUP BY window_start, window_end",
           f"{WINDOW}, top_price BIGINT, bids BIGINT"),
    "q11": ("SELECT bidder, window_start, window_end, count(*) AS bids "
            "FROM TABLE(SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
            "GROUP BY bidder, window_start, window_end",
            f"bidder BIGINT, {WINDOW}, bids BIGINT"),
    "tumbling": ("SELECT auction, window_start, window_end, count(*) AS bids, sum(price) AS volume "
                 "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
                 "GROUP BY auction, window_start, window_end",
                 f"auction BIGINT, {WINDOW}, bids BIGINT, volume BIGINT"),
    # Updating queries (a changelog into the blackhole), as in Flink's Nexmark (where
    # `day` is a reserved word, so quoted).
    "q15": ("SELECT `day`, count(*) AS total_bids, "
            f"{BANDS.format(x='*', n='bids')}, "
            "count(DISTINCT bidder) AS total_bidders, "
            f"{BANDS.format(x='DISTINCT bidder', n='bidders')}, "
            "count(DISTINCT auction) AS total_auctions, "
            f"{BANDS.format(x='DISTINCT auction', n='auctions')} "
            "FROM (SELECT auction, bidder, price, DATE_FORMAT(date_time, 'yyyy-MM-dd') AS `day` "
            "FROM bid) GROUP BY `day`",
            "`day` STRING, " + ", ".join(f"c{i} BIGINT" for i in range(12))),
    "q17": ("SELECT auction, `day`, count(*) AS total_bids, "
            f"{BANDS.format(x='*', n='bids')}, "
            "min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, "
            "sum(price) AS sum_price "
            "FROM (SELECT auction, price, CAST(date_time AS DATE) AS `day` FROM bid) "
            "GROUP BY auction, `day`",
            "auction BIGINT, `day` DATE, " + ", ".join(f"c{i} BIGINT" for i in range(8))),
    "q18": ("SELECT auction, bidder, price, channel, url, date_time, extra FROM ("
            "SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) "
            "AS rank_number FROM bid) WHERE rank_number <= 1",
            BIDS),
    "q19": ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) "
            "AS rank_number FROM bid) WHERE rank_number <= 10",
            f"{BIDS}, rank_number BIGINT"),
    # Joins, as Flink's Nexmark writes them (regular joins, state kept forever).
    "q3": ("SELECT P.name, P.city, P.state, A.id FROM auction AS A JOIN person AS P "
           "ON A.seller = P.id WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' "
           "OR P.state = 'CA')",
           "name STRING, city STRING, state STRING, id BIGINT"),
    "q7-join": ("SELECT B.auction, B.price, B.bidder, B.date_time, B.extra FROM bid B JOIN ("
                "SELECT MAX(price) AS maxprice, window_end AS date_time "
                "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
                "GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice "
                "WHERE B.date_time BETWEEN B1.date_time - INTERVAL '10' SECOND AND B1.date_time",
                "auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP(3), extra STRING"),
    "q8": ("SELECT P.id, P.name, P.starttime FROM ("
           "SELECT id, name, window_start AS starttime, window_end AS endtime "
           "FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
           "GROUP BY id, name, window_start, window_end) P JOIN ("
           "SELECT seller, window_start AS starttime, window_end AS endtime "
           "FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
           "GROUP BY seller, window_start, window_end) A "
           "ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime",
           "id BIGINT, name STRING, starttime TIMESTAMP(3)"),
    "q20": ("SELECT auction, bidder, price, channel, url, B.date_time, B.extra, item_name, "
            "description, initial_bid, reserve, A.date_time, expires, seller, category, "
            "A.extra FROM bid AS B JOIN auction AS A ON B.auction = A.id WHERE A.category = 10",
            f"{BIDS}, item_name STRING, description STRING, initial_bid BIGINT, "
            "reserve BIGINT, date_time0 TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, "
            "category BIGINT, extra0 STRING"),
    # The rest of Flink's Nexmark, as its query files write them.
    "q4": ("SELECT Q.category, AVG(Q.final) FROM ("
           "SELECT MAX(B.price) AS final, A.category FROM auction A, bid B "
           "WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires "
           "GROUP BY A.id, A.category) Q GROUP BY Q.category",
           "category BIGINT, avg_price BIGINT"),
    "q5-hottest": ("SELECT AuctionBids.auction, AuctionBids.num FROM ("
                   "SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime "
                   "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) "
                   "GROUP BY auction, window_start, window_end) AS AuctionBids JOIN ("
                   "SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM ("
                   "SELECT count(*) AS num, window_start AS starttime, window_end AS endtime "
                   "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) "
                   "GROUP BY auction, window_start, window_end) AS CountBids "
                   "GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids "
                   "ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime "
                   "AND AuctionBids.num >= MaxBids.maxn",
                   "auction BIGINT, num BIGINT"),
    # q6 as Sluice's example writes it (Flink's Nexmark writes an OVER window over an
    # updating result, which Flink does not run): a Top-N per seller over q4's
    # per-auction aggregate, averaged.
    "q6": ("SELECT seller, AVG(final) FROM ("
           "SELECT seller, final, ROW_NUMBER() OVER (PARTITION BY seller "
           "ORDER BY expires DESC, id DESC) AS rn FROM ("
           "SELECT A.id, A.seller, A.expires, MAX(B.price) AS final FROM auction A, bid B "
           "WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires "
           "GROUP BY A.id, A.seller, A.expires)) WHERE rn <= 10 GROUP BY seller",
           "seller BIGINT, avg_price BIGINT"),
    "q9": ("SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, "
           "category, extra, auction, bidder, price, bid_date_time, bid_extra FROM ("
           "SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, "
           "B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY A.id "
           "ORDER BY B.price DESC, B.date_time ASC) AS rownum FROM auction A, bid B "
           "WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires) "
           "WHERE rownum <= 1",
           f"{AUCTIONS}, auction BIGINT, bidder BIGINT, price BIGINT, "
           "bid_date_time TIMESTAMP(3), bid_extra STRING"),
    "q10": ("SELECT auction, bidder, price, date_time, extra, "
            "DATE_FORMAT(date_time, 'yyyy-MM-dd'), DATE_FORMAT(date_time, 'HH:mm') FROM bid",
            "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP(3), extra STRING, "
            "dt STRING, hm STRING"),
    "q12": ("SELECT bidder, count(*) AS bid_count, window_start, window_end "
            "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(p_time), INTERVAL '10' SECOND)) "
            "GROUP BY bidder, window_start, window_end",
            f"bidder BIGINT, bid_count BIGINT, {WINDOW}"),
    "q13": ("SELECT B.auction, B.bidder, B.price, B.date_time, S.`value` FROM bid B "
            "JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S ON mod(B.auction, 10000) = S.key",
            "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP(3), `value` STRING"),
    "q16": ("SELECT channel, DATE_FORMAT(date_time, 'yyyy-MM-dd') AS `day`, "
            "max(DATE_FORMAT(date_time, 'HH:mm')) AS `minute`, count(*) AS total_bids, "
            f"{BANDS.format(x='*', n='bids')}, "
            "count(DISTINCT bidder) AS total_bidders, "
            f"{BANDS.format(x='DISTINCT bidder', n='bidders')}, "
            "count(DISTINCT auction) AS total_auctions, "
            f"{BANDS.format(x='DISTINCT auction', n='auctions')} "
            "FROM bid GROUP BY channel, DATE_FORMAT(date_time, 'yyyy-MM-dd')",
            "channel STRING, `day` STRING, `minute` STRING, "
            + ", ".join(f"c{i} BIGINT" for i in range(12))),
    "q21": ("SELECT auction, bidder, price, channel, CASE "
            "WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1' "
            "WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3' "
            "ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id FROM bid "
            "WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL "
            "OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')",
            "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, channel_id STRING"),
    "q22": ("SELECT auction, bidder, price, channel, SPLIT_INDEX(url, '/', 3) AS dir1, "
            "SPLIT_INDEX(url, '/', 4) AS dir2, SPLIT_INDEX(url, '/', 5) AS dir3 FROM bid",
            "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, dir1 STRING, "
            "dir2 STRING, dir3 STRING"),
    # An interval join (both times are rowtime attributes, so Flink plans its
    # IntervalJoin): every bid of its auction's first 10 seconds.
    "interval-join": ("SELECT A.id AS auction, A.seller, B.bidder, B.price, B.date_time AS bid_time "
                      "FROM auction A, bid B WHERE A.id = B.auction "
                      "AND B.date_time BETWEEN A.date_time AND A.date_time + INTERVAL '10' SECOND",
                      "auction BIGINT, seller BIGINT, bidder BIGINT, price BIGINT, "
                      "bid_time TIMESTAMP(3)"),
    # A regular LEFT JOIN whose ON holds conditions on both sides (updating).
    "left-join-condition": ("SELECT B.auction, B.bidder, B.price, A.seller, A.reserve FROM bid B "
                       "LEFT JOIN auction A ON B.auction = A.id AND A.category = 10 "
                       "AND B.price > A.reserve",
                       "auction BIGINT, bidder BIGINT, price BIGINT, seller BIGINT, "
                       "reserve BIGINT"),
    # IN (SELECT ...): Flink plans a semi join.
    "semi-in": ("SELECT auction, bidder, price, date_time FROM bid "
                "WHERE auction IN (SELECT id FROM auction WHERE category = 10)",
                "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP(3)"),
    "union-all": ("SELECT auction AS id, price AS amount, date_time FROM bid WHERE price > 1000 "
                  "UNION ALL SELECT id, initial_bid, date_time FROM auction",
                  "id BIGINT, amount BIGINT, date_time TIMESTAMP(3)"),
    # Expressions over aggregates and HAVING (updating).
    "having": ("SELECT auction, SUM(price) / COUNT(*) AS mean_price, "
               "MAX(price) - MIN(price) AS spread FROM bid GROUP BY auction HAVING COUNT(*) >= 50",
               "auction BIGINT, mean_price BIGINT, spread BIGINT"),
    # An OVER aggregate over a RANGE frame of event time (Flink's over aggregation).
    "over": ("SELECT auction, bidder, price, date_time, COUNT(*) OVER w AS recent_bids, "
             "MAX(price) OVER w AS recent_top FROM bid WINDOW w AS (PARTITION BY auction "
             "ORDER BY date_time RANGE BETWEEN INTERVAL '10' SECOND PRECEDING AND CURRENT ROW)",
             "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP(3), "
             "recent_bids BIGINT, recent_top BIGINT"),
}

# The tables each query reads besides `bid`.
JOINED = {"q3": ("auction", "person"), "q8": ("auction", "person"), "q20": ("auction",),
          "q4": ("auction",), "q6": ("auction",), "q9": ("auction",), "interval-join": ("auction",),
          "left-join-condition": ("auction",), "semi-in": ("auction",), "union-all": ("auction",)}
# Columns a query's bid table computes besides the CSV's.
COMPUTED = {"q12": "p_time AS PROCTIME(),", "q13": "p_time AS PROCTIME(),"}

TABLE = """CREATE TABLE {name} (
  {columns}, {computed}
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv')"""


def jvm_pid():
    """The PyFlink gateway JVM: this process's child named java."""
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2:].split()[1])
            if ppid == me and st[st.index("(") + 1:st.rindex(")")] == "java":
                return int(d)
        except (OSError, ValueError):
            continue
    return None


def vm_hwm_mb(pid):
    if pid is None:
        return float("nan")
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a directory of headerless CSV bids")
    ap.add_argument("--query", "-q", required=True, choices=sorted(QUERIES))
    ap.add_argument("--auctions", default=None, help="a directory of headerless CSV auctions")
    ap.add_argument("--persons", default=None, help="a directory of headerless CSV persons")
    ap.add_argument("--side-input", default=None,
                    help="q13: a directory with Nexmark's side input (key,value lines)")
    ap.add_argument("--out", default=None,
                    help="q10: where its partitioned files go (default: a temporary directory)")
    ap.add_argument("--rows", type=int, required=True,
                    help="the events the query reads (bids, and auctions or persons it joins)")
    ap.add_argument("--parallelism", "-p", type=int, default=2)
    ap.add_argument("--log-dir", default=None, help="Flink's logs (default: a temporary directory)")
    args = ap.parse_args()

    import tempfile
    os.environ["FLINK_LOG_DIR"] = args.log_dir or tempfile.mkdtemp(prefix="flink-sql-logs-")
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    conf.set_string("parallelism.default", str(args.parallelism))
    conf.set_string("pipeline.name", f"sluice-peer-{args.query}")
    settings = (EnvironmentSettings.new_instance().in_streaming_mode()
                .with_configuration(conf).build())
    t_env = TableEnvironment.create(settings)
    t_jvm = time.time()
    pid = jvm_pid()
    dirs = {"bid": args.data, "auction": args.auctions, "person": args.persons}
    columns_of = {"bid": BIDS, "auction": AUCTIONS, "person": PERSONS}
    for name in ("bid",) + JOINED.get(args.query, ()):
        if dirs[name] is None:
            ap.error(f"{args.query} reads {name}s: give --{name}s")
        computed = COMPUTED.get(args.query, "") if name == "bid" else ""
        t_env.execute_sql(TABLE.format(name=name, columns=columns_of[name], computed=computed,
                                       path="file://" + os.path.abspath(dirs[name])))
    if args.query == "q13":
        if args.side_input is None:
            ap.error("q13 reads the side input: give --side-input")
        t_env.execute_sql("CREATE TABLE side_input (key BIGINT, `value` STRING) WITH ("
                          "'connector' = 'filesystem', 'format' = 'csv', "
                          f"'path' = 'file://{os.path.abspath(args.side_input)}')")
    select, columns = QUERIES[args.query]
    scratch = None
    if args.query == "q10":
        out = args.out or tempfile.mkdtemp(prefix="flink-q10-")
        scratch = None if args.out else out
        t_env.execute_sql(f"CREATE TABLE output ({columns}) PARTITIONED BY (dt, hm) WITH ("
                          f"'connector' = 'filesystem', 'path' = 'file://{os.path.abspath(out)}', "
                          "'format' = 'csv')")
    else:
        t_env.execute_sql(f"CREATE TABLE output ({columns}) WITH ('connector' = 'blackhole')")
    t_sub = time.time()
    result = t_env.execute_sql(f"INSERT INTO output {select}")
    jer = result.get_job_client().get_job_execution_result().result()
    t_end = time.time()
    if scratch is not None:
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = jer.get_net_runtime() / 1000.0
    eps = args.rows / seconds if seconds > 0 else float("nan")
    print(f"flink q={args.query} rows={args.rows} seconds={seconds:.3f} events_per_s={eps:.0f} "
          f"submit_to_finish_s={t_end - t_sub:.3f} jvm_start_s={t_jvm - T0:.3f} "
          f"jvm_peak_rss_mb={vm_hwm_mb(pid):.0f} parallelism={args.parallelism}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
