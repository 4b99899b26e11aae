-- Per bucket of bid counts (an auction's count modulo 10): how many different counts
-- its auctions have, and how many auctions: COUNT(DISTINCT ...) over an updating result
-- (another GROUP BY's changelog). As an auction's count goes from n to n + 1, n is taken
-- back from its bucket, which counts it no more once no auction has it.
SET 'pipeline.name' = 'bid-count-buckets-distinct';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '100000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/bid-count-buckets-distinct',
  'format' = 'jsonl'
);

CREATE VIEW counts AS SELECT auction, COUNT(*) AS n FROM bid GROUP BY auction;

INSERT INTO output
SELECT n % 10 AS bucket, COUNT(DISTINCT n) AS counts, COUNT(*) AS auctions
FROM counts
GROUP BY n % 10;
