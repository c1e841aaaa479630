//! A session's messages rendered once per format, as they are appended, so the request of the
//! next step is spliced from cached fragments instead of re-rendered from the whole history: a
//! step's own work does not grow with the history, only copying the bytes out does.
//!
//! Every message is kept in the neutral format (budgets measure it, a trimmed request is built
//! from it). The other formats are rendered for a session from the first request in them on:
//! that request catches up from the neutral fragments, and later messages are rendered in it as
//! they come. A session that speaks one format pays for one.
//!
//! The fragments are made by the same functions as [`crate::formats::render`], so
//! [`Transcript::render`] gives exactly the bytes of `render(request, format).to_string()`; the
//! tests check it on every shape of conversation.

use std::sync::Arc;

use serde_json::Value;

use crate::conversation::{Header, Message};
use crate::formats::json_text::{json_len, json_string, write_json};
use crate::formats::pieces::Sink;
use crate::formats::{self, Format};
use crate::store::StoreError;

/// A body's fixed part in one format, serialized: the members before the message list
/// (from the `{`) and after it (to the `}`), in the canonical key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    // Shared: a whole body hands them out as pieces (a system prompt and tools can be large).
    before: Arc<str>,
    after: Arc<str>,
}

impl Head {
    /// The fixed part of a body for `header` in `format`, with `shown` tools when a subset is shown.
    pub fn new(header: &Header, shown: Option<&[String]>, format: Format) -> Self {
        let (mut before, mut after) = (String::from("{"), String::new());
        let mut first = true;
        for (key, value) in &formats::head(header, format, shown) {
            if key.as_str() < formats::list_key(format) {
                entry(&mut before, &mut first, key);
                before.push_str(&value.to_string());
            } else {
                after.push(','); // the message list always comes before
                entry(&mut after, &mut true, key);
                after.push_str(&value.to_string());
            }
        }
        after.push('}');
        Self {
            before: before.into(),
            after: after.into(),
        }
    }

    /// The bytes it holds (for the session cache's budget).
    pub fn bytes(&self) -> usize {
        self.before.len() + self.after.len()
    }

    /// What comes before the first item of the message list (through its `[`) and after the
    /// last (from its `]`): a body is `open`, its items joined by commas, then `close`.
    pub fn around_list(&self, format: Format) -> (String, String) {
        let mut open = String::with_capacity(self.before.len() + 16);
        open.push_str(&self.before);
        let mut first = self.before.len() == 1; // only the `{`
        entry(&mut open, &mut first, formats::list_key(format));
        open.push('[');
        let mut close = String::with_capacity(self.after.len() + 1);
        close.push(']');
        close.push_str(&self.after);
        (open, close)
    }
}

/// `body` (a request body in `format`) as [`Head::around_list`]'s two ends and its message
/// list's items, each compact JSON: `open`, the items joined by commas, then `close` is
/// `body.to_string()`. `None` when `body` is not an object holding the list.
pub fn split_body(body: &Value, format: Format) -> Option<(String, Vec<String>, String)> {
    let map = body.as_object()?;
    let key = formats::list_key(format);
    let items = map
        .get(key)?
        .as_array()?
        .iter()
        .map(Value::to_string)
        .collect();
    let (mut open, mut close) = (String::from("{"), String::from("]"));
    let mut first = true;
    for (k, v) in map {
        if k.as_str() < key {
            entry(&mut open, &mut first, k);
            open.push_str(&v.to_string());
        } else if k.as_str() > key {
            close.push(',');
            entry(&mut close, &mut true, k);
            close.push_str(&v.to_string());
        }
    }
    entry(&mut open, &mut first, key);
    open.push('[');
    close.push('}');
    Some((open, items, close))
}

/// A body's message list as [`Transcript::fragments`] gives it: `lead`, each of `closed`,
/// then `tail`, each fragment one or more compact JSON values joined by commas (an empty one
/// holds none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fragments<'a> {
    /// What comes first and depends on the header (OpenAI's system message).
    pub lead: Option<String>,
    /// The fragments made once, in order; they never change.
    pub closed: &'a [Arc<str>],
    /// What comes last and changes as messages arrive (the open Anthropic turn, OpenAI's
    /// pending attachments).
    pub tail: Option<String>,
}

