-- Nexmark q0 (pass-through): every bid, unchanged. The SQL twin of
-- examples/q0-passthrough.yaml; `sluice run examples/nexmark/q0.sql`.
SET 'pipeline.name' = 'q0-passthrough';
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
  'path' = 'out/q0-passthrough',
  'format' = 'jsonl'
);

INSERT INTO output SELECT * FROM bid;
