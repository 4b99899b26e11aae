-- The geometric mean of bid prices per channel in 10-second tumbling windows, and of
-- the prices of 1,000,000 or more. `geomean` is an aggregate function registered in
-- Rust by the program cli/examples/udf.rs, so this job runs with that program in the
-- place of `sluice`:
--   cargo run -p sluice-cli --example udf -- run examples/sql/geomean-price.sql
SET 'pipeline.name' = 'geomean-price';
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
  'path' = 'out/geomean-price',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT channel, window_start, window_end,
       COUNT(*) AS bids,
       GEOMEAN(price) AS typical_price,
       GEOMEAN(price) FILTER (WHERE price >= 1000000) AS typical_dear_price
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
GROUP BY channel, window_start, window_end;