/// The compact JSON of each message, per format. Anthropic merges consecutive same-role
/// messages into one turn, so its last turn stays open (as values) until the role changes.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    neutral: Vec<Arc<str>>,
    openai: Vec<Arc<str>>,
    anthropic: Vec<Arc<str>>,
    /// OpenAI Responses items, comma-joined per message (empty when a message has none).
    responses: Vec<Arc<str>>,
    /// Attachments of tool results waiting for OpenAI's next non-tool message (as values).
    openai_pending: Vec<Value>,
    /// Per format, why it cannot carry this session's history, if it cannot.
    unsupported: Vec<(Format, &'static str)>,
    /// Whether a message holds a document (servers of some dialects take none).
    documents: bool,
    open_turn: Option<(&'static str, Vec<Value>)>,
    /// Gemini contents, closed; the open one and the call names are in `gemini_state`.
    gemini: Vec<Arc<str>>,
    gemini_state: formats::gemini::State,
    /// The models that wrote the replies recorded in Gemini's shape. The fragments send their
    /// signatures as written, right for a body asking for that model only; a body asking for
    /// another is rendered whole (a session that changed models pays for it).
    gemini_models: Vec<String>,
    /// Converse messages, closed, and the open one.
    bedrock: Vec<Arc<str>>,
    bedrock_open: Option<(&'static str, Vec<Value>)>,
    bytes: usize,
    /// Bytes of the fragments per format (in [`Format::ALL`]'s order), to size a body's
    /// buffer once: a guess from the total either wastes or reallocates.
    format_bytes: [usize; FORMATS],
    /// The formats rendered as messages are pushed (in [`Format::ALL`]'s order): neutral
    /// always, the others once asked for.
    active: [bool; FORMATS],
}

const FORMATS: usize = Format::ALL.len();

/// `values` as compact JSON, comma-separated, written into one string.
fn comma_joined(values: &[Value]) -> String {
    use std::fmt::Write;
    let len = values.iter().map(json_len).sum::<usize>() + values.len().saturating_sub(1);
    let mut out = String::with_capacity(len);
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{v}");
    }
    out
}

/// A format's place in [`Format::ALL`].
fn slot(format: Format) -> usize {
    Format::ALL.iter().position(|f| *f == format).unwrap_or(0)
}

impl Transcript {
    /// An empty transcript.
    pub fn new() -> Self {
        let mut transcript = Self::default();
        transcript.active[slot(Format::Neutral)] = true;
        transcript
    }

    /// Renders and keeps `message`.
    pub fn push(&mut self, message: &Message) {
        for format in Format::ALL {
            let known = self.unsupported.iter().any(|(f, _)| *f == format);
            if let (false, Some(what)) = (known, formats::unsupported(format, message)) {
                self.unsupported.push((format, what));
            }
        }
        if let Message::User { content, .. } | Message::Tool { content, .. } = message {
            self.documents |= content
                .blocks()
                .iter()
                .any(|b| matches!(b, crate::conversation::content::Block::Document { .. }));
        }
        let neutral = formats::neutral_text(message);
        self.bytes += neutral.len();
        self.format_bytes[slot(Format::Neutral)] += neutral.len() + 1;
        self.neutral.push(neutral.into());
        for format in Format::ALL.into_iter().filter(|f| *f != Format::Neutral) {
            if self.active[slot(format)] {
                self.render_message(format, message);
            }
        }
    }

    /// Renders `message` in `format` (not neutral) after the ones rendered so far.
    fn render_message(&mut self, format: Format, message: &Message) {
        match format {
            Format::Neutral => {}
            Format::Openai => {
                let mut items = Vec::new();
                formats::openai::push_openai(&mut items, &mut self.openai_pending, message);
                let openai = comma_joined(&items);
                self.bytes += openai.len();
                self.format_bytes[slot(Format::Openai)] += openai.len() + 1;
                self.openai.push(openai.into());
            }
            Format::OpenaiResponses => {
                let responses = comma_joined(&formats::responses::responses_items(message));
                self.bytes += responses.len();
                self.format_bytes[slot(Format::OpenaiResponses)] += responses.len() + 1;
                self.responses.push(responses.into());
            }
            Format::Anthropic => {
                let mut turns: Vec<(&'static str, Vec<Value>)> =
                    self.open_turn.take().into_iter().collect();
                formats::anthropic::push_anthropic(&mut turns, message);
                // Every turn but the last is closed: the next message cannot merge into it.
                let open = turns.pop();
                for (role, blocks) in turns {
                    let closed = json_string(&formats::anthropic::anthropic_turn(role, blocks));
                    self.bytes += closed.len();
                    self.format_bytes[slot(Format::Anthropic)] += closed.len() + 1;
                    self.anthropic.push(closed.into());
                }
                self.open_turn = open;
            }
            Format::Gemini => {
                if let Message::Assistant { native, .. } = message {
                    if let Some(crate::conversation::Native::Gemini { model: Some(m), .. }) =
                        native.as_deref()
                    {
                        let m = m.trim_start_matches("models/");
                        if !self.gemini_models.iter().any(|k| k == m) {
                            self.gemini_models.push(m.to_string());
                        }
                    }
                }
                self.gemini_state.push(message, None);
                let closed = self.gemini_state.turns.len().saturating_sub(1);
                for (role, parts) in self.gemini_state.turns.drain(..closed) {
                    let turn = json_string(&formats::gemini::turn(role, parts));
                    self.bytes += turn.len();
                    self.format_bytes[slot(Format::Gemini)] += turn.len() + 1;
                    self.gemini.push(turn.into());
                }
            }
            Format::Bedrock => {
                let mut turns: Vec<(&'static str, Vec<Value>)> =
                    self.bedrock_open.take().into_iter().collect();
                formats::bedrock::push(&mut turns, message);
                let open = turns.pop();
                for (role, content) in turns {
                    let closed = json_string(&formats::bedrock::turn(role, content));
                    self.bytes += closed.len();
                    self.format_bytes[slot(Format::Bedrock)] += closed.len() + 1;
                    self.bedrock.push(closed.into());
                }
                self.bedrock_open = open;
            }
        }
    }

    /// Whether a Gemini body for `header` needs other bytes than the fragments hold: it asks
    /// for a model other than one that wrote a recorded reply.
    fn gemini_rerender(&self, header: &Header) -> bool {
        if self.gemini_models.is_empty() {
            return false;
        }
        let model = formats::gemini::model_of(header);
        model.is_some_and(|m| self.gemini_models.iter().any(|w| w != m))
    }

    /// The Gemini contents for `header`, rendered from the neutral fragments.
    fn gemini_whole(&self, header: &Header) -> Vec<Value> {
        let model = formats::gemini::model_of(header);
        let mut state = formats::gemini::State::default();
        for text in &self.neutral {
            // The fragments are this module's own output: they decode (the tests check it).
            if let Ok(message) = serde_json::from_str::<Message>(text) {
                state.push(&message, model);
            }
        }
        state
            .turns
            .into_iter()
            .map(|(role, parts)| formats::gemini::turn(role, parts))
            .collect()
    }

    /// Renders every message so far in `format` if it was not asked for before, and every
    /// later one as it is pushed. Fails only if a neutral fragment no longer decodes (the
    /// index of the first that does not, and why), which would be a bug of this module.
    pub fn activate(&mut self, format: Format) -> Result<(), (usize, String)> {
        if self.active[slot(format)] {
            return Ok(());
        }
        for i in 0..self.neutral.len() {
            let message: Message =
                serde_json::from_str(&self.neutral[i]).map_err(|e| (i, e.to_string()))?;
            self.render_message(format, &message);
        }
        self.active[slot(format)] = true;
        Ok(())
    }

    /// The message list of a body for `header` in `format` as fragments, without joining
    /// them: those made once as messages arrived (borrowed; each is one or more compact JSON
    /// values, comma-joined), with what depends on the end of the list around them — the
    /// OpenAI system message before, the open Anthropic turn (with its cache breakpoint) or
    /// OpenAI's pending attachments after. Their values in order are the body's list, as
    /// [`Transcript::render`] writes it. A caller can so work on what is new of each request
    /// (a counterfactual replay hashes each fragment once). Call [`Transcript::activate`] for
    /// `format` first.
    pub fn fragments<'a>(&'a self, header: &Header, format: Format) -> Fragments<'a> {
        debug_assert!(self.active[slot(format)], "fragments before activate");
        match format {
            Format::Neutral => Fragments {
                lead: None,
                closed: &self.neutral,
                tail: None,
            },
            Format::Openai => Fragments {
                lead: formats::openai::system_message(header).map(|s| s.to_string()),
                closed: &self.openai,
                tail: formats::openai::flush_openai(&mut self.openai_pending.clone())
                    .map(|m| m.to_string()),
            },
            Format::Anthropic => Fragments {
                lead: None,
                closed: &self.anthropic,
                tail: self.open_anthropic(header),
            },
            Format::OpenaiResponses => Fragments {
                lead: None,
                closed: &self.responses,
                tail: None,
            },
            Format::Gemini if self.gemini_rerender(header) => Fragments {
                lead: None,
                closed: &[],
                tail: Some(comma_joined(&self.gemini_whole(header))),
            },
            Format::Gemini => Fragments {
                lead: None,
                closed: &self.gemini,
                tail: self.open_gemini(),
            },
            Format::Bedrock => Fragments {
                lead: None,
                closed: &self.bedrock,
                tail: self.open_bedrock(header),
            },
        }
    }

    /// Whether `format` is rendered as messages arrive ([`Transcript::activate`]).
    pub fn is_active(&self, format: Format) -> bool {
        self.active[slot(format)]
    }

    /// Each message's neutral JSON, in order.
    pub fn neutral(&self) -> &[Arc<str>] {
        &self.neutral
    }

    /// Why `format` cannot carry this session's messages, if it cannot.
    pub fn unsupported(&self, format: Format) -> Option<&'static str> {
        self.unsupported
            .iter()
            .find(|(f, _)| *f == format)
            .map(|(_, what)| *what)
    }

    /// Whether a message so far holds a document.
    pub fn has_documents(&self) -> bool {
        self.documents
    }

    /// Roughly how many bytes the fragments hold (for the session cache's budget).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The request body for `header` and every message pushed so far, in `format`: the bytes of
    /// [`formats::render`]`(…).to_string()`, written in one pass into one buffer. Fails as
    /// [`Transcript::render_into`] does.
    pub fn render(
        &mut self,
        header: &Header,
        shown: Option<&[String]>,
        format: Format,
    ) -> crate::error::Result<String> {
        let mut out = String::new();
        self.render_into(header, shown, format, &mut out)?;
        Ok(out)
    }

    /// [`Transcript::render`], appended to `out` (so a caller can put the body inside an
    /// envelope without copying it). A kept message that does not decode is `store_corrupt`
    /// ([`StoreError::undecodable_message`]); a transcript knows no session, so the error names
    /// none and the message by its place, from 1 (a session's state names both:
    /// `SessionState::activate`).
    pub fn render_into(
        &mut self,
        header: &Header,
        shown: Option<&[String]>,
        format: Format,
        out: &mut String,
    ) -> crate::error::Result<()> {
        self.activate(format).map_err(|(i, problem)| {
            crate::error::Error::Store(StoreError::undecodable_message("", i as u64 + 1, problem))
        })?;
        self.render_with(&Head::new(header, shown, format), header, format, out);
        Ok(())
    }

    /// [`Transcript::render_into`] around a [`Head`] made earlier for the same header, tools
    /// shown and format: a session keeps its head while the header stays, so a step does not
    /// serialize the system prompt and the tools again. Call [`Transcript::activate`] for
    /// `format` first (a format not rendered yet has no fragments).
    pub fn render_with<S: Sink>(&self, head: &Head, header: &Header, format: Format, out: &mut S) {
        debug_assert!(self.active[slot(format)], "render_with before activate");
        out.reserve(head.before.len() + self.list_bytes(format) + head.after.len());
        out.kept(&head.before);
        // The list's key after the head's entries (the head is only the `{` when it has
        // none); the formats' list keys are plain names, written as they are.
        if head.before.len() != 1 {
            out.text(",");
        }
        out.text("\"");
        out.text(formats::list_key(format));
        out.text("\":[");
        let mut items = self
            .items(header, format)
            .filter(|i| !i.is_empty())
            .peekable();
        while let Some(item) = items.next() {
            match item {
                Item::Kept(kept) => out.kept(kept),
                Item::Made(made) => out.made(made),
            }
            if items.peek().is_some() {
                out.text(",");
            }
        }
        out.text("]");
        out.kept(&head.after);
    }

    /// The bytes a whole body in `format` takes beyond its head, roughly (to size a buffer
    /// once: a guess from the total either wastes or reallocates).
    pub fn list_bytes(&self, format: Format) -> usize {
        // The open turns and OpenAI's pending attachments are not counted yet.
        let open = if self.open_turn.is_some()
            || !self.openai_pending.is_empty()
            || self.bedrock_open.is_some()
            || !self.gemini_state.turns.is_empty()
        {
            1024
        } else {
            64
        };
        self.format_bytes[slot(format)] + open
    }

    /// The message list's items in `format` as a body holds them, empty ones left out: the
    /// kept fragments borrowed (they never change once made), the rest (OpenAI's system
    /// message and pending attachments, Anthropic's open turn) made on each call. Call
    /// [`Transcript::activate`] for `format` first.
    pub fn list_items<'a>(
        &'a self,
        header: &'a Header,
        format: Format,
    ) -> impl Iterator<Item = std::borrow::Cow<'a, str>> + 'a {
        use std::borrow::Cow;
        self.items(header, format)
            .filter(|i| !i.is_empty())
            .map(|i| match i {
                Item::Kept(k) => Cow::Borrowed(&**k),
                Item::Made(m) => Cow::Owned(m),
            })
    }

    /// The messages' fragments in `format`, in order.
    fn items<'a>(&'a self, header: &'a Header, format: Format) -> Items<'a> {
        let other: Box<dyn Iterator<Item = Item<'a>> + 'a> = match format {
            // Kept fragments alone: walked as they are, with no iterator boxed.
            Format::Neutral => return Items::Kept(self.neutral.iter()),
            Format::OpenaiResponses => return Items::Kept(self.responses.iter()),
            Format::Openai => Box::new(
                formats::openai::system_message(header)
                    .map(|s| Item::Made(s.to_string()))
                    .into_iter()
                    .chain(self.openai.iter().map(Item::Kept))
                    .chain(
                        formats::openai::flush_openai(&mut self.openai_pending.clone())
                            .map(|m| Item::Made(m.to_string())),
                    ),
            ),
            Format::Anthropic => Box::new(
                (self.anthropic.iter().map(Item::Kept))
                    .chain(self.open_anthropic(header).map(Item::Made)),
            ),
            Format::Gemini if self.gemini_rerender(header) => Box::new(
                self.gemini_whole(header)
                    .into_iter()
                    .map(|turn| Item::Made(turn.to_string())),
            ),
            Format::Gemini => Box::new(
                (self.gemini.iter().map(Item::Kept)).chain(self.open_gemini().map(Item::Made)),
            ),
            Format::Bedrock => Box::new(
                (self.bedrock.iter().map(Item::Kept))
                    .chain(self.open_bedrock(header).map(Item::Made)),
            ),
        };
        Items::Other(other)
    }

    /// The open Anthropic turn, with its rolling breakpoint, as JSON text.
    fn open_anthropic(&self, header: &Header) -> Option<String> {
        let (role, blocks) = self.open_turn.as_ref()?;
        let empty = formats::anthropic::anthropic_turn(role, Vec::new());
        let mark = formats::anthropic::last_breakpoint(header, blocks);
        let mark = mark.as_ref().map(|(i, v)| (*i, "cache_control", v));
        Some(turn_json(&empty, blocks, mark, None))
    }

    /// The open Gemini turn as JSON text.
    fn open_gemini(&self) -> Option<String> {
        let (role, parts) = self.gemini_state.turns.last()?;
        Some(turn_json(
            &formats::gemini::turn(role, Vec::new()),
            parts,
            None,
            None,
        ))
    }

    /// The open Bedrock turn, with its cache point, as JSON text.
    fn open_bedrock(&self, header: &Header) -> Option<String> {
        let (role, content) = self.bedrock_open.as_ref()?;
        let empty = formats::bedrock::turn(role, Vec::new());
        let point = formats::bedrock::last_cache_point(header);
        Some(turn_json(&empty, content, None, point.as_ref()))
    }
}

