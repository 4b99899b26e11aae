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
    certificates_in(&path.display().to_string(), &read(path)?)
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The certificates of PEM text known as `what` in errors.
fn certificates_in(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no certificate in it"));
    }
    Ok(certs)
}

fn private_key_in(what: &str, pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| format!("{what}: no PEM private key in it ({e})"))
}

fn roots_in(what: &str, pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates_in(what, pem)? {
        roots
            .add(cert)
            .map_err(|e| format!("{what}: not a usable CA certificate: {e}"))?;
    }
    Ok(roots)
}

/// PEM text and the name errors give it (a file's path).
type Named<'a> = (&'a str, &'a [u8]);

fn server_config_of(
    cert: Named<'_>,
    key: Named<'_>,
    client_ca: Option<Named<'_>>,
) -> Result<Arc<ServerConfig>, String> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        Some((what, pem)) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots_in(what, pem)?),
                provider(),
            )
            .build()
            .map_err(|e| format!("{what}: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(
            certificates_in(cert.0, cert.1)?,
            private_key_in(key.0, key.1)?,
        )
        .map_err(|e| {
            format!(
                "{} and {}: the key does not fit the certificate: {e}",
                cert.0, key.0
            )
        })?;
    Ok(Arc::new(config))
}

fn client_config_of(
    ca: Named<'_>,
    identity: Option<(Named<'_>, Named<'_>)>,
) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots_in(ca.0, ca.1)?);
    match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                certificates_in(cert.0, cert.1)?,
                private_key_in(key.0, key.1)?,
            )
            .map_err(|e| format!("{}: {e}", cert.0)),
        None => Ok(builder.with_no_client_auth()),
    }
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
    let names = [cert, key].map(|p| p.display().to_string());
    let (cert, key) = (read(cert)?, read(key)?);
    let ca = client_ca
        .map(|p| Ok::<_, String>((p.display().to_string(), read(p)?)))
        .transpose()?;
    server_config_of(
        (&names[0], &cert),
        (&names[1], &key),
        ca.as_ref().map(|(n, pem)| (n.as_str(), pem.as_slice())),
    )
}

/// A client trusting only `ca`'s certificates, presenting `identity` (certificate and
/// key files) when given.
///
/// # Errors
/// A file that cannot be read or parsed.
pub fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<ClientConfig, String> {
    let ca_name = ca.display().to_string();
    let ca = read(ca)?;
    let identity = identity
        .map(|(c, k)| {
            Ok::<_, String>((
                (c.display().to_string(), read(c)?),
                (k.display().to_string(), read(k)?),
            ))
        })
        .transpose()?;
    client_config_of(
        (&ca_name, &ca),
        identity
            .as_ref()
            .map(|((cn, c), (kn, k))| ((cn.as_str(), c.as_slice()), (kn.as_str(), k.as_slice()))),
    )
}

/// This process's identity in the cluster, for gRPC between roles (mutual TLS): the
/// cluster's CA, and this host's certificate and key, from `SLUICE_TLS_CA`,
/// `SLUICE_TLS_CERT` and `SLUICE_TLS_KEY` (PEM files; all three or none).
pub struct ClusterTls {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// Set by [`init_cluster_tls`] or [`set_cluster_tls`]; leaked so that roles hold a
/// plain reference (it is set once per process, once more in a benchmark).
static CLUSTER: std::sync::RwLock<Option<&'static ClusterTls>> = std::sync::RwLock::new(None);

/// Reads the cluster TLS files named by the environment; true when roles are to talk
/// TLS with them.
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
    set_cluster_tls(tls.map(|t| &*Box::leak(Box::new(t))));
    Ok(on)
}

/// Replaces this process's cluster identity and returns the one it had. Servers and
/// connections read it when they start, so those already running keep theirs: a
/// benchmark measures a cluster with and without TLS in one run this way.
pub fn set_cluster_tls(tls: Option<&'static ClusterTls>) -> Option<&'static ClusterTls> {
    std::mem::replace(
        &mut *CLUSTER.write().unwrap_or_else(|p| p.into_inner()),
        tls,
    )
}

/// A cluster identity made now (a CA of its own and a certificate it signed for
/// `names`, for server and client use), for benchmarks and tests that need TLS between
/// processes of this machine: the CA, the certificate and its key, as PEM text.
///
/// # Errors
/// A name rcgen cannot put in a certificate.
pub fn ephemeral_identity(names: &[&str]) -> Result<[String; 3], String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "Sluice ephemeral CA");
    let ca_key = KeyPair::generate().map_err(|e| e.to_string())?;
    let ca_pem = ca.self_signed(&ca_key).map_err(|e| e.to_string())?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .map_err(|e| e.to_string())?;
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = leaf.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    Ok([ca_pem, cert.pem(), key.serialize_pem()])
}

/// A new key and a certificate signing request for it (PEM text: key, request), which
/// a worker joining a cluster sends to a coordinator ([`CertificateAuthority`]).
///
/// # Errors
/// A name rcgen cannot put in a request.
pub fn certificate_request(name: &str) -> Result<(String, String), String> {
    use rcgen::{CertificateParams, DnType, KeyPair};
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    let request = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| e.to_string())?;
    Ok((key.serialize_pem(), request))
}

