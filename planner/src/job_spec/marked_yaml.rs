//! A small YAML tree that remembers where every node was written.
//!
//! `yaml-rust2`'s own `Yaml` tree drops positions, so we pull events from its `Parser`
//! ourselves and build a [`Node`] per scalar, sequence and mapping, each with the 1-based
//! line and column it starts at. Decoding then works on this tree and can point at the exact
//! spot of every mistake.
//!
//! # What is accepted
//!
//! One YAML document of plain data: no anchors, aliases or tags (they are rejected with a
//! message saying so), at most [`MAX_DEPTH`] levels of nesting, and no duplicate keys in a
//! mapping. YAML syntax errors keep the scanner's position.
//!
//! # Why not `Parser::load`
//!
//! `load` recurses once per nesting level (a hostile `[[[[...` overflows the stack) and
//! asserts on event order. Pulling events with `next_token` in a loop over an explicit
//! stack avoids both, so no input can crash the parser.

use std::collections::HashMap;
use std::fmt;

use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, ScanError, TScalarStyle};

use sluice_common::pb;

/// Deepest nesting of sequences and mappings accepted; job files need about six.
pub(crate) const MAX_DEPTH: usize = 64;

/// A position in the job file, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    /// The start of the file.
    pub const START: Pos = Pos { line: 1, column: 1 };

    /// `yaml-rust2` markers count lines from 1 and columns from 0.
    fn from_marker(marker: &Marker) -> Pos {
        Pos {
            line: saturating_u32(marker.line().max(1)),
            column: saturating_u32(marker.col().saturating_add(1)),
        }
    }

    /// The position as the job graph stores it.
    pub fn to_location(self) -> pb::Location {
        pb::Location {
            line: self.line,
            column: self.column,
        }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A mistake at a position in the file; the caller adds the file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PosError {
    pub pos: Pos,
    pub message: String,
}

impl PosError {
    pub fn new(pos: Pos, message: impl Into<String>) -> PosError {
        PosError {
            pos,
            message: message.into(),
        }
    }
}

/// A node of the tree and where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub value: Value,
    pub pos: Pos,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    /// Nothing at all, `~` or `null`, written plain. A key with no value holds a `Null`
    /// positioned at the key.
    Null,
    /// Any other scalar. `quoted` is true for quoted and block (`|`, `>`) scalars, which are
    /// strings whatever they look like: `"2"` is not an integer.
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    /// Entries in file order; keys are unique among scalar keys.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// The text of a scalar (empty for anything else).
    pub fn text(&self) -> &str {
        match &self.value {
            Value::Scalar { text, .. } => text,
            _ => "",
        }
    }

    /// How the node reads in an error message: "`two`", "the string \"two\"", "a list".
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Null => "nothing".to_owned(),
            Value::Scalar {
                text,
                quoted: false,
            } => format!("`{}`", abbreviate(text)),
            Value::Scalar { text, quoted: true } => {
                format!("the string \"{}\"", abbreviate(text))
            }
            Value::Seq(_) => "a list".to_owned(),
            Value::Map(_) => "a mapping".to_owned(),
        }
    }
}

/// Long values are cut in messages so one line stays readable.
fn abbreviate(text: &str) -> String {
    const MAX_CHARS: usize = 40;
    if text.chars().count() <= MAX_CHARS {
        text.to_owned()
    } else {
        let head: String = text.chars().take(MAX_CHARS).collect();
        format!("{head}...")
    }
}

/// Parses one YAML document into a marked tree.
pub(crate) fn parse(text: &str) -> Result<Node, PosError> {
    let mut parser = Parser::new_from_str(text);
    let mut builder = TreeBuilder::default();
    loop {
        let (event, marker) = parser
            .next_token()
            .map_err(|error| syntax_error(text, &error, &builder.stack))?;
        if let Some(root) = builder.on_event(event, &marker)? {
            return Ok(root);
        }
    }
}

/// A sequence or mapping whose end event has not arrived yet.
struct Frame {
    start: Marker,
    pos: Pos,
    kind: FrameKind,
}

enum FrameKind {
    Seq(Vec<Node>),
    Map {
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
        seen: HashMap<String, Pos>,
    },
}

