//! The Kafka broker of the test services, as the tests that need it see it.
//!
//! `scripts/test-services.sh start` exports `SLUICE_TEST_KAFKA` (`host:port` of a tansu
//! broker). Without it a Kafka test fails, saying how to start the services, unless
//! `SLUICE_SKIP_KAFKA=1` asks to skip it loudly. Each test makes topics of its own
//! ([`KafkaEnv::topic`]); the broker keeps them in memory until it stops.
//!
//! tansu 0.6 reports a partition's end (high watermark) as the first offset of its last
//! record batch plus one, which is the true end only when batches hold one record:
//! [`KafkaEnv::produce`] writes so, and tests that read what a batching producer wrote
//! read until they have what they expect instead of to the end.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::s3::unique_prefix;
use crate::service_env::{Service, service_env};

/// The broker and a name prefix for one test's topics.
#[derive(Debug, Clone)]
pub struct KafkaEnv {
    /// `host:port` of the broker.
    pub brokers: String,
    prefix: String,
}

/// The broker's settings for `test`; `None` (after a loud message saying that `what` is
/// not tested) when `SLUICE_SKIP_KAFKA=1`.
///
/// # Panics
/// When the test services are not configured and skipping was not asked for.
pub fn kafka_env(test: &str, what: &str) -> Option<KafkaEnv> {
    let service = Service {
        label: "Kafka",
        endpoint_var: "SLUICE_TEST_KAFKA",
        skip_var: "SLUICE_SKIP_KAFKA",
        start_hint: "(scripts/test does this)",
        required: &[],
    };
    let (brokers, _) = service_env(&service, test, what)?;
    let prefix = unique_prefix(test).replace(['/', '_'], "-");
    Some(KafkaEnv { brokers, prefix })
}

impl KafkaEnv {
    /// A topic name no other test or run uses.
    pub fn topic(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// Creates `topic` with `partitions` partitions.
    ///
    /// # Panics
    /// When the broker refuses.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .expect("a Kafka admin client");
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let results = admin
            .create_topics(
                [&new],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create_topics");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
        }
    }

    /// [`KafkaEnv::create_topic`] for tests without a runtime of their own.
    ///
    /// # Panics
    /// When the broker refuses.
    pub fn create_topic_blocking(&self, topic: &str, partitions: i32) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(self.create_topic(topic, partitions));
    }

    /// The offsets `group` committed for partitions `0..partitions` of `topic` (-1 where
    /// none).
    ///
    /// # Panics
    /// When the broker does not answer within 10 s.
    pub fn committed(&self, topic: &str, group: &str, partitions: i32) -> Vec<i64> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .create()
            .expect("a Kafka consumer");
        let mut list = rdkafka::TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(topic, p);
        }
        let found = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("reading {group}'s offsets: {e}"));
        (0..partitions)
            .map(
                |p| match found.find_partition(topic, p).map(|e| e.offset()) {
                    Some(rdkafka::Offset::Offset(o)) => o,
                    _ => -1,
                },
            )
            .collect()
    }

    /// The values of `topic` (partitions `0..partitions`) from the start: read until at
    /// least `at_least` came and then nothing more for two seconds, or `limit` passed.
    pub fn read_values(
        &self,
        topic: &str,
        partitions: i32,
        at_least: usize,
        limit: Duration,
    ) -> Vec<String> {
        use rdkafka::Message;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", "sluice-test-reader")
            .set("fetch.wait.max.ms", "10")
            .create()
            .expect("a Kafka consumer");
        let mut list = rdkafka::TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
                .expect("assignment");
        }
        consumer.assign(&list).expect("assign");
        let started = std::time::Instant::now();
        let mut last = std::time::Instant::now();
        let mut values = Vec::new();
        while started.elapsed() < limit
            && (values.len() < at_least || last.elapsed() < Duration::from_secs(2))
        {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
                values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
                last = std::time::Instant::now();
            }
        }
        values
    }

    /// Writes `records` (key, value) to `partition` of `topic` and waits until the
    /// broker has them.
    ///
    /// # Panics
    /// When a record is not delivered within 30 s.
    pub fn produce(&self, topic: &str, partition: i32, records: &[(Option<&str>, &str)]) {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("linger.ms", "5")
            // tansu answers a partition's end offset as its last batch's first offset
            // plus one: with one record per batch that is the true end, which bounded
            // reads stop at.
            .set("batch.num.messages", "1")
            .create()
            .expect("a Kafka producer");
        for (key, value) in records {
            let mut record = BaseRecord::<str, str>::to(topic)
                .partition(partition)
                .payload(*value);
            if let Some(key) = key {
                record = record.key(*key);
            }
            let mut record = Some(record);
            for _ in 0..1000 {
                match producer.send(record.take().expect("record")) {
                    Ok(()) => break,
                    Err((e, back)) => {
                        assert!(
                            matches!(
                                e,
                                rdkafka::error::KafkaError::MessageProduction(
                                    rdkafka::types::RDKafkaErrorCode::QueueFull
                                )
                            ),
                            "producing to {topic}: {e}"
                        );
                        record = Some(back);
                        producer.poll(Duration::from_millis(10));
                    }
                }
            }
        }
        producer
            .flush(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("flushing records to {topic}: {e}"));
    }
}
