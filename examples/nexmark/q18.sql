-- Nexmark q18: the last bid of every bidder on every auction (deduplication keeping
-- the latest row: ROW_NUMBER() ordered by time, descending, bounded to 1). A later bid
-- replaces the one kept: the output is a changelog of deletes (op -D) and inserts (+I).
SET 'pipeline.name' = 'q18-last-bid';
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
  'path' = 'out/q18-last-bid',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, price, channel, url, date_time, extra
FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC)
    AS rank_number
  FROM bid
)
WHERE rank_number <= 1;
