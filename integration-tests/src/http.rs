//! Talking to a role's HTTP endpoints as a user's tools would: a minimal HTTP/1.1 client
//! (the REST API, `/metrics`) and Prometheus's `promtool`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The last `max` bytes of `s` (at a character boundary).
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = s.len() - max;
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}

/// A minimal HTTP/1.1 request (`Connection: close`) to `addr` with a JSON body; the
/// status code and the body parsed as JSON (a string when it is not JSON).
pub fn http_request(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    http_request_as(addr, method, path, Some("application/json"), body)
}

/// [`http_request`] with the body's `content_type` (none: no header). The body is sent
/// from its own thread and a failed send is ignored: a server may answer and close
/// before it read all of a body it refuses.
pub fn http_request_as(
    addr: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut stream =
        TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let body = body.unwrap_or("").to_owned();
    let content_type = content_type
        .map(|t| format!("Content-Type: {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{content_type}\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut sender = stream.try_clone().expect("cloning the stream");
    let sending = std::thread::spawn(move || {
        let _ = sender
            .write_all(head.as_bytes())
            .and_then(|()| sender.write_all(body.as_bytes()));
    });
    let mut raw = Vec::new();
    let read = stream.read_to_end(&mut raw);
    let _ = sending.join();
    if raw.is_empty() {
        panic!("no answer to {method} {path}: {read:?}");
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP header in {raw:?}"));
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status code in {head:?}"));
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let text = if chunked {
        let mut out = String::new();
        let mut rest = rest;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            out.push_str(&after[..n]);
            rest = after[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        rest.to_owned()
    };
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (code, value)
}

/// Runs Prometheus's own parser and linter (`promtool check metrics`) on `text`.
///
/// # Panics
/// When promtool is not installed (`SLUICE_TEST_PROMTOOL`) or finds a problem.
pub fn promtool_check(text: &str) {
    let promtool = std::env::var("SLUICE_TEST_PROMTOOL").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_PROMTOOL is not set: run the tests through scripts/test, which \
             installs promtool (Debian's prometheus package) and exports it"
        )
    });
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {promtool}: {e}"));
    check
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("writing to promtool");
    let out = check.wait_with_output().expect("promtool ran");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
