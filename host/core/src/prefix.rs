//! Why a request's cache prefix broke: two requests compared as the provider reads them.
//!
//! **The prefix** of a request is what a provider's prompt cache can reuse: the provider reads
//! the model, then the tools, then the system prompt, then the messages in order, whatever the
//! key order of the JSON body. So two requests are compared as *streams* of those parts, each
//! serialized as the format sends it (compact JSON) with `cache_control` markers left out (they
//! mark a breakpoint; they are not content). [`diff`] gives the bytes two streams share, the part
//! where they first differ, and the causes in words.
//!
//! ```
//! use promptd_core::conversation::{FrozenRequest, Header, Message};
//! use promptd_core::formats::Format;
//! use promptd_core::prefix::diff;
//!
//! let header = Header { system: "You are terse.".into(), ..Header::default() };
//! let before = FrozenRequest { header: header.clone(), messages: vec![Message::user("hi")], shown_tools: None };
//! let mut after = before.clone();
//! after.messages.push(Message::user("more"));
//! let d = diff(&before, None, &after, None, Format::Openai);
//! assert!(d.prefix_kept);
//! assert_eq!(d.causes, ["only new messages: prefix kept"]);
//! ```

use serde::Serialize;
use serde_json::Value;

use crate::conversation::FrozenRequest;
use crate::formats::{self, Format};
use crate::provenance::{short_sha, Given, Provenance};

/// One part of a request's stream, in the order a provider reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// `model`, `tool \`NAME\``, `system`, `message N` (1-based, in the format's list).
    pub label: String,
    /// The part's bytes as they appear in the stream.
    pub text: String,
}

/// The TTL a `cache_control` marker asks for (defined with the header, which records the one
/// an agent chose; read here, where markers are read; [`crate::cache`] models what it means).
pub use crate::conversation::Ttl;

/// `request` in `format` as the provider reads it: model, tools, system, messages.
pub fn stream(request: &FrozenRequest, format: Format) -> Vec<Part> {
    marked_stream(request, format)
        .into_iter()
        .map(|(part, _)| part)
        .collect()
}

/// [`stream`], with the cache breakpoint each part carries: the TTL of its `cache_control`
/// markers where Anthropic reads them (on a tool, a block, a tool result's blocks; `"ttl":
/// "1h"`, else 5 minutes), the part's text left without them.
pub fn marked_stream(request: &FrozenRequest, format: Format) -> Vec<(Part, Option<Ttl>)> {
    marked_parts(&formats::render(request, format), format)
}

/// [`marked_stream`] of a request body already rendered in `format`.
pub fn marked_parts(body: &Value, format: Format) -> Vec<(Part, Option<Ttl>)> {
    match format {
        Format::Gemini => return gemini_parts(body),
        Format::Bedrock => return bedrock_parts(body),
        _ => {}
    }
    let mut parts = Vec::new();
    let mut push = |label: String, v: &Value| {
        let mark = breakpoint(v);
        let text = if mark.is_some() {
            let mut v = v.clone();
            strip_cache_control(&mut v);
            v.to_string()
        } else {
            v.to_string()
        };
        parts.push((Part { label, text }, mark))
    };
    if let Some(model) = body.get("model") {
        push("model".into(), model);
    }
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        for tool in tools {
            // K9: a deferred tool is not in the prompt; a namespace is, without its tools.
            if tool.get("defer_loading") == Some(&Value::Bool(true)) {
                continue;
            }
            if tool.get("type").and_then(Value::as_str) == Some("namespace") {
                let mut shown = tool.clone();
                if let Value::Object(map) = &mut shown {
                    map.remove("tools");
                }
                push(format!("tool `{}`", tool_name(tool)), &shown);
                continue;
            }
            push(format!("tool `{}`", tool_name(tool)), tool);
        }
    }
    for key in ["system", "instructions"] {
        if let Some(system) = body.get(key) {
            push("system".into(), system);
        }
    }
    let list = body
        .get(formats::list_key(format))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    // Chat Completions carries the system prompt as the list's first item: it is the part
    // `system` there as everywhere, and the conversation is numbered from 1 after it.
    let lead = usize::from(format == Format::Openai && list.first().is_some_and(is_system));
    for m in &list[..lead] {
        push("system".into(), m);
    }
    for (i, m) in list[lead..].iter().enumerate() {
        push(format!("message {}", i + 1), m);
    }
    parts
}

