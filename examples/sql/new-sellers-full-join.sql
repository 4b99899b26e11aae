-- Every person and every auction, paired where the person sells the auction, lives in
-- Oregon or Idaho, and opened it within a minute of joining: a FULL JOIN whose ON holds
-- conditions on both sides it keeps. Its result is updating: a person or an auction is
-- first written padded with nulls (+I); when the first pair of it passing all of ON
-- arrives, that row is deleted (-D) and the pair inserted (+I). A row no pair of passes
-- stays padded, once.
SET 'pipeline.name' = 'new-sellers-full-join';
SET 'parallelism.default' = '2';

CREATE TABLE auction WITH (
  'connector' = 'nexmark',
  'stream' = 'auction',
  'events' = '20000',
  'seed' = '42'
);

CREATE TABLE person WITH (
  'connector' = 'nexmark',
  'stream' = 'person',
  'events' = '5000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/new-sellers-full-join',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT P.id, P.state, A.id AS auction, A.category
FROM person AS P FULL JOIN auction AS A
ON P.id = A.seller AND P.state IN ('OR', 'ID')
AND A.date_time < P.date_time + INTERVAL '1' MINUTE;
