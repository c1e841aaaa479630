//! The tools a step shows (A6–A8): `tool_order` checked, tools in order, the shown names
//! apart with `allowed_tools`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::calls::Calls;
use super::effective::Picked;
use super::model::{AssembledTool, Options, Origin};
use crate::error::{Error, Result};
use crate::plugin::model::Step;
use crate::plugin::names::UNLISTED_TOOLS;
use crate::plugin::registry::Registry;

/// A8: every `tool_order` name must be known to some loaded plugin.
pub(super) fn check_tool_order(registry: &Registry, order: &[String]) -> Result<()> {
    let known = registry.known_tools();
    let unknown: Vec<String> = order
        .iter()
        .filter(|n| *n != UNLISTED_TOOLS && known.binary_search(n).is_err())
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Error::UnknownToolOrderName { unknown, known })
    }
}

/// The names of a tool set in A7's order: by name, or by `tool_order`.
pub(super) fn in_order<'n>(names: &BTreeSet<&'n str>, options: &Options) -> Vec<&'n str> {
    match &options.tool_order {
        None => names.iter().copied().collect(),
        Some(order) => {
            let listed: BTreeSet<&str> = order.iter().map(String::as_str).collect();
            let mut out = Vec::with_capacity(names.len());
            for entry in order.iter() {
                if entry == UNLISTED_TOOLS {
                    out.extend(names.iter().filter(|n| !listed.contains(*n)));
                } else if let Some(n) = names.get(entry.as_str()) {
                    out.push(*n);
                }
            }
            out
        }
    }
}

/// The tools a step shows, in order, who gave them, and the shown names (`allowed_tools`).
pub(super) struct OrderedTools {
    pub(super) tools: Arc<[AssembledTool]>,
    pub(super) origins: Arc<[Origin]>,
    pub(super) shown: Option<Vec<String>>,
}

/// A6, A7: shown tools, by name or by `tool_order` (all known tools, and the shown names
/// apart, with [`Options::keep_all_tools`]). `step` is `None` when no plugin filters tools
/// (a layout's ordering, which calls nothing).
pub(super) fn order_tools(
    tools: &BTreeMap<&str, Picked<'_>>,
    options: &Options,
    step: Option<&Step>,
    calls: &mut Calls,
) -> Result<OrderedTools> {
    // Each filtering plugin is asked once which of its known tools it shows this step.
    let mut shown: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for &(entry, _, _, _) in tools.values() {
        if entry.declaration.filters_tools && !shown.contains_key(entry.id.as_str()) {
            let Some(step) = step else {
                continue;
            };
            let names = calls.shown_tools(entry, step)?.clone();
            if let Some(bad) = names
                .iter()
                .find(|n| !entry.declaration.tools.iter().any(|t| &t.name == *n))
            {
                return Err(Error::UnknownShownTool {
                    plugin: entry.id.clone(),
                    tool: bad.clone(),
                });
            }
            shown.insert(&entry.id, names.iter().cloned().collect());
        }
    }
    let visible: BTreeSet<&str> = tools
        .iter()
        .filter(|(name, (e, _, _, _))| shown.get(e.id.as_str()).is_none_or(|s| s.contains(**name)))
        .map(|(n, _)| *n)
        .collect();

    let shown_names = in_order(&visible, options);
    let (names, shown) = if options.keep_all_tools {
        let all = in_order(&tools.keys().copied().collect(), options);
        let shown = shown_names.iter().map(|n| n.to_string()).collect();
        (all, Some(shown))
    } else {
        (shown_names, None)
    };
    let mut out = Vec::with_capacity(names.len());
    let mut origins = Vec::with_capacity(names.len());
    for name in names {
        let (entry, index, scope, _) = tools[name];
        let t = &entry.declaration.tools[index];
        let parameters = entry
            .schemas
            .get(t.name.as_str())
            .and_then(|by_scope| by_scope.iter().find(|(s, _)| *s == t.scope))
            .map(|(_, schema)| schema.clone())
            .unwrap_or_else(|| Arc::new(serde_json::Value::Object(Default::default())));
        out.push(AssembledTool {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters,
            defer: entry
                .options
                .defer
                .holds(&t.name)
                .then(|| Arc::from(entry.id.as_str())),
        });
        origins.push(Origin {
            name: name.to_string(),
            plugin: entry.id.clone(),
            scope: scope.key().to_string(),
        });
    }
    Ok(OrderedTools {
        tools: out.into(),
        origins: origins.into(),
        shown,
    })
}
