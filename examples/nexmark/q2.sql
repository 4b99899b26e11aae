-- Nexmark q2 (selection): the bids on every 123rd auction. The SQL twin of
-- examples/q2-filter.yaml.
SET 'pipeline.name' = 'q2-filter';
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
  'path' = 'out/q2-filter',
  'format' = 'jsonl'
);

INSERT INTO output SELECT auction, price FROM bid WHERE auction % 123 = 0;
