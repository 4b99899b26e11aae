-- Nexmark q4: the average closing price of the auctions in each category. Each
-- auction's closing price is its highest bid made while it was open (an inner
-- aggregate over a join of auctions and bids); the average per category is an
-- aggregate over that aggregate's changelog: when an auction's highest bid is beaten,
-- its old price is taken back (-U) from its category's average and the new one added
-- (+U). Both results update as bids arrive, so the output is a changelog.
SET 'pipeline.name' = 'q4-average-price-per-category';
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
  'path' = 'out/q4-average-price-per-category',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT Q.category, AVG(Q.final) AS avg_price
FROM (
  SELECT MAX(B.price) AS final, A.category
  FROM auction A, bid B
  WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
  GROUP BY A.id, A.category
) Q
GROUP BY Q.category;