/// Whether a Chat Completions list item is a system (or developer) message.
fn is_system(item: &Value) -> bool {
    matches!(
        item.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

/// A Gemini body's stream: model, each function declaration, the system instruction, each
/// content. Gemini caches implicitly: no part carries a breakpoint.
fn gemini_parts(body: &Value) -> Vec<(Part, Option<Ttl>)> {
    let mut parts = Vec::new();
    let mut push = |label: String, v: &Value| {
        parts.push((
            Part {
                label,
                text: v.to_string(),
            },
            None,
        ))
    };
    if let Some(model) = body.get("model") {
        push("model".into(), model);
    }
    let config = body.get("config");
    let tools = config
        .and_then(|c| c.get("tools"))
        .and_then(Value::as_array);
    for tool in tools.into_iter().flatten() {
        let declarations = tool.get("functionDeclarations").and_then(Value::as_array);
        for declaration in declarations.into_iter().flatten() {
            push(format!("tool `{}`", tool_name(declaration)), declaration);
        }
    }
    if let Some(system) = config.and_then(|c| c.get("systemInstruction")) {
        push("system".into(), system);
    }
    let contents = body.get("contents").and_then(Value::as_array);
    for (i, content) in contents.into_iter().flatten().enumerate() {
        push(format!("message {}", i + 1), content);
    }
    parts
}

/// The TTL of a Converse `cachePoint` block, if `v` is one.
fn cache_point(v: &Value) -> Option<Ttl> {
    let point = v.get("cachePoint")?;
    Some(match point.get("ttl").and_then(Value::as_str) {
        Some("1h") => Ttl::Hour1,
        _ => Ttl::Minutes5,
    })
}

/// `blocks` without their `cachePoint` blocks, and the longest TTL those asked for.
fn without_cache_points(blocks: &[Value]) -> (Value, Option<Ttl>) {
    let mark = blocks.iter().filter_map(cache_point).max();
    let kept = blocks
        .iter()
        .filter(|b| cache_point(b).is_none())
        .cloned()
        .collect();
    (Value::Array(kept), mark)
}

/// A Converse body's stream: model, each tool, the system blocks, each message. A
/// `cachePoint` block marks the end of what comes before it: the tool before it in
/// `toolConfig.tools`, the system, or its message.
fn bedrock_parts(body: &Value) -> Vec<(Part, Option<Ttl>)> {
    let mut parts: Vec<(Part, Option<Ttl>)> = Vec::new();
    let part = |label: String, v: &Value| Part {
        label,
        text: v.to_string(),
    };
    if let Some(model) = body.get("modelId") {
        parts.push((part("model".into(), model), None));
    }
    let tools = body
        .get("toolConfig")
        .and_then(|c| c.get("tools"))
        .and_then(Value::as_array);
    for tool in tools.into_iter().flatten() {
        match (cache_point(tool), parts.last_mut()) {
            (Some(ttl), Some(last)) => last.1 = last.1.max(Some(ttl)),
            (Some(_), None) => {}
            (None, _) => {
                let name = tool.get("toolSpec").map_or("?", tool_name);
                parts.push((part(format!("tool `{name}`"), tool), None));
            }
        }
    }
    if let Some(Value::Array(system)) = body.get("system") {
        let (kept, mark) = without_cache_points(system);
        parts.push((part("system".into(), &kept), mark));
    }
    let messages = body.get("messages").and_then(Value::as_array);
    for (i, message) in messages.into_iter().flatten().enumerate() {
        let mut message = message.clone();
        let mut mark = None;
        if let Some(Value::Array(content)) = message.get("content") {
            let (kept, m) = without_cache_points(content);
            mark = m;
            if let Value::Object(map) = &mut message {
                map.insert("content".into(), kept);
            }
        }
        parts.push((part(format!("message {}", i + 1), &message), mark));
    }
    parts
}

/// K9: the part of a body's `tools` array that is in the prompt: deferred tools left out,
/// namespaces without their tools.
pub fn prompt_tools(tools: &Value) -> Value {
    let Some(list) = tools.as_array() else {
        return tools.clone();
    };
    Value::Array(
        list.iter()
            .filter(|t| t.get("defer_loading") != Some(&Value::Bool(true)))
            .map(|t| {
                let mut t = t.clone();
                if t.get("type").and_then(Value::as_str) == Some("namespace") {
                    if let Value::Object(map) = &mut t {
                        map.remove("tools");
                    }
                }
                t
            })
            .collect(),
    )
}

/// A tool's name in any format's shape (`name`, or OpenAI Chat's `function.name`).
fn tool_name(tool: &Value) -> &str {
    tool.get("name")
        .or_else(|| tool.get("function").and_then(|f| f.get("name")))
        .and_then(Value::as_str)
        .unwrap_or("?")
}

/// The longest TTL of the `cache_control` markers of `v` (a tool, the system blocks or a
/// message), if it has any. Only where Anthropic reads a breakpoint: on a tool, a block, or a
/// block in a block's `content` (a tool result's); a `cache_control` key inside a tool call's
/// `input` or any other value is data, not a breakpoint.
pub(crate) fn breakpoint(v: &Value) -> Option<Ttl> {
    match v {
        Value::Object(map) => {
            let own = map.get("cache_control").map(|c| {
                if c.get("ttl").and_then(Value::as_str) == Some("1h") {
                    Ttl::Hour1
                } else {
                    Ttl::Minutes5
                }
            });
            map.get("content")
                .and_then(breakpoint)
                .into_iter()
                .chain(own)
                .max()
        }
        Value::Array(items) => items.iter().filter_map(breakpoint).max(),
        _ => None,
    }
}

/// `v` without the markers [`breakpoint`] reads (and nothing else).
pub(crate) fn strip_cache_control(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("cache_control");
            if let Some(content) = map.get_mut("content") {
                strip_cache_control(content);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_cache_control),
        _ => {}
    }
}

/// How much of one request's stream another one repeats.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Diff {
    /// Bytes of the later request's stream.
    pub bytes: usize,
    /// Bytes of the earlier one's.
    pub previous_bytes: usize,
    /// Bytes at the start of both streams that are equal.
    pub shared_bytes: usize,
    /// The whole earlier stream is a prefix of the later one: a provider can reuse all of it.
    pub prefix_kept: bool,
    /// Where the streams first differ; `None` when one is a prefix of the other.
    pub first_divergence: Option<Divergence>,
    /// Why, in words, most important first.
    pub causes: Vec<String>,
    /// Changes that did not touch the prefix (a plugin swapped for an equal one…).
    pub notes: Vec<String>,
}

