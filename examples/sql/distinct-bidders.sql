-- Nexmark q15's bidding statistics per channel in 10-second windows sliding by 5
-- seconds instead of per day: bids, distinct bidders, and distinct bidders of bids of
-- 1,000,000 or more. A window's COUNT(DISTINCT bidder) runs as two windows: one row per
-- channel, bidder and window, then a cascade counting them per channel and window as the
-- watermark passes each window's end. Both keep only open windows.
SET 'pipeline.name' = 'distinct-bidders';
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
  'path' = 'out/distinct-bidders',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT channel, window_start, window_end,
       COUNT(*) AS bids,
       COUNT(DISTINCT bidder) AS bidders,
       COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS dear_bidders,
       MAX(price) AS top_price
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '5' SECOND, INTERVAL '10' SECOND))
GROUP BY channel, window_start, window_end;
