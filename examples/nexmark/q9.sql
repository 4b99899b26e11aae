-- Nexmark q9: each auction with its winning bid, the highest made while it was open
-- (the earliest of equal ones). A join of auctions and bids under a Top-N: ROW_NUMBER()
-- per auction, kept where it is 1. When a higher bid arrives the auction's row is
-- retracted (-U) and the new winner written (+U), so the output is a changelog.
SET 'pipeline.name' = 'q9-winning-bids';
SET 'parallelism.default' = '2';

CREATE TABLE auction WITH (
  'connector' = 'nexmark',
  'stream' = 'auction',
  'events' = '65000',
  'seed' = '42'
);

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q9-winning-bids',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller,
       category, extra, auction, bidder, price, bid_date_time, bid_extra
FROM (
  SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time,
         B.extra AS bid_extra,
         ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rownum
  FROM auction A, bid B
  WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
)
WHERE rownum <= 1;