/// The JSON text of `empty` (a turn whose one list is empty) with `items` in that list, each
/// written where it is kept: entry `(i, key, value)` of `mark` added to item `i`, `extra`
/// after the last. The same bytes as the turn built with copies of the items and written
/// out, without the copies (a turn holding a 20 MiB message is not cloned, issue 32).
fn turn_json(
    empty: &Value,
    items: &[Value],
    mark: Option<(usize, &str, &Value)>,
    extra: Option<&Value>,
) -> String {
    let skeleton = json_string(empty);
    // The turn's only list is empty, and its other values (a role) hold no brackets.
    let (before, after) = skeleton.split_once("[]").unwrap_or((&skeleton, ""));
    let item = |i: usize| match mark {
        Some((at, key, value)) if at == i => match &items[i] {
            Value::Object(map) => Either::Marked(WithEntry { map, key, value }),
            other => Either::Kept(other),
        },
        _ => Either::Kept(&items[i]),
    };
    let all = || (0..items.len()).map(item).chain(extra.map(Either::Kept));
    let count = all().count();
    let len = before.len() + after.len() + 2 + count.saturating_sub(1);
    let mut out = Vec::with_capacity(len + all().map(|i| json_len(&i)).sum::<usize>());
    out.extend_from_slice(before.as_bytes());
    out.push(b'[');
    for (n, i) in all().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        write_json(&mut out, &i);
    }
    out.push(b']');
    out.extend_from_slice(after.as_bytes());
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// An item of [`turn_json`]: kept as it is, or with one entry added.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Either<'a> {
    Kept(&'a Value),
    Marked(WithEntry<'a>),
}

/// `map` with `key` set to `value`, written in the order a [`serde_json::Map`] holding it
/// iterates (sorted, or in insertion order with serde_json's `preserve_order`): the bytes
/// of the map with the entry inserted, without copying its values.
struct WithEntry<'a> {
    map: &'a serde_json::Map<String, Value>,
    key: &'a str,
    value: &'a Value,
}

