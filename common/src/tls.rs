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
