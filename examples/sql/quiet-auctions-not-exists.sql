-- Auctions of category 10 no bid over 10 000 000 has reached yet: NOT EXISTS, an anti
-- join. Its result is updating: an auction is written when it arrives without such a
-- bid (+I), and taken back (-D) when the first one comes. Both sides are kept in state.
SET 'pipeline.name' = 'quiet-auctions-not-exists';
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
  'path' = 'out/quiet-auctions-not-exists',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT A.id, A.seller, A.reserve FROM auction A
WHERE A.category = 10
AND NOT EXISTS (SELECT * FROM bid B WHERE B.auction = A.id AND B.price > 10000000);
