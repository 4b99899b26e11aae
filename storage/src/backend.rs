//! Building the object store a parsed URL names.
//!
//! # Local
//! object_store's `LocalFileSystem` over the whole file system; the URL's path is the
//! root prefix, so `file:///data/x` and `/data/x` are the same objects.
//!
//! # Remote (OpenDAL)
//! An OpenDAL operator for the service (`s3`, `azblob`) rooted at the bucket,
//! with a retry layer (back-off 100 ms doubling up to 15 s, jitter,
//! [`ClientOptions::effective_retries`] retries) over a reqwest client with the
//! connect and request timeouts, wrapped in `object_store_opendal::OpendalStore` so it
//! is an object_store 0.13 `ObjectStore`. TLS is rustls with the ring provider.
//!
//! Where each setting comes from (first found wins):
//!
//! | setting | S3 | Azure Blob |
//! |---|---|---|
//! | endpoint | `?endpoint=`, options, `AWS_ENDPOINT_URL`, `AWS_ENDPOINT` | `?endpoint=`, options, `AZURE_STORAGE_ENDPOINT`, `https://<account>.blob.core.windows.net` |
//! | region / account | `?region=`, options, `AWS_REGION`, `AWS_DEFAULT_REGION`, `us-east-1` | `?account=`, `AZURE_STORAGE_ACCOUNT_NAME` |
//! | credentials | options, then OpenDAL's AWS chain (`AWS_ACCESS_KEY_ID` ..., profiles, web identity) | `AZURE_STORAGE_ACCOUNT_KEY` (or `AZURE_STORAGE_ACCESS_KEY`), else `AZURE_STORAGE_SAS_TOKEN` |
//!
//! S3 uses path-style requests (what S3-compatible servers expect). With an endpoint of
//! its own, an S3 store does not ask EC2's instance-metadata service for credentials
//! (there is none next to an S3-compatible server).

use std::sync::{Arc, Once};

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store_opendal::OpendalStore;
use opendal::layers::RetryLayer;
use opendal::{HttpTransporter, OperationContext, Operator};
use opendal_http_transport_reqwest::ReqwestTransport;

use crate::error::{Error, Result};
use crate::options::{ClientOptions, FIRST_BACKOFF, MAX_BACKOFF, StoreOptions};
use crate::url::{Scheme, StoreUrl};

/// The store `url` names.
pub fn build(url: &StoreUrl, options: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    match url.scheme {
        Scheme::Local => local(url, options),
        Scheme::S3 => remote(url, options, s3_operator(url, options)?),
        Scheme::AzureBlob => remote(url, options, azblob_operator(url, options)?),
    }
}

fn local(url: &StoreUrl, options: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    if options.create_local_root {
        let dir = std::path::PathBuf::from(format!("/{}", url.root));
        std::fs::create_dir_all(&dir).map_err(|e| Error::Config {
            url: url.url.clone(),
            reason: format!("cannot create directory '{}': {e}", dir.display()),
        })?;
    }
    Ok(Arc::new(LocalFileSystem::new()))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn first<const N: usize>(candidates: [Option<String>; N]) -> Option<String> {
    candidates.into_iter().flatten().next()
}

fn s3_operator(url: &StoreUrl, options: &StoreOptions) -> Result<Operator> {
    let endpoint = first([
        url.endpoint.clone(),
        options.endpoint.clone(),
        env("AWS_ENDPOINT_URL"),
        env("AWS_ENDPOINT"),
    ]);
    let region = first([
        url.region.clone(),
        options.region.clone(),
        env("AWS_REGION"),
        env("AWS_DEFAULT_REGION"),
    ])
    .unwrap_or_else(|| "us-east-1".to_string());
    let mut builder = opendal::services::S3::default()
        .bucket(&url.bucket)
        .root("/")
        .region(&region);
    if let Some(endpoint) = &endpoint {
        builder = builder.endpoint(endpoint).disable_ec2_metadata();
    }
    if let Some(key) = &options.access_key_id {
        builder = builder.access_key_id(key);
    }
    if let Some(secret) = &options.secret_access_key {
        builder = builder.secret_access_key(secret);
    }
    operator(url, Operator::new(builder))
}

fn azblob_operator(url: &StoreUrl, options: &StoreOptions) -> Result<Operator> {
    let account =
        first([url.account.clone(), env("AZURE_STORAGE_ACCOUNT_NAME")]).ok_or_else(|| {
            Error::Config {
                url: url.url.clone(),
                reason: "no Azure storage account: add ?account=NAME or set \
                     AZURE_STORAGE_ACCOUNT_NAME"
                    .into(),
            }
        })?;
    let endpoint = first([
        url.endpoint.clone(),
        options.endpoint.clone(),
        env("AZURE_STORAGE_ENDPOINT"),
    ])
    .unwrap_or_else(|| format!("https://{account}.blob.core.windows.net"));
    let mut builder = opendal::services::Azblob::default()
        .container(&url.bucket)
        .root("/")
        .endpoint(&endpoint)
        .account_name(&account);
    if let Some(key) = env("AZURE_STORAGE_ACCOUNT_KEY").or_else(|| env("AZURE_STORAGE_ACCESS_KEY"))
    {
        builder = builder.account_key(&key);
    } else if let Some(sas) = env("AZURE_STORAGE_SAS_TOKEN") {
        builder = builder.sas_token(&sas);
    }
    operator(url, Operator::new(builder))
}

fn operator(url: &StoreUrl, built: opendal::Result<Operator>) -> Result<Operator> {
    built.map_err(|e| Error::Config {
        url: url.url.clone(),
        reason: e.to_string(),
    })
}

fn remote(url: &StoreUrl, options: &StoreOptions, op: Operator) -> Result<Arc<dyn ObjectStore>> {
    let transport = HttpTransporter::new(ReqwestTransport::new(http_client(url, &options.client)?));
    let op = op
        .layer(
            RetryLayer::new()
                .with_jitter()
                .with_factor(2.0)
                .with_min_delay(FIRST_BACKOFF)
                .with_max_delay(MAX_BACKOFF)
                .with_max_times(options.client.effective_retries()),
        )
        .with_context(OperationContext::new().with_http_transport(transport));
    Ok(Arc::new(OpendalStore::new(op)))
}

fn http_client(url: &StoreUrl, client: &ClientOptions) -> Result<reqwest_opendal::Client> {
    install_crypto_provider();
    reqwest_opendal::Client::builder()
        .connect_timeout(client.connect_timeout)
        .timeout(client.request_timeout)
        .build()
        .map_err(|e| Error::Config {
            url: url.url.clone(),
            reason: format!("cannot build the HTTP client: {e}"),
        })
}

/// Makes ring the process's rustls provider unless one is installed already: reqwest is
/// built without a provider of its own (aws-lc-rs would add minutes of C to a build).
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
