//! The dead-letter output of a file source subtask: bad records with where they came from.
//!
//! Subtask `i` writes `<dead_letter_path>/bad-<i>.txt`, one line per bad record:
//! `<file>:<line>: <error>: <raw record>`. Locally the file is created at the first bad
//! record and written through at once; on S3 the lines are buffered and the object is
//! uploaded by [`DeadLetter::finish`].

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sluice_common::pb;

use crate::store;
use sluice_compute::error::{Error, Result};

enum Target {
    Local {
        path: std::path::PathBuf,
        file: Option<std::io::BufWriter<std::fs::File>>,
    },
    Remote {
        store: Arc<dyn ObjectStore>,
        location: Path,
        buffer: Vec<u8>,
        dirty: bool,
    },
}

/// Where one subtask's bad records go.
pub struct DeadLetter {
    target: Target,
    display: String,
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetter")
            .field("display", &self.display)
            .finish_non_exhaustive()
    }
}

impl DeadLetter {
    /// The output of `subtask` under the directory or URL `dir`.
    pub fn new(dir: &str, cfg: Option<&pb::ObjectStoreConfig>, subtask: usize) -> Result<Self> {
        if dir.is_empty() {
            return Err(Error::Plan(
                "on_error: dead_letter needs a dead_letter_path (a directory or s3:// URL)".into(),
            ));
        }
        let name = format!("bad-{subtask}.txt");
        if let Some(local) = store::local_path(dir)? {
            let path = local.join(&name);
            let display = path.display().to_string();
            return Ok(DeadLetter {
                target: Target::Local { path, file: None },
                display,
            });
        }
        let (store, root, root_display) = store::resolve(dir, cfg)?;
        let location = root.clone().join(name.as_str());
        let display = store::display_location(&root_display, &root, &location);
        let target = Target::Remote {
            store,
            location,
            buffer: Vec::new(),
            dirty: false,
        };
        Ok(DeadLetter { target, display })
    }

    /// Where the bad records go, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Records one bad record found at `location` (`file:line`).
    pub fn write(&mut self, location: &str, message: &str, raw: &[u8]) -> Result<()> {
        let message = message.replace(['\n', '\r'], " ");
        let raw = String::from_utf8_lossy(raw);
        let line = format!("{location}: {message}: {raw}\n");
        match &mut self.target {
            Target::Local { path, file } => {
                let io = |e| Error::io(path.display().to_string(), e);
                if file.is_none() {
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent).map_err(io)?;
                    }
                    *file = Some(std::io::BufWriter::new(
                        std::fs::File::create(&*path).map_err(io)?,
                    ));
                }
                let f = file.as_mut().expect("opened above");
                f.write_all(line.as_bytes()).map_err(io)?;
                f.flush().map_err(io)
            }
            Target::Remote { buffer, dirty, .. } => {
                buffer.extend_from_slice(line.as_bytes());
                *dirty = true;
                Ok(())
            }
        }
    }

    /// Makes everything written so far durable (uploads the object on S3).
    pub async fn finish(&mut self) -> Result<()> {
        match &mut self.target {
            Target::Local { path, file } => match file.as_mut() {
                Some(f) => f
                    .flush()
                    .map_err(|e| Error::io(path.display().to_string(), e)),
                None => Ok(()),
            },
            Target::Remote {
                store,
                location,
                buffer,
                dirty,
            } => {
                if *dirty {
                    let payload = PutPayload::from(Bytes::from(buffer.clone()));
                    store.put(location, payload).await?;
                    *dirty = false;
                }
                Ok(())
            }
        }
    }
}
