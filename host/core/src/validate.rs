//! R1: everything a plugin declares is checked before any of it becomes visible.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};
use crate::interpolate;
use crate::model::{Content, Declaration, Kind, Scope};
use crate::names::{is_item_name, is_tool_name, is_variable_name, UNLISTED_TOOLS};

/// Parsed tool parameters, by (tool name, declared scope).
pub type ToolSchemas = BTreeMap<(String, Scope), serde_json::Value>;

/// Checks names, scopes, static templates, duplicates and tool schemas; returns each tool's
/// parsed parameters. The first problem refuses the whole plugin.
pub fn validate(plugin: &str, decl: &Declaration) -> Result<ToolSchemas> {
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

    for s in &decl.sections {
        check_item_name(plugin, Kind::Section, &s.name)?;
        check_template(plugin, Kind::Section, &s.name, &s.text)?;
        unique(Kind::Section, &s.name, &s.scope)?;
    }
    for c in &decl.contexts {
        check_item_name(plugin, Kind::Context, &c.name)?;
        check_template(plugin, Kind::Context, &c.name, &c.text)?;
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
        schemas.insert((t.name.clone(), t.scope.clone()), value);
    }
    Ok(schemas)
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
