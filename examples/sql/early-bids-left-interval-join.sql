-- An outer interval join: every auction with each bid made in its first 10 seconds, and
-- once with null bid columns when it had none. Both sides' times are their tables' event
-- times and ON bounds one by the other, so this is Flink's outer interval join: an
-- auction that no bid matched is written padded with nulls when the watermark passes its
-- first 10 seconds, for good. The result is append-only (unlike a regular LEFT JOIN's,
-- which deletes a padded row when its first match arrives), and state stays bounded by
-- the interval. ON may hold any condition: a pair that fails it is no match (here every
-- category 10 auction is written padded).
SET 'pipeline.name' = 'early-bids-left-interval-join';
SET 'parallelism.default' = '2';

CREATE TABLE auction (
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'stream' = 'auction',
  'events' = '65000',
  'seed' = '42'
);

CREATE TABLE bid (
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/early-bids-left-interval-join',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT A.id AS auction, A.seller, B.bidder, B.price, B.date_time AS bid_time
FROM auction A LEFT JOIN bid B
  ON A.id = B.auction
  AND B.date_time BETWEEN A.date_time AND A.date_time + INTERVAL '10' SECOND
  AND B.price > 1000
  AND A.category <> 10;
