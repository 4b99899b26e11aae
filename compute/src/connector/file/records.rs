//! Finding the records of a text file and the line each starts on.
//!
//! The decoders of arrow-csv and arrow-json work on byte streams and do not say which
//! record was bad; this scanner cuts a file into records first, so that a bad record can
//! be named by `file:line` and dropped alone. JSON lines end at every newline; CSV
//! records end at a newline outside double quotes (a quoted field may span lines).
//! Blank lines hold no record but are counted.

/// One record: its bytes and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSpan {
    /// Offset of its first byte.
    pub start: usize,
    /// Offset just past its content, before the line terminator.
    pub end: usize,
    /// Offset of the next record (just past the terminator).
    pub next: usize,
    /// 1-based line it starts on.
    pub line: u64,
}

/// Walks the records of one file's bytes.
#[derive(Debug, Clone)]
pub struct RecordScanner {
    /// CSV quoting rules (otherwise JSON lines).
    csv: bool,
    pos: usize,
    line: u64,
}

impl RecordScanner {
    /// A scanner at the start of a file; `csv` selects CSV quoting rules.
    pub fn new(csv: bool) -> Self {
        RecordScanner {
            csv,
            pos: 0,
            line: 1,
        }
    }

    /// True when every record of `data` has been returned.
    pub fn at_end(&self, data: &[u8]) -> bool {
        self.pos >= data.len()
    }

    /// Appends up to `max` records of `data` to `out`, skipping blank lines.
    pub fn scan(&mut self, data: &[u8], max: usize, out: &mut Vec<RecordSpan>) {
        let mut taken = 0;
        while taken < max && self.pos < data.len() {
            let start = self.pos;
            let line = self.line;
            let (end, next, newlines) = if self.csv {
                csv_record_end(data, start)
            } else {
                match data[start..].iter().position(|b| *b == b'\n') {
                    Some(i) => (start + i, start + i + 1, 1),
                    None => (data.len(), data.len(), 0),
                }
            };
            self.pos = next;
            self.line += newlines;
            let content = trim_cr(&data[start..end]);
            if content.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            out.push(RecordSpan {
                start,
                end,
                next,
                line,
            });
            taken += 1;
        }
    }
}

/// `(end, next, newlines consumed)` of the CSV record starting at `start`.
fn csv_record_end(data: &[u8], start: usize) -> (usize, usize, u64) {
    let mut in_quotes = false;
    let mut newlines = 0;
    let mut i = start;
    while let Some(offset) = data[i..].iter().position(|b| *b == b'\n' || *b == b'"') {
        i += offset;
        if data[i] == b'"' {
            in_quotes = !in_quotes;
        } else {
            newlines += 1;
            if !in_quotes {
                return (i, i + 1, newlines);
            }
        }
        i += 1;
    }
    (data.len(), data.len(), newlines)
}

/// The record's text without a trailing carriage return.
pub fn trim_cr(bytes: &[u8]) -> &[u8] {
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(csv: bool, text: &str) -> Vec<(u64, String)> {
        let mut s = RecordScanner::new(csv);
        let mut out = Vec::new();
        s.scan(text.as_bytes(), usize::MAX, &mut out);
        assert!(s.at_end(text.as_bytes()));
        out.iter()
            .map(|r| {
                (
                    r.line,
                    String::from_utf8_lossy(trim_cr(&text.as_bytes()[r.start..r.end])).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn csv_records_may_span_lines_inside_quotes() {
        let text = "a,b\n1,\"x\ny\"\n\n2,\"\"\"q\"\"\"\r\n3,z";
        assert_eq!(
            scan_all(true, text),
            vec![
                (1, "a,b".into()),
                (2, "1,\"x\ny\"".into()),
                (5, "2,\"\"\"q\"\"\"".into()),
                (6, "3,z".into())
            ]
        );
    }

    #[test]
    fn json_lines_end_at_every_newline_and_blank_lines_count() {
        let text = "{\"a\":1}\n\n  \n{\"a\":\"x\ny\"}\n";
        assert_eq!(
            scan_all(false, text),
            vec![
                (1, "{\"a\":1}".into()),
                (4, "{\"a\":\"x".into()),
                (5, "y\"}".into())
            ]
        );
    }

    #[test]
    fn scanning_resumes_where_it_stopped() {
        let text = b"1\n2\n3\n4\n5\n";
        let mut s = RecordScanner::new(true);
        let mut out = Vec::new();
        s.scan(text, 2, &mut out);
        assert_eq!(out.len(), 2);
        assert!(!s.at_end(text));
        out.clear();
        s.scan(text, 10, &mut out);
        assert_eq!(out.iter().map(|r| r.line).collect::<Vec<_>>(), [3, 4, 5]);
        assert!(s.at_end(text));
    }
}
