//! Where each part of a step's request came from.
//!
//! **Provenance** names, for one step, the plugin (id and sha256) and scope that gave each
//! section, context, variable and tool, with a short hash of each part's text. It is recorded
//! with the step's `request/header` event, and in the step marker when the plugins changed
//! without changing the header (a plugin swapped for a byte-different but equal one), so any
//! past step can be explained after its plugins are gone. [`crate::prefix`] uses it to say
//! why a request's cache prefix broke.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::assembly::{Assembly, Origin};
use crate::plugin::registry::{short_hash, Registry};

/// Which plugin gave each part of one step's request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Provenance {
    /// Every plugin serving the step, id → sha256 of its file: the plugin set.
    pub plugins: BTreeMap<String, String>,
    /// Each plugin that was given config values, id → a short hash of them; absent for the
    /// others (and in logs written before it was recorded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, String>,
    /// The plugins the config trusts as `data` (R7); a held change is never one whose
    /// plugin's trust changed (K7).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub data: std::collections::BTreeSet<String>,
    /// The published plugin set served (K10), when the daemon follows a store: a daemon
    /// still on an older set refuses the session's steps instead of moving it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<u64>,
    /// Who gave each effective section.
    pub sections: Vec<Given>,
    /// Who gave each effective context.
    pub contexts: Vec<Given>,
    /// Who gave each effective variable.
    pub variables: Vec<Given>,
    /// Who gave each tool shown.
    pub tools: Vec<Given>,
}

/// One effective contribution and who gave it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Given {
    /// The contribution's name.
    pub name: String,
    /// The id of the plugin that gave it.
    pub plugin: String,
    /// The effective scope: `global`, or the agent or group name it is scoped to.
    pub scope: String,
    /// A short hash of the part's text (a section's or context's interpolated text, a tool's
    /// description and schema), to tell which part changed. Never for variables: their values
    /// may be secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Provenance {
    /// The provenance of `assembly`, made from `registry`.
    pub fn of(registry: &Registry, assembly: &Assembly) -> Self {
        let plugins = registry
            .plugins()
            .map(|p| (p.id.clone(), p.sha256.clone().unwrap_or_default()))
            .collect();
        let configs = registry
            .plugins()
            .filter_map(|p| Some((p.id.clone(), p.config_hash.clone()?)))
            .collect();
        let data = registry
            .plugins()
            .filter(|p| p.options.trust == crate::plugin::trust::Trust::Data)
            .map(|p| p.id.clone())
            .collect();
        let texts = |list: &[(Arc<str>, Arc<str>)]| -> BTreeMap<String, String> {
            list.iter()
                .map(|(name, text)| (name.to_string(), short_hash(text.as_bytes())))
                .collect()
        };
        let (sections, contexts) = (texts(&assembly.sections), texts(&assembly.contexts));
        let tools: BTreeMap<&str, String> = assembly
            .tools
            .iter()
            .map(|t| {
                let schema = t.parameters.to_string();
                let hash = short_hash(format!("{}\n{schema}", t.description).as_bytes());
                (t.name.as_str(), hash)
            })
            .collect();
        let given = |origins: &[Origin], text: &dyn Fn(&str) -> Option<String>| -> Vec<Given> {
            origins
                .iter()
                .map(|o| Given {
                    name: o.name.clone(),
                    plugin: o.plugin.clone(),
                    scope: o.scope.clone(),
                    text: text(&o.name),
                })
                .collect()
        };
        let explain = &assembly.explain;
        Self {
            plugins,
            configs,
            data,
            set: registry.set(),
            sections: given(&explain.sections, &|n| sections.get(n).cloned()),
            contexts: given(&explain.contexts, &|n| contexts.get(n).cloned()),
            variables: given(&explain.variables, &|_| None),
            tools: given(&explain.tools, &|n| tools.get(n).cloned()),
        }
    }

    pub(crate) fn sha_of(&self, plugin: &str) -> &str {
        self.plugins.get(plugin).map_or("", String::as_str)
    }

    pub(crate) fn config_of(&self, plugin: &str) -> Option<&str> {
        self.configs.get(plugin).map(String::as_str)
    }
}

/// The first 8 hex digits of a sha256, as causes show it.
pub(crate) fn short_sha(sha: &str) -> &str {
    sha.get(..8).unwrap_or(sha)
}
