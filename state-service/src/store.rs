//! The durable tier: an [`ObjectStore`] and the root prefix built from the configured URL,
//! and the object names of a shard below it.
//!
//! What the URL means is `sluice-storage`'s: a local directory (`file:///abs/dir` or a
//! plain path, created if missing), `s3://bucket/prefix` (endpoint, region and
//! credentials from the URL's `?endpoint=...&region=...` or the usual AWS environment
//! variables), `gs://` or `azblob://`. Remote requests time out and are retried as
//! [`ObjectStoreClientConfig`] says, so an unreachable store fails a flush or commit
//! with `Unavailable` within seconds. Credentials are never logged or put in errors.
//! This module knows nothing about what the objects hold.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
pub use sluice_storage::child;
use sluice_storage::{ClientOptions, Store, StoreOptions};

use crate::config::ObjectStoreClientConfig;
use crate::error::{Error, Result};
use crate::shard_id::ShardKey;

/// Size of one part of a multipart upload, at most (S3's least is 5 MiB).
const PART_SIZE: usize = 8 << 20;
/// Size of one part of a multipart upload, at least.
const MIN_PART_SIZE: usize = 5 << 20;
/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;
/// Uploads at once without a memory share set.
const DEFAULT_UPLOADS: usize = 4;
/// Bytes read from a local file at a time while uploading it in parts.
const READ_CHUNK: usize = 1 << 20;

/// An object store and the prefix everything of this service lives under.
#[derive(Clone, Debug)]
pub struct Durable {
    store: Arc<dyn ObjectStore>,
    root: Path,
    display: String,
    uploads: Uploads,
}

/// What bounds the memory of uploads: each holds a permit while it runs, and about
/// three parts (the part being filled and those in flight).
#[derive(Clone, Debug)]
struct Uploads {
    permits: Arc<tokio::sync::Semaphore>,
    part: usize,
}

impl Uploads {
    /// Uploads sharing `memory` bytes: parts between 5 and 8 MiB, so that one upload
    /// fits, and as many uploads at once as fit (at least one, at most 16).
    fn within(memory: usize) -> Self {
        let part = (memory / (PARTS_IN_FLIGHT + 1)).clamp(MIN_PART_SIZE, PART_SIZE);
        let each = part * (PARTS_IN_FLIGHT + 1);
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new((memory / each).clamp(1, 16))),
            part,
        }
    }

    /// Objects bigger than this go in parts (smaller ones are held whole).
    fn threshold(&self) -> usize {
        2 * self.part
    }

    async fn permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.permits
            .acquire()
            .await
            .expect("the upload semaphore is never closed")
    }
}

impl Durable {
    /// Builds the store `url` names, with the default client timeouts and retries.
    pub fn from_url(url: &str) -> Result<Self> {
        Self::from_url_with(url, &ObjectStoreClientConfig::default())
    }

    /// Builds the store `url` names; a remote store times out and retries as `client`
    /// says.
    pub fn from_url_with(url: &str, client: &ObjectStoreClientConfig) -> Result<Self> {
        let options = StoreOptions {
            create_local_root: true,
            client: ClientOptions {
                connect_timeout: client.connect_timeout,
                request_timeout: client.request_timeout,
                max_retries: client.max_retries,
                retry_timeout: client.retry_timeout,
            },
            ..StoreOptions::default()
        };
        let store = Store::open(url, &options).map_err(|e| Error::Config(e.to_string()))?;
        Ok(Self {
            store: Arc::clone(store.store()),
            root: store.root().clone(),
            display: store.display().to_string(),
            uploads: Uploads::within(DEFAULT_UPLOADS * (PARTS_IN_FLIGHT + 1) * PART_SIZE),
        })
    }

