-- Every auction with its count of bids while it is among the ten most bid on, and a
-- null count while it is not: a LEFT JOIN of an updating result (a Top-N over a GROUP
-- BY). The join keeps a count of matches per auction: an auction entering the top ten
-- takes back its padded row (-D) and inserts its pair (+I); its count changing takes
-- back the old pair and inserts the new; leaving the top ten takes back its pair and
-- writes it padded with nulls again.
SET 'pipeline.name' = 'hot-auctions-left-join';
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
  'path' = 'out/hot-auctions-left-join',
  'format' = 'jsonl'
);

CREATE VIEW hot AS
SELECT auction, bids FROM (
  SELECT auction, bids,
    ROW_NUMBER() OVER (ORDER BY bids DESC, auction DESC) AS rownum
  FROM (SELECT auction, COUNT(*) AS bids FROM bid GROUP BY auction)
) WHERE rownum <= 10;

INSERT INTO output
SELECT A.id, A.category, H.bids
FROM auction AS A LEFT JOIN hot AS H ON A.id = H.auction;
