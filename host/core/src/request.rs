//! Explanations and declarations as JSON, with sorted keys so equal inputs give equal bytes.
//! (Requests themselves are rendered by [`crate::formats`].)

use serde_json::{json, Map, Value};

use crate::conversation::{FrozenRequest, Message};
use crate::formats::{self, Format};
use crate::session;

use crate::assembly::{Assembly, Origin};
use crate::plugin::model::{Content, Declaration};

/// The neutral request of one assembly outside any session (`promptd assemble`): the same
/// shape a daemon step returns in the neutral format, `{"model", "system", "tools",
/// "messages"}`, with the runtime context as the only message. With `explain`, an `explain`
/// key says where everything came from.
pub fn neutral_json(a: &Assembly, model: Map<String, Value>, explain: bool) -> Value {
    let frozen = FrozenRequest {
        header: session::header(a, model),
        messages: a.runtime_context.iter().map(Message::snapshot).collect(),
        shown_tools: a.shown_tools.clone(),
    };
    let mut out = formats::render(&frozen, Format::Neutral);
    if explain {
        out["explain"] = explain_json(a);
    }
    out
}

/// Which plugin (and scope) gave each effective section, context, variable and tool, and
/// which optional plugins were left out (`promptd assemble --explain`).
pub fn explain_json(a: &Assembly) -> Value {
    let origins = |list: &[Origin]| -> Vec<Value> {
        list.iter()
            .map(|o| json!({"name": o.name, "plugin": o.plugin, "scope": o.scope}))
            .collect()
    };
    json!({
        "sections": origins(&a.explain.sections),
        "contexts": origins(&a.explain.contexts),
        "variables": origins(&a.explain.variables),
        "tools": origins(&a.explain.tools),
        "omitted": a.omitted.iter().map(|o| json!({
            "plugin": o.plugin, "contribution": o.contribution, "cause": o.cause,
        })).collect::<Vec<_>>(),
    })
}

/// What a plugin declares, as JSON (for `promptd plugin check` and the plugin list).
pub fn declaration_json(d: &Declaration) -> Value {
    let text = |c: &Content| match c {
        Content::Static(t) => json!({"static": t}),
        Content::Dynamic => json!("dynamic"),
    };
    json!({
        "sections": d.sections.iter().map(|s| json!({
            "name": s.name, "order": s.order, "text": text(&s.text),
            "complete": s.complete, "scope": s.scope.key(),
        })).collect::<Vec<_>>(),
        "contexts": d.contexts.iter().map(|c| json!({
            "name": c.name, "order": c.order, "text": text(&c.text), "scope": c.scope.key(),
        })).collect::<Vec<_>>(),
        "variables": d.variables.iter().map(|v| json!({
            "name": v.name, "value": text(&v.value), "scope": v.scope.key(),
        })).collect::<Vec<_>>(),
        "tools": d.tools.iter().map(|t| json!({
            "name": t.name, "description": t.description,
            // Validated as a JSON object at load (R1); shown as declared if it ever is not.
            "parameters": serde_json::from_str::<Value>(&t.parameters)
                .unwrap_or_else(|_| Value::String(t.parameters.clone())),
            "scope": t.scope.key(),
        })).collect::<Vec<_>>(),
        "filters_tools": d.filters_tools,
    })
}
