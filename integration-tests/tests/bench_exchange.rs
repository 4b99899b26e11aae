//! `sluice bench exchange --tls` at a small size, as a smoke test: two worker processes
//! move every record over the data plane plainly and then over mutual TLS (with a CA
//! made for the run), and the benchmark prints both with their ratio.

use sluice_integration_tests::{run_sluice, tempdir};

/// `key=value` words of the output line that starts with `kind=KIND`.
fn line_of<'a>(stdout: &'a str, kind: &str) -> Vec<(&'a str, &'a str)> {
    let prefix = format!("kind={kind} ");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {kind} line in:\n{stdout}"));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

fn field<'a>(words: &[(&'a str, &'a str)], key: &str) -> &'a str {
    words
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {key} in {words:?}"))
}

#[test]
fn the_exchange_moves_every_record_plainly_and_over_mutual_tls() {
    let dir = tempdir();
    let args = [
        "bench",
        "exchange",
        "--events",
        "300000",
        "--no-raw",
        "--tls",
        "--timeout-secs",
        "120",
    ];
    let out = run_sluice(&args, dir.path());
    out.assert_success().assert_no_panic();
    let plain = line_of(&out.stdout, "exchange");
    let tls = line_of(&out.stdout, "exchange-tls");
    assert_eq!(field(&plain, "records"), "300000", "{}", out.stdout);
    assert_eq!(field(&tls, "records"), "300000", "{}", out.stdout);
    assert_ne!(field(&tls, "bytes"), "0", "{}", out.stdout);
    assert!(
        out.stdout.lines().any(|l| l.starts_with("tls_ratio=")),
        "{}",
        out.stdout
    );
}
