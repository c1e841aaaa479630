//! A client's request body as the gateway reads it: where each part the splice touches sits in
//! the client's bytes, without re-encoding anything (G2).
//!
//! Parsing borrows every value from the body (`serde_json::value::RawValue`), so a span is the
//! client's own bytes: unknown fields, number spellings, escapes and key order are never seen,
//! let alone changed.

use std::ops::Range;

use serde_json::value::RawValue;

use super::{GatewayError, Ingress};

/// One top-level member of a client's body: its key and where its value sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The key as decoded.
    pub key: String,
    /// The value's bytes in the body.
    pub value: Range<usize>,
}

/// A client's body, read for the splice: its top-level members in their order, and the parts
/// of the ones the splice needs.
#[derive(Clone, Debug)]
pub struct ClientBody<'a> {
    /// The body's text.
    pub text: &'a str,
    /// Where the top-level object's `{` is.
    pub open: usize,
    /// Its members, in the client's order.
    pub members: Vec<Member>,
}

/// Where a JSON value borrowed from `text` sits in it.
fn span(text: &str, raw: &RawValue) -> Range<usize> {
    let start = raw.get().as_ptr() as usize - text.as_ptr() as usize;
    start..start + raw.get().len()
}

/// Where a body's top-level members sit, kept apart from its text: a body read once is read
/// again from them without a second parse ([`ClientBody::with_spans`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spans {
    /// Where the top-level object's `{` is.
    pub open: usize,
    /// Its members, in the client's order.
    pub members: Vec<Member>,
}

impl<'a> ClientBody<'a> {
    /// Where its members sit.
    pub fn spans(&self) -> Spans {
        Spans {
            open: self.open,
            members: self.members.clone(),
        }
    }

    /// Its spans, the body let go.
    pub fn into_spans(self) -> Spans {
        Spans {
            open: self.open,
            members: self.members,
        }
    }

    /// The body `text` whose spans [`ClientBody::spans`] gave when it was parsed.
    pub fn with_spans(text: &'a str, spans: Spans) -> ClientBody<'a> {
        ClientBody {
            text,
            open: spans.open,
            members: spans.members,
        }
    }

    /// Reads `bytes` as a JSON object: refused (`invalid_body`) when it is not UTF-8 JSON, not
    /// an object, or repeats a key (which one a provider would take is not defined).
    pub fn parse(bytes: &'a [u8]) -> Result<ClientBody<'a>, GatewayError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| GatewayError::InvalidBody(format!("the body is not UTF-8: {e}")))?;
        let object: Vec<(String, &'a RawValue)> = serde_json::from_str::<Object<'a>>(text)
            .map_err(|e| GatewayError::InvalidBody(format!("the body is not a JSON object: {e}")))?
            .0;
        let mut members = Vec::with_capacity(object.len());
        for (key, raw) in object {
            if members.iter().any(|m: &Member| m.key == key) {
                return Err(GatewayError::InvalidBody(format!(
                    "the body has the key `{key}` twice"
                )));
            }
            members.push(Member {
                value: span(text, raw),
                key,
            });
        }
        let open = text.find('{').unwrap_or(0);
        Ok(ClientBody {
            text,
            open,
            members,
        })
    }

    /// The member `key`, when the body has it.
    pub fn member(&self, key: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.key == key)
    }

    /// The text of `key`'s value, when the body has it.
    pub fn raw(&self, key: &str) -> Option<&'a str> {
        self.member(key).map(|m| &self.text[m.value.clone()])
    }

    /// `key`'s value decoded as `T`, when the body has it (refused when it has another shape).
    pub fn decode<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, GatewayError> {
        self.raw(key)
            .map(|raw| {
                serde_json::from_str(raw).map_err(|e| {
                    GatewayError::InvalidBody(format!("`{key}` has an unexpected shape: {e}"))
                })
            })
            .transpose()
    }

    /// Whether the client asked for a streamed reply (`"stream": true`).
    pub fn streamed(&self) -> bool {
        self.raw("stream").is_some_and(|s| s.trim() == "true")
    }

    /// The model the client named.
    pub fn model(&self) -> Option<String> {
        self.decode::<String>("model").ok().flatten()
    }

    /// Where the body's last byte before its closing `}` is, for a member added at the end.
    pub fn close(&self) -> usize {
        self.text.rfind('}').unwrap_or(self.text.len())
    }

    /// Checks what the ingress needs of the body (`messages` for the Messages and Chat
    /// shapes, `input` for Responses, `contents` for Gemini, each of the right JSON type).
    pub fn check(&self, ingress: Ingress) -> Result<(), GatewayError> {
        let (key, array_only) = match ingress {
            Ingress::ChatCompletions | Ingress::Messages | Ingress::CountTokens => {
                ("messages", true)
            }
            Ingress::Responses => ("input", false),
            Ingress::GenerateContent | Ingress::StreamGenerateContent => ("contents", true),
            Ingress::Converse | Ingress::ConverseStream => ("messages", true),
        };
        match self.raw(key).map(first_byte) {
            Some(b'[') => Ok(()),
            Some(b'"') if !array_only => Ok(()),
            None if ingress == Ingress::Responses => Ok(()),
            _ => Err(GatewayError::InvalidBody(format!(
                "`{key}` must be {}",
                if array_only {
                    "an array"
                } else {
                    "a string or an array"
                }
            ))),
        }
    }
}

/// The first byte of a JSON value's text.
pub(crate) fn first_byte(raw: &str) -> u8 {
    raw.as_bytes().first().copied().unwrap_or(b' ')
}

/// The elements of a JSON array borrowed from `text`, with their spans; `None` when `range`
/// holds no array.
pub fn elements(text: &str, range: Range<usize>) -> Option<Vec<Range<usize>>> {
    let items: Vec<&RawValue> = serde_json::from_str(&text[range]).ok()?;
    Some(items.iter().map(|raw| span(text, raw)).collect())
}

/// The members of a JSON object borrowed from `text`, with their spans; `None` when `range`
/// holds no object.
pub fn members(text: &str, range: Range<usize>) -> Option<Vec<Member>> {
    let object: Object<'_> = serde_json::from_str(&text[range]).ok()?;
    Some(
        object
            .0
            .into_iter()
            .map(|(key, raw)| Member {
                value: span(text, raw),
                key,
            })
            .collect(),
    )
}

/// A JSON object's members in their order, values borrowed (serde's maps would sort or drop
/// repeated keys).
struct Object<'a>(Vec<(String, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Object<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((key, value));
                }
                Ok(Object(out))
            }
        }
        d.deserialize_map(Visit)
    }
}
