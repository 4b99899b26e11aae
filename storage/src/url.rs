//! Reading a store URL: its scheme, bucket (or container), root prefix and settings.
//!
//! Pure parsing, no I/O: every mistake is an [`Error`] that names the URL and what was
//! wrong with it. Query parameters carry settings that are not secret:
//!
//! | scheme | parameters |
//! |---|---|
//! | `s3`, `s3a` | `endpoint`, `region` |
//! | `azblob` | `endpoint`, `account` |
//!
//! Local paths take none (a `?` is part of a file name there).
//!
//! `gs://` is refused like any unknown scheme: OpenDAL serves GCS, but no GCS emulator
//! that installs here (fake-gcs-server, gcp-storage-emulator) honours
//! `ifGenerationMatch=0`, so create-if-absent on GCS could not be tested, and a store
//! whose fencing write is untested is not offered.

use std::path::{Component, PathBuf};

use object_store::path::Path;

use crate::error::{Error, Result};

/// The kinds of store a URL can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// A local directory or file.
    Local,
    /// S3 or an S3-compatible server.
    S3,
    /// Azure Blob Storage.
    AzureBlob,
}

impl Scheme {
    /// The URL schemes this crate understands, for messages.
    pub const SUPPORTED: &'static str =
        "a local path, file:///abs/path, s3://bucket/prefix or azblob://container/prefix";

    fn known_parameters(self) -> &'static [&'static str] {
        match self {
            Scheme::Local => &[],
            Scheme::S3 => &["endpoint", "region"],
            Scheme::AzureBlob => &["endpoint", "account"],
        }
    }
}

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreUrl {
    /// The URL as written, for messages.
    pub url: String,
    /// Which store.
    pub scheme: Scheme,
    /// The bucket (S3) or container (Azure); empty for local paths.
    pub bucket: String,
    /// The prefix inside the bucket; for a local path the absolute path without its
    /// leading `/`.
    pub root: Path,
    /// `endpoint` from the query.
    pub endpoint: Option<String>,
    /// `region` from the query (S3).
    pub region: Option<String>,
    /// `account` from the query (Azure).
    pub account: Option<String>,
}

impl StoreUrl {
    /// Parses `url`: a local path (absolute, or relative to the current directory), a
    /// `file://` URL, or a URL of a supported remote scheme.
    pub fn parse(url: &str) -> Result<Self> {
        if let Some(local) = local_path(url)? {
            let root = Path::from_absolute_path(&local).map_err(|e| Error::InvalidUrl {
                url: url.to_string(),
                reason: format!("'{}' is not a usable local path: {e}", local.display()),
            })?;
            return Ok(Self {
                url: url.to_string(),
                scheme: Scheme::Local,
                bucket: String::new(),
                root,
                endpoint: None,
                region: None,
                account: None,
            });
        }
        let parsed = ::url::Url::parse(url).map_err(|e| Error::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let scheme = match parsed.scheme() {
            "s3" | "s3a" => Scheme::S3,
            "azblob" => Scheme::AzureBlob,
            other => {
                return Err(Error::UnsupportedScheme {
                    url: url.to_string(),
                    scheme: other.to_string(),
                });
            }
        };
        let bucket = parsed
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| Error::MissingBucket {
                url: url.to_string(),
            })?
            .to_string();
        let root = Path::from_url_path(parsed.path()).map_err(|e| Error::InvalidUrl {
            url: url.to_string(),
            reason: format!("invalid prefix: {e}"),
        })?;
        let mut out = Self {
            url: url.to_string(),
            scheme,
            bucket,
            root,
            endpoint: None,
            region: None,
            account: None,
        };
        for (key, value) in parsed.query_pairs() {
            let known = scheme.known_parameters();
            let slot = match key.as_ref() {
                "endpoint" if known.contains(&"endpoint") => &mut out.endpoint,
                "region" if known.contains(&"region") => &mut out.region,
                "account" if known.contains(&"account") => &mut out.account,
                other => {
                    return Err(Error::UnknownParameter {
                        url: url.to_string(),
                        name: other.to_string(),
                        known: known.join(", "),
                    });
                }
            };
            *slot = Some(value.into_owned()).filter(|v| !v.is_empty());
        }
        Ok(out)
    }

