//! The cluster's certificate authority and the coordinator's certificate, made by the
//! first deploy and kept beside the cluster file in `<name>.tls/` (only this user reads
//! it): `ca.pem` is what clients trust (`--ca`), `ca.key` signs, `<host>.pem` and
//! `<host>.key` go to each host, where every role presents them (gRPC between roles in
//! both directions, the coordinator's REST API). A certificate is signed again only
//! when its host's addresses change, so a second deploy changes nothing.
//!
//! This module makes and keeps certificates; it must not know how they are installed.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The certificates of one cluster.
pub struct Pki {
    dir: PathBuf,
}

/// A host's certificate and key, as PEM text.
pub struct HostCert {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

fn ca_params(cluster: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, format!("Sluice {cluster} CA"));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn write_private(path: &Path, text: &str) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

impl Pki {
    /// The certificates in `dir`, if a deploy made them.
    pub fn existing(dir: &Path) -> Option<Pki> {
        dir.join("ca.pem").is_file().then(|| Pki {
            dir: dir.to_path_buf(),
        })
    }

    /// The certificates in `dir`, made now when missing.
    pub fn ensure(dir: &Path, cluster: &str) -> Result<Pki, String> {
        if let Some(pki) = Pki::existing(dir) {
            return Ok(pki);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let ca = ca_params(cluster)
            .self_signed(&key)
            .map_err(|e| e.to_string())?;
        write_private(&dir.join("ca.key"), &key.serialize_pem())?;
        write_private(&dir.join("ca.pem"), &ca.pem())?;
        Ok(Pki {
            dir: dir.to_path_buf(),
        })
    }

    /// The CA's private key, which coordinators hold when workers may join.
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// The CA's certificate: what clients trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Host `host`'s certificate for `names` (addresses or DNS names), for server and
    /// client use, signed now unless the kept one has exactly these names.
    pub fn host(&self, cluster: &str, host: &str, names: &[String]) -> Result<HostCert, String> {
        let (cert, key, names_file) = (
            self.dir.join(format!("{host}.pem")),
            self.dir.join(format!("{host}.key")),
            self.dir.join(format!("{host}.names")),
        );
        let wanted = names.join("\n");
        if read(&names_file).ok().as_deref() == Some(wanted.as_str()) {
            return Ok(HostCert {
                cert: read(&cert)?,
                key: read(&key)?,
            });
        }
        let ca_key = KeyPair::from_pem(&read(&self.dir.join("ca.key"))?)
            .map_err(|e| format!("{}: {e}", self.dir.join("ca.key").display()))?;
        let issuer = Issuer::new(ca_params(cluster), ca_key);
        let mut params = CertificateParams::new(names.to_vec()).map_err(|e| e.to_string())?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("sluice {cluster} {host}"));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf_key = KeyPair::generate().map_err(|e| e.to_string())?;
        let leaf = params
            .signed_by(&leaf_key, &issuer)
            .map_err(|e| e.to_string())?;
        let made = HostCert {
            cert: leaf.pem(),
            key: leaf_key.serialize_pem(),
        };
        write_private(&cert, &made.cert)?;
        write_private(&key, &made.key)?;
        write_private(&names_file, &wanted)?;
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_certificate_is_reused_and_verifies_against_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("demo.tls");
        let pki = Pki::ensure(&tls, "demo").unwrap();
        let names = vec!["127.0.0.2".to_string(), "coord.example".to_string()];
        let first = pki.host("demo", "a", &names).unwrap();
        let again = Pki::ensure(&tls, "demo")
            .unwrap()
            .host("demo", "a", &names)
            .unwrap();
        assert_eq!(
            first.cert, again.cert,
            "the same names keep the certificate"
        );
        let other = pki.host("demo", "a", &names[..1]).unwrap();
        assert_ne!(
            first.cert, other.cert,
            "other names get another certificate"
        );
        // rustls accepts the pair as a server identity and the CA as a root.
        std::fs::write(dir.path().join("c.pem"), &other.cert).unwrap();
        std::fs::write(dir.path().join("c.key"), &other.key).unwrap();
        sluice_common::tls::server_config(
            &dir.path().join("c.pem"),
            &dir.path().join("c.key"),
            Some(&pki.ca()),
        )
        .unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(tls.join("ca.key")).unwrap().permissions(),
        );
        assert_eq!(mode & 0o077, 0);
    }
}
