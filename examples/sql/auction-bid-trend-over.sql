-- Each bid with its auction's bids in the 10 seconds up to it: how many, the highest
-- price and how far the bid is above their mean. An OVER aggregate (Flink's over
-- aggregation): per auction in event time, each bid is written once the watermark
-- passes it, with aggregates over a RANGE frame of the bids before it (bids of the same
-- time included). Its result is append-only, and keeps the bid's event time.
SET 'pipeline.name' = 'auction-bid-trend-over';
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
  'path' = 'out/auction-bid-trend-over',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, price, date_time,
       COUNT(*) OVER recent AS recent_bids,
       MAX(price) OVER recent AS recent_top,
       price - AVG(price) OVER recent AS above_mean
FROM bid
WHERE price > 1000
WINDOW recent AS (
  PARTITION BY auction ORDER BY date_time
  RANGE BETWEEN INTERVAL '10' SECOND PRECEDING AND CURRENT ROW
);
