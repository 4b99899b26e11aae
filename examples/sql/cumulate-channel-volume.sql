-- A cumulating window (Flink's CUMULATE): per channel, the bids and volume so far in
-- each 10-second window, reported every 2 seconds (windows [0, 2 s), [0, 4 s), ..
-- [0, 10 s), then [10 s, 12 s), ...), so a dashboard sees the running total without
-- waiting for the window to close.
SET 'pipeline.name' = 'cumulate-channel-volume';
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
  'path' = 'out/cumulate-channel-volume',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT channel, window_start, window_end, COUNT(*) AS bids, SUM(price) AS volume
FROM TABLE(CUMULATE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY channel, window_start, window_end;
