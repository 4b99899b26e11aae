//! What identifies a state: owning operator, name, and TTL.

use super::ttl::TtlConfig;

/// Names one state of one operator. Names must be unique per operator across all kinds of
/// state (a value and a map state with the same name would share keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDescriptor {
    /// The operator that owns the state (unique within the job).
    pub operator_id: u32,
    /// The state's name within its operator; at most `u16::MAX` bytes.
    pub name: String,
    /// Time to live of the state's values; `None` keeps them forever.
    pub ttl: Option<TtlConfig>,
}

impl StateDescriptor {
    /// A state without TTL.
    pub fn new(operator_id: u32, name: impl Into<String>) -> Self {
        Self {
            operator_id,
            name: name.into(),
            ttl: None,
        }
    }

    /// The same state with values expiring per `ttl`.
    pub fn with_ttl(mut self, ttl: TtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }
}
