-- Nexmark q15: per day, how many bids, distinct bidders and distinct auctions there
-- were, in total and per price band (COUNT(DISTINCT ...) with FILTER (WHERE ...)). An
-- unbounded GROUP BY: the output is a changelog (op +I, then -U/+U per change).
SET 'pipeline.name' = 'q15-daily-stats';
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
  'path' = 'out/q15-daily-stats',
  'format' = 'jsonl'
);

-- Flink's q15 groups by DATE_FORMAT(dateTime, 'yyyy-MM-dd'); Sluice groups by
-- columns, so the day is computed first.
CREATE VIEW bid_day AS
SELECT auction, bidder, price, DATE_FORMAT(date_time, 'yyyy-MM-dd') AS day FROM bid;

INSERT INTO output
SELECT day,
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
FROM bid_day
GROUP BY day;
