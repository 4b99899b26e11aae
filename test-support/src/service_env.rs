//! The one way a test finds a test service in its environment (S3, Azurite): the
//! endpoint variable, a loud skip when asked for, and a clear failure otherwise.

use std::io::Write;

/// A test service as the environment names it.
pub(crate) struct Service<'a> {
    /// The name in messages: `S3`, `Azure`.
    pub label: &'a str,
    /// The variable holding the endpoint.
    pub endpoint_var: &'a str,
    /// The variable that, set to `1`, skips the tests of this service.
    pub skip_var: &'a str,
    /// Said after how to start the services (what it needs, or who does it).
    pub start_hint: &'a str,
    /// Variables that must be set with the endpoint.
    pub required: &'a [&'a str],
}

/// The endpoint and the values of `service.required` for `test`; `None` (after a loud
/// message saying that `what` is not tested) when the skip variable is `1`.
///
/// # Panics
/// When the test services are not configured and skipping was not asked for.
pub(crate) fn service_env(
    service: &Service<'_>,
    test: &str,
    what: &str,
) -> Option<(String, Vec<String>)> {
    let Service {
        label,
        endpoint_var,
        skip_var,
        start_hint,
        required,
    } = service;
    let endpoint = std::env::var(endpoint_var).unwrap_or_default();
    if endpoint.is_empty() {
        if std::env::var(skip_var).as_deref() == Ok("1") {
            // Straight to stderr: the test harness captures `eprintln!` of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!!!!! SKIPPED {label} test `{test}`: {skip_var}=1 and no \
                 {endpoint_var}. {what} is NOT tested. !!!!!!!!\n"
            );
            return None;
        }
        panic!(
            "{endpoint_var} is not set: start the test services first with\n    \
             eval \"$(scripts/test-services.sh start)\"\n{start_hint}, or set \
             {skip_var}=1 to skip the {label} tests"
        );
    }
    let values = required
        .iter()
        .map(|name| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!(
                    "{name} is not set although {endpoint_var} is: export everything \
                     `scripts/test-services.sh start` prints"
                )
            })
        })
        .collect();
    Some((endpoint, values))
}
