//! Object stores named by URL, and the one conditional write Sluice relies on.
//!
//! # What this crate owns
//!
//! - [`Store::open`]: the mapping from a user-written URL to an
//!   [`object_store::ObjectStore`] and a root inside it. Every crate that
//!   keeps objects (the file connectors, the state service's durable tier, the
//!   coordinator's checkpoint metadata) goes through it, so a URL means the same thing
//!   everywhere:
//!
//!   | URL | backend |
//!   |---|---|
//!   | `/abs/dir`, `rel/dir`, `file:///abs/dir` | the local file system (object_store's `LocalFileSystem`) |
//!   | `s3://bucket/prefix` (`s3a://` too) | S3 or an S3-compatible server, through OpenDAL |
//!   | `azblob://container/prefix` | Azure Blob Storage, through OpenDAL |
//!
//!   `gs://` is refused: see [`url`] for why.
//!
//!   Settings come from the URL's query (`?endpoint=...&region=...`, see [`url`]), then
//!   [`StoreOptions`], then the usual environment variables of each cloud; credentials
//!   never come from the URL and never reach a message or a log.
//! - [`create_if_absent`]: write an object only if no object has that name, atomically,
//!   with the whole content visible at once. The checkpoint commit protocol's fencing
//!   rests on it (`coordinator/src/checkpoint/store.rs`).
//!
//! # What it must not know
//!
//! What the objects hold (checkpoints, shards, part files), job specs or protos: callers
//! translate their own settings into [`StoreOptions`] and their own errors from
//! [`Error`].
//!
//! # Why two implementations behind one trait
//!
//! DataFusion, Parquet and the rest of Sluice speak object_store 0.13's `ObjectStore`
//! trait. Remote stores are OpenDAL operators seen through `object_store_opendal` 0.58,
//! the adapter release that implements object_store 0.13 (0.59 moved to 0.14). Local
//! directories stay object_store's `LocalFileSystem`: OpenDAL's `fs` service creates a
//! file with `O_EXCL` and then writes it, so a reader can see a created but still empty
//! `_metadata`, or (with its atomic-write directory) checks for the name and then renames
//! over it, which two writers can both pass. `LocalFileSystem` writes a temporary file
//! and `link(2)`s it into place, which is atomic and fails when the name exists.
//! See [`backend`] for how each is built.

pub mod backend;
mod create;
pub mod error;
pub mod options;
pub mod url;

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;

pub use crate::create::{CreateOutcome, create_if_absent};
pub use crate::error::{Error, Result};
pub use crate::options::{ClientOptions, StoreOptions};
pub use crate::url::{Scheme, StoreUrl, local_path};

/// An object store and the root prefix a URL named inside it.
#[derive(Clone, Debug)]
pub struct Store {
    store: Arc<dyn ObjectStore>,
    root: Path,
    display: String,
    scheme: Scheme,
}

impl Store {
    /// Builds the store `url` names (see the crate documentation for the schemes).
    ///
    /// Local roots are absolute (a relative path is taken from the current directory)
    /// and created when [`StoreOptions::create_local_root`] says so. Nothing is sent
    /// over the network here: a wrong endpoint or missing bucket shows at the first
    /// request.
    pub fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        let parsed = StoreUrl::parse(url)?;
        let store = backend::build(&parsed, options)?;
        Ok(Self {
            store,
            root: parsed.root.clone(),
            display: parsed.display(),
            scheme: parsed.scheme,
        })
    }

    /// Uses `store` as it is, everything below `root` (tests, in-memory stores).
    pub fn from_parts(store: Arc<dyn ObjectStore>, root: Path, display: String) -> Self {
        Self {
            store,
            root,
            display,
            scheme: Scheme::Local,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix the URL named (for a local path: the absolute directory, without its
    /// leading `/`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The URL-like form of the root, for messages (`s3://bucket/prefix`, `/abs/dir`).
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Which kind of store this is.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The object `rel` (slash-separated, empty parts skipped) below the root.
    pub fn child(&self, rel: &str) -> Path {
        child(&self.root, rel)
    }

    /// The display form of `location`, an object below the root.
    pub fn display_location(&self, location: &Path) -> String {
        let scheme_root = self
            .display
            .strip_suffix(self.root.as_ref())
            .unwrap_or(&self.display);
        let scheme_root = scheme_root.strip_suffix('/').unwrap_or(scheme_root);
        format!("{scheme_root}/{location}")
    }
}

/// The object `rel` (slash-separated, empty parts skipped) below `root`.
pub fn child(root: &Path, rel: &str) -> Path {
    rel.split('/')
        .filter(|p| !p.is_empty())
        .fold(root.clone(), |p, part| p.join(part))
}
