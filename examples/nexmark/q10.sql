-- Nexmark q10: every bid written to files partitioned by its day and minute, as
-- Flink's q10 writes a file table PARTITIONED BY (dt, hm): a directory per value,
-- out/q10-partitioned-files/dt=2015-07-15/hm=00%3A01/part-*.csv (a ':' in a value is
-- escaped as %3A, as Hive and Flink escape it). The partition columns are in the path,
-- not in the files. With checkpoints, every directory's part is committed in two
-- phases, as an unpartitioned file table's.
SET 'pipeline.name' = 'q10-partitioned-files';
SET 'parallelism.default' = '2';

CREATE TABLE bid WITH (
  'connector' = 'nexmark',
  'stream' = 'bid',
  'events' = '1000000',
  'seed' = '42'
);

CREATE TABLE output PARTITIONED BY (dt, hm) WITH (
  'connector' = 'file',
  'path' = 'out/q10-partitioned-files',
  'format' = 'csv'
);

INSERT INTO output
SELECT auction, bidder, price, date_time, extra,
       DATE_FORMAT(date_time, 'yyyy-MM-dd') AS dt,
       DATE_FORMAT(date_time, 'HH:mm') AS hm
FROM bid;
