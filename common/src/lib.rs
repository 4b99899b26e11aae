//! # sluice-common
//!
//! The vocabulary every Sluice process shares, and nothing that runs a job:
//!
//! - [`pb`]: the protobuf messages compiled from `common/proto/` (the [`pb::JobGraph`] and
//!   its parts). Generated types are used through this module only.
//! - [`aggregate_names`]: the names of aggregate functions a program registered, for the
//!   SQL front end.
//! - [`byte_size`]: byte sizes as people write them on command lines (`512MiB`, `1.5GB`).
//! - [`channel_state`]: the object format of an unaligned checkpoint's channel state
//!   (written by workers, kept by the coordinator beside `_metadata`).
//! - [`output`]: command output on stdout that ends quietly when the reader closes it.
//! - [`key_group`]: the stable key hash and the key-group ranges of DESIGN §4.
//! - [`process`]: this or another process's resident memory, threads and CPU time, from
//!   `/proc` (worker reports, the state service's memory line, benchmarks).
//! - [`rng`]: the seeded random-number generator (Nexmark's data, benchmarks, tests).
//! - [`state`]: keyed state: the tables operators hold, the subtask backend and job store
//!   traits with their epochs, the in-memory store, and the conformance suites.
//!
//! This crate must not know about Arrow, DataFusion, RocksDB, foyer, S3 or the network:
//! those belong to the crates that run things (`compute`, `state-service`).

pub mod aggregate_names;
pub mod byte_size;
pub mod channel_state;
pub mod key_group;
pub mod output;
pub mod process;
pub mod rng;
pub mod state;
pub mod tls;
pub mod url_list;

/// The largest message on the coordinator's control stream (either way): a checkpoint's
/// acknowledgement and a deployment carry an unaligned checkpoint's channel state.
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 1 << 30;

/// Protobuf messages of the job model, generated from `proto/job_graph.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/sluice.job.rs"));

    /// A checkpoint's `_metadata` message, generated from `proto/checkpoint.proto`.
    #[allow(missing_docs, clippy::all)]
    pub mod checkpoint {
        include!(concat!(env!("OUT_DIR"), "/sluice.checkpoint.rs"));
    }

    /// The keyed-state service's gRPC API, generated from `proto/state_service.proto`.
    #[allow(missing_docs, clippy::all)]
    pub mod state {
        include!(concat!(env!("OUT_DIR"), "/sluice.state.rs"));
    }

    /// Messages between the coordinator and its workers (the `Attach` stream) and state
    /// nodes (`AttachStateNode`), generated from `proto/cluster.proto`.
    pub mod cluster {
        include!(concat!(env!("OUT_DIR"), "/sluice.cluster.rs"));

        /// Version of the control protocol; a coordinator refuses workers and state
        /// nodes that speak another.
        pub const PROTOCOL_VERSION: u32 = 2;
    }

    impl node::Kind {
        /// Whether operators of this kind keep keyed state (windows, dedup, aggregates,
        /// Top-N, joins, OVER aggregates).
        pub fn keeps_state(&self) -> bool {
            matches!(
                self,
                Self::Window(_)
                    | Self::Dedup(_)
                    | Self::Aggregate(_)
                    | Self::TopN(_)
                    | Self::Join(_)
                    | Self::Over(_)
            )
        }
    }

    /// The path `cluster` uses for `sluice.job` types.
    #[doc(hidden)]
    pub mod job {
        pub use super::JobGraph;
    }
}

/// Number of key groups when a job does not say (DESIGN §4).
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;
