-- People who bid over 10 000 000 and sell nothing in category 10: EXCEPT, each distinct
-- row of the first query while no row of the second equals it. It runs as a dedup of the
-- bidders, then an anti join keyed by every column (nulls equal, as set operations
-- compare rows). Its result is updating: a bidder is written when first seen (+I), and
-- taken back (-D) when an auction of category 10 of theirs arrives. INTERSECT is the same
-- with a semi join: each distinct row once, when the other query has it too.
SET 'pipeline.name' = 'big-bidders-except-sellers';
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
  'path' = 'out/big-bidders-except-sellers',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT bidder AS person FROM bid WHERE price > 10000000
EXCEPT
SELECT seller FROM auction WHERE category = 10;
