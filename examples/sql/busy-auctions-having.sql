-- Auctions with at least 50 bids, with their mean price and the spread between their
-- highest and lowest bid: expressions over aggregates, and HAVING on an aggregate
-- the SELECT list does not show. Its result is updating (a GROUP BY without a window):
-- an auction is written once its 50th bid arrives, then updated with every bid.
SET 'pipeline.name' = 'busy-auctions-having';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '100000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/busy-auctions-having',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, SUM(price) / COUNT(*) AS mean_price, MAX(price) - MIN(price) AS spread
FROM bid
GROUP BY auction
HAVING COUNT(*) >= 50;