/// Where two requests' streams first differ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Divergence {
    /// The part of the later request where it starts (`tool \`bash\``, `system`, …).
    pub part: String,
    /// Its byte offset in the later stream.
    pub offset: usize,
}

/// Compares `after` with `before` (an earlier step's request) in `format`; the provenances,
/// when known, name the plugins behind a change.
pub fn diff(
    before: &FrozenRequest,
    before_from: Option<&Provenance>,
    after: &FrozenRequest,
    after_from: Option<&Provenance>,
    format: Format,
) -> Diff {
    let (old, new) = (stream(before, format), stream(after, format));
    let previous_bytes = old.iter().map(|p| p.text.len()).sum();
    let bytes = new.iter().map(|p| p.text.len()).sum();
    let mut shared = 0;
    let mut divergence = None;
    for (i, part) in new.iter().enumerate() {
        let Some(was) = old.get(i) else { break };
        if was.text == part.text {
            shared += part.text.len();
            continue;
        }
        let common = common_prefix(&was.text, &part.text);
        divergence = Some((
            i,
            Divergence {
                part: part.label.clone(),
                offset: shared + common,
            },
        ));
        shared += common;
        break;
    }
    let prefix_kept = divergence.is_none() && old.len() <= new.len();
    if divergence.is_none() && old.len() > new.len() {
        // The later request is shorter: it ends where the earlier one went on.
        divergence = Some((
            new.len(),
            Divergence {
                part: old[new.len()].label.clone(),
                offset: shared,
            },
        ));
    }
    let mut causes = Vec::new();
    let mut notes = Vec::new();
    explain(
        before,
        before_from,
        after,
        after_from,
        &mut causes,
        &mut notes,
    );
    if prefix_kept {
        causes.clear(); // what changed did not touch the prefix: say so, keep the rest as notes
        causes.push(if new.len() > old.len() {
            "only new messages: prefix kept".to_string()
        } else {
            "nothing changed: prefix kept".to_string()
        });
    } else if let Some((i, d)) = &divergence {
        if d.part.starts_with("message") && causes.is_empty() {
            causes.push(message_cause(&old, &new, *i, format));
        }
    }
    Diff {
        bytes,
        previous_bytes,
        shared_bytes: shared,
        prefix_kept,
        first_divergence: divergence.map(|(_, d)| d),
        causes,
        notes,
    }
}

