//! Typed reading of the marked YAML tree: mappings checked against the keys they may hold,
//! and scalars read as strings, integers, booleans, durations or one of a set of names.
//!
//! Every failure is a [`PosError`] at the offending node (or, for a missing key, at the
//! mapping that should have held it) whose message names the field by its dotted path
//! (`source.nexmark.events`, `pipeline[2].window`) and says what was expected.

use super::duration::parse_duration_ms;
use super::marked_yaml::{Node, Pos, PosError, Value};

pub(crate) type Result<T> = std::result::Result<T, PosError>;

/// A key and its value, as written.
#[derive(Clone, Copy)]
pub(crate) struct Entry<'a> {
    pub key: &'a Node,
    pub value: &'a Node,
}

/// A mapping under decoding, known to hold only allowed keys.
pub(crate) struct Fields<'a> {
    /// Where the mapping starts (for missing keys).
    pub pos: Pos,
    /// Dotted path of the mapping, empty at the top level.
    pub path: String,
    entries: Vec<(&'a str, Entry<'a>)>,
}

impl<'a> Fields<'a> {
    /// Reads `node` as a mapping whose keys must all be in `allowed`.
    pub fn new(node: &'a Node, path: &str, allowed: &[&str]) -> Result<Fields<'a>> {
        Self::with_noun(node, path, allowed, "key")
    }

    /// Like [`Fields::new`]; `noun` names what an unknown key was taken for ("operator").
    pub fn with_noun(
        node: &'a Node,
        path: &str,
        allowed: &[&str],
        noun: &str,
    ) -> Result<Fields<'a>> {
        let entries: &[(Node, Node)] = match &node.value {
            Value::Map(entries) => entries,
            _ => {
                let keys = if allowed.is_empty() {
                    "no keys: write `{}`".to_owned()
                } else {
                    format!("keys: {}", allowed.join(", "))
                };
                let what = if path.is_empty() {
                    "the job file to be a mapping".to_owned()
                } else {
                    format!("a mapping for `{path}`")
                };
                return Err(PosError::new(
                    node.pos,
                    format!("expected {what} ({keys}), found {}", node.describe()),
                ));
            }
        };
        let mut fields = Fields {
            pos: node.pos,
            path: path.to_owned(),
            entries: Vec::with_capacity(entries.len()),
        };
        for (key, value) in entries {
            let name = match &key.value {
                Value::Scalar { text, .. } => text.as_str(),
                _ => {
                    return Err(PosError::new(
                        key.pos,
                        format!(
                            "expected a key name {}, found {}",
                            place(path),
                            key.describe()
                        ),
                    ));
                }
            };
            if !allowed.contains(&name) {
                return Err(unknown(key, name, noun, path, allowed));
            }
            fields.entries.push((name, Entry { key, value }));
        }
        Ok(fields)
    }

    /// Like [`Fields::new`], but `key:` with no value counts as an empty mapping.
    pub fn or_empty(node: &'a Node, path: &str, allowed: &[&str]) -> Result<Fields<'a>> {
        if node.value == Value::Null {
            return Ok(Fields {
                pos: node.pos,
                path: path.to_owned(),
                entries: Vec::new(),
            });
        }
        Self::new(node, path, allowed)
    }

    pub fn get(&self, key: &str) -> Option<Entry<'a>> {
        self.entries
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, entry)| *entry)
    }

    /// The entry for `key`, or an error at this mapping; `hint` follows the message.
    pub fn require(&self, key: &str, hint: &str) -> Result<Entry<'a>> {
        self.get(key).ok_or_else(|| {
            PosError::new(
                self.pos,
                format!("missing `{key}` {}{hint}", place(&self.path)),
            )
        })
    }

    /// The keys present among `names`, in file order.
    pub fn present(&self, names: &[&str]) -> Vec<(&'a str, Entry<'a>)> {
        self.entries
            .iter()
            .filter(|(name, _)| names.contains(name))
            .copied()
            .collect()
    }

    /// The dotted path of a key of this mapping.
    pub fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Reads an optional key with `read(value, path)`.
    pub fn opt<T>(&self, key: &str, read: impl Fn(&Node, &str) -> Result<T>) -> Result<Option<T>> {
        self.get(key)
            .map(|entry| read(entry.value, &self.path_of(key)))
            .transpose()
    }
}

/// `path.key`, or `key` at the top level.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// "at the top level" or "in source.file".
pub(crate) fn place(path: &str) -> String {
    if path.is_empty() {
        "at the top level".to_owned()
    } else {
        format!("in {path}")
    }
}

