//! The names of aggregate functions a program registered in Rust (`compute`'s
//! `expr::udf::register_aggregate`), for the front ends, which plan `name(x)` in a
//! SELECT list as an aggregate call without knowing how it computes.
//!
//! It holds names only: what a function does lives in `compute`.

use std::sync::RwLock;

static NAMES: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// The built-in aggregate functions' names (`mean` is `avg`).
pub const BUILT_IN: &[&str] = &["count", "sum", "min", "max", "avg", "mean"];

/// Whether `name` (any case) is an aggregate function: built in or registered.
pub fn is_aggregate(name: &str) -> bool {
    BUILT_IN.iter().any(|b| b.eq_ignore_ascii_case(name)) || is_registered(name)
}

/// Records `name` (any case) as a registered aggregate function of this process.
pub fn register(name: &str) {
    let name = name.to_ascii_lowercase();
    let mut names = NAMES.write().unwrap_or_else(|e| e.into_inner());
    if !names.contains(&name) {
        names.push(name);
    }
}

/// Whether `name` (any case) is a registered aggregate function.
pub fn is_registered(name: &str) -> bool {
    let names = NAMES.read().unwrap_or_else(|e| e.into_inner());
    names.iter().any(|n| n.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_found_in_any_case() {
        super::register("GeoMean_Test");
        assert!(super::is_registered("geomean_test"));
        assert!(!super::is_registered("geomean_other"));
        assert!(super::is_aggregate("GEOMEAN_TEST") && super::is_aggregate("Mean"));
        assert!(!super::is_aggregate("geomean_other"));
    }
}
