-- Nexmark q5 (hot items, per-auction part): the number of bids each auction received
-- in sliding 10-second windows that start every 2 seconds. The SQL twin of
-- examples/q5-hot-items.yaml.
SET 'pipeline.name' = 'q5-hot-items';
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
  'path' = 'out/q5-hot-items',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, window_start, window_end, COUNT(*) AS bids
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;
