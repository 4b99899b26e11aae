//! TLS configurations from PEM files, for every role's servers and clients: rustls with
//! the ring provider, TLS 1.2 and 1.3. Errors name the file and what was wrong with it.
//!
//! This module reads certificates and keys; it must not know which endpoint uses them.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default TLS provider (for clients built without one of
/// these configurations, which would otherwise have none); later calls change nothing.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The certificates of a PEM file (a chain: the leaf first).
///
/// # Errors
/// An unreadable file, or one without any certificate.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("{}: no PEM private key in it ({e})", path.display()))
}

fn roots(ca: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
    }
    Ok(roots)
}

/// A server presenting `cert` (with `key`); with `client_ca`, clients must present a
/// certificate that CA signed (mutual TLS).
///
/// # Errors
/// A file that cannot be read or parsed, or a key that does not match the certificate.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, String> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certificates(cert)?, private_key(key)?)
        .map_err(|e| {
            format!(
                "{} and {}: the key does not fit the certificate: {e}",
                cert.display(),
                key.display()
            )
        })?;
    Ok(Arc::new(config))
}

/// A client trusting only `ca`'s certificates, presenting `identity` (certificate and
/// key files) when given.
///
/// # Errors
/// A file that cannot be read or parsed.
pub fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca)?);
    match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| format!("{}: {e}", cert.display())),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// This process's identity in the cluster, for gRPC between roles (mutual TLS): the
/// cluster's CA, and this host's certificate and key, from `SLUICE_TLS_CA`,
/// `SLUICE_TLS_CERT` and `SLUICE_TLS_KEY` (PEM files; all three or none).
pub struct ClusterTls {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

static CLUSTER: std::sync::OnceLock<Option<ClusterTls>> = std::sync::OnceLock::new();

/// Reads the cluster TLS files named by the environment, once per process; true when
/// gRPC between roles is to use them.
///
/// # Errors
/// Some of the three variables set and not others, or files rustls cannot use
/// (unreadable, not PEM, a key that does not fit the certificate).
pub fn init_cluster_tls() -> Result<bool, String> {
    let vars = ["SLUICE_TLS_CA", "SLUICE_TLS_CERT", "SLUICE_TLS_KEY"].map(std::env::var_os);
    let tls = match vars {
        [None, None, None] => None,
        [Some(ca), Some(cert), Some(key)] => {
            let (ca, cert, key) = (Path::new(&ca), Path::new(&cert), Path::new(&key));
            // Checked as rustls would use them, so a mistake stops the role at start.
            server_config(cert, key, Some(ca))?;
            let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
            Some(ClusterTls {
                ca: read(ca)?,
                cert: read(cert)?,
                key: read(key)?,
            })
        }
        _ => {
            return Err(
                "SLUICE_TLS_CA, SLUICE_TLS_CERT and SLUICE_TLS_KEY go together: set all three or none"
                    .into(),
            );
        }
    };
    let on = tls.is_some();
    let _ = CLUSTER.set(tls);
    Ok(on)
}

/// The cluster TLS identity, when [`init_cluster_tls`] found one.
pub fn cluster_tls() -> Option<&'static ClusterTls> {
    CLUSTER.get().and_then(Option::as_ref)
}

/// `https` when roles talk TLS, `http` otherwise: the scheme of the URLs a role
/// advertises.
pub fn scheme() -> &'static str {
    if cluster_tls().is_some() {
        "https"
    } else {
        "http"
    }
}

impl ClusterTls {
    /// A gRPC server presenting this host's certificate and requiring a client
    /// certificate of the cluster's CA.
    pub fn server(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(tonic::transport::Certificate::from_pem(&self.ca))
    }

    /// A gRPC client trusting only the cluster's CA and presenting this host's
    /// certificate.
    pub fn client(&self) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca))
            .identity(tonic::transport::Identity::from_pem(&self.cert, &self.key))
    }
}

/// A gRPC endpoint for `url`, over mutual TLS when this process has a cluster identity.
///
/// # Errors
/// A malformed URL; `http://` while the cluster talks TLS, or `https://` without a
/// cluster identity (either would fail later with a vaguer message).
pub fn endpoint(url: &str) -> Result<tonic::transport::Endpoint, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|e| format!("bad URL `{url}`: {e}"))?;
    match (cluster_tls(), url.starts_with("https://")) {
        (Some(tls), true) => endpoint
            .tls_config(tls.client())
            .map_err(|e| format!("{url}: {e}")),
        (None, false) => Ok(endpoint),
        (Some(_), false) => Err(format!(
            "`{url}`: this role talks TLS to the cluster (SLUICE_TLS_*); use https://"
        )),
        (None, true) => Err(format!(
            "`{url}` is https://: set SLUICE_TLS_CA, SLUICE_TLS_CERT and SLUICE_TLS_KEY"
        )),
    }
}

/// A gRPC server builder, over mutual TLS when this process has a cluster identity.
///
/// # Errors
/// A certificate or key tonic cannot use.
pub fn grpc_server() -> Result<tonic::transport::Server, String> {
    let builder = tonic::transport::Server::builder();
    match cluster_tls() {
        Some(tls) => builder
            .tls_config(tls.server())
            .map_err(|e| format!("gRPC TLS: {e}")),
        None => Ok(builder),
    }
}

/// `error` with every cause after it (`transport error: invalid peer certificate:
/// UnknownIssuer`): TLS failures say what went wrong only in their causes.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// Whether an error's text (with its causes) is a TLS certificate failure: a wrong CA,
/// a certificate for another name, an expired one, a refused or missing client
/// certificate. Retrying cannot help those; the configuration must change.
pub fn is_certificate_error(text: &str) -> bool {
    [
        "invalid peer certificate",
        "received fatal alert",
        "peer sent no certificates",
        "certificate not valid",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}
