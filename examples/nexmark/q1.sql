-- Nexmark q1 (currency conversion): each bid's price in euros. The SQL twin of
-- examples/q1-currency.yaml.
SET 'pipeline.name' = 'q1-currency';
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
  'path' = 'out/q1-currency',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, price * 0.908 AS price_eur, channel, url, date_time, extra
FROM bid;
