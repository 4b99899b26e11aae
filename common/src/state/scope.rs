//! The current key and namespace that typed state handles read and write under.

use crate::key_group::key_group_of;

/// The key (with its key group) and namespace an access is scoped to, borrowed from the
/// caller so a batch of scopes costs no copies. The namespace is empty for state that is
/// not windowed; a window operator puts its window's encoding there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyScope<'a> {
    /// The key group of `key`.
    pub key_group: u16,
    /// The key's canonical bytes (see [`crate::key_group`]).
    pub key: &'a [u8],
    /// The namespace, e.g. an encoded window; empty when none.
    pub namespace: &'a [u8],
}

impl<'a> KeyScope<'a> {
    /// A scope with an explicit key group.
    pub fn new(key_group: u16, key: &'a [u8], namespace: &'a [u8]) -> Self {
        Self {
            key_group,
            key,
            namespace,
        }
    }

    /// A scope with no namespace.
    pub fn keyed(key_group: u16, key: &'a [u8]) -> Self {
        Self::new(key_group, key, &[])
    }

    /// A scope whose key group is computed from the key's canonical bytes.
    pub fn hashed(key: &'a [u8], namespace: &'a [u8], max_parallelism: u32) -> Self {
        Self::new(key_group_of(key, max_parallelism), key, namespace)
    }

    /// The same key under another namespace.
    pub fn with_namespace(self, namespace: &'a [u8]) -> Self {
        Self { namespace, ..self }
    }
}