/// Bytes two strings share at their start, at a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

fn message_cause(old: &[Part], new: &[Part], i: usize, format: Format) -> String {
    let label = &new[i].label;
    if i + 1 == old.len() && matches!(format, Format::Anthropic | Format::Gemini | Format::Bedrock)
    {
        return format!("{label} grew: a new message joined the previous turn");
    }
    if i >= old.len() {
        return "only new messages: prefix kept".into();
    }
    format!("{label} changed: earlier history was left out or compacted")
}

/// The header's changes between two requests, in words.
fn explain(
    before: &FrozenRequest,
    before_from: Option<&Provenance>,
    after: &FrozenRequest,
    after_from: Option<&Provenance>,
    causes: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    let (a, b) = (&before.header, &after.header);
    if a.model.get("model") != b.model.get("model") {
        causes.push(format!(
            "model changed: {} → {}",
            a.model.get("model").unwrap_or(&Value::Null),
            b.model.get("model").unwrap_or(&Value::Null)
        ));
    } else if a.model != b.model {
        notes.push("model settings changed".into());
    }
    // Tools, in order: the first difference breaks everything after it.
    let names = |r: &FrozenRequest| -> Vec<String> {
        r.header.tools.iter().map(|t| t.name.clone()).collect()
    };
    let (old_names, new_names) = (names(before), names(after));
    if old_names != new_names {
        let removed: Vec<&String> = old_names
            .iter()
            .filter(|n| !new_names.contains(n))
            .collect();
        let added: Vec<&String> = new_names
            .iter()
            .filter(|n| !old_names.contains(n))
            .collect();
        let list = |v: &[&String]| {
            v.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !added.is_empty() {
            causes.push(format!("tools added: {}", list(&added)));
        }
        if !removed.is_empty() {
            causes.push(format!("tools removed: {}", list(&removed)));
        }
        if added.is_empty() && removed.is_empty() {
            causes.push("tool order changed".into());
        }
    }
    for new_tool in &b.tools {
        let Some(old_tool) = a.tools.iter().find(|t| t.name == new_tool.name) else {
            continue;
        };
        if old_tool != new_tool {
            let what = if old_tool.parameters != new_tool.parameters {
                "schema"
            } else {
                "description"
            };
            causes.push(format!(
                "tool `{}` {what} changed{}",
                new_tool.name,
                by_plugin(
                    before_from,
                    after_from,
                    |p| &p.tools,
                    "tool",
                    &new_tool.name
                )
            ));
        }
    }
    if a.system != b.system {
        system_causes(before_from, after_from, causes);
    }
    // Plugins whose file changed: a cause when they gave a changed part, else a note.
    if let (Some(pa), Some(pb)) = (before_from, after_from) {
        plugin_notes(pa, pb, causes, notes);
    }
}

/// Why the system prompt changed: each section added, changed or removed, by the provenances;
/// else the prompt as a whole.
fn system_causes(
    before_from: Option<&Provenance>,
    after_from: Option<&Provenance>,
    causes: &mut Vec<String>,
) {
    let mut named = false;
    if let (Some(pa), Some(pb)) = (before_from, after_from) {
        for s in &pb.sections {
            match pa.sections.iter().find(|o| o.name == s.name) {
                None => causes.push(format!(
                    "section `{}` added (plugin `{}`)",
                    s.name, s.plugin
                )),
                Some(o) if o.text != s.text => causes.push(format!(
                    "section `{}` text changed{}",
                    s.name,
                    by_plugin(before_from, after_from, |p| &p.sections, "section", &s.name)
                )),
                _ => continue,
            }
            named = true;
        }
        for o in &pa.sections {
            if !pb.sections.iter().any(|s| s.name == o.name) {
                causes.push(format!(
                    "section `{}` removed (plugin `{}`)",
                    o.name, o.plugin
                ));
                named = true;
            }
        }
    }
    if !named {
        causes.push("system prompt changed".into());
    }
}

/// The plugins whose file or config changed, joined or left, as notes (a changed plugin that
/// a cause already names is not noted again).
fn plugin_notes(pa: &Provenance, pb: &Provenance, causes: &[String], notes: &mut Vec<String>) {
    for (id, sha) in &pb.plugins {
        match pa.plugins.get(id) {
            Some(old) if old != sha => {
                let mentioned = causes.iter().any(|c| c.contains(&format!("plugin `{id}`")));
                if !mentioned {
                    notes.push(format!(
                        "plugin `{id}` changed (sha256 {}→{}) without changing the request's parts",
                        short_sha(old),
                        short_sha(sha)
                    ));
                }
            }
            Some(_) if pa.config_of(id) != pb.config_of(id) => {
                let mentioned = causes.iter().any(|c| c.contains(&format!("plugin `{id}`")));
                if !mentioned {
                    notes.push(format!(
                        "plugin `{id}`'s config changed without changing the request's parts"
                    ));
                }
            }
            None => notes.push(format!("plugin `{id}` joined")),
            _ => {}
        }
    }
    for id in pa.plugins.keys().filter(|id| !pb.plugins.contains_key(*id)) {
        notes.push(format!("plugin `{id}` left"));
    }
}

/// The plugin behind the part of a later request labelled `part` (as [`stream`] labels them)
/// where it first differs from an earlier one: the tool's giver, or for the system prompt the
/// giver of the first section that was added, removed or changed; `None` for messages and
/// the model, and when the provenances do not say.
pub fn culprit(
    part: &str,
    before_from: Option<&Provenance>,
    after_from: Option<&Provenance>,
) -> Option<String> {
    let (pa, pb) = (before_from?, after_from?);
    if let Some(name) = part
        .strip_prefix("tool `")
        .and_then(|r| r.strip_suffix('`'))
    {
        let giver = |p: &Provenance| {
            p.tools
                .iter()
                .find(|g| g.name == name)
                .map(|g| g.plugin.clone())
        };
        return giver(pb).or_else(|| giver(pa));
    }
    if part != "system" {
        return None;
    }
    let first_change = |old: &[Given], new: &[Given]| -> Option<String> {
        let changed = new.iter().find(|s| {
            old.iter()
                .find(|o| o.name == s.name)
                .is_none_or(|o| o.text != s.text || o.plugin != s.plugin)
        });
        let removed = || old.iter().find(|o| !new.iter().any(|s| s.name == o.name));
        changed.or_else(removed).map(|g| g.plugin.clone())
    };
    first_change(&pa.sections, &pb.sections).or_else(|| first_change(&pa.contexts, &pb.contexts))
}

/// ": plugin `tools` sha256 a1b2c3d4→e5f6a7b8" for a part, from the provenances.
fn by_plugin<'p>(
    before: Option<&'p Provenance>,
    after: Option<&'p Provenance>,
    list: impl Fn(&'p Provenance) -> &'p Vec<Given>,
    kind: &str,
    name: &str,
) -> String {
    let find = |p: Option<&'p Provenance>| -> Option<(&'p Provenance, &'p Given)> {
        let p = p?;
        list(p).iter().find(|g| g.name == name).map(|g| (p, g))
    };
    match (find(before), find(after)) {
        (Some((pa, ga)), Some((pb, gb))) if ga.plugin == gb.plugin => {
            let id = &gb.plugin;
            let (old, new) = (pa.sha_of(id), pb.sha_of(id));
            let config_changed = pa.config_of(id) != pb.config_of(id);
            match (old == new, config_changed) {
                (false, false) => {
                    format!(
                        ": plugin `{id}` sha256 {}→{}",
                        short_sha(old),
                        short_sha(new)
                    )
                }
                (false, true) => format!(
                    ": plugin `{id}` sha256 {}→{} and its config changed",
                    short_sha(old),
                    short_sha(new)
                ),
                (true, true) if new.is_empty() => format!(": plugin `{id}` (its config changed)"),
                (true, true) => format!(": plugin `{id}` (same file; its config changed)"),
                // Neither the file nor the config: only what the plugin computes per step (or
                // a variable the text uses), or, without a file (an MCP server), what it lists.
                (true, false) if new.is_empty() => {
                    format!(": plugin `{id}` (no file; what it declares changed)")
                }
                (true, false) if kind == "tool" => format!(
                    ": plugin `{id}` (same file and config; it declared the tool differently)"
                ),
                (true, false) => format!(
                    ": plugin `{id}` (same file and config; its dynamic text, or a variable \
                     the text uses, changed)"
                ),
            }
        }
        (Some((_, ga)), Some((_, gb))) => {
            format!(": now from plugin `{}` (was `{}`)", gb.plugin, ga.plugin)
        }
        (_, Some((_, gb))) => format!(": plugin `{}`", gb.plugin),
        _ => String::new(),
    }
}

