//! Create-if-absent: the one conditional write.
//!
//! `PutMode::Create` on every backend: `If-None-Match: *` on S3 and Azure Blob (through
//! OpenDAL), a temporary file `link(2)`ed into place on a local directory. The object appears whole or not at all, and exactly
//! one of several concurrent writers of a name gets [`CreateOutcome::Created`].
//!
//! What a caller does with an ambiguous answer (a timeout, a retry that finds its own
//! earlier attempt's object) is the caller's protocol: the coordinator reads the object
//! back and compares bytes (`coordinator/src/checkpoint/store.rs`).

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};

/// What a [`create_if_absent`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The object did not exist; it now holds the bytes written.
    Created,
    /// An object of that name existed; nothing was written.
    AlreadyExists,
}

/// Writes `bytes` to `location` unless an object is there.
///
/// A store that cannot write conditionally answers
/// [`object_store::Error::NotImplemented`] or [`object_store::Error::NotSupported`];
/// every other error is the store's.
pub async fn create_if_absent(
    store: &dyn ObjectStore,
    location: &Path,
    bytes: Bytes,
) -> object_store::Result<CreateOutcome> {
    let opts = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match store
        .put_opts(location, PutPayload::from_bytes(bytes), opts)
        .await
    {
        Ok(_) => Ok(CreateOutcome::Created),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(CreateOutcome::AlreadyExists),
        Err(e) => Err(e),
    }
}
