-- Nexmark q12: how many bids each bidder makes in each 10-second window of processing
-- time. `p_time AS PROCTIME()` in the table's column list is the wall clock when a bid
-- arrives; a window over it needs no watermark and fires when the clock passes its
-- end (and, for a bounded input, at its end). Which window a bid falls into depends on
-- when it is read, so two runs count the same bids in different windows.
SET 'pipeline.name' = 'q12-processing-time-windows';
SET 'parallelism.default' = '2';

CREATE TABLE bid (
  p_time AS PROCTIME()
) WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42',
  'max_events_per_second' = '100000'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q12-processing-time-windows',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT bidder, COUNT(*) AS bid_count, window_start, window_end
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(p_time), INTERVAL '10' SECOND))
GROUP BY bidder, window_start, window_end;