/// The cluster CA's signing half, which a coordinator holds when workers it was not
/// given may join (an auto-scaled group): it signs their certificate requests.
pub struct CertificateAuthority {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca: String,
}

impl CertificateAuthority {
    /// The CA from its certificate and key (PEM text).
    ///
    /// # Errors
    /// Text that is not a certificate or a key, or a key that does not sign for it.
    pub fn from_pem(ca: &str, key: &str) -> Result<Self, String> {
        let signing = rcgen::KeyPair::from_pem(key).map_err(|e| format!("the CA's key: {e}"))?;
        // A key of another certificate would sign certificates nobody trusts.
        let cert = certificates_in("the CA certificate", ca.as_bytes())?;
        let spki = webpki_spki(&cert[0]).ok_or("the CA certificate cannot be parsed")?;
        if spki != rcgen::PublicKeyData::subject_public_key_info(&signing) {
            return Err("the key is not the CA certificate's key".into());
        }
        let issuer = rcgen::Issuer::from_ca_cert_pem(ca, signing)
            .map_err(|e| format!("the CA certificate: {e}"))?;
        Ok(Self {
            issuer,
            ca: ca.to_owned(),
        })
    }

    /// The CA's certificate (PEM), which the joining worker trusts from then on.
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// A certificate for the key in `request` (PEM), for server and client use, naming
    /// only `address`: whatever the request asks, it is valid for the address the
    /// worker was seen at, so it cannot pose as another host.
    ///
    /// # Errors
    /// A request that is not PEM or whose signature does not verify.
    pub fn sign_request(
        &self,
        request: &str,
        address: std::net::IpAddr,
        name: &str,
    ) -> Result<String, String> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose};
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(request)
            .map_err(|e| format!("not a certificate signing request: {e}"))?;
        let mut params =
            CertificateParams::new(vec![address.to_string()]).map_err(|e| e.to_string())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        csr.params = params;
        csr.signed_by(&self.issuer)
            .map(|c| c.pem())
            .map_err(|e| e.to_string())
    }
}

/// The SubjectPublicKeyInfo of a certificate (DER).
fn webpki_spki(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(cert.as_ref()).ok()?;
    Some(parsed.tbs_certificate.subject_pki.raw.to_vec())
}

/// The cluster TLS identity, when [`init_cluster_tls`] found one.
pub fn cluster_tls() -> Option<&'static ClusterTls> {
    *CLUSTER.read().unwrap_or_else(|p| p.into_inner())
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
    /// An identity from PEM text: the cluster's CA, this host's certificate and its key.
    ///
    /// # Errors
    /// Text rustls cannot use, or a key that does not fit the certificate.
    pub fn from_pem(ca: Vec<u8>, cert: Vec<u8>, key: Vec<u8>) -> Result<Self, String> {
        server_config_of(
            ("the certificate", &cert),
            ("its key", &key),
            Some(("the CA", &ca)),
        )?;
        Ok(Self { ca, cert, key })
    }

    /// A rustls server presenting this host's certificate and requiring a client
    /// certificate of the cluster's CA (the workers' data plane).
    ///
    /// # Errors
    /// None for an identity made by [`ClusterTls::from_pem`] or [`init_cluster_tls`],
    /// which checked the same.
    pub fn rustls_server(&self) -> Result<Arc<ServerConfig>, String> {
        server_config_of(
            ("the certificate", &self.cert),
            ("its key", &self.key),
            Some(("the CA", &self.ca)),
        )
    }

    /// A rustls client trusting only the cluster's CA and presenting this host's
    /// certificate.
    ///
    /// # Errors
    /// As [`ClusterTls::rustls_server`].
    pub fn rustls_client(&self) -> Result<Arc<ClientConfig>, String> {
        client_config_of(
            ("the CA", &self.ca),
            Some((("the certificate", &self.cert), ("its key", &self.key))),
        )
        .map(Arc::new)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (String, String) {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_joining_worker_gets_a_certificate_for_the_address_it_was_seen_at() {
        let (ca_pem, ca_key) = ca();
        let authority = CertificateAuthority::from_pem(&ca_pem, &ca_key).unwrap();
        let (key, request) = certificate_request("worker").unwrap();
        let address: std::net::IpAddr = "10.0.2.7".parse().unwrap();
        let cert = authority.sign_request(&request, address, "worker").unwrap();
        // The identity is usable as a cluster identity of this CA.
        ClusterTls::from_pem(
            ca_pem.into_bytes(),
            cert.clone().into_bytes(),
            key.into_bytes(),
        )
        .unwrap();
        use x509_parser::prelude::FromDer;
        let der = certificates_in("it", cert.as_bytes()).unwrap();
        let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(&der[0]).unwrap();
        let names = parsed.subject_alternative_name().unwrap().unwrap();
        assert_eq!(
            format!("{:?}", names.value.general_names),
            "[IPAddress([10, 0, 2, 7])]"
        );
        // A request that is not one, and a key of another CA, are named.
        assert!(
            authority
                .sign_request("junk", address, "w")
                .unwrap_err()
                .contains("not a certificate signing request")
        );
        let (_, other_key) = ca();
        assert_eq!(
            CertificateAuthority::from_pem(authority.ca_pem(), &other_key)
                .err()
                .as_deref(),
            Some("the key is not the CA certificate's key")
        );
    }
}
