//! Bearer tokens on the REST API (`sluice coordinator --auth-tokens FILE`).
//!
//! The file holds no token, only each token's SHA-256, so reading it does not let anyone
//! in. One token per line, `#` starts a comment:
//!
//! ```text
//! operate sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 admin
//! read    sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752 dashboards
//! ```
//!
//! `read` may `GET` (jobs, status, metrics, the cluster); `operate` may also submit,
//! cancel, stop, savepoint, rescale, drain and rebalance. The web UI's files and the
//! OpenAPI document carry no data and stay public. Refusals name what is missing and
//! never echo the token.
//!
//! This module owns who may call what; it must not know what the endpoints do.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read-only: `GET` and `HEAD`.
    Read,
    /// Everything.
    Operate,
    /// Only `POST /v1/workers/join`: a worker that joins by itself (an auto-scaled one).
    Join,
}

/// The accepted tokens, by hash.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Access, String)>,
}

impl Tokens {
    /// Reads a tokens file's text; `file` names it in errors.
    ///
    /// # Errors
    /// A line that is not `read|operate|join sha256:<64 hex digits> [name]`, with its line
    /// number; a file without any token.
    pub fn parse(file: &str, text: &str) -> Result<Tokens, String> {
        let mut tokens = Tokens::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = format!("{file}:{}", i + 1);
            let mut words = line.split_whitespace();
            let access = match words.next() {
                Some("read") => Access::Read,
                Some("operate") => Access::Operate,
                Some("join") => Access::Join,
                Some(other) => {
                    return Err(format!(
                        "{at}: unknown role `{other}`; expected read, operate or join"
                    ));
                }
                None => continue,
            };
            let hash = words
                .next()
                .and_then(|w| w.strip_prefix("sha256:"))
                .and_then(parse_hex)
                .ok_or_else(|| {
                    format!("{at}: expected `sha256:` and 64 hex digits after the role")
                })?;
            let name = words.next().unwrap_or("unnamed").to_owned();
            if words.next().is_some() {
                return Err(format!("{at}: expected ROLE sha256:HEX [NAME], found more"));
            }
            tokens.entries.push((hash, access, name));
        }
        if tokens.entries.is_empty() {
            return Err(format!(
                "{file}: no token in it; every request would be refused"
            ));
        }
        Ok(tokens)
    }

    /// The access and name of `token`, if it is one of these.
    pub fn check(&self, token: &str) -> Option<(Access, &str)> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.entries
            .iter()
            .find(|(h, _, _)| *h == hash)
            .map(|(_, access, name)| (*access, name.as_str()))
    }
}

/// `sha256:<hex>` of `token`: its line in a tokens file.
pub fn hash_line(token: &str) -> String {
    let hash = Sha256::digest(token.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn parse_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Where workers join; the only path a join token opens.
const JOIN_PATH: &str = "/v1/workers/join";

/// Paths anyone may read: the web UI's files (which hold no data) and the API's
/// description.
fn public(path: &str) -> bool {
    matches!(
        path,
        "/" | "/ui/" | "/ui/app.js" | "/ui/app.css" | "/v1/openapi.yaml"
    )
}

/// The REST layer: a request needs a bearer token allowed its method.
pub async fn require_token(
    State(tokens): State<Arc<Tokens>>,
    request: Request,
    next: Next,
) -> Response {
    if public(request.uri().path()) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(presented) = presented else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "this API needs a bearer token (`sluice --token` or SLUICE_TOKEN; \
             `Authorization: Bearer <token>`)",
        );
    };
    match tokens.check(presented) {
        None => refuse(
            StatusCode::UNAUTHORIZED,
            "the bearer token is not valid here",
        ),
        Some((Access::Read, name))
            if request.method() != Method::GET && request.method() != Method::HEAD =>
        {
            refuse(
                StatusCode::FORBIDDEN,
                &format!(
                    "token `{name}` may only read; {} {} needs an operate token",
                    request.method(),
                    request.uri().path()
                ),
            )
        }
        Some((Access::Join, name)) if request.uri().path() != JOIN_PATH => refuse(
            StatusCode::FORBIDDEN,
            &format!(
                "token `{name}` may only join workers (POST {JOIN_PATH}); {} {} needs another",
                request.method(),
                request.uri().path()
            ),
        ),
        Some(_) => next.run(request).await,
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut response = (
        status,
        axum::Json(serde_json::json!({ "error": message, "field": "authorization" })),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_by_hash_with_their_role() {
        let text = format!(
            "# tokens\noperate {} admin\n\nread {} dashboards # for Grafana\n",
            hash_line("s3cret"),
            hash_line("look")
        );
        let tokens = Tokens::parse("tokens", &text).unwrap();
        assert_eq!(tokens.check("s3cret"), Some((Access::Operate, "admin")));
        assert_eq!(tokens.check("look"), Some((Access::Read, "dashboards")));
        assert_eq!(tokens.check("guess"), None);
        assert_eq!(
            hash_line("test"),
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn a_bad_tokens_file_is_refused_at_its_line() {
        let err = |t: &str| Tokens::parse("t", t).unwrap_err();
        assert_eq!(
            err("admin sha256:00"),
            "t:1: unknown role `admin`; expected read, operate or join"
        );
        assert!(err("\nread sha256:xyz").starts_with("t:2: expected `sha256:`"));
        assert!(err("read s3cret").starts_with("t:1:"));
        assert!(err("# nothing\n").contains("no token"));
        assert!(err(&format!("read {} a b", hash_line("x"))).contains("found more"));
    }
}
