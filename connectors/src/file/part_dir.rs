//! The directory a file sink writes its parts into: listing names, making a hidden part
//! visible, deleting one.
//!
//! # Local
//!
//! Parts are files; [`PartDir::promote`] is `rename(2)`, which is atomic, and the
//! directory is synced after renames so that a stage change survives a machine crash.
//!
//! # S3
//!
//! An object store has no rename. A pending part is a complete object under its hidden
//! name; promoting copies it server-side to the visible name (one atomic `CopyObject`:
//! readers see the whole object or none) and then deletes the hidden one. Copy then
//! delete is idempotent: a crash between the two leaves both, and doing it again copies
//! the same bytes once more. `CopyObject` takes at most 5 GiB, which bounds one part.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use sluice_compute::error::{Error, Result};

/// Parts larger than this are uploaded in several requests.
const MULTIPART_THRESHOLD: usize = 32 * 1024 * 1024;

/// A local directory or an object-store prefix.
#[derive(Clone)]
pub enum PartDir {
    /// A local directory.
    Local(PathBuf),
    /// A prefix in an object store.
    Remote {
        /// The store.
        store: Arc<dyn ObjectStore>,
        /// The prefix (the sink's `path`).
        root: Path,
        /// How [`store::resolve`](crate::store::resolve) displays `root`.
        root_display: String,
    },
}

impl std::fmt::Debug for PartDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display(""))
    }
}

impl PartDir {
    /// `name` in this directory, for messages (the directory itself for `""`).
    pub fn display(&self, name: &str) -> String {
        match self {
            PartDir::Local(dir) if name.is_empty() => dir.display().to_string(),
            PartDir::Local(dir) => dir.join(name).display().to_string(),
            PartDir::Remote {
                root, root_display, ..
            } => {
                if name.is_empty() {
                    root_display.clone()
                } else {
                    crate::store::display_location(root_display, root, &self.location(name))
                }
            }
        }
    }

    /// The local path of `name` (`None` for an object store).
    pub fn local_path(&self, name: &str) -> Option<PathBuf> {
        match self {
            PartDir::Local(dir) => Some(dir.join(name)),
            PartDir::Remote { .. } => None,
        }
    }

    fn location(&self, name: &str) -> Path {
        match self {
            PartDir::Local(_) => Path::from(name),
            PartDir::Remote { root, .. } => root.clone().join(name),
        }
    }

    /// The names of the files directly in the directory, hidden ones included.
    pub async fn list(&self) -> Result<Vec<String>> {
        match self {
            PartDir::Local(dir) => {
                let io = |e| Error::io(dir.display().to_string(), e);
                let entries = match std::fs::read_dir(dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(io(e)),
                };
                let mut names = Vec::new();
                for entry in entries {
                    let entry = entry.map_err(io)?;
                    if let Some(name) = entry.file_name().to_str() {
                        names.push(name.to_owned());
                    }
                }
                Ok(names)
            }
            PartDir::Remote { store, root, .. } => {
                let prefix = (!root.as_ref().is_empty()).then_some(root);
                let listed = store.list_with_delimiter(prefix).await?;
                Ok(listed
                    .objects
                    .into_iter()
                    .filter_map(|meta| meta.location.filename().map(str::to_owned))
                    .collect())
            }
        }
    }

    /// Creates the empty file or object `name` (a marker), durably: a local file is
    /// synced with its directory.
    pub async fn touch(&self, name: &str) -> Result<()> {
        match self {
            PartDir::Local(dir) => {
                let path = dir.join(name);
                let io = |e| Error::io(path.display().to_string(), e);
                File::create(&path).and_then(|f| f.sync_all()).map_err(io)?;
                self.sync()
            }
            PartDir::Remote { .. } => self.upload(name, Vec::new()).await,
        }
    }

    /// Uploads `bytes` as the object `name` (object stores only).
    pub async fn upload(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let PartDir::Remote { store, .. } = self else {
            return Err(Error::Internal(format!(
                "upload of {} to a local directory",
                self.display(name)
            )));
        };
        let location = self.location(name);
        if bytes.len() <= MULTIPART_THRESHOLD {
            store.put(&location, PutPayload::from(bytes)).await?;
        } else {
            let mut upload = WriteMultipart::new(store.put_multipart(&location).await?);
            upload.put(bytes::Bytes::from(bytes));
            upload.finish().await?;
        }
        Ok(())
    }

    /// Moves the file `from` to `to` (visible to readers at once, whole), idempotently:
    /// when `from` is gone but `to` exists, the move already happened.
    pub async fn promote(&self, from: &str, to: &str) -> Result<()> {
        match self {
            PartDir::Local(dir) => {
                let (src, dst) = (dir.join(from), dir.join(to));
                match std::fs::rename(&src, &dst) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && dst.exists() => Ok(()),
                    Err(e) => Err(Error::io(src.display().to_string(), e)),
                }
            }
            PartDir::Remote { store, .. } => {
                let (src, dst) = (self.location(from), self.location(to));
                match store.copy(&src, &dst).await {
                    Ok(()) => {}
                    Err(object_store::Error::NotFound { .. }) if self.exists(to).await? => {
                        return Ok(());
                    }
                    Err(e) => return Err(e.into()),
                }
                self.delete(from).await
            }
        }
    }

    /// Deletes `name`; a file that is already gone is fine.
    pub async fn delete(&self, name: &str) -> Result<()> {
        match self {
            PartDir::Local(dir) => {
                let path = dir.join(name);
                match std::fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(Error::io(path.display().to_string(), e)),
                }
            }
            PartDir::Remote { store, .. } => match store.delete(&self.location(name)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Whether `name` exists.
    pub async fn exists(&self, name: &str) -> Result<bool> {
        match self {
            PartDir::Local(dir) => Ok(dir.join(name).exists()),
            PartDir::Remote { store, .. } => match store.head(&self.location(name)).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Makes the renames and deletions so far durable (local directories only; an object
    /// store's requests are durable when they return).
    pub fn sync(&self) -> Result<()> {
        if let PartDir::Local(dir) = self {
            let io = |e| Error::io(dir.display().to_string(), e);
            std::fs::File::open(dir)
                .map_err(io)?
                .sync_all()
                .map_err(io)?;
        }
        Ok(())
    }
}
