//! R1: everything a plugin declares is checked before any of it becomes visible.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};
use crate::plugin::interpolate;
use crate::plugin::model::{Content, Declaration, Kind, Scope};
use crate::plugin::names::{is_item_name, is_tool_name, is_variable_name, UNLISTED_TOOLS};
use crate::plugin::sandbox::DeclarationLimits;

/// Parsed tool parameters, by tool name, then declared scope: parsed once at load and shared
/// by every assembly (never copied per step).
pub type ToolSchemas = BTreeMap<String, Vec<(Scope, std::sync::Arc<serde_json::Value>)>>;

/// Checks names, scopes, static templates, duplicates and tool schemas; returns each tool's
/// parsed parameters. The first problem refuses the whole plugin.
///
/// Text that is never interpolated is never parsed (T7): a `verbatim` section or context, and
/// every context of a `data` plugin (`data_contexts`), may hold any braces at all.
pub fn validate(
    plugin: &str,
    decl: &Declaration,
    limits: &DeclarationLimits,
    data_contexts: bool,
) -> Result<ToolSchemas> {
    check_limits(plugin, decl, limits)?;
    let mut seen: BTreeSet<(Kind, String, Scope)> = BTreeSet::new();
    let mut unique = |kind: Kind, name: &str, scope: &Scope| -> Result<()> {
        check_scope(plugin, scope)?;
        if !seen.insert((kind, name.to_string(), scope.clone())) {
            return Err(Error::DuplicateName {
                plugin: plugin.into(),
                kind,
                name: name.into(),
                scope: scope.to_string(),
            });
        }
        Ok(())
    };

    if let Some(reads) = &decl.reads {
        check_reads(plugin, Kind::Section, "*", &Content::Dynamic, reads, limits)?;
    }
    for s in &decl.sections {
        check_item_name(plugin, Kind::Section, &s.name)?;
        if let Some(reads) = &s.reads {
            check_reads(plugin, Kind::Section, &s.name, &s.text, reads, limits)?;
        }
        if !s.verbatim {
            check_template(plugin, Kind::Section, &s.name, &s.text)?;
        }
        unique(Kind::Section, &s.name, &s.scope)?;
    }
    for c in &decl.contexts {
        check_item_name(plugin, Kind::Context, &c.name)?;
        if let Some(reads) = &c.reads {
            check_reads(plugin, Kind::Context, &c.name, &c.text, reads, limits)?;
        }
        if !(c.verbatim || data_contexts) {
            check_template(plugin, Kind::Context, &c.name, &c.text)?;
        }
        unique(Kind::Context, &c.name, &c.scope)?;
    }
    for v in &decl.variables {
        if !is_variable_name(&v.name) {
            return Err(Error::InvalidName {
                plugin: plugin.into(),
                kind: Kind::Variable,
                name: v.name.clone(),
                rule: "variable names match ^[a-z][a-z0-9_]*$",
            });
        }
        if let Some(reads) = &v.reads {
            check_reads(plugin, Kind::Variable, &v.name, &v.value, reads, limits)?;
        }
        unique(Kind::Variable, &v.name, &v.scope)?;
    }
    let mut schemas = ToolSchemas::new();
    for t in &decl.tools {
        if t.name == UNLISTED_TOOLS {
            return Err(Error::ReservedToolName {
                plugin: plugin.into(),
                name: t.name.clone(),
            });
        }
        if !is_tool_name(&t.name) {
            return Err(Error::InvalidName {
                plugin: plugin.into(),
                kind: Kind::Tool,
                name: t.name.clone(),
                rule: "tool names match ^[a-zA-Z0-9_-]{1,64}$",
            });
        }
        unique(Kind::Tool, &t.name, &t.scope)?;
        let schema_error = |cause: String| Error::InvalidSchema {
            plugin: plugin.into(),
            tool: t.name.clone(),
            cause,
        };
        let value: serde_json::Value = serde_json::from_str(&t.parameters)
            .map_err(|e| schema_error(format!("not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(schema_error(format!(
                "a JSON Schema must be an object, got {}",
                json_type(&value)
            )));
        }
        schemas
            .entry(t.name.clone())
            .or_default()
            .push((t.scope.clone(), std::sync::Arc::new(value)));
    }
    Ok(schemas)
}

