-- Nexmark q19: the ten highest bids of every auction, with their rank, kept up to date
-- as bids arrive (Top-N: ROW_NUMBER() bounded by the enclosing WHERE). The output is a
-- changelog: a rank's first row is an insert (op +I); when a higher bid pushes rows
-- down, every rank whose row changed is retracted (-U) and updated (+U). Ties in price
-- are broken by the rest of the row, so a run's answer is deterministic.
SET 'pipeline.name' = 'q19-top-bids';
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
  'path' = 'out/q19-top-bids',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT * FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
  FROM bid
)
WHERE rank_number <= 10;
