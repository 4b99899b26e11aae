-- Every person in Oregon with each category 10 auction they opened, and a null auction
-- while they have opened none: a LEFT JOIN. Its result is updating: a person is first
-- written padded with a null auction (+I); when their first such auction arrives that
-- row is deleted (-D) and the joined one inserted (+I). The ON condition on the auction
-- side filters auctions before the join, the WHERE on the person side persons (both
-- sides are kept in state).
SET 'pipeline.name' = 'oregon-sellers-left-join';
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
  'path' = 'out/oregon-sellers-left-join',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT P.id, P.name, A.id AS auction
FROM person AS P LEFT JOIN auction AS A ON P.id = A.seller AND A.category = 10
WHERE P.state = 'OR';