/// Most facts one `reads` names.
pub const MAX_READ_FACTS: usize = 64;

/// World 0.3.0: `reads` only on a dynamic item, naming at most [`MAX_READ_FACTS`] facts, each
/// non-empty and no longer than a name may be.
fn check_reads(
    plugin: &str,
    kind: Kind,
    name: &str,
    content: &Content,
    reads: &crate::plugin::model::Reads,
    limits: &DeclarationLimits,
) -> Result<()> {
    let refuse = |cause: String| Error::InvalidReads {
        plugin: plugin.into(),
        kind,
        name: name.into(),
        cause,
    };
    if let Content::Static(_) = content {
        return Err(refuse(
            "is for a dynamic item: a static one is never called".into(),
        ));
    }
    if reads.facts.len() > MAX_READ_FACTS {
        return Err(refuse(format!(
            "{} facts, more than {MAX_READ_FACTS}",
            reads.facts.len()
        )));
    }
    for fact in &reads.facts {
        if fact.is_empty() || fact.len() > limits.max_name_bytes {
            return Err(refuse(format!(
                "a fact name of {} bytes: names are 1 to {} bytes (limits.max_name_bytes)",
                fact.len(),
                limits.max_name_bytes
            )));
        }
    }
    Ok(())
}

/// L8: counts per kind, name lengths and the declaration's total size, before any other check
/// (so the cost of refusing is linear in the declaration and bounded by the guest's memory).
fn check_limits(plugin: &str, decl: &Declaration, limits: &DeclarationLimits) -> Result<()> {
    let over = |what: String, limit: usize, key: &'static str| Error::DeclarationLimit {
        plugin: plugin.into(),
        what,
        limit,
        key,
    };
    let counts = [
        (
            decl.sections.len(),
            limits.max_sections,
            "sections",
            "max_sections",
        ),
        (
            decl.contexts.len(),
            limits.max_contexts,
            "contexts",
            "max_contexts",
        ),
        (
            decl.variables.len(),
            limits.max_variables,
            "variables",
            "max_variables",
        ),
        (decl.tools.len(), limits.max_tools, "tools", "max_tools"),
    ];
    for (n, limit, kind, key) in counts {
        if n > limit {
            return Err(over(format!("declares {n} {kind}"), limit, key));
        }
    }
    let mut names: Vec<(Kind, &str, &Scope)> = Vec::new();
    let mut total = 0usize;
    let content = |c: &Content| match c {
        Content::Static(text) => text.len(),
        Content::Dynamic => 0,
    };
    for s in &decl.sections {
        names.push((Kind::Section, &s.name, &s.scope));
        total += content(&s.text);
    }
    for c in &decl.contexts {
        names.push((Kind::Context, &c.name, &c.scope));
        total += content(&c.text);
    }
    for v in &decl.variables {
        names.push((Kind::Variable, &v.name, &v.scope));
        total += content(&v.value);
    }
    for t in &decl.tools {
        names.push((Kind::Tool, &t.name, &t.scope));
        total += t.description.len() + t.parameters.len();
    }
    for (kind, name, scope) in names {
        total += name.len() + scope.key().len();
        for (what, text) in [("name", name), ("scope key", scope.key())] {
            if text.len() > limits.max_name_bytes {
                return Err(over(
                    format!(
                        "a {kind} {what} `{}` is {} bytes",
                        crate::plugin::names::shortened(text, 32),
                        text.len()
                    ),
                    limits.max_name_bytes,
                    "max_name_bytes",
                ));
            }
        }
    }
    if total > limits.max_declared_bytes {
        return Err(over(
            format!("declares {} KiB in all", total.div_ceil(1024)),
            limits.max_declared_bytes >> 10,
            "max_declared_kb",
        ));
    }
    Ok(())
}

