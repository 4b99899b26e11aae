//! Releases: the binary `sluice deploy` installs when a version is named (`version:` in
//! the cluster file, or `--version`) instead of given as a file. The cluster file's
//! `releases` is a URL or path with `{version}` in it; a release behind http(s) is
//! downloaded once into the user's cache (releases do not change), a local one is used
//! where it lies. Either way it must be a Linux executable, whose architecture the host
//! checks compare with each host's.
//!
//! This module must not know about hosts, SSH or roles.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::Failure;

/// A release larger than this is refused: a URL pointing at something else.
const MAX_BYTES: u64 = 4 << 30;

/// The binary of release `version`, fetched from `template` when not cached.
pub fn fetch(template: &str, version: &str) -> Result<PathBuf, Failure> {
    fetch_into(template, version, &cache_dir())
}

fn fetch_into(template: &str, version: &str, cache: &Path) -> Result<PathBuf, Failure> {
    let location = template.replace("{version}", version);
    let path = if location.starts_with("http://") || location.starts_with("https://") {
        download(&location, version, cache)?
    } else {
        let path = PathBuf::from(location.strip_prefix("file://").unwrap_or(&location));
        if !path.is_file() {
            return Err(Failure::usage(format!(
                "release {version}: {} is not a file (from `releases` in the cluster file)",
                path.display()
            )));
        }
        path
    };
    elf_arch(&path)
        .map_err(|e| Failure::usage(format!("release {version} ({}): {e}", shown(&location))))?;
    Ok(path)
}

/// The CPU architecture (as `uname -m` names it) a Linux executable is built for.
pub fn elf_arch(path: &Path) -> Result<&'static str, String> {
    let mut header = Vec::with_capacity(20);
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::Read::read_to_end(&mut std::io::Read::take(file, 20), &mut header)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if header.len() < 20 || header[..4] != *b"\x7fELF" {
        return Err("not a Linux (ELF) executable".to_owned());
    }
    let machine = match header[5] {
        1 => u16::from_le_bytes([header[18], header[19]]),
        _ => u16::from_be_bytes([header[18], header[19]]),
    };
    match machine {
        0x3e => Ok("x86_64"),
        0xb7 => Ok("aarch64"),
        0x03 => Ok("i686"),
        0x28 => Ok("arm"),
        0xf3 => Ok("riscv64"),
        0x15 => Ok("ppc64le"),
        0x16 => Ok("s390x"),
        other => Err(format!(
            "an executable for an unknown machine (ELF e_machine {other:#x})"
        )),
    }
}

/// A URL as it may be printed: no user information, no query (a presigned URL's
/// signature or a token must not reach a terminal or a log).
pub fn shown(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    match without_query.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit('@').next().unwrap_or(authority);
            format!("{scheme}://{host}{path}")
        }
        None => without_query.to_owned(),
    }
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLUICE_RELEASE_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("sluice").join("releases")
}

fn download(url: &str, version: &str, cache: &Path) -> Result<PathBuf, Failure> {
    let key = crate::hex(&Sha256::digest(url.as_bytes()))[..16].to_owned();
    let dir = cache.join(format!("{version}-{key}"));
    let path = dir.join("sluice");
    if path.is_file() {
        return Ok(path);
    }
    let fail = |what: String| Failure::from(anyhow::anyhow!("release {version}: {what}"));
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let partial = dir.join(format!("sluice.part-{}", std::process::id()));
    let rt = crate::runtime()?;
    let result = rt.block_on(get(url, &partial));
    // A page of HTML where the binary should be is refused before it is cached.
    if let Err(e) = result.and_then(|()| elf_arch(&partial).map(|_| ())) {
        let _ = std::fs::remove_file(&partial);
        return Err(fail(format!("fetching {}: {e}", shown(url))));
    }
    std::fs::rename(&partial, &path).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    Ok(path)
}

/// Streams `url` into a new executable file at `to`.
async fn get(url: &str, to: &Path) -> Result<(), String> {
    sluice_common::tls::install_default_provider();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60));
    // The system's trusted roots: a release server is a public one, not the cluster's.
    for cert in rustls_native_certs::load_native_certs().certs {
        if let Ok(c) = reqwest::Certificate::from_der(cert.as_ref()) {
            builder = builder.add_root_certificate(c);
        }
    }
    let client = builder.build().map_err(|e| e.to_string())?;
    let mut response = client.get(url).send().await.map_err(error_chain)?;
    if !response.status().is_success() {
        return Err(format!("the server answered {}", response.status()));
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(to)
        .map_err(|e| format!("{}: {e}", to.display()))?;
    let mut written = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(error_chain)? {
        written += chunk.len() as u64;
        if written > MAX_BYTES {
            return Err(format!(
                "larger than {} GiB: not a Sluice binary",
                MAX_BYTES >> 30
            ));
        }
        file.write_all(&chunk)
            .map_err(|e| format!("{}: {e}", to.display()))?;
    }
    file.sync_all()
        .map_err(|e| format!("{}: {e}", to.display()))
}

/// An error and its causes, without the URL reqwest puts in its own message.
fn error_chain(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    /// Answers each of `answers` in turn, one HTTP request each, on loopback.
    fn server(answers: Vec<(u16, Vec<u8>)>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for (status, body) in answers {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let mut stream = stream;
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(&body);
            }
        });
        format!("http://{address}")
    }

    fn this_binary() -> Vec<u8> {
        std::fs::read(std::env::current_exe().unwrap()).unwrap()
    }

    #[test]
    fn a_release_is_downloaded_once_and_checked() {
        let cache = tempfile::tempdir().unwrap();
        let fetch = |t: &str, v: &str| fetch_into(t, v, cache.path());
        let base = server(vec![
            (200, this_binary()),
            (404, b"no".to_vec()),
            (200, b"<html>".to_vec()),
        ]);
        let template = format!("{base}/{{version}}/sluice?token=secret-7f3a");
        let path = fetch(&template, "1.2.3").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), this_binary());
        assert_eq!(elf_arch(&path).unwrap(), std::env::consts::ARCH);
        // Cached: the server is not asked again (its next answer would be a 404).
        assert_eq!(fetch(&template, "1.2.3").unwrap(), path);
        let missing = fetch(&template, "9.9.9").unwrap_err();
        assert!(missing.message().contains("404"), "{}", missing.message());
        assert!(
            missing.message().contains("/9.9.9/sluice"),
            "{}",
            missing.message()
        );
        assert!(
            !missing.message().contains("secret-7f3a"),
            "{}",
            missing.message()
        );
        let page = fetch(&template, "2.0").unwrap_err();
        assert!(
            page.message().contains("not a Linux (ELF) executable"),
            "{}",
            page.message()
        );
    }

    #[test]
    fn a_local_release_is_used_where_it_lies() {
        let dir = tempfile::tempdir().unwrap();
        let release = dir.path().join("1.0").join("sluice");
        std::fs::create_dir_all(release.parent().unwrap()).unwrap();
        std::fs::write(&release, this_binary()).unwrap();
        let template = format!("file://{}/{{version}}/sluice", dir.path().display());
        assert_eq!(fetch(&template, "1.0").unwrap(), release);
        let err = fetch(&template, "1.1").unwrap_err();
        assert!(
            err.message().contains("1.1/sluice is not a file"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn printed_urls_carry_no_secrets() {
        assert_eq!(
            shown("https://user:pw@dl.example.com/1.0/sluice?X-Amz-Signature=abc"),
            "https://dl.example.com/1.0/sluice"
        );
        assert_eq!(shown("/srv/r/1.0/sluice"), "/srv/r/1.0/sluice");
    }
}