impl serde::Serialize for WithEntry<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        // The keys alone, to learn the map's order; the values are not copied.
        let mut order: serde_json::Map<String, Value> = (self.map.keys())
            .map(|k| (k.clone(), Value::Null))
            .collect();
        order.insert(self.key.to_string(), Value::Null);
        let mut map = s.serialize_map(Some(order.len()))?;
        for k in order.keys() {
            let value = if k == self.key {
                Some(self.value)
            } else {
                self.map.get(k)
            };
            if let Some(value) = value {
                map.serialize_entry(k, value)?;
            }
        }
        map.end()
    }
}

/// One item of a body's message list: a fragment kept as messages arrived, or one made for
/// this body.
enum Item<'a> {
    Kept(&'a Arc<str>),
    Made(String),
}

/// A format's message list items ([`Transcript::items`]).
enum Items<'a> {
    Kept(std::slice::Iter<'a, Arc<str>>),
    Other(Box<dyn Iterator<Item = Item<'a>> + 'a>),
}

impl<'a> Iterator for Items<'a> {
    type Item = Item<'a>;

    fn next(&mut self) -> Option<Item<'a>> {
        match self {
            Items::Kept(kept) => kept.next().map(Item::Kept),
            Items::Other(other) => other.next(),
        }
    }
}

