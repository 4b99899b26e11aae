//! The coordinator's side of its workers: who is attached ([`registry`]) and the gRPC
//! control API they attach through ([`grpc`]).

pub mod grpc;
pub mod registry;
