//! Seeded randomness for tests: the workspace's one generator
//! ([`sluice_common::rng::Rng`]) and a seed that can be replayed.

use std::io::Write;

pub use sluice_common::rng::Rng;

/// The seed in the environment variable `var` (decimal or `0x` hex), else `default`.
/// The seed is printed (to stderr, past the test harness's capture) so a failing run
/// says how to replay it.
///
/// # Panics
/// When `var` is set to something that is not a number: a replay with a mistyped seed
/// must not silently run another one.
pub fn seed_from_env(var: &str, default: u64) -> u64 {
    let seed = match std::env::var(var) {
        Ok(text) => parse_seed(&text)
            .unwrap_or_else(|| panic!("{var}={text:?} is not a seed (decimal or 0x hex)")),
        Err(_) => default,
    };
    let _ = writeln!(
        std::io::stderr(),
        "seed {seed:#x} (replay with {var}={seed:#x})"
    );
    seed
}

/// A generator seeded from `var` (see [`seed_from_env`]).
pub fn rng_from_env(var: &str, default: u64) -> Rng {
    Rng::new(seed_from_env(var, default))
}

fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim().replace('_', "");
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_read_as_decimal_or_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed("0x5eed_f00d"), Some(0x5eed_f00d));
        assert_eq!(parse_seed("seed"), None);
        assert_eq!(
            seed_from_env("SLUICE_TEST_SUPPORT_UNSET_SEED", 7),
            7,
            "an unset variable gives the default"
        );
    }
}
