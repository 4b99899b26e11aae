-- Nexmark q6: each seller's average selling price over their last 10 closed auctions.
-- An auction's selling price is its highest bid made while it was open (an aggregate
-- over a join of auctions and bids, as in q4); its closing time is when it expires.
-- A Top-N over that aggregate's changelog keeps each seller's 10 latest-closing
-- auctions: when an auction's price rises, its old row is taken back (-U) and the new
-- one ranked, and when an auction falls out of a seller's ten the one below it moves in.
-- The average per seller is an aggregate over the Top-N's changelog. Flink's Nexmark
-- writes q6 as an OVER window over an updating result, which Flink does not run; this
-- is the same question in a Top-N.
SET 'pipeline.name' = 'q6-average-selling-price-by-seller';
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
  'path' = 'out/q6-average-selling-price-by-seller',
  'format' = 'jsonl'
);

-- Each auction with bids, and its highest bid while it was open.
CREATE VIEW closed AS
SELECT A.id, A.seller, A.expires, MAX(B.price) AS final
FROM auction A, bid B
WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
GROUP BY A.id, A.seller, A.expires;

INSERT INTO output
SELECT seller, AVG(final) AS avg_price
FROM (
  SELECT seller, final,
         ROW_NUMBER() OVER (PARTITION BY seller ORDER BY expires DESC, id DESC) AS rn
  FROM closed
)
WHERE rn <= 10
GROUP BY seller;
