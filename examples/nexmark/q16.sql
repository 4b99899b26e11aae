-- Nexmark q16: per channel and day, how many bids, distinct bidders and distinct
-- auctions there were, in total and per price band, and the minute of the day's last
-- bid. An unbounded GROUP BY of a column and an expression (the day): the output is a
-- changelog (op +I, then -U/+U per change).
SET 'pipeline.name' = 'q16-channel-daily-stats';
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
  'path' = 'out/q16-channel-daily-stats',
  'format' = 'jsonl'
);

-- Flink's q16 takes MAX(DATE_FORMAT(date_time, 'HH:mm')); within one day that is the
-- minute of the day's last bid, and Sluice's MAX takes numbers and times, not text.
CREATE VIEW channel_days AS
SELECT channel,
       DATE_FORMAT(date_time, 'yyyy-MM-dd') AS day,
       MAX(date_time) AS last_bid,
       COUNT(*) AS total_bids,
       COUNT(*) FILTER (WHERE price < 10000) AS rank1_bids,
       COUNT(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       COUNT(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
       COUNT(DISTINCT bidder) AS total_bidders,
       COUNT(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
       COUNT(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
       COUNT(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
       COUNT(DISTINCT auction) AS total_auctions,
       COUNT(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
       COUNT(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
       COUNT(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions
FROM bid
GROUP BY channel, DATE_FORMAT(date_time, 'yyyy-MM-dd');

INSERT INTO output
SELECT channel, day, DATE_FORMAT(last_bid, 'HH:mm') AS minute, total_bids, rank1_bids,
       rank2_bids, rank3_bids, total_bidders, rank1_bidders, rank2_bidders, rank3_bidders,
       total_auctions, rank1_auctions, rank2_auctions, rank3_auctions
FROM channel_days;
