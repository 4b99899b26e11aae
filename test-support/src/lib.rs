//! # sluice-test-support
//!
//! What the workspace's tests share, so that no test crate keeps its own copy:
//!
//! - [`s3`]: the S3 server of the test services (`scripts/test-services.sh start`): its
//!   settings from the environment, a prefix of its own per test, a store on it, and
//!   removing what a test wrote. A test that needs S3 and finds none fails, saying how
//!   to start the services, unless `SLUICE_SKIP_S3=1` asks to skip it loudly.
//! - [`azure`]: the same for the Azure Blob emulator (Azurite): its settings, a prefix
//!   per test; `SLUICE_SKIP_AZURE=1` skips loudly.
//! - [`kafka`]: the Kafka broker (tansu): its address, topics of a test's own, and
//!   records written to a chosen partition; `SLUICE_SKIP_KAFKA=1` skips loudly.
//! - [`rng`]: the workspace's seeded generator with its seed taken from the environment,
//!   so a failing randomized test can be replayed.
//!
//! A dev-dependency only: no production crate may depend on it. It must not know what
//! any test checks.

pub mod azure;
pub mod kafka;
pub mod otlp;
pub mod rng;
pub mod s3;
mod service_env;
