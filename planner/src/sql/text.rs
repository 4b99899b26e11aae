//! The pieces of Flink SQL that DataFusion's parser does not take, cut out of the text
//! before it parses: `WATERMARK FOR ...` and a processing-time column `p AS PROCTIME()`
//! in a table's column list, `FOR SYSTEM_TIME AS OF l.p_time` after a joined table,
//! and the `TABLE` keyword before a window function's table argument
//! (`HOP(TABLE bid, ...)`). Each is blanked with spaces, so every other token
//! keeps its line and column.

use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

use crate::job_spec::Pos;

use super::lower::{Result, SqlError};

/// A `WATERMARK FOR column AS expression` clause cut out of the text.
#[derive(Debug, Clone)]
pub(super) struct WatermarkClause {
    /// Where `WATERMARK` was written.
    pub at: Pos,
    pub column: String,
    /// The expression's text and where it starts.
    pub expr: String,
    pub expr_at: Pos,
}

/// A computed column `column AS PROCTIME()` cut out of the text: the table's processing
/// time, which a window may be over.
#[derive(Debug, Clone)]
pub(super) struct ProctimeClause {
    /// Where the column's name was written.
    pub at: Pos,
    pub column: String,
}

/// `FOR SYSTEM_TIME AS OF column` cut out of the text after a joined table: a temporal
/// join's time.
#[derive(Debug, Clone)]
pub(super) struct AsOfClause {
    /// Where `FOR` was written.
    pub at: Pos,
    /// The column, as written (`b.p_time`: `["b", "p_time"]`).
    pub column: Vec<String>,
    /// Where the column starts.
    pub column_at: Pos,
    /// Where the name of the table it follows starts.
    pub table_at: Pos,
}

/// The clauses cut out of a text, in text order; each CREATE TABLE takes its own.
#[derive(Debug, Default)]
pub(super) struct Clauses {
    pub watermarks: Vec<WatermarkClause>,
    pub proctimes: Vec<ProctimeClause>,
    pub as_of: Vec<AsOfClause>,
}

/// The text with the clauses blanked, and the clauses.
pub(super) struct Prepared {
    pub sql: String,
    pub clauses: Clauses,
}

/// A position as job files report them, from a parser location (line 0: unknown).
pub(super) fn pos(l: Location) -> Pos {
    if l.line == 0 {
        return Pos::START;
    }
    Pos {
        line: u32::try_from(l.line).unwrap_or(u32::MAX),
        column: u32::try_from(l.column).unwrap_or(u32::MAX),
    }
}

pub(super) fn prepare(sql: &str) -> Result<Prepared> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| SqlError::new(pos(e.location), e.message))?;
    // Significant tokens only, with their index into `tokens`.
    let sig: Vec<&TokenWithSpan> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    let lines = LineIndex::new(sql);
    let mut blank: Vec<(usize, usize)> = Vec::new();
    let mut watermarks = Vec::new();
    let mut proctimes = Vec::new();
    let mut as_of_clauses = Vec::new();
    let mut i = 0;
    while i < sig.len() {
        let after_open_or_comma = i > 0 && matches!(sig[i - 1].token, Token::LParen | Token::Comma);
        if after_open_or_comma && is_keyword(sig[i], Keyword::TABLE) {
            // `HOP(TABLE bid, ...)`: the table argument, as an identifier.
            blank.push(lines.range(sig[i]));
        } else if after_open_or_comma
            && is_word(sig[i], "WATERMARK")
            && sig.get(i + 1).is_some_and(|t| is_keyword(t, Keyword::FOR))
        {
            let (clause, end) = watermark(&sig, i, sql, &lines)?;
            blank.push(around_commas(&sig, i, end, &lines));
            watermarks.push(clause);
            i = end;
            continue;
        } else if i > 0
            && is_keyword(sig[i], Keyword::FOR)
            && sig.get(i + 1).is_some_and(|t| is_word(t, "SYSTEM_TIME"))
        {
            let (clause, end) = as_of(&sig, i)?;
            blank.push((lines.range(sig[i]).0, lines.range(sig[end - 1]).1));
            as_of_clauses.push(clause);
            i = end;
            continue;
        } else if after_open_or_comma
            && let Some(Token::Word(column)) = sig.get(i).map(|t| &t.token)
            && sig.get(i + 1).is_some_and(|t| is_keyword(t, Keyword::AS))
            && sig.get(i + 2).is_some_and(|t| is_word(t, "PROCTIME"))
            && sig.get(i + 3).is_some_and(|t| t.token == Token::LParen)
            && sig.get(i + 4).is_some_and(|t| t.token == Token::RParen)
        {
            proctimes.push(ProctimeClause {
                at: pos(sig[i].span.start),
                column: column.value.clone(),
            });
            blank.push(around_commas(&sig, i, i + 5, &lines));
            i += 5;
            continue;
        }
        i += 1;
    }
    let mut bytes = sql.as_bytes().to_vec();
    for (from, to) in blank {
        for b in &mut bytes[from..to] {
            if *b != b'\n' && *b != b'\r' {
                *b = b' ';
            }
        }
    }
    // Whole tokens were replaced by ASCII spaces, so the text is still UTF-8.
    let sql = String::from_utf8(bytes)
        .map_err(|_| SqlError::new(Pos::START, "the SQL text is not UTF-8".to_owned()))?;
    Ok(Prepared {
        sql,
        clauses: Clauses {
            watermarks,
            proctimes,
            as_of: as_of_clauses,
        },
    })
}

