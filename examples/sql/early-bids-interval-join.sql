-- An interval join: every bid made in the first 10 seconds of its auction. Both sides'
-- times are their tables' event times (each has a WATERMARK), and the condition bounds
-- one by the other, so this is Flink's interval join: an auction is kept only until
-- the watermark passes its first 10 seconds, and a bid until it passes the bid's time,
-- after which no row of the other side can match it. State stays bounded by the
-- interval however long the job runs (a regular join, as in q4, keeps both sides for
-- ever). `sluice explain` says "an interval join: each kept until the watermark passes
-- the last time it can match".
SET 'pipeline.name' = 'early-bids-interval-join';
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
  'path' = 'out/early-bids-interval-join',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT A.id AS auction, A.seller, B.bidder, B.price, B.date_time AS bid_time
FROM auction A, bid B
WHERE A.id = B.auction
  AND B.date_time BETWEEN A.date_time AND A.date_time + INTERVAL '10' SECOND;
