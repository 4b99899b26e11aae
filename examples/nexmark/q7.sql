-- Nexmark q7: the highest bid of every 10 s window, as Flink's Nexmark writes it: the
-- bids joined with each window's maximum price, on the price and the bid's time falling
-- in the window. A regular join: both sides stay in keyed state (here keyed by price),
-- and the time condition is checked on each pair. (examples/q7-highest-bid.yaml is
-- the window alone.)
SET 'pipeline.name' = 'q7-highest-bid-join';
SET 'parallelism.default' = '2';

CREATE TABLE bid (
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42',
  'max_out_of_orderness' = '2s'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q7-highest-bid-join',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT B.auction, B.price, B.bidder, B.date_time, B.extra
FROM bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end AS date_time
  FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.date_time BETWEEN B1.date_time - INTERVAL '10' SECOND AND B1.date_time;
