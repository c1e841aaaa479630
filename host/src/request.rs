//! The request as JSON: `{"system", "tools", "messages"}` with sorted keys, so equal inputs
//! give equal bytes.

use serde_json::{json, Value};

use crate::assembly::{Assembly, Origin};
use crate::model::{Content, Declaration};

/// The neutral request body. `messages` holds the runtime context snapshot as one user message
/// when there is one. With `explain`, adds which plugin gave each contribution and what
/// optional plugins were left out.
pub fn request_json(a: &Assembly, explain: bool) -> Value {
    // serde_json's map is a BTreeMap (no `preserve_order`), so keys serialize sorted.
    let tools: Vec<Value> = a
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
        .collect();
    let messages: Vec<Value> = a
        .runtime_context
        .iter()
        .map(|c| json!({"role": "user", "content": c}))
        .collect();
    let mut out = json!({"system": a.system, "tools": tools, "messages": messages});
    if explain {
        let origins = |list: &[Origin]| -> Vec<Value> {
            list.iter()
                .map(|o| json!({"name": o.name, "plugin": o.plugin, "scope": o.scope}))
                .collect()
        };
        out["explain"] = json!({
            "sections": origins(&a.explain.sections),
            "contexts": origins(&a.explain.contexts),
            "variables": origins(&a.explain.variables),
            "tools": origins(&a.explain.tools),
            "omitted": a.omitted.iter().map(|o| json!({
                "plugin": o.plugin, "contribution": o.contribution, "cause": o.cause,
            })).collect::<Vec<_>>(),
        });
    }
    out
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
            "parameters": serde_json::from_str::<Value>(&t.parameters).unwrap_or(Value::Null),
            "scope": t.scope.key(),
        })).collect::<Vec<_>>(),
        "filters_tools": d.filters_tools,
    })
}
