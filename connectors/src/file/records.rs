//! Finding the records of a text file and the line each starts on.
//!
//! The decoders of arrow-csv and arrow-json work on byte streams and do not say which
//! record was bad; this scanner cuts a file into records first, so that a bad record can
//! be named by `file:line` and dropped alone. JSON lines end at every newline; CSV
//! records end at a newline outside double quotes (a quoted field may span lines).
//! Blank lines hold no record but are counted.
//!
//! The bytes may be a window of the file that ends anywhere: unless the window reaches
//! the end of the file, a record is returned only once its terminating newline is inside
//! the window, so a record cut off by the window's end is left for the next scan. The
//! caller may drop a consumed prefix of the window ([`RecordScanner::discard`]); the
//! line counter carries on, so lines stay exact across windows.

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

impl RecordSpan {
    /// The line the next record starts on, given the `data` the span is in: every
    /// newline of the record, quoted or not, and its terminator count.
    pub fn next_line(&self, data: &[u8]) -> u64 {
        self.line
            + data[self.start..self.next]
                .iter()
                .filter(|b| **b == b'\n')
                .count() as u64
    }
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

    /// A scanner resuming a file at a record boundary whose first record starts on `line`
    /// (the window then begins at that record's first byte).
    pub fn at_line(csv: bool, line: u64) -> Self {
        RecordScanner { csv, pos: 0, line }
    }

    /// True when every record of `data` has been returned.
    pub fn at_end(&self, data: &[u8]) -> bool {
        self.pos >= data.len()
    }

    /// Offset in the current window of the first byte not yet returned.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// 1-based line of the file the next record starts on.
    pub fn line(&self) -> u64 {
        self.line
    }

    /// Follows the caller dropping the first `n` bytes of the window (all returned).
    pub fn discard(&mut self, n: usize) {
        assert!(n <= self.pos, "discarding bytes not yet scanned");
        self.pos -= n;
    }

    /// Appends up to `max` records of `data`, which ends where the file does, to `out`,
    /// skipping blank lines.
    pub fn scan(&mut self, data: &[u8], max: usize, out: &mut Vec<RecordSpan>) {
        self.scan_window(data, max, true, out);
    }

    /// Like [`scan`](Self::scan) on a window of the file: unless `eof` says that `data`
    /// ends where the file does, a record without its terminating newline in `data` is
    /// not returned (nor its lines counted) yet.
    pub fn scan_window(&mut self, data: &[u8], max: usize, eof: bool, out: &mut Vec<RecordSpan>) {
        let mut taken = 0;
        while taken < max && self.pos < data.len() {
            let start = self.pos;
            let line = self.line;
            let found = if self.csv {
                csv_record_end(data, start)
            } else {
                find_newline(&data[start..]).map(|i| (start + i, start + i + 1, 1))
            };
            let (end, next, newlines) = match found {
                Some(found) => found,
                // The last record of the file may lack its terminator.
                None if eof => (data.len(), data.len(), 0),
                None => break,
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

fn find_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| *b == b'\n')
}

/// `(end, next, newlines consumed)` of the CSV record starting at `start`, or `None`
/// when `data` ends before its terminating newline (outside quotes).
fn csv_record_end(data: &[u8], start: usize) -> Option<(usize, usize, u64)> {
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
                return Some((i, i + 1, newlines));
            }
        }
        i += 1;
    }
    None
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

    #[test]
    fn a_record_cut_off_by_the_window_waits_for_more_bytes() {
        let text = "a,b\n1,\"x\ny\"\r\n\n2,z";
        let mut s = RecordScanner::new(true);
        let mut out = Vec::new();
        // Cut inside the quoted newline's record: only the header is complete.
        s.scan_window(&text.as_bytes()[..8], 10, false, &mut out);
        assert_eq!(out.iter().map(|r| r.line).collect::<Vec<_>>(), [1]);
        assert_eq!((s.pos(), s.line()), (4, 2));
        // Cut just before the CRLF's newline: still incomplete.
        s.scan_window(&text.as_bytes()[..12], 10, false, &mut out);
        assert_eq!(out.len(), 1);
        s.scan_window(&text.as_bytes()[..13], 10, false, &mut out);
        assert_eq!(out.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 2]);
        assert_eq!((s.pos(), s.line()), (13, 4));
        // The last record has no newline: complete only at the end of the file.
        s.scan_window(text.as_bytes(), 10, false, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(s.line(), 5);
        // Drop the consumed prefix: offsets shift, lines carry on.
        let pos = s.pos();
        s.discard(pos);
        let rest = &text.as_bytes()[pos..];
        s.scan(rest, 10, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!((out[2].start, out[2].end, out[2].line), (0, 3, 5));
        assert!(s.at_end(rest));
    }

    #[test]
    fn json_lines_wait_for_their_newline() {
        let text = b"{\"a\":1}\n{\"a\":2}";
        let mut s = RecordScanner::new(false);
        let mut out = Vec::new();
        s.scan_window(text, 10, false, &mut out);
        assert_eq!(out.len(), 1);
        assert!(!s.at_end(text));
        s.scan(text, 10, &mut out);
        assert_eq!(out.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 2]);
        assert!(s.at_end(text));
    }

    #[test]
    fn a_resumed_scanner_keeps_counting_lines() {
        let text = "a,b\n1,\"x\ny\"\r\n\n2,z\n3,w\n";
        let mut s = RecordScanner::new(true);
        let mut out = Vec::new();
        s.scan(text.as_bytes(), 2, &mut out);
        let last = out[1];
        assert_eq!(last.next_line(text.as_bytes()), 4);
        // Resume at the byte after the second record, on its next line.
        let rest = &text.as_bytes()[last.next..];
        let mut resumed = RecordScanner::at_line(true, last.next_line(text.as_bytes()));
        let mut more = Vec::new();
        resumed.scan(rest, 10, &mut more);
        s.scan(text.as_bytes(), 10, &mut out);
        assert_eq!(
            more.iter().map(|r| r.line).collect::<Vec<_>>(),
            out[2..].iter().map(|r| r.line).collect::<Vec<_>>()
        );
        assert_eq!(more.iter().map(|r| r.line).collect::<Vec<_>>(), [5, 6]);
    }
}
