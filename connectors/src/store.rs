//! Resolving a user-written path or URL to an object store and a location in it, and
//! the listing rule for "directories".
//!
//! What a URL means is `sluice-storage`'s (local paths, `file://`, `s3://`, `gs://`,
//! `azblob://`); this module adds the job's own store settings ([`pb::ObjectStoreConfig`])
//! and the listing rule (every object below the prefix, sorted, hidden files skipped).
//! It must not know about file formats: the file source and sink decide what the bytes
//! mean. Credentials are never logged or put in error messages.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use sluice_common::pb;
use sluice_storage::{Store, StoreOptions};

use sluice_compute::error::{Error, Result};

/// Resolves `path` to a store, the location inside it, and a display form for messages.
///
/// Remote stores take endpoint, region and credentials from `cfg`, else from the URL's
/// query and the environment; local paths are absolute (relative ones are taken from the
/// current directory).
pub fn resolve(
    path: &str,
    cfg: Option<&pb::ObjectStoreConfig>,
) -> Result<(Arc<dyn ObjectStore>, Path, String)> {
    let store = Store::open(path, &options(cfg)).map_err(|e| Error::Plan(e.to_string()))?;
    Ok((
        Arc::clone(store.store()),
        store.root().clone(),
        store.display().to_string(),
    ))
}

/// The job's store settings as `sluice-storage` takes them (empty fields: not set).
fn options(cfg: Option<&pb::ObjectStoreConfig>) -> StoreOptions {
    let set = |v: &str| Some(v.to_string()).filter(|v| !v.is_empty());
    let cfg = cfg.cloned().unwrap_or_default();
    // `allow_http` needs no setting: an `http://` endpoint is used as written.
    StoreOptions {
        endpoint: set(&cfg.endpoint),
        region: set(&cfg.region),
        access_key_id: set(&cfg.access_key_id),
        secret_access_key: set(&cfg.secret_access_key),
        ..StoreOptions::default()
    }
}

/// The absolute local path `path` names, or `None` when it is a URL of another scheme.
pub fn local_path(path: &str) -> Result<Option<std::path::PathBuf>> {
    sluice_storage::local_path(path).map_err(|e| Error::Plan(e.to_string()))
}

/// The display form of `location`, a child of the `root` that [`resolve`] displayed as
/// `root_display`.
pub fn display_location(root_display: &str, root: &Path, location: &Path) -> String {
    let scheme_root = root_display
        .strip_suffix(root.as_ref())
        .unwrap_or(root_display);
    let scheme_root = scheme_root.strip_suffix('/').unwrap_or(scheme_root);
    format!("{scheme_root}/{location}")
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
        let err = resolve("hdfs://namenode/x", None).unwrap_err();
        assert!(
            matches!(err, Error::Plan(ref m) if m.contains("hdfs://namenode/x")),
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
