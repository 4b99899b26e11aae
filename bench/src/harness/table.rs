//! Result lines, as people read them and scripts parse them.
//!
//! A [`Table`] is a header line and then one row per run, in one separator (the state
//! and checkpoint benchmarks write CSV, the cluster benchmark spaces); a row must have
//! as many values as the header has columns. A [`Line`] is one line of `key=value`
//! words (the Nexmark and exchange benchmarks), which [`field`] reads back.

use std::fmt;
use std::str::FromStr;

/// Columns and the separator between them.
#[derive(Debug, Clone, Copy)]
pub struct Table {
    columns: &'static [&'static str],
    separator: &'static str,
}

impl Table {
    /// A table of `columns`, separated by `separator`.
    pub const fn new(columns: &'static [&'static str], separator: &'static str) -> Self {
        Self { columns, separator }
    }

    /// The header line.
    pub fn header(&self) -> String {
        self.columns.join(self.separator)
    }

    /// One row; `values` are already formatted, one per column.
    ///
    /// # Panics
    /// When the number of values is not the number of columns (a bug in the benchmark).
    pub fn row(&self, values: &[String]) -> String {
        assert_eq!(
            values.len(),
            self.columns.len(),
            "a row of {} values for the columns {:?}",
            values.len(),
            self.columns
        );
        values.join(self.separator)
    }
}

/// A line of `key=value` words, built field by field.
#[derive(Debug, Default, Clone)]
pub struct Line(String);

impl Line {
    /// An empty line.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `key=value` (`value` formatted as given: pass `format!("{x:.3}")` for a
    /// precision).
    pub fn field(mut self, key: &str, value: impl fmt::Display) -> Self {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        self.0.push_str(key);
        self.0.push('=');
        self.0.push_str(&value.to_string());
        self
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The value of `key=value` in a line of whitespace-separated `key=value` words.
pub fn field<T: FromStr>(line: &str, key: &str) -> Option<T> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_their_fields() {
        let line = Line::new()
            .field("kind", "raw")
            .field("bytes", 42)
            .field("seconds", format!("{:.3}", 1.5))
            .to_string();
        assert_eq!(line, "kind=raw bytes=42 seconds=1.500");
        assert_eq!(field::<u64>(&line, "bytes"), Some(42));
        assert_eq!(field::<f64>(&line, "seconds"), Some(1.5));
        assert_eq!(field::<String>(&line, "kind").as_deref(), Some("raw"));
        assert_eq!(field::<u64>(&line, "byte"), None);
        assert_eq!(field::<u64>(&line, "kind"), None);
    }

    #[test]
    fn tables_have_a_header_and_rows_of_as_many_values() {
        let t = Table::new(&["a", "b"], ",");
        assert_eq!(t.header(), "a,b");
        assert_eq!(t.row(&["1".into(), "x".into()]), "1,x");
    }

    #[test]
    #[should_panic(expected = "a row of 1 values")]
    fn a_short_row_is_a_bug() {
        Table::new(&["a", "b"], " ").row(&["1".into()]);
    }
}
