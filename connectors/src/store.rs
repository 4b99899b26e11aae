//! Resolving a user-written path or URL to an object store and a location in it.
//!
//! This module owns the mapping from `s3://bucket/prefix`, `file:///abs` and plain paths
//! to an [`ObjectStore`], and the listing rule for "directories" (every object below the
//! prefix, sorted, hidden files skipped). It must not know about file formats: the file
//! source and sink decide what the bytes mean.
//!
//! Credentials come from the job's [`pb::ObjectStoreConfig`] or the environment
//! (`AWS_ACCESS_KEY_ID` ...); they are never logged or put in error messages.

use std::path::{Component, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use sluice_common::pb;

use sluice_compute::error::{Error, Result};

/// Resolves `path` to a store, the location inside it, and a display form for messages.
///
/// `s3://bucket/prefix` uses S3 (endpoint, region and credentials from `cfg` or the
/// environment); `file:///abs` and plain paths use the local file system, relative paths
/// being taken from the current directory.
pub fn resolve(
    path: &str,
    cfg: Option<&pb::ObjectStoreConfig>,
) -> Result<(Arc<dyn ObjectStore>, Path, String)> {
    if let Some(local) = local_path(path)? {
        let location = Path::from_absolute_path(&local).map_err(|e| {
            Error::Plan(format!("cannot use local path '{}': {e}", local.display()))
        })?;
        let display = format!("/{location}");
        return Ok((Arc::new(LocalFileSystem::new()), location, display));
    }
    let url = url::Url::parse(path)
        .map_err(|e| Error::Plan(format!("cannot parse '{path}' as a URL: {e}")))?;
    match url.scheme() {
        "s3" | "s3a" => {
            let bucket = url
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| Error::Plan(format!("'{path}' names no bucket (s3://bucket/...)")))?
                .to_string();
            let location = Path::from_url_path(url.path())
                .map_err(|e| Error::Plan(format!("invalid object key in '{path}': {e}")))?;
            let store = s3_store(&bucket, cfg)?;
            let display = format!("s3://{bucket}/{location}");
            Ok((store, location, display))
        }
        other => Err(Error::Plan(format!(
            "unsupported scheme '{other}' in path '{path}': use a local path, file:// or s3://"
        ))),
    }
}

/// The absolute local path `path` names, or `None` when it is a URL of another scheme.
pub fn local_path(path: &str) -> Result<Option<PathBuf>> {
    let raw = if let Some(rest) = path.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(Error::Plan(format!(
                "'{path}' is not an absolute file URL (use file:///absolute/path)"
            )));
        }
        let url = url::Url::parse(path)
            .map_err(|e| Error::Plan(format!("cannot parse '{path}' as a URL: {e}")))?;
        url.to_file_path()
            .map_err(|()| Error::Plan(format!("'{path}' is not a local file URL")))?
    } else if has_scheme(path) {
        return Ok(None);
    } else {
        PathBuf::from(path)
    };
    let absolute = if raw.is_absolute() {
        raw
    } else {
        std::env::current_dir()
            .map_err(|e| Error::io(".", e))?
            .join(raw)
    };
    Ok(Some(normalize(&absolute)))
}

/// The display form of `location`, a child of the `root` that [`resolve`] displayed as
/// `root_display`.
pub fn display_location(root_display: &str, root: &Path, location: &Path) -> String {
    let scheme_root = root_display
        .strip_suffix(root.as_ref())
        .unwrap_or(root_display);
    format!("{scheme_root}{location}")
}

