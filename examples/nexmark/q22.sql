-- Nexmark q22: the first three directories of each bid's URL (Flink's SPLIT_INDEX,
-- counting from 0; a piece that is not there is null).
SET 'pipeline.name' = 'q22-url-dirs';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42'
);

CREATE TABLE output WITH (
  'connector' = 'file',
  'path' = 'out/q22-url-dirs',
  'format' = 'jsonl'
);

INSERT INTO output
SELECT auction, bidder, price, channel,
       SPLIT_INDEX(url, '/', 3) AS dir1,
       SPLIT_INDEX(url, '/', 4) AS dir2,
       SPLIT_INDEX(url, '/', 5) AS dir3
FROM bid;