impl Item<'_> {
    fn is_empty(&self) -> bool {
        match self {
            Item::Kept(k) => k.is_empty(),
            Item::Made(m) => m.is_empty(),
        }
    }
}

/// Writes `"key":` after a comma unless it is the object's first entry.
fn entry(out: &mut String, first: &mut bool, key: &str) {
    if !*first {
        out.push(',');
    }
    *first = false;
    // Keys are settings and list names: plain ones need no escaping and no allocation.
    if key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        out.push('"');
        out.push_str(key);
        out.push('"');
    } else {
        out.push_str(&Value::String(key.to_string()).to_string());
    }
    out.push(':');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{FrozenRequest, ToolCall, ToolSpec};
    use proptest::prelude::*;
    use serde_json::{json, Map};

    fn block() -> impl Strategy<Value = crate::conversation::content::Block> {
        use crate::conversation::content::Block;
        prop_oneof![
            "[a-z ]{0,4}".prop_map(|text| Block::Text { text }),
            Just(Block::Image {
                media_type: Some("image/png".into()),
                data: Some("iVBORw0KGgo=".into()),
                url: None,
            }),
            Just(Block::Image {
                media_type: None,
                data: None,
                url: Some("https://x/a.png".into()),
            }),
            prop::option::of("[a-z]{1,3}\\.pdf").prop_map(|name| Block::Document {
                media_type: Some("application/pdf".into()),
                data: Some("JVBERi0=".into()),
                url: None,
                name,
            }),
        ]
    }

    fn content() -> impl Strategy<Value = crate::conversation::content::Content> {
        use crate::conversation::content::Content;
        prop_oneof![
            "[a-z\"\\\\é{}<>]{0,6}".prop_map(Content::Text),
            prop::collection::vec(block(), 0..4).prop_map(Content::Blocks),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        let text = prop_oneof![Just(String::new()), "[a-z\"\\\\é{}<>]{0,6}"];
        prop_oneof![
            text.clone().prop_map(Message::user),
            content().prop_map(|content| Message::User {
                content,
                snapshot: false
            }),
            text.clone().prop_map(Message::snapshot),
            (text.clone(), 0..3usize).prop_map(|(content, calls)| Message::Assistant {
                content,
                tool_calls: (0..calls)
                    .map(|i| ToolCall {
                        id: format!("c{i}"),
                        name: "read".into(),
                        arguments: json!({"path": "a", "n": i}),
                        arguments_text: None,
                    })
                    .collect(),
                blocks: Vec::new(),
                native: None,
            }),
            // Replies recorded in Gemini's shape (by this model, another, or one unsaid) and
            // in Bedrock's.
            (
                text.clone(),
                prop_oneof![Just(None), Just(Some("m")), Just(Some("models/other"))]
            )
                .prop_map(|(content, model)| native_reply(content, model)),
            (content(), any::<bool>()).prop_map(|(content, is_error)| Message::Tool {
                tool_call_id: "c0".into(),
                content,
                is_error,
            }),
        ]
    }

    /// A reply with a call `c0`, in Gemini's shape (by `model`) or, without one, Bedrock's.
    fn native_reply(content: String, model: Option<&str>) -> Message {
        use crate::conversation::Native;
        let call = ToolCall {
            id: "c0".into(),
            name: "read".into(),
            arguments: json!({"path": "a"}),
            arguments_text: None,
        };
        let native = match model {
            Some(model) => Native::Gemini {
                model: (model != "m" || content.is_empty()).then(|| model.to_string()),
                parts: vec![
                    json!({"text": content, "thoughtSignature": "c2ln"}),
                    json!({"functionCall": {"name": "read", "args": {"path": "a"}},
                        "thoughtSignature": "c2lnMg=="}),
                ],
            },
            None => Native::Bedrock {
                content: vec![
                    json!({"reasoningContent": {"reasoningText": {"text": "hm", "signature": "s"}}}),
                    json!({"toolUse": {"toolUseId": "c0", "name": "read", "input": {"path": "a"}}}),
                ],
            },
        };
        Message::Assistant {
            content,
            tool_calls: vec![call],
            blocks: Vec::new(),
            native: Some(Box::new(native)),
        }
    }

    fn header(model: bool, system: &str, tools: usize) -> Header {
        let mut m = Map::new();
        if model {
            // Keys on both sides of "messages", and one that collides with it.
            m.insert("max_tokens".into(), json!(64));
            m.insert("model".into(), json!("m"));
            m.insert("temperature".into(), json!(0.5));
            m.insert("messages".into(), json!("from config"));
            m.insert("a".into(), json!(null));
            m.insert("input".into(), json!("collides with Responses"));
            m.insert("anthropic".into(), json!({"max_tokens": 9, "top_k": 3}));
            m.insert("gemini".into(), json!({"contents": "collides", "top_k": 3}));
            m.insert("bedrock".into(), json!({"inferenceConfig": {"topP": 0.9}}));
        }
        Header {
            layout: if model {
                crate::conversation::LAYOUT
            } else {
                0
            },
            cache_key: model.then(|| "promptd-s1".to_string()),
            cache_ttl: None,
            model: m,
            system: system.into(),
            tools: (0..tools)
                .map(|i| ToolSpec {
                    name: format!("t{i}"),
                    description: "d".into(),
                    parameters: json!({"type": "object"}).into(),
                    defer: None,
                })
                .collect(),
        }
    }

    /// An open turn is written where its blocks are kept, with the breakpoint added to the
    /// last block that may carry one (replacing one it has), after a thinking block and
    /// before; the bytes are those of the turn built from copies.
    #[test]
    fn q4_an_open_turn_is_written_in_place_as_the_built_turn_is() {
        let header = header(true, "", 0);
        let cases = [
            vec![json!({"type": "text", "text": "a\"b"})],
            vec![
                json!({"type": "text", "text": "x", "cache_control": {"type": "old"}}),
                json!({"type": "thinking", "thinking": "t", "signature": "s"}),
            ],
            vec![json!({"type": "tool_result", "tool_use_id": "c", "content": "r", "z": 1})],
        ];
        for blocks in cases {
            let built = formats::anthropic::anthropic_last_turn(&header, "user", blocks.clone());
            let empty = formats::anthropic::anthropic_turn("user", Vec::new());
            let mark = formats::anthropic::last_breakpoint(&header, &blocks);
            let mark = mark.as_ref().map(|(i, v)| (*i, "cache_control", v));
            let written = turn_json(&empty, &blocks, mark, None);
            assert_eq!(written, built.to_string());
            assert_eq!(written.capacity(), written.len(), "sized once");
            let point = formats::bedrock::last_cache_point(&header);
            let bedrock = formats::bedrock::last_turn(&header, "user", blocks.clone());
            let empty = formats::bedrock::turn("user", Vec::new());
            assert_eq!(
                turn_json(&empty, &blocks, None, point.as_ref()),
                bedrock.to_string()
            );
        }
    }

    /// A session that speaks one format keeps its messages in neutral and that format only;
    /// asking for another renders the history in it once, and later messages in both.
    #[test]
    fn only_the_formats_asked_for_are_kept() {
        let header = header(true, "Be brief.", 1);
        let mut t = Transcript::new();
        t.push(&Message::user("hello there"));
        let neutral_only = t.bytes();
        assert!(t.openai.is_empty() && t.anthropic.is_empty() && t.responses.is_empty());
        t.render(&header, None, Format::Openai).unwrap();
        assert_eq!(t.openai.len(), 1);
        assert!(t.anthropic.is_empty() && t.responses.is_empty());
        assert!(t.bytes() > neutral_only);
        t.push(&Message::user("and more"));
        assert_eq!((t.neutral.len(), t.openai.len()), (2, 2));
        assert!(t.responses.is_empty());
    }

    proptest! {
        #[test]
        fn q4_q8_spliced_fragments_are_the_rendered_bytes(
            messages in proptest::collection::vec(message(), 0..12),
            model in any::<bool>(),
            system in prop_oneof![Just(""), Just("Be brief.")],
            tools in 0..3usize,
            shown in prop::option::of(prop::collection::vec(0..3usize, 0..3)),
        ) {
            let header = header(model, system, tools);
            let shown: Option<Vec<String>> =
                shown.map(|s| s.into_iter().map(|i| format!("t{i}")).collect());
            let mut transcript = Transcript::new();
            for (i, m) in messages.iter().enumerate() {
                transcript.push(m);
                let request = FrozenRequest {
                    header: header.clone(),
                    messages: messages[..=i].to_vec(),
                    shown_tools: shown.clone(),
                };
                for format in Format::ALL {
                    let body = formats::render(&request, format);
                    prop_assert_eq!(
                        transcript.render(&header, shown.as_deref(), format).unwrap(),
                        body.to_string()
                    );
                    // Written as pieces (kept fragments shared), the same bytes.
                    let mut pieces = crate::formats::pieces::Pieces::sharing_from(1);
                    let head = Head::new(&header, shown.as_deref(), format);
                    transcript.render_with(&head, &header, format, &mut pieces);
                    prop_assert_eq!(pieces.len(), body.to_string().len());
                    prop_assert_eq!(pieces.into_string(), body.to_string());
                    // The fragments, their values in order, are the body's list.
                    let f = transcript.fragments(&header, format);
                    let joined: Vec<&str> = f
                        .lead
                        .iter()
                        .map(String::as_str)
                        .chain(f.closed.iter().map(|c| &**c))
                        .chain(f.tail.iter().map(String::as_str))
                        .filter(|s| !s.is_empty())
                        .collect();
                    let list: Value = serde_json::from_str(&format!("[{}]", joined.join(",")))
                        .expect("fragments are JSON values");
                    prop_assert_eq!(&list, &body[formats::list_key(format)]);
                }
            }
            // A format first asked for after every message catches up from the neutral
            // fragments to the same bytes.
            let whole = FrozenRequest {
                header: header.clone(),
                messages: messages.clone(),
                shown_tools: shown.clone(),
            };
            for format in Format::ALL {
                let mut late = Transcript::new();
                for m in &messages {
                    late.push(m);
                }
                prop_assert_eq!(
                    late.render(&header, shown.as_deref(), format).unwrap(),
                    formats::render(&whole, format).to_string()
                );
            }
            let empty = FrozenRequest {
                header: header.clone(),
                messages: Vec::new(),
                shown_tools: None,
            };
            for format in Format::ALL {
                prop_assert_eq!(
                    Transcript::new().render(&header, None, format).unwrap(),
                    formats::render(&empty, format).to_string()
                );
            }
        }
    }
}
