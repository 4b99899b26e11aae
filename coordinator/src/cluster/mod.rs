//! The coordinator's side of its workers and state nodes: who is attached
//! ([`registry`], [`state_nodes`]) and the gRPC control API they attach through
//! ([`grpc`]).

pub mod grpc;
pub mod registry;
pub mod state_nodes;
