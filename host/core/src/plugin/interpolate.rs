//! Strict `{{name}}` interpolation (SPEC T1–T4).
//!
//! A template is parsed into literal pieces and references before any value is looked up, so a
//! value is never scanned again (T1) and an error never leaves `{{name}}` in place (T4).

use crate::error::{Error, Result};
use crate::plugin::names::is_variable_name;
use std::borrow::Cow;

/// One parsed piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text used as it is.
    Literal(&'a str),
    /// A `{{name}}` reference; `offset` is the byte offset of its `{{`.
    Reference {
        /// The variable's name.
        name: &'a str,
        /// The byte offset of its `{{`.
        offset: usize,
    },
}

/// Why a template could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// The byte offset of the malformed reference.
    pub offset: usize,
    /// The reference's text, braces included.
    pub snippet: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Malformed {
    /// The error of this malformation in the template at `location`.
    pub fn at(self, location: &str) -> Error {
        Error::MalformedReference {
            location: location.to_string(),
            offset: self.offset,
            snippet: self.snippet,
            reason: self.reason,
        }
    }
}

/// What a reference resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved<'v> {
    /// The variable's value: borrowed when it is a static one (no copy per reference).
    Value(Cow<'v, str>),
    /// A dynamic variable's value, shared with the assembly's memo of calls (no copy either).
    Shared(std::sync::Arc<str>),
    /// The variable exists but has no value this assembly; `plugin` declared it.
    Absent {
        /// The plugin that declares the variable.
        plugin: String,
    },
    /// No such variable; `known` lists every variable that exists, sorted.
    Unknown {
        /// Every variable that exists, sorted.
        known: Vec<String>,
    },
}

/// Splits `text` into literals and references.
///
/// - `{{` with no `}}` anywhere after it is literal text (T2).
/// - `{{` with a later `}}` whose inside holds a brace is malformed (T3).
/// - a group whose inside is not a variable name (`{{ model }}`, `{{}}`) is malformed (T4).
pub fn parse(text: &str) -> Result<Vec<Piece<'_>>, Malformed> {
    pieces(text).collect()
}

/// [`parse`], one piece at a time (nothing allocated): the first malformed reference ends it.
pub fn pieces(text: &str) -> Pieces<'_> {
    Pieces {
        text,
        at: 0,
        reference: None,
    }
}

/// The pieces of a template, in order ([`pieces`]).
pub struct Pieces<'a> {
    text: &'a str,
    /// Where the text not yet split starts (its length once done).
    at: usize,
    /// A reference found after the literal just given.
    reference: Option<Piece<'a>>,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = Result<Piece<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(reference) = self.reference.take() {
            return Some(Ok(reference));
        }
        let (text, at) = (self.text, self.at);
        if at >= text.len() {
            return None;
        }
        let found = find_pair(text, at, '{')
            .and_then(|open| find_pair(text, open + 2, '}').map(|close| (open, close)));
        let Some((open, close)) = found else {
            // T2: no `{{` is closed after here, so the rest is literal.
            self.at = text.len();
            return Some(Ok(Piece::Literal(&text[at..])));
        };
        let inner = &text[open + 2..close];
        let reason = if inner.contains(['{', '}']) {
            Some("a reference is `{{name}}` with no other braces inside")
        } else if !is_variable_name(inner) {
            Some("a variable name matches ^[a-z][a-z0-9_]*$ (no spaces)")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.at = text.len();
            return Some(Err(Malformed {
                offset: open,
                snippet: text[open..close + 2].to_string(),
                reason,
            }));
        }
        self.at = close + 2;
        let reference = Piece::Reference {
            name: inner,
            offset: open,
        };
        if open == at {
            return Some(Ok(reference));
        }
        self.reference = Some(reference);
        Some(Ok(Piece::Literal(&text[at..open])))
    }
}

