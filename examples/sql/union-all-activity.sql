-- Big bids and new category 10 auctions as one stream of activity: UNION ALL of two
-- queries over two tables. Its rows are each side's as they come, under the first
-- side's column names; both sides give the same column types.
SET 'pipeline.name' = 'union-all-activity';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '100000',
  'seed' = '42'
);

CREATE TABLE auction WITH (
  'connector' = 'nexmark',
  'stream' = 'auction',
  'events' = '6000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/union-all-activity',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT 'bid' AS kind, auction AS id, price AS amount, date_time FROM bid
WHERE price > 10000000
UNION ALL
SELECT 'auction', id, initial_bid, date_time FROM auction WHERE category = 10;
