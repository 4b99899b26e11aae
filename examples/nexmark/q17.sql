-- Nexmark q17: per auction and day, bid statistics that change with every bid. An
-- unbounded GROUP BY has no window to close, so its result is a changelog: a key's
-- first row is an insert (op +I), each later change retracts the old row (-U) and
-- adds the new one (+U). The output files carry the op column; `sluice run` on a
-- bounded source ends with every key's final row standing.
SET 'pipeline.name' = 'q17-auction-day-stats';
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
  'path' = 'out/q17-auction-day-stats',
  'format' = 'jsonl'
);

-- Flink's q17 groups by DATE_FORMAT(dateTime, 'yyyy-MM-dd'); Sluice groups by
-- columns, so the day is computed first.
CREATE VIEW bid_day AS
SELECT auction, price, CAST(date_time AS DATE) AS day FROM bid;

INSERT INTO output
SELECT auction, day,
       COUNT(*) AS total_bids,
       COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
       COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
       MIN(price) AS min_price,
       MAX(price) AS max_price,
       AVG(price) AS avg_price,
       SUM(price) AS sum_price
FROM bid_day
GROUP BY auction, day;