/// A step's request against the step before it and against the last earlier step that had the
/// same header (`GET /v1/sessions/{id}/steps/{n}/diff`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepDiff {
    /// The step compared.
    pub step: u64,
    /// The format whose stream is compared.
    pub format: Format,
    /// Bytes of this step's stream (model, tools, system, messages).
    pub bytes: usize,
    /// Against step n−1; `None` on a session's first step.
    pub previous: Option<Against>,
    /// Against the last step before n−1 whose header equals this step's (the provider may
    /// still hold its cache), when there is one.
    pub same_header: Option<Against>,
    /// Why the prefix against step n−1 broke, or that it was kept.
    pub causes: Vec<String>,
    /// Whether `causes` broke the cache: step n's request does not start with the whole of
    /// step n−1's, so what a provider cached for n−1 is not read whole. False on a first
    /// step (nothing to break) and when the prefix was kept.
    pub breaks_cache: bool,
    /// Changes that did not touch the prefix.
    pub notes: Vec<String>,
    /// The share of this step's input a provider could serve from its cache, the best of the
    /// two comparisons.
    pub cached_share: CachedShare,
}

/// One comparison of a step's stream with an earlier step's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Against {
    /// The earlier step.
    pub step: u64,
    /// Bytes of that step's stream.
    pub bytes: usize,
    /// Bytes the two streams share from their start.
    pub shared_bytes: usize,
    /// Whether the earlier stream is a prefix of this one (a provider's cache can serve it all).
    pub prefix_kept: bool,
    /// Where the streams first differ; `None` when one is a prefix of the other.
    pub first_divergence: Option<Divergence>,
}

