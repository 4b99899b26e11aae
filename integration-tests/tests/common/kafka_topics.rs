//! Kafka topics for the end-to-end tests that read them (`kafka.rs`, `coordinator.rs`):
//! a topic loaded with `sluice kafka produce`, and single records in a chosen partition.
//!
//! tansu reports a partition's end as the first offset of its last record batch plus
//! one (see `sluice_test_support::kafka`): after a batched load, each partition gets one
//! last record in a batch of its own, so that `bounded: latest` ends where the data
//! does.

use std::path::Path;

use sluice_integration_tests::run_sluice;
use sluice_test_support::kafka::KafkaEnv;

/// A bid as the Nexmark JSON records have it, for the last record of a partition.
pub fn bid(auction: i64, ms: i64) -> String {
    format!(
        r#"{{"auction":{auction},"bidder":1,"price":100,"channel":"x","url":"u","date_time":"{}","extra":""}}"#,
        sluice_integration_tests::format_timestamp_ms(ms)
    )
}

/// Loads `events` Nexmark bids into a new 4-partition topic, then one last bid per
/// partition (in a batch of its own; see the module doc).
pub fn load(env: &KafkaEnv, dir: &Path, name: &str, events: u64) -> String {
    let topic = env.topic(name);
    env.create_topic_blocking(&topic, 4);
    run_sluice(
        &[
            "kafka",
            "produce",
            "--brokers",
            &env.brokers,
            "--topic",
            &topic,
            "--from-nexmark",
            "--events",
            &events.to_string(),
            "--seed",
            "11",
        ],
        dir,
    )
    .assert_success()
    .assert_stderr_contains(&format!("wrote {events} events"));
    for p in 0..4 {
        let last = bid(1000 + p as i64, 1_436_918_400_000 + 3_600_000);
        env.produce(&topic, p, &[(None, last.as_str())]);
    }
    topic
}
