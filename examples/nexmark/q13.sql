-- Nexmark q13: every bid enriched with a row of a bounded side table. A processing-time
-- temporal join (Flink's lookup join): `FOR SYSTEM_TIME AS OF B.p_time` joins each bid
-- with the side table as it is when the bid arrives. The table is bounded and does not
-- change, so every subtask reads it whole when it starts and joins bids against it in
-- memory; bids are not kept, and no keyed state is used.
SET 'pipeline.name' = 'q13-side-input-join';
SET 'parallelism.default' = '2';

CREATE TABLE bid (
  p_time AS PROCTIME()
) WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42'
);

-- Flink's q13 reads side_input.txt from the file system; the generator's side_input
-- stream holds the same rows (key k, value 'k'). A file table works the same way:
-- 'connector' = 'file', 'format' = 'csv', 'schema.key' = 'int64', 'schema.value' = 'string'.
CREATE TABLE side_input WITH (
  'connector' = 'nexmark',
  'stream' = 'side_input',
  'events' = '10000'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q13-side-input-join',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT B.auction, B.bidder, B.price, B.date_time, S.`value`
FROM bid B
JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S
ON mod(B.auction, 10000) = S.key;