#[derive(Default)]
struct TreeBuilder {
    stack: Vec<Frame>,
    root: Option<Node>,
    documents: usize,
}

impl TreeBuilder {
    /// Feeds one event; returns the root once the stream ends.
    fn on_event(&mut self, event: Event, marker: &Marker) -> Result<Option<Node>, PosError> {
        let pos = Pos::from_marker(marker);
        match event {
            Event::Nothing | Event::StreamStart | Event::DocumentEnd => {}
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(PosError::new(
                        pos,
                        "a job file holds a single YAML document; found a second one (remove \
                         the extra `---`)",
                    ));
                }
            }
            Event::StreamEnd => {
                return match self.root.take() {
                    Some(root) => Ok(Some(root)),
                    None => Err(PosError::new(
                        Pos::START,
                        "the job file is empty; expected a mapping with at least `name`, \
                         `source` and `sink`",
                    )),
                };
            }
            Event::Alias(_) => {
                return Err(PosError::new(
                    pos,
                    "aliases (`*name`) are not supported in job files; write the value out",
                ));
            }
            Event::Scalar(text, style, anchor, tag) => {
                check_plain(pos, anchor, tag.as_ref())?;
                let value = match style {
                    TScalarStyle::Plain if is_null(&text) => Value::Null,
                    TScalarStyle::Plain => Value::Scalar {
                        text,
                        quoted: false,
                    },
                    _ => Value::Scalar { text, quoted: true },
                };
                self.push(Node { value, pos })?;
            }
            Event::SequenceStart(anchor, tag) => {
                check_plain(pos, anchor, tag.as_ref())?;
                self.open(marker, pos, FrameKind::Seq(Vec::new()))?;
            }
            Event::MappingStart(anchor, tag) => {
                check_plain(pos, anchor, tag.as_ref())?;
                let kind = FrameKind::Map {
                    entries: Vec::new(),
                    key: None,
                    seen: HashMap::new(),
                };
                self.open(marker, pos, kind)?;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = self.stack.pop() else {
                    return Err(PosError::new(pos, "unbalanced end of a YAML collection"));
                };
                let value = match frame.kind {
                    FrameKind::Seq(items) => Value::Seq(items),
                    FrameKind::Map { entries, .. } => Value::Map(entries),
                };
                self.push(Node {
                    value,
                    pos: frame.pos,
                })?;
            }
        }
        Ok(None)
    }

    fn open(&mut self, marker: &Marker, pos: Pos, kind: FrameKind) -> Result<(), PosError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(PosError::new(
                pos,
                format!("the YAML is nested more than {MAX_DEPTH} levels deep"),
            ));
        }
        self.stack.push(Frame {
            start: *marker,
            pos,
            kind,
        });
        Ok(())
    }

    /// Adds a finished node to the open collection, or makes it the root.
    fn push(&mut self, node: Node) -> Result<(), PosError> {
        let Some(frame) = self.stack.last_mut() else {
            if self.root.is_some() {
                return Err(PosError::new(
                    node.pos,
                    "a job file holds a single YAML document",
                ));
            }
            self.root = Some(node);
            return Ok(());
        };
        match &mut frame.kind {
            FrameKind::Seq(items) => items.push(node),
            FrameKind::Map { entries, key, seen } => match key.take() {
                None => {
                    if let Value::Scalar { text, .. } = &node.value
                        && let Some(first) = seen.insert(text.clone(), node.pos)
                    {
                        return Err(PosError::new(
                            node.pos,
                            format!(
                                "duplicate key `{}` (first written at {first})",
                                abbreviate(text)
                            ),
                        ));
                    }
                    // A block mapping's start marker sits after its first key; the key is
                    // where a reader sees the mapping begin.
                    if entries.is_empty() && node.pos < frame.pos {
                        frame.pos = node.pos;
                    }
                    *key = Some(node);
                }
                Some(k) => {
                    let mut value = node;
                    if value.value == Value::Null {
                        // An absent value is reported at its key, not at the next line.
                        value.pos = k.pos;
                    }
                    entries.push((k, value));
                }
            },
        }
        Ok(())
    }
}