    /// Bounds what uploads hold in memory at once to about `bytes` (one upload at
    /// least: about 15 MiB).
    pub fn with_upload_memory(mut self, bytes: usize) -> Self {
        self.uploads = Uploads::within(bytes);
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The URL-like form of the root, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// `<root>/jobs/<job>/shards/<start>-<end>`.
    pub fn shard_root(&self, shard: &ShardKey) -> Path {
        self.root
            .clone()
            .join("jobs")
            .join(shard.job.as_str())
            .join("shards")
            .join(format!("{}-{}", shard.start, shard.end))
    }

    /// Uploads `bytes` to `location` (multipart when big).
    pub async fn put(&self, location: &Path, bytes: Bytes) -> Result<()> {
        let what = format!("uploading {location}");
        if bytes.len() <= self.uploads.threshold() {
            self.store
                .put(location, PutPayload::from_bytes(bytes))
                .await
                .map_err(|e| Error::store(&what, e))?;
            return Ok(());
        }
        // The parts are copies: the caller's bytes stay held too. The permit comes first,
        // so an upload waiting for its turn has not opened a multipart upload yet.
        let _permit = self.uploads.permit().await;
        let upload = self
            .store
            .put_multipart(location)
            .await
            .map_err(|e| Error::store(&what, e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, self.uploads.part);
        for chunk in bytes.chunks(self.uploads.part) {
            writer
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| Error::store(&what, e))?;
            writer.write(chunk);
        }
        writer.finish().await.map_err(|e| Error::store(&what, e))?;
        Ok(())
    }

    /// Uploads the local file `path` to `location`, returning its size. Streamed: a
    /// small file is read whole (at most two parts), a bigger one goes in parts read one
    /// at a time, with at most [`PARTS_IN_FLIGHT`] parts uploading, so an upload holds
    /// about 3 parts (the one being filled and those in flight) of memory whatever the
    /// file's size; and only as many uploads run at once as the node's share allows.
    pub async fn put_file(&self, location: &Path, path: &std::path::Path) -> Result<u64> {
        use tokio::io::AsyncReadExt;
        let what = format!("uploading {location}");
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| Error::io(path, e))?;
        let len = file.metadata().await.map_err(|e| Error::io(path, e))?.len();
        let _permit = self.uploads.permit().await;
        if len <= self.uploads.threshold() as u64 {
            let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
            file.read_to_end(&mut bytes)
                .await
                .map_err(|e| Error::io(path, e))?;
            let len = bytes.len() as u64;
            self.put(location, Bytes::from(bytes)).await?;
            return Ok(len);
        }
        let upload = self
            .store
            .put_multipart(location)
            .await
            .map_err(|e| Error::store(&what, e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, self.uploads.part);
        let mut sent = 0u64;
        // The writer gathers reads into parts of its chunk size itself.
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            let n = match file.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    writer.abort().await.ok();
                    return Err(Error::io(path, e));
                }
            };
            writer
                .wait_for_capacity(PARTS_IN_FLIGHT)
                .await
                .map_err(|e| Error::store(&what, e))?;
            writer.write(&buf[..n]);
            sent += n as u64;
        }
        writer.finish().await.map_err(|e| Error::store(&what, e))?;
        Ok(sent)
    }

    /// Reads a whole object (for small ones: manifests).
    pub async fn get(&self, location: &Path) -> Result<Bytes> {
        let what = format!("reading {location}");
        let got = self
            .store
            .get(location)
            .await
            .map_err(|e| Error::store(&what, e))?;
        got.bytes().await.map_err(|e| Error::store(&what, e))
    }

    /// Downloads an object into the local file `path` (created or truncated), chunk by
    /// chunk as the store streams it; returns its size.
    pub async fn get_to_file(&self, location: &Path, path: &std::path::Path) -> Result<u64> {
        use tokio::io::AsyncWriteExt;
        let what = format!("reading {location}");
        let got = self
            .store
            .get(location)
            .await
            .map_err(|e| Error::store(&what, e))?;
        let mut stream = got.into_stream();
        let file = tokio::fs::File::create(path)
            .await
            .map_err(|e| Error::io(path, e))?;
        let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
        let mut len = 0u64;
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| Error::store(&what, e))?
        {
            out.write_all(&chunk)
                .await
                .map_err(|e| Error::io(path, e))?;
            len += chunk.len() as u64;
        }
        out.flush().await.map_err(|e| Error::io(path, e))?;
        Ok(len)
    }

    /// Every object below `prefix`.
    pub async fn list(&self, prefix: &Path) -> Result<Vec<Path>> {
        let what = format!("listing {prefix}");
        let metas: Vec<_> = self
            .store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(|e| Error::store(&what, e))?;
        Ok(metas.into_iter().map(|m| m.location).collect())
    }

    /// Deletes an object; a missing one is not an error.
    pub async fn delete(&self, location: &Path) -> Result<()> {
        match self.store.delete(location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store(&format!("deleting {location}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_make_the_directory_and_bad_urls_are_config_errors() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        let url = format!("file://{}", sub.display());
        let d = Durable::from_url(&url).unwrap();
        assert!(sub.is_dir());
        assert!(d.display().contains("a/b"));
        assert!(matches!(
            Durable::from_url("file://relative"),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            Durable::from_url("hdfs://namenode/x"),
            Err(Error::Config(m)) if m.contains("hdfs://namenode/x")
        ));
    }
}
