-- Nexmark q5 as Flink's Nexmark writes it: the auctions with the most bids in each
-- 10-second window sliding by 2 seconds. Each auction's count per window (a window
-- aggregate) is joined with each window's highest count. That maximum groups by the
-- windows' ends, so it is a window of its own (Flink's cascading window aggregation):
-- it fires once per window when the watermark reaches the window's end. The join on
-- the windows' ends is a window join: it keeps a window's rows only until the
-- watermark passes its end. The output is append-only, as in Flink.
-- (examples/sql/q5-hot-items.sql is the per-auction count alone.)
SET 'pipeline.name' = 'q5-hottest-auctions';
SET 'parallelism.default' = '2';

CREATE TABLE bid (
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42',
  'max_out_of_orderness' = '2s'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q5-hottest-auctions',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT AuctionBids.auction, AuctionBids.num
FROM (
  SELECT auction, COUNT(*) AS num, window_start AS starttime, window_end AS endtime
  FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
  GROUP BY auction, window_start, window_end
) AS AuctionBids
JOIN (
  SELECT MAX(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
  FROM (
    SELECT COUNT(*) AS num, window_start AS starttime, window_end AS endtime
    FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
    GROUP BY auction, window_start, window_end
  ) AS CountBids
  GROUP BY CountBids.starttime, CountBids.endtime
) AS MaxBids
ON AuctionBids.starttime = MaxBids.starttime
   AND AuctionBids.endtime = MaxBids.endtime
   AND AuctionBids.num >= MaxBids.maxn;
