-- Nexmark q11 (user sessions): for each bidder, sessions of activity that end after 10
-- seconds without a bid; the number of bids in each session and the times of its first
-- and last bid. The SQL twin of examples/q11-user-sessions.yaml.
SET 'pipeline.name' = 'q11-user-sessions';
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
  'path' = 'out/q11-user-sessions',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT bidder, window_start, window_end, COUNT(*) AS bids,
       MIN(date_time) AS first_bid, MAX(date_time) AS last_bid
FROM TABLE(SESSION(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