fn is_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

fn check_plain(pos: Pos, anchor: usize, tag: Option<&Tag>) -> Result<(), PosError> {
    if anchor != 0 {
        return Err(PosError::new(
            pos,
            "anchors (`&name`) are not supported in job files; write the value out",
        ));
    }
    if let Some(tag) = tag {
        return Err(PosError::new(
            pos,
            format!(
                "YAML tags (`{}{}`) are not supported in job files",
                tag.handle, tag.suffix
            ),
        ));
    }
    Ok(())
}

/// A scanner error, with a hint when a flow collection (`[` or `{`) is still open.
fn syntax_error(text: &str, error: &ScanError, open: &[Frame]) -> PosError {
    let mut message = format!("invalid YAML: {}", error.info());
    if error.info().contains("tab") {
        message.push_str(" (YAML indents with spaces, not tabs)");
    }
    let open_flow = open.iter().rev().find_map(|frame| {
        let opener = char_at(text, &frame.start)?;
        let closer = match opener {
            '[' => ']',
            '{' => '}',
            _ => return None,
        };
        Some((opener, closer, frame.pos))
    });
    if let Some((opener, closer, pos)) = open_flow {
        message.push_str(&format!(
            " (inside the `{opener}` opened at {pos}; is a `{closer}` missing?)"
        ));
    }
    PosError::new(Pos::from_marker(error.marker()), message)
}

/// The character a marker points at, if any.
fn char_at(text: &str, marker: &Marker) -> Option<char> {
    let line = text.lines().nth(marker.line().checked_sub(1)?)?;
    line.chars().nth(marker.col())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: u32, column: u32) -> Pos {
        Pos { line, column }
    }

    #[test]
    fn positions_are_one_based_and_block_mappings_start_at_their_first_key() {
        let root = parse("a: 1\nb:\n  c: [x, 'y']\nd:\n").unwrap();
        assert_eq!(root.pos, pos(1, 1));
        let Value::Map(entries) = &root.value else {
            panic!("not a map")
        };
        assert_eq!(entries[0].0.pos, pos(1, 1));
        assert_eq!(entries[0].1.pos, pos(1, 4));
        let inner = &entries[1].1;
        assert_eq!(inner.pos, pos(3, 3));
        let Value::Map(inner) = &inner.value else {
            panic!("not a map")
        };
        assert_eq!(inner[0].1.pos, pos(3, 6));
        let Value::Seq(items) = &inner[0].1.value else {
            panic!("not a seq")
        };
        assert_eq!(items[1].pos, pos(3, 10));
        assert_eq!(
            items[1].value,
            Value::Scalar {
                text: "y".into(),
                quoted: true
            }
        );
        // `d:` has no value: a null at the key.
        assert_eq!(entries[2].1.value, Value::Null);
        assert_eq!(entries[2].1.pos, pos(4, 1));
    }

    #[test]
    fn rejects_duplicates_anchors_tags_and_second_documents() {
        let err = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(err.pos, pos(3, 1));
        assert!(
            err.message
                .contains("duplicate key `a` (first written at 1:1)")
        );

        let err = parse("a: &x 1\nb: *x\n").unwrap_err();
        assert!(err.message.contains("anchors"), "{err:?}");

        let err = parse("a: !!str 1\n").unwrap_err();
        assert!(err.message.contains("tags"), "{err:?}");

        let err = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(err.pos.line, 2);
        assert!(err.message.contains("single YAML document"));
    }

    #[test]
    fn syntax_errors_keep_the_scanner_position_and_name_the_open_bracket() {
        let err = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert_eq!(err.pos, pos(2, 2));
        assert!(err.message.starts_with("invalid YAML: "), "{err:?}");
        assert!(err.message.contains("the `[` opened at 1:4"), "{err:?}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let err = parse(&"[".repeat(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!(err.pos, pos(1, 65));
        assert!(
            err.message.contains("nested more than 64 levels"),
            "{err:?}"
        );
        // Far deeper, the scanner's own limit may answer first; either way, an error.
        assert!(parse(&"[".repeat(100_000)).is_err());
    }
}