/// The clause starting at `sig[i]` (`FOR SYSTEM_TIME AS OF col`), and the index just
/// past it.
fn as_of(sig: &[&TokenWithSpan], i: usize) -> Result<(AsOfClause, usize)> {
    let at = pos(sig[i].span.start);
    let expected = || {
        SqlError::new(
            at,
            "expected `FOR SYSTEM_TIME AS OF alias.column`, the processing-time column of \
             the join's other side"
                .to_owned(),
        )
    };
    if !(sig.get(i + 2).is_some_and(|t| is_keyword(t, Keyword::AS))
        && sig.get(i + 3).is_some_and(|t| is_word(t, "OF")))
    {
        return Err(expected());
    }
    let mut end = i + 4;
    let mut column = Vec::new();
    loop {
        match sig.get(end).map(|t| &t.token) {
            Some(Token::Word(w)) => column.push(w.value.clone()),
            _ => return Err(expected()),
        }
        end += 1;
        if sig.get(end).is_none_or(|t| t.token != Token::Period) {
            break;
        }
        end += 1;
    }
    Ok((
        AsOfClause {
            at,
            column,
            column_at: pos(sig[i + 4].span.start),
            table_at: pos(sig[i - 1].span.start),
        },
        end,
    ))
}

/// The byte range of the clause `sig[i..end]` in a column list, with one comma that
/// separates it from a neighbour.
fn around_commas(
    sig: &[&TokenWithSpan],
    i: usize,
    end: usize,
    lines: &LineIndex,
) -> (usize, usize) {
    let mut from = lines.range(sig[i]).0;
    let mut to = lines.range(sig[end - 1]).1;
    if matches!(sig[i - 1].token, Token::Comma) {
        from = lines.range(sig[i - 1]).0;
    } else if sig
        .get(end)
        .is_some_and(|t| matches!(t.token, Token::Comma))
    {
        to = lines.range(sig[end]).1;
    }
    (from, to)
}

/// The clause starting at `sig[i]` (`WATERMARK`), and the index just past it: it ends
/// before a `,` or `)` outside parentheses of its own.
fn watermark(
    sig: &[&TokenWithSpan],
    i: usize,
    sql: &str,
    lines: &LineIndex,
) -> Result<(WatermarkClause, usize)> {
    let at = pos(sig[i].span.start);
    let expected = "expected `WATERMARK FOR column AS column - INTERVAL 'n' SECOND`";
    let column = match sig.get(i + 2).map(|t| &t.token) {
        Some(Token::Word(w)) => w.value.clone(),
        _ => return Err(SqlError::new(at, expected.to_owned())),
    };
    if !sig.get(i + 3).is_some_and(|t| is_keyword(t, Keyword::AS)) {
        return Err(SqlError::new(at, expected.to_owned()));
    }
    let start = i + 4;
    let mut depth = 0usize;
    let mut end = start;
    while end < sig.len() {
        match sig[end].token {
            Token::LParen => depth += 1,
            Token::RParen if depth == 0 => break,
            Token::RParen => depth -= 1,
            Token::Comma if depth == 0 => break,
            Token::SemiColon | Token::EOF => break,
            _ => {}
        }
        end += 1;
    }
    if end == start {
        return Err(SqlError::new(at, expected.to_owned()));
    }
    let expr = sql[lines.range(sig[start]).0..lines.range(sig[end - 1]).1].to_owned();
    Ok((
        WatermarkClause {
            at,
            column,
            expr,
            expr_at: pos(sig[start].span.start),
        },
        end,
    ))
}

fn is_keyword(t: &TokenWithSpan, k: Keyword) -> bool {
    matches!(&t.token, Token::Word(w) if w.keyword == k && w.quote_style.is_none())
}

fn is_word(t: &TokenWithSpan, word: &str) -> bool {
    matches!(&t.token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// Byte offsets of parser locations (1-based lines, columns counted in characters).
struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self { text, starts }
    }

    fn offset(&self, l: Location) -> usize {
        let Some(&start) = usize::try_from(l.line)
            .ok()
            .and_then(|line| line.checked_sub(1))
            .and_then(|line| self.starts.get(line))
        else {
            return self.text.len();
        };
        let col = usize::try_from(l.column)
            .unwrap_or(usize::MAX)
            .saturating_sub(1);
        self.text[start..]
            .char_indices()
            .nth(col)
            .map_or(self.text.len(), |(i, _)| start + i)
    }

    fn range(&self, t: &TokenWithSpan) -> (usize, usize) {
        (self.offset(t.span.start), self.offset(t.span.end))
    }
}
