//! SQL expressions on Arrow batches, compiled and evaluated by DataFusion.
//!
//! The job file holds expressions as SQL text (`price * 0.908 AS price_eur`). This module
//! turns them into DataFusion physical expressions against a known input schema once, at
//! planning time, so that type errors and unknown columns surface before the job runs,
//! and evaluation is vectorized over whole batches. It never interprets rows itself.
//!
//! - [`compile`]: scalar expressions (filters, projections, aggregate arguments).
//! - [`udf`]: Flink's functions DataFusion lacks, and user-defined scalar functions.
//! - [`aggregate`]: aggregate calls (`count(*)`, `sum(price)`) split into a function and
//!   its argument.
//! - [`wildcard`]: a select item `*` or `* EXCEPT (a, b)`, which the select expands.

pub mod aggregate;
mod compile;
pub mod udf;

pub use compile::{CompiledExpr, ExprCompiler, strip_aliases};

/// A select item `*` or `* EXCEPT (a, b)` (every input column, but those): the names it
/// leaves out, or `None` when `sql` is not such an item.
pub fn wildcard(sql: &str) -> Option<Vec<String>> {
    let rest = sql.trim().strip_prefix('*')?.trim();
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let (word, list) = rest.split_at(rest.find('(')?);
    if !word.trim().eq_ignore_ascii_case("except") {
        return None;
    }
    let list = list.strip_prefix('(')?.trim_end().strip_suffix(')')?;
    Some(
        list.split(',')
            .map(|n| n.trim().trim_matches('"').to_owned())
            .filter(|n| !n.is_empty())
            .collect(),
    )
}

#[cfg(test)]
mod wildcard_tests {
    use super::wildcard;

    #[test]
    fn star_and_star_except_are_read() {
        assert_eq!(wildcard("*"), Some(vec![]));
        assert_eq!(
            wildcard(" * EXCEPT (a, \"b\") "),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(wildcard("a * 2"), None);
        assert_eq!(wildcard("* 2"), None);
        assert_eq!(wildcard("* REPLACE (a)"), None);
    }
}
