-- Bids over 5 000 000 on auctions that have had at least 100 bids: IN over an updating
-- subquery (a GROUP BY with HAVING), a semi join that counts each bid's matches. A bid
-- is written (+I) once its auction reaches 100 bids, and would be taken back (-D) if
-- its auction left the subquery's result; its result is updating.
SET 'pipeline.name' = 'hot-auction-bids-in';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '100000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/hot-auction-bids-in',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, price FROM bid
WHERE price > 5000000
AND auction IN (SELECT auction FROM bid GROUP BY auction HAVING COUNT(*) >= 100);
