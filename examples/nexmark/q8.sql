-- Nexmark q8: people who created an auction in the same 10 s window in which they
-- registered. Each side is grouped per window first (a window aggregate without
-- aggregate functions emits each group once, when its window closes); the two
-- results are joined on the person, the window start and the window end.
SET 'pipeline.name' = 'q8-new-users';
SET 'parallelism.default' = '2';

CREATE TABLE person (
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'stream' = 'person',
  'events' = '20000',
  'seed' = '42',
  'max_out_of_orderness' = '2s'
);

CREATE TABLE auction (
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND
) WITH (
  'connector' = 'nexmark',
  'stream' = 'auction',
  'events' = '60000',
  'seed' = '42',
  'max_out_of_orderness' = '2s'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q8-new-users',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT P.id, P.name, P.starttime
FROM (
  SELECT id, name, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
  GROUP BY id, name, window_start, window_end
) P
JOIN (
  SELECT seller, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
  GROUP BY seller, window_start, window_end
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime;