    /// The URL-like form of the root, for messages: `s3://bucket/prefix`, `/abs/dir`
    /// (no query, so no endpoint and nothing secret).
    pub fn display(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Local => return format!("/{}", self.root),
            Scheme::S3 => "s3",
            Scheme::AzureBlob => "azblob",
        };
        format!("{scheme}://{}/{}", self.bucket, self.root)
    }
}

/// The absolute local path `path` names, or `None` when it is a URL of another scheme.
///
/// `file:///abs` and plain paths are local; a relative path is taken from the current
/// directory; `.` and `..` are resolved lexically (the path need not exist).
pub fn local_path(path: &str) -> Result<Option<PathBuf>> {
    let raw = if let Some(rest) = path.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(Error::InvalidUrl {
                url: path.to_string(),
                reason: "not an absolute file URL (use file:///absolute/path)".into(),
            });
        }
        let url = ::url::Url::parse(path).map_err(|e| Error::InvalidUrl {
            url: path.to_string(),
            reason: e.to_string(),
        })?;
        url.to_file_path().map_err(|()| Error::InvalidUrl {
            url: path.to_string(),
            reason: "not a local file URL".into(),
        })?
    } else if has_scheme(path) {
        return Ok(None);
    } else if path.is_empty() {
        return Err(Error::InvalidUrl {
            url: path.to_string(),
            reason: format!("empty; use {}", Scheme::SUPPORTED),
        });
    } else {
        PathBuf::from(path)
    };
    let absolute = if raw.is_absolute() {
        raw
    } else {
        std::env::current_dir()
            .map_err(|e| Error::InvalidUrl {
                url: path.to_string(),
                reason: format!("a relative path, and the current directory is unknown: {e}"),
            })?
            .join(raw)
    };
    Ok(Some(normalize(&absolute)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_file_paths_are_local_and_absolute() {
        let u = StoreUrl::parse("/tmp/a/./b/../c").unwrap();
        assert_eq!(u.scheme, Scheme::Local);
        assert_eq!(u.root.as_ref(), "tmp/a/c");
        assert_eq!(u.display(), "/tmp/a/c");
        let u = StoreUrl::parse("file:///tmp/x%20y/z").unwrap();
        assert_eq!(u.root.as_ref(), "tmp/x y/z");
        let u = StoreUrl::parse("rel/dir").unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(u.display(), cwd.join("rel/dir").to_str().unwrap());
    }

    #[test]
    fn remote_urls_name_bucket_prefix_and_settings() {
        let u =
            StoreUrl::parse("s3://bucket/some/prefix/?endpoint=http://h:8333&region=eu").unwrap();
        assert_eq!(u.scheme, Scheme::S3);
        assert_eq!(u.bucket, "bucket");
        assert_eq!(u.root.as_ref(), "some/prefix");
        assert_eq!(u.endpoint.as_deref(), Some("http://h:8333"));
        assert_eq!(u.region.as_deref(), Some("eu"));
        assert_eq!(u.display(), "s3://bucket/some/prefix");
        assert_eq!(StoreUrl::parse("s3a://b").unwrap().display(), "s3://b/");
        let u = StoreUrl::parse("azblob://c/p?account=devstoreaccount1").unwrap();
        assert_eq!(u.scheme, Scheme::AzureBlob);
        assert_eq!(u.account.as_deref(), Some("devstoreaccount1"));
    }

    #[test]
    fn mistakes_name_the_url_and_what_is_wrong() {
        let cases = [
            ("hdfs://nn/x", "unsupported scheme 'hdfs'"),
            ("gs://bucket/x", "unsupported scheme 'gs' (use a local path"),
            ("s3:///nobucket", "names no bucket"),
            ("azblob://", "names no bucket"),
            ("s3://b/p?colour=blue", "unknown parameter 'colour'"),
            ("azblob://c/p?region=eu", "unknown parameter 'region'"),
            ("file://relative", "not an absolute file URL"),
            ("", "empty"),
        ];
        for (url, wanted) in cases {
            let err = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(err.contains(wanted), "{url}: {err}");
            if !url.is_empty() {
                assert!(err.contains(url), "{url}: {err}");
            }
        }
        // Not a URL and not a path either: still an error, never a panic.
        assert!(StoreUrl::parse("s3://b/p?endpoint=%zz").is_ok());
    }
}
