-- Nexmark q3: who is selling in category 10 in Oregon, Idaho or California? A regular
-- join of two streams: every auction and every person is kept in keyed state, so an
-- auction meets its seller whichever of the two arrives first. The WHERE conjuncts
-- that name one side's columns filter that side before the join.
SET 'pipeline.name' = 'q3-local-item-suggestion';
SET 'parallelism.default' = '2';

CREATE TABLE auction WITH (
  'connector' = 'nexmark',
  'stream' = 'auction',
  'events' = '60000',
  'seed' = '42'
);

CREATE TABLE person WITH (
  'connector' = 'nexmark',
  'stream' = 'person',
  'events' = '20000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q3-local-item-suggestion',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT P.name, P.city, P.state, A.id
FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA');
