-- Nexmark q14: bids between 1.1 M and 55 M (in euros, 1 M to 50 M) with the part of
-- the day they were made in and how many times 'c' occurs in their extra field, by a
-- user-defined function registered in Rust. Run it with the program that registers
-- count_char (cli/examples/udf.rs):
--   cargo run -p sluice-cli --example udf -- run examples/nexmark/q14.sql
SET 'pipeline.name' = 'q14-count-char';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q14-count-char',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, 0.908 * price AS price,
       CASE
         WHEN HOUR(date_time) >= 8 AND HOUR(date_time) <= 18 THEN 'dayTime'
         WHEN HOUR(date_time) <= 6 OR HOUR(date_time) >= 20 THEN 'nightTime'
         ELSE 'otherTime'
       END AS bid_time_type,
       date_time, extra, count_char(extra, 'c') AS c_counts
FROM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000;
