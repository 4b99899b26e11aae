-- Nexmark q20: every bid on an auction of category 10, with the auction's details. Both
-- sides have a date_time and an extra column; as in Flink, the second of each is
-- named with a suffix (date_time0, extra0). The auction side is filtered before the
-- join, so only category 10's auctions are kept in state; every bid is kept, since an
-- auction may arrive after its bids.
SET 'pipeline.name' = 'q20-expanded-bid';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42'
);

CREATE TABLE auction WITH (
  'connector' = 'nexmark',
  'stream' = 'auction',
  'events' = '65000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q20-expanded-bid',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, price, channel, url, B.date_time, B.extra,
       item_name, description, initial_bid, reserve, A.date_time, expires, seller,
       category, A.extra
FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
WHERE A.category = 10;
