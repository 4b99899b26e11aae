-- Bids per channel in 10-second tumbling windows, split into price bands with
-- FILTER (WHERE ...), as Nexmark q15 splits its daily statistics (q15's distinct
-- bidders per window are in distinct-bidders.sql).
SET 'pipeline.name' = 'price-bands';
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
  'path' = 'out/price-bands',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT channel, window_start, window_end,
       COUNT(*) AS bids,
       COUNT(*) FILTER (WHERE price < 10000) AS band1,
       COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS band2,
       COUNT(*) FILTER (WHERE price >= 1000000) AS band3,
       SUM(price) FILTER (WHERE price >= 1000000) AS band3_volume,
       MAX(price) FILTER (WHERE channel <> 'Google') AS top_price_elsewhere
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
GROUP BY channel, window_start, window_end;
