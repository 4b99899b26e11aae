//! Keyed state (placeholder until the state module lands).
mod error;
pub use error::{StateError, StateResult};