/// The byte offset of the first `cc` (`{{` or `}}`) in `text` at or after `from`: a SIMD
/// search for the brace (memchr), as this runs on every dynamic text of every step; texts are
/// short and braces rare, so a pair searcher's setup would cost more than it saves.
fn find_pair(text: &str, from: usize, c: char) -> Option<usize> {
    let (bytes, brace) = (text.as_bytes(), c as u8);
    let mut at = from;
    loop {
        let found = at + memchr::memchr(brace, bytes.get(at..)?)?;
        if bytes.get(found + 1) == Some(&brace) {
            return Some(found);
        }
        at = found + 1;
    }
}

/// Interpolates `text`, resolving each reference with `resolve`. `location` names the section
/// or context (e.g. `section deployment:persona`) in errors.
pub fn interpolate<'v>(
    text: &str,
    location: &str,
    resolve: &mut dyn FnMut(&str) -> Result<Resolved<'v>>,
) -> Result<String> {
    render(text, &|| location.to_string(), resolve).map(Cow::into_owned)
}

/// [`interpolate`] for the assembly's hot path: `location` is only made for an error, and a
/// text without a reference comes back borrowed, as it is (T2).
pub fn render<'t, 'v>(
    text: &'t str,
    location: &dyn Fn() -> String,
    resolve: &mut dyn FnMut(&str) -> Result<Resolved<'v>>,
) -> Result<Cow<'t, str>> {
    let mut out = String::new();
    Ok(match render_into(text, &mut out, location, resolve)? {
        true => Cow::Owned(out),
        false => Cow::Borrowed(text),
    })
}