/// "a, b or c" for messages.
pub(crate) fn one_of(names: &[&str]) -> String {
    match names {
        [] => "nothing".to_owned(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

fn unknown(key: &Node, name: &str, noun: &str, path: &str, allowed: &[&str]) -> PosError {
    let expected = if allowed.is_empty() {
        "it takes no settings".to_owned()
    } else {
        format!("expected one of {}", allowed.join(", "))
    };
    let mut message = format!("unknown {noun} `{name}` {}; {expected}", place(path));
    if let Some(close) = closest(name, allowed) {
        message.push_str(&format!(" (did you mean `{close}`?)"));
    }
    PosError::new(key.pos, message)
}

/// The allowed name within a small edit distance of `name`, if any.
fn closest<'n>(name: &str, allowed: &[&'n str]) -> Option<&'n str> {
    let limit = (name.chars().count() / 3).clamp(1, 3);
    allowed
        .iter()
        .map(|candidate| (edit_distance(name, candidate), *candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance; names are short so the quadratic table is fine.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

fn type_error(node: &Node, expected: &str, path: &str) -> PosError {
    PosError::new(
        node.pos,
        format!(
            "expected {expected} for `{path}`, found {}",
            node.describe()
        ),
    )
}

/// Any scalar as text (`port: 80` reads as "80"); must not be empty.
pub(crate) fn string(node: &Node, path: &str) -> Result<String> {
    match &node.value {
        Value::Scalar { text, .. } if !text.trim().is_empty() => Ok(text.clone()),
        _ => Err(type_error(node, "a non-empty string", path)),
    }
}

/// A plain non-negative integer; `_` may separate digits (`10_000_000`).
pub(crate) fn u64_value(node: &Node, path: &str) -> Result<u64> {
    let expected = "a non-negative integer";
    let text = match &node.value {
        Value::Scalar {
            text,
            quoted: false,
        } => text.as_str(),
        _ => return Err(type_error(node, expected, path)),
    };
    let digits: String = text.chars().filter(|c| *c != '_').collect();
    let well_formed = !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && !text.starts_with('_')
        && !text.ends_with('_');
    if !well_formed {
        return Err(type_error(node, expected, path));
    }
    digits
        .parse()
        .map_err(|_| PosError::new(node.pos, format!("`{path}` is too large: {text}")))
}

/// A plain integer in `min..=max`.
pub(crate) fn u32_in(node: &Node, path: &str, min: u32, max: u32) -> Result<u32> {
    let value = u64_value(node, path)?;
    match u32::try_from(value) {
        Ok(value) if (min..=max).contains(&value) => Ok(value),
        _ => Err(PosError::new(
            node.pos,
            format!("`{path}` must be between {min} and {max}, found {value}"),
        )),
    }
}

/// `true` or `false`, written plain.
pub(crate) fn bool_value(node: &Node, path: &str) -> Result<bool> {
    match &node.value {
        Value::Scalar {
            text,
            quoted: false,
        } => match text.as_str() {
            "true" | "True" | "TRUE" => Ok(true),
            "false" | "False" | "FALSE" => Ok(false),
            _ => Err(type_error(node, "true or false", path)),
        },
        _ => Err(type_error(node, "true or false", path)),
    }
}

/// A duration such as `10s` in milliseconds.
pub(crate) fn duration_ms(node: &Node, path: &str) -> Result<u64> {
    let text = match &node.value {
        Value::Scalar { text, .. } => text,
        _ => return Err(type_error(node, "a duration such as `10s`", path)),
    };
    parse_duration_ms(text)
        .map_err(|reason| PosError::new(node.pos, format!("bad duration for `{path}`: {reason}")))
}

/// A duration that may be negative (`-10s`), in milliseconds.
pub(crate) fn signed_duration_ms(node: &Node, path: &str) -> Result<i64> {
    let text = match &node.value {
        Value::Scalar { text, .. } => text.trim(),
        _ => return Err(type_error(node, "a duration such as `-10s`", path)),
    };
    let (sign, magnitude) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest.trim_start()),
        None => (1, text),
    };
    let ms = parse_duration_ms(magnitude).map_err(|reason| {
        PosError::new(node.pos, format!("bad duration for `{path}`: {reason}"))
    })?;
    i64::try_from(ms)
        .map(|ms| sign * ms)
        .map_err(|_| PosError::new(node.pos, format!("`{path}` is too long")))
}

/// A duration that must be longer than zero.
pub(crate) fn positive_duration_ms(node: &Node, path: &str) -> Result<u64> {
    match duration_ms(node, path)? {
        0 => Err(PosError::new(
            node.pos,
            format!("`{path}` must be longer than zero"),
        )),
        ms => Ok(ms),
    }
}

/// One of a fixed set of names, mapped to its value.
pub(crate) fn choice<T: Copy>(node: &Node, path: &str, options: &[(&str, T)]) -> Result<T> {
    let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
    let text = match &node.value {
        Value::Scalar { text, .. } => text.as_str(),
        _ => {
            return Err(type_error(
                node,
                &format!("one of {}", one_of(&names)),
                path,
            ));
        }
    };
    options
        .iter()
        .find(|(name, _)| *name == text)
        .map(|(_, value)| *value)
        .ok_or_else(|| {
            let mut message = format!(
                "unknown value {} for `{path}`; expected one of {}",
                node.describe(),
                names.join(", ")
            );
            if let Some(close) = closest(text, &names) {
                message.push_str(&format!(" (did you mean `{close}`?)"));
            }
            PosError::new(node.pos, message)
        })
}

/// A non-empty list of non-empty strings, each with its position; a single string is
/// accepted as a list of one when `single_ok`.
pub(crate) fn string_list(node: &Node, path: &str, single_ok: bool) -> Result<Vec<(String, Pos)>> {
    let expected = if single_ok {
        "a string or a non-empty list of strings"
    } else {
        "a non-empty list of strings"
    };
    let items: &[Node] = match &node.value {
        Value::Seq(items) if !items.is_empty() => items,
        Value::Scalar { .. } if single_ok => std::slice::from_ref(node),
        _ => return Err(type_error(node, expected, path)),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| Ok((string(item, &format!("{path}[{i}]"))?, item.pos)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_are_close_names_only() {
        assert_eq!(closest("flter", &["filter", "select"]), Some("filter"));
        assert_eq!(
            closest("paralelism", &["parallelism", "name"]),
            Some("parallelism")
        );
        assert_eq!(closest("kafka", &["nexmark", "file"]), None);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn lists_read_naturally() {
        assert_eq!(one_of(&["a"]), "a");
        assert_eq!(one_of(&["a", "b", "c"]), "a, b or c");
    }
}