/// The share of a step's input a provider could serve from its cache.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CachedShare {
    /// Shared bytes over this step's bytes.
    pub bytes: f64,
    /// The same in tokens, when the agent's budget names a tokenizer.
    pub tokens: Option<TokenShare>,
}

/// A cached share counted in tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenShare {
    /// Tokens of the shared prefix.
    pub shared: usize,
    /// Tokens of the whole stream.
    pub total: usize,
    /// The tokenizer that counted them.
    pub tokenizer: String,
}

/// Over a whole log: how many steps had a previous request, and how many of those kept all of
/// it as their prefix (no header change, nothing dropped or compacted between them) — the
/// figure `promptd session log` shows.
pub fn prefix_kept_share<'a>(
    events: impl IntoIterator<Item = (crate::store::EventKind, &'a Value)>,
) -> (u64, u64) {
    use crate::store::EventKind;
    let (mut kept, mut compared) = (0, 0);
    let (mut steps, mut broken) = (0u64, false);
    let mut last: Option<Value> = None;
    for (kind, body) in events {
        match kind {
            EventKind::RequestHeader => {
                let h = body.get("header").cloned();
                // A `resume` header equal to the last one breaks nothing.
                if last.is_some() && h != last {
                    broken = true;
                }
                last = h;
            }
            EventKind::HistoryDropped | EventKind::HistoryCompacted => broken = true,
            EventKind::Step => {
                if steps > 0 {
                    compared += 1;
                    kept += u64::from(!broken);
                }
                steps += 1;
                broken = false;
            }
            _ => {}
        }
    }
    (kept, compared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{Header, ToolSpec};
    use serde_json::json;

    fn request(schema: Value, system: &str) -> FrozenRequest {
        FrozenRequest {
            header: Header {
                system: system.into(),
                tools: vec![ToolSpec {
                    name: "probe_search".into(),
                    description: "Search.".into(),
                    parameters: schema.into(),
                    defer: None,
                }],
                ..Header::default()
            },
            messages: Vec::new(),
            shown_tools: None,
        }
    }

    fn from(sha: &str, config: Option<&str>) -> Provenance {
        let given = |name: &str| Given {
            name: name.into(),
            plugin: "probe".into(),
            scope: "global".into(),
            text: None,
        };
        Provenance {
            plugins: [("probe".to_string(), sha.to_string())].into(),
            configs: config
                .map(|c| [("probe".to_string(), c.to_string())].into())
                .unwrap_or_default(),
            sections: vec![given("persona")],
            tools: vec![given("probe_search")],
            ..Provenance::default()
        }
    }

    /// Issue 26: a cause names what changed — the plugin's config, its file, or neither —
    /// never "its dynamic value" for a static schema whose config changed.
    #[test]
    fn q16_a_cause_says_whether_the_config_the_file_or_neither_changed() {
        let (a, b) = (
            request(json!({"type": "object"}), "S"),
            request(json!({"type": "object", "required": ["q"]}), "S"),
        );
        let causes = |pa: &Provenance, pb: &Provenance| {
            diff(&a, Some(pa), &b, Some(pb), Format::Openai).causes
        };
        assert_eq!(
            causes(&from("aaaa1111", Some("c1")), &from("aaaa1111", Some("c2"))),
            ["tool `probe_search` schema changed: plugin `probe` (same file; its config changed)"]
        );
        assert_eq!(
            causes(&from("aaaa1111", None), &from("aaaa1111", Some("c2"))),
            ["tool `probe_search` schema changed: plugin `probe` (same file; its config changed)"]
        );
        assert_eq!(
            causes(&from("aaaa1111", Some("c1")), &from("bbbb2222", Some("c1"))),
            ["tool `probe_search` schema changed: plugin `probe` sha256 aaaa1111→bbbb2222"]
        );
        assert_eq!(
            causes(&from("aaaa1111", Some("c1")), &from("bbbb2222", Some("c2"))),
            ["tool `probe_search` schema changed: plugin `probe` sha256 aaaa1111→bbbb2222 and its config changed"]
        );
        assert_eq!(
            causes(&from("aaaa1111", Some("c1")), &from("aaaa1111", Some("c1"))),
            ["tool `probe_search` schema changed: plugin `probe` (same file and config; it declared the tool differently)"]
        );
        assert_eq!(
            causes(&from("", None), &from("", None)),
            ["tool `probe_search` schema changed: plugin `probe` (no file; what it declares changed)"]
        );
        // A section's text with neither changed: computed per step, or a variable it uses.
        let (a, b) = (request(json!({}), "one"), request(json!({}), "two"));
        let (mut pa, mut pb) = (from("aaaa1111", Some("c1")), from("aaaa1111", Some("c1")));
        pa.sections[0].text = Some(crate::plugin::registry::short_hash(b"one"));
        pb.sections[0].text = Some(crate::plugin::registry::short_hash(b"two"));
        let d = diff(&a, Some(&pa), &b, Some(&pb), Format::Openai);
        assert_eq!(
            d.causes,
            ["section `persona` text changed: plugin `probe` (same file and config; its dynamic text, or a variable the text uses, changed)"]
        );
    }

    /// A config change that leaves every part as it was is a note, not a cause.
    #[test]
    fn a_config_change_without_effect_is_a_note() {
        let a = request(json!({}), "S");
        let d = diff(
            &a,
            Some(&from("aaaa1111", Some("c1"))),
            &a,
            Some(&from("aaaa1111", Some("c2"))),
            Format::Openai,
        );
        assert_eq!(d.causes, ["nothing changed: prefix kept"]);
        assert_eq!(
            d.notes,
            ["plugin `probe`'s config changed without changing the request's parts"]
        );
    }

    /// Only Anthropic's own breakpoint positions are breakpoints: a `cache_control` key in a
    /// tool call's input is the model's data, kept in the stream and never counted, so the
    /// three markers promptd writes are all a body has.
    #[test]
    fn a_cache_control_key_inside_a_tool_input_is_data_not_a_breakpoint() {
        let body = serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "t",
                    "input": {"cache_control": {"type": "ephemeral"}}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                    "content": [{"type": "text", "text": "ok"}],
                    "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
            ],
        });
        let parts = marked_parts(&body, Format::Anthropic);
        let marks: Vec<Option<Ttl>> = parts.iter().map(|(_, m)| *m).collect();
        assert_eq!(marks, vec![None, None, Some(Ttl::Hour1)], "{parts:?}");
        assert!(
            parts[1].0.text.contains("\"input\":{\"cache_control\""),
            "{parts:?}"
        );
        assert!(!parts[2].0.text.contains("cache_control"), "{parts:?}");
    }
}