/// [`render`] onto the end of `out`, so a caller can keep one buffer for many texts; false
/// (and `out` untouched) when `text` references nothing.
pub fn render_into<'v>(
    text: &str,
    out: &mut String,
    location: &dyn Fn() -> String,
    resolve: &mut dyn FnMut(&str) -> Result<Resolved<'v>>,
) -> Result<bool> {
    // Checked whole before any value is looked up (T4); the first pieces are kept on the
    // stack, so most texts are scanned once and none needs a list on the heap.
    const KEPT: usize = 8;
    let mut kept: [Option<Piece<'_>>; KEPT] = Default::default();
    let (mut count, mut references) = (0, 0);
    for piece in pieces(text) {
        let piece = piece.map_err(|m| m.at(&location()))?;
        references += usize::from(matches!(piece, Piece::Reference { .. }));
        if let Some(slot) = kept.get_mut(count) {
            *slot = Some(piece);
        }
        count += 1;
    }
    if references == 0 {
        return Ok(false);
    }
    out.reserve(text.len() + 16 * references);
    match count <= KEPT {
        true => fill_into(out, kept.into_iter().flatten(), location, resolve)?,
        // Every piece is known good now.
        false => fill_into(out, pieces(text).map_while(Result::ok), location, resolve)?,
    }
    Ok(true)
}

/// `pieces`, already checked (T4), onto the end of `out` with each reference resolved by
/// `resolve`: [`render`]'s second half, and all of it for a text split once and kept.
pub fn fill_into<'t, 'v>(
    out: &mut String,
    pieces: impl Iterator<Item = Piece<'t>>,
    location: &dyn Fn() -> String,
    resolve: &mut dyn FnMut(&str) -> Result<Resolved<'v>>,
) -> Result<()> {
    for piece in pieces {
        match piece {
            Piece::Literal(s) => out.push_str(s),
            Piece::Reference { name, .. } => match resolve(name)? {
                Resolved::Value(v) => out.push_str(&v),
                Resolved::Shared(v) => out.push_str(&v),
                Resolved::Absent { plugin } => {
                    return Err(Error::VariableAbsent {
                        location: location(),
                        name: name.to_string(),
                        plugin,
                    })
                }
                Resolved::Unknown { known } => {
                    return Err(Error::UnknownVariable {
                        location: location(),
                        name: name.to_string(),
                        known,
                    })
                }
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn vars(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    fn render(text: &str, vars: &BTreeMap<String, Option<String>>) -> Result<String> {
        interpolate(text, "section test", &mut |name| {
            Ok(match vars.get(name) {
                Some(Some(v)) => Resolved::Value(v.as_str().into()),
                Some(None) => Resolved::Absent { plugin: "p".into() },
                None => Resolved::Unknown {
                    known: vars.keys().cloned().collect(),
                },
            })
        })
    }

    #[test]
    fn t1_replaces_reference_with_value() {
        let v = vars(&[("model", Some("opus"))]);
        assert_eq!(render("runs on {{model}}.", &v).unwrap(), "runs on opus.");
    }

    #[test]
    fn t1_value_containing_braces_is_never_rescanned() {
        let v = vars(&[("a", Some("{{sneaky}}")), ("sneaky", Some("LEAK"))]);
        assert_eq!(render("x {{a}} y", &v).unwrap(), "x {{sneaky}} y");
    }

    #[test]
    fn t2_unclosed_braces_are_literal() {
        let text = "shell ${X:-{{fallback} stays";
        assert_eq!(render(text, &vars(&[])).unwrap(), text);
        assert_eq!(render("{{", &vars(&[])).unwrap(), "{{");
        let v = vars(&[("a", Some("1"))]);
        assert_eq!(render("{{a}} then {{ open", &v).unwrap(), "1 then {{ open");
    }

    #[test]
    fn t3_triple_braces_malformed_with_position() {
        let err = render("ab {{{model}}}", &vars(&[("model", Some("m"))])).unwrap_err();
        assert_eq!(err.code(), "malformed_reference");
        match err {
            Error::MalformedReference {
                offset, location, ..
            } => {
                assert_eq!(offset, 3);
                assert_eq!(location, "section test");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn t3_brace_inside_group_is_malformed_even_if_later_reference_is_fine() {
        let err = render("x {{a{b}} y {{model}}", &vars(&[("model", Some("m"))])).unwrap_err();
        assert!(
            matches!(err, Error::MalformedReference { offset: 2, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn t4_spaces_or_empty_are_malformed() {
        for text in ["{{ model }}", "{{}}", "{{Model}}", "{{1x}}"] {
            let err = render(text, &vars(&[("model", Some("m"))])).unwrap_err();
            assert_eq!(err.code(), "malformed_reference", "{text}");
            assert!(err.to_string().contains("section test"), "{err}");
        }
    }

    #[test]
    fn t4_unknown_variable_lists_registered_ones() {
        let v = vars(&[("b", Some("1")), ("a", Some("2"))]);
        let err = render("{{constructor}}", &v).unwrap_err();
        assert_eq!(err.code(), "unknown_variable");
        assert!(
            err.to_string().contains("registered variables: a, b"),
            "{err}"
        );
    }

    #[test]
    fn t4_unknown_variable_says_when_there_are_none() {
        let err = render("{{x}}", &vars(&[])).unwrap_err();
        assert!(
            err.to_string().contains("no variables are registered"),
            "{err}"
        );
    }

    #[test]
    fn t4_constructor_is_an_ordinary_name_when_registered() {
        let v = vars(&[("constructor", Some("ok"))]);
        assert_eq!(render("{{constructor}}", &v).unwrap(), "ok");
    }

    #[test]
    fn t4_absent_value_is_its_own_error() {
        let err = render("{{date}}", &vars(&[("date", None)])).unwrap_err();
        assert_eq!(err.code(), "variable_absent");
    }

    #[test]
    fn t4_error_never_leaves_reference_in_place() {
        // A failure is an Err, so no partially rendered text with `{{secret}}` escapes.
        assert!(render("token {{secret}}", &vars(&[])).is_err());
    }

    #[test]
    fn parse_keeps_multibyte_text_intact() {
        let v = vars(&[("n", Some("世界"))]);
        assert_eq!(render("你好 {{n}} ✓", &v).unwrap(), "你好 世界 ✓");
    }
}