/// Every object at or below `prefix`, sorted by location, skipping hidden files.
///
/// When `prefix` names an object itself, that object alone is returned. A file is hidden
/// when its name, or a directory between `prefix` and it, starts with `.` or `_`.
pub async fn list_files(store: &dyn ObjectStore, prefix: &Path) -> Result<Vec<ObjectMeta>> {
    if !prefix.as_ref().is_empty() {
        match store.head(prefix).await {
            Ok(meta) => return Ok(vec![meta]),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let listed: Vec<ObjectMeta> = store.list(Some(prefix)).try_collect().await?;
    let mut files: Vec<ObjectMeta> = listed
        .into_iter()
        .filter(|meta| !is_hidden(prefix, &meta.location))
        .collect();
    files.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(files)
}

fn is_hidden(prefix: &Path, location: &Path) -> bool {
    match location.prefix_match(prefix) {
        Some(mut rest) => rest.any(|part| {
            let part = part.as_ref();
            part.starts_with('.') || part.starts_with('_')
        }),
        None => false,
    }
}

fn has_scheme(path: &str) -> bool {
    match path.find("://") {
        Some(i) => {
            let scheme = &path[..i];
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

/// Removes `.` and resolves `..` lexically (the path may not exist yet).
fn normalize(path: &std::path::Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn s3_store(bucket: &str, cfg: Option<&pb::ObjectStoreConfig>) -> Result<Arc<dyn ObjectStore>> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let cfg = cfg.cloned().unwrap_or_default();
    if !cfg.endpoint.is_empty() {
        builder = builder.with_endpoint(&cfg.endpoint);
    }
    if !cfg.region.is_empty() {
        builder = builder.with_region(&cfg.region);
    } else if builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .is_none()
    {
        let region = builder
            .get_config_value(&AmazonS3ConfigKey::DefaultRegion)
            .unwrap_or_else(|| "us-east-1".to_string());
        builder = builder.with_region(region);
    }
    let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
    let plain_http = endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"));
    if cfg.allow_http || plain_http {
        builder = builder.with_allow_http(true);
    }
    if !cfg.access_key_id.is_empty() {
        builder = builder.with_access_key_id(&cfg.access_key_id);
    }
    if !cfg.secret_access_key.is_empty() {
        builder = builder.with_secret_access_key(&cfg.secret_access_key);
    }
    let store = builder
        .build()
        .map_err(|e| Error::Plan(format!("cannot configure S3 for bucket '{bucket}': {e}")))?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_file_paths_are_local_and_absolute() {
        let (_, loc, display) = resolve("/tmp/a/./b/../c", None).unwrap();
        assert_eq!(loc.as_ref(), "tmp/a/c");
        assert_eq!(display, "/tmp/a/c");
        let (_, loc, _) = resolve("file:///tmp/x%20y/z", None).unwrap();
        assert_eq!(loc.as_ref(), "tmp/x y/z");
        let (_, loc, _) = resolve("rel/dir", None).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(format!("/{loc}"), cwd.join("rel/dir").to_str().unwrap());
    }

    #[test]
    fn s3_urls_name_bucket_and_key() {
        let cfg = pb::ObjectStoreConfig {
            endpoint: "http://localhost:9000".into(),
            access_key_id: "k".into(),
            secret_access_key: "SECRETVALUE".into(),
            ..Default::default()
        };
        let (store, loc, display) = resolve("s3://bucket/some/prefix/", Some(&cfg)).unwrap();
        assert_eq!(loc.as_ref(), "some/prefix");
        assert_eq!(display, "s3://bucket/some/prefix");
        assert!(!store.to_string().contains("SECRETVALUE"));
        let child = Path::from("some/prefix/part-0.csv");
        assert_eq!(
            display_location(&display, &loc, &child),
            "s3://bucket/some/prefix/part-0.csv"
        );
    }

    #[test]
    fn unknown_schemes_are_plan_errors_naming_the_path() {
        let err = resolve("gs://bucket/x", None).unwrap_err();
        assert!(
            matches!(err, Error::Plan(ref m) if m.contains("gs://bucket/x")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn listing_sorts_and_skips_hidden_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "b.csv",
            "a.csv",
            ".hidden",
            "_SUCCESS",
            "sub/c.csv",
            "_tmp/d.csv",
        ] {
            let p = dir.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let (store, root, display) = resolve(dir.path().to_str().unwrap(), None).unwrap();
        let files = list_files(store.as_ref(), &root).await.unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|m| display_location(&display, &root, &m.location))
            .collect();
        let base = dir.path().to_str().unwrap();
        assert_eq!(
            names,
            vec![
                format!("{base}/a.csv"),
                format!("{base}/b.csv"),
                format!("{base}/sub/c.csv")
            ]
        );
        // A file path lists as itself.
        let (store, one, _) = resolve(&format!("{base}/b.csv"), None).unwrap();
        let files = list_files(store.as_ref(), &one).await.unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            store
                .get(&files[0].location)
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
            "x"
        );
    }
}