/// A scope key must itself be a valid name, and `global` is only spelled as the global scope.
pub fn check_scope(plugin: &str, scope: &Scope) -> Result<()> {
    if let Scope::Agent(name) = scope {
        let rule = if name == "global" {
            Some("`global` is the global scope, not an agent")
        } else if !is_item_name(name) {
            Some("agent scope keys are non-empty printable ASCII without whitespace")
        } else {
            None
        };
        if let Some(rule) = rule {
            return Err(Error::InvalidScope {
                plugin: plugin.into(),
                scope: name.clone(),
                rule,
            });
        }
    }
    Ok(())
}

fn check_item_name(plugin: &str, kind: Kind, name: &str) -> Result<()> {
    if is_item_name(name) {
        Ok(())
    } else {
        Err(Error::InvalidName {
            plugin: plugin.into(),
            kind,
            name: name.into(),
            rule: "names are non-empty printable ASCII without whitespace",
        })
    }
}

/// Static text is parsed at load, so a malformed reference refuses the plugin early.
fn check_template(plugin: &str, kind: Kind, name: &str, text: &Content) -> Result<()> {
    if let Content::Static(text) = text {
        interpolate::parse(text)
            .map_err(|m| m.at(&format!("plugin `{plugin}`, {kind} `{name}`")))?;
    }
    Ok(())
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::model::{Section, Tool};

    fn section(name: &str, text: &str) -> Section {
        Section {
            name: name.into(),
            order: 0,
            text: Content::Static(text.into()),
            complete: false,
            scope: Scope::Global,
            verbatim: false,
            reads: None,
            refresh: None,
        }
    }

    fn refused(decl: &Declaration, limits: &DeclarationLimits) -> String {
        let e = validate("p", decl, limits, false).expect_err("over a limit");
        assert_eq!(e.code(), "declaration_limit", "{e}");
        e.to_string()
    }

    #[test]
    fn l8_counts_names_and_total_bytes_are_bounded() {
        let limits = DeclarationLimits {
            max_sections: 3,
            max_tools: 1,
            max_name_bytes: 8,
            max_declared_bytes: 1024,
            ..DeclarationLimits::default()
        };
        let many = Declaration {
            sections: (0..4).map(|i| section(&format!("s{i}"), "x")).collect(),
            ..Declaration::default()
        };
        assert_eq!(
            refused(&many, &limits),
            "plugin `p`: declares 4 sections, over the limit of 3 (limits.max_sections)"
        );
        let tool = |name: &str| Tool {
            name: name.into(),
            description: String::new(),
            parameters: "{}".into(),
            scope: Scope::Global,
            refresh: None,
            defer: false,
        };
        let tools = Declaration {
            tools: vec![tool("a"), tool("b")],
            ..Declaration::default()
        };
        assert!(
            refused(&tools, &limits).contains("2 tools, over the limit of 1 (limits.max_tools)")
        );

        let long = Declaration {
            sections: vec![section(&"n".repeat(10_240), "x")],
            ..Declaration::default()
        };
        let message = refused(&long, &limits);
        assert!(
            message.contains("10240 bytes, over the limit of 8 (limits.max_name_bytes)")
                && message.len() < 200,
            "{message}"
        );
        let scoped = Declaration {
            sections: vec![Section {
                scope: Scope::Agent("a".repeat(9)),
                ..section("s", "x")
            }],
            ..Declaration::default()
        };
        assert!(refused(&scoped, &limits).contains("scope key"));

        let big = Declaration {
            sections: vec![
                section("a", &"x".repeat(600)),
                section("b", &"x".repeat(600)),
            ],
            ..Declaration::default()
        };
        assert_eq!(
            refused(&big, &limits),
            "plugin `p`: declares 2 KiB in all, over the limit of 1 (limits.max_declared_kb)"
        );
        let fits = Declaration {
            sections: vec![section("a", &"x".repeat(600))],
            ..Declaration::default()
        };
        assert!(validate("p", &fits, &limits, false).is_ok());
    }
}
