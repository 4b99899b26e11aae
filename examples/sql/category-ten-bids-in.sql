-- Bids over 5 000 000 on auctions of category 10: `auction IN (SELECT ...)`, a semi
-- join. Each bid is written once, when an auction of category 10 with its id has been
-- seen (at once if the auction came first, else when it comes), so the result is
-- append-only. Both sides are kept in state: a bid may wait for its auction.
SET 'pipeline.name' = 'category-ten-bids-in';
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
  'path' = 'out/category-ten-bids-in',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, price FROM bid
WHERE price > 5000000 AND auction IN (SELECT id FROM auction WHERE category = 10);
