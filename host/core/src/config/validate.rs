//! Checking a parsed `promptd.toml` as a whole, before it serves (R6, Q14, H6): names, chains,
//! tool order, model settings per provider, budgets and templates, limits, stores and MCP
//! servers. Each problem is a `config_invalid` naming the key.

use super::*;
use crate::formats::Format;

impl Config {
    pub(super) fn validate(&self) -> Result<()> {
        if let Some(order) = &self.tool_order {
            let mut seen = BTreeSet::new();
            for name in order {
                if !seen.insert(name) {
                    return Err(Error::ToolOrderDuplicate(name.clone()));
                }
            }
            if !seen.contains(&UNLISTED_TOOLS.to_string()) {
                return Err(Error::ToolOrderMissingRest);
            }
        }
        self.check_model_settings()?;
        if self.fleet.poll_ms == Some(0) {
            return Err(Error::ConfigInvalid(
                "fleet.poll_ms must be greater than 0".into(),
            ));
        }
        for (stem, plugin) in &self.plugins {
            plugin.refresh(stem).map_err(Error::ConfigInvalid)?;
            plugin.defer(stem).map_err(Error::ConfigInvalid)?;
        }
        self.check_agent_budgets()?;
        for (model, price) in &self.pricing {
            price.check(model).map_err(Error::ConfigInvalid)?;
        }
        self.cache
            .anthropic
            .check("anthropic")
            .map_err(Error::ConfigInvalid)?;
        self.cache
            .openai
            .check("openai")
            .map_err(Error::ConfigInvalid)?;
        for (name, agent) in &self.agents {
            check_agent_name(name, "agent")?;
            if let Some(parent) = &agent.parent {
                check_agent_name(parent, &format!("parent of agent `{name}`"))?;
            }
            self.chain(name)?; // detects cycles
        }
        self.check_limits()?;
        self.check_mcp_servers()?;
        self.check_plugin_tables()?;
        Ok(())
    }

    /// Every limit, daemon-wide and per declaration, is positive when set.
    fn check_limits(&self) -> Result<()> {
        positive("limits.timeout_ms", self.limits.timeout_ms)?;
        positive("limits.memory_mb", self.limits.memory_mb)?;
        positive("limits.compile_timeout_ms", self.limits.compile_timeout_ms)?;
        positive("limits.compile_memory_mb", self.limits.compile_memory_mb)?;
        positive("limits.max_output_kb", self.limits.max_output_kb)?;
        positive("limits.instances", self.limits.instances)?;
        positive("limits.header_timeout_ms", self.limits.header_timeout_ms)?;
        positive("limits.idle_timeout_ms", self.limits.idle_timeout_ms)?;
        positive("limits.body_timeout_ms", self.limits.body_timeout_ms)?;
        positive(
            "limits.bodies_in_flight_mb",
            self.limits.bodies_in_flight_mb,
        )?;
        positive(
            "limits.compile_memory_total_mb",
            self.limits.compile_memory_total_mb,
        )?;
        positive("limits.max_connections", self.limits.max_connections)?;
        positive("limits.log_kb_per_call", self.limits.log_kb_per_call)?;
        positive("limits.max_body_mb", self.limits.max_body_mb)?;
        positive("limits.max_block_kb", self.limits.max_block_kb)?;
        positive("limits.log_lines_per_s", self.limits.log_lines_per_s)?;
        for (key, value) in self.limits.declaration_keys() {
            positive(&format!("limits.{key}"), value)?;
        }
        Ok(())
    }

    /// Each `[mcp.NAME]` server: its name, one transport and the keys that go with it, its
    /// numbers, resources, scope and tool prefix.
    fn check_mcp_servers(&self) -> Result<()> {
        for (name, server) in &self.mcp {
            let what = format!("mcp.{name}");
            server.refresh(name).map_err(Error::ConfigInvalid)?;
            server.defer(name).map_err(Error::ConfigInvalid)?;
            if !is_item_name(name) || name.contains(':') {
                return Err(Error::ConfigInvalid(format!(
                    "{what}: the name must be printable ASCII without whitespace or `:`"
                )));
            }
            if server.command.is_some() == server.url.is_some() {
                return Err(Error::ConfigInvalid(format!(
                    "{what}: give exactly one of `command` (stdio) and `url` (Streamable HTTP)"
                )));
            }
            if server.url.is_none() && !server.headers.is_empty() {
                return Err(Error::ConfigInvalid(format!(
                    "{what}: `headers` go with `url`"
                )));
            }
            if server.command.is_none() && (!server.args.is_empty() || !server.env.is_empty()) {
                return Err(Error::ConfigInvalid(format!(
                    "{what}: `args` and `env` go with `command`"
                )));
            }
            positive(&format!("{what}.timeout_ms"), server.timeout_ms)?;
            positive(
                &format!("{what}.max_failures"),
                server.max_failures.map(u64::from),
            )?;
            if let Some(uri) = server.resources.iter().find(|u| !is_item_name(u)) {
                return Err(Error::ConfigInvalid(format!(
                    "{what}.resources: `{uri}` must be a URI without whitespace"
                )));
            }
            if let Some(scope) = &server.scope {
                check_agent_name(scope, &format!("scope of MCP server `{name}`"))?;
            }
            if let Some(prefix) = &server.tool_prefix {
                if prefix.len() > 32
                    || !prefix
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    return Err(Error::ConfigInvalid(format!(
                        "{what}.tool_prefix: at most 32 of [a-zA-Z0-9_-]"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Each `[plugins.STEM]` table: its numbers, environment names, folders, scope, and an id
    /// of its own.
    fn check_plugin_tables(&self) -> Result<()> {
        let mut ids = BTreeMap::new();
        for (stem, plugin) in &self.plugins {
            positive(&format!("plugins.{stem}.timeout_ms"), plugin.timeout_ms)?;
            positive(&format!("plugins.{stem}.memory_mb"), plugin.memory_mb)?;
            positive(
                &format!("plugins.{stem}.compile_timeout_ms"),
                plugin.compile_timeout_ms,
            )?;
            positive(
                &format!("plugins.{stem}.compile_memory_mb"),
                plugin.compile_memory_mb,
            )?;
            positive(
                &format!("plugins.{stem}.max_output_kb"),
                plugin.max_output_kb,
            )?;
            positive(&format!("plugins.{stem}.instances"), plugin.instances)?;
            for (key, value) in plugin.declaration_keys() {
                positive(&format!("plugins.{stem}.{key}"), value)?;
            }
            for name in &plugin.env {
                if name.is_empty() || name.contains('=') {
                    return Err(Error::ConfigInvalid(format!(
                        "plugins.{stem}.env: `{name}` is not an environment variable name"
                    )));
                }
            }
            for guest in plugin.dirs.values() {
                if !guest.starts_with('/') {
                    return Err(Error::ConfigInvalid(format!(
                        "plugins.{stem}.dirs: the plugin's path `{guest}` must be absolute"
                    )));
                }
            }
            if let Some(scope) = &plugin.scope {
                check_agent_name(scope, &format!("scope of plugin `{stem}`"))?;
            }
            let id = plugin.id.as_deref().unwrap_or(stem);
            if !is_item_name(id) {
                return Err(Error::ConfigInvalid(format!(
                    "plugin `{stem}`: id `{id}` must be non-empty printable ASCII without whitespace"
                )));
            }
            if let Some(other) = ids.insert(id.to_string(), stem) {
                return Err(Error::ConfigInvalid(format!(
                    "plugins `{other}` and `{stem}` both have the id `{id}`"
                )));
            }
        }
        Ok(())
    }

    /// Provider tables must be tables; and a provider configured anywhere is one the agents are
    /// known to use, so every agent must then have its required keys (else a step in that
    /// format would fail with `missing_model_setting`).
    fn check_model_settings(&self) -> Result<()> {
        let tables = std::iter::once(("model".to_string(), self.model.as_ref())).chain(
            self.agents
                .iter()
                .map(|(name, a)| (format!("agents.{name}.model"), a.model.as_ref())),
        );
        let mut used = BTreeSet::new();
        for (at, table) in tables {
            for (key, value) in table.into_iter().flatten() {
                if PROVIDER_TABLES.contains(&key.as_str()) {
                    if !value.is_table() {
                        return Err(Error::ConfigInvalid(format!(
                            "{at}.{key} must be a table of {key} settings"
                        )));
                    }
                    used.insert(key.as_str());
                }
            }
        }
        let agents = std::iter::once(DEFAULT_AGENT).chain(self.agents.keys().map(String::as_str));
        for agent in agents {
            self.chain(agent)?;
            let model = self.model(agent);
            for provider in &used {
                let Ok(format) = provider.parse::<crate::formats::Format>() else {
                    continue;
                };
                if let Err(e) = crate::formats::check_settings(&model, format) {
                    return Err(Error::ConfigInvalid(format!("agent `{agent}`: {e}")));
                }
                if matches!(format, Format::Openai | Format::OpenaiResponses) {
                    check_retention(agent, &model, format)?;
                }
            }
        }
        Ok(())
    }

    fn check_agent_budgets(&self) -> Result<()> {
        for (name, agent) in &self.agents {
            if let Some(t) = &agent.tool_result_template {
                if t.matches("{observation}").count() != 1 {
                    return Err(Error::ConfigInvalid(format!(
                        "agents.{name}.tool_result_template must contain `{{observation}}` exactly once"
                    )));
                }
            }
            let Some(b) = &agent.budget else { continue };
            if let Some(t) = &b.tokenizer {
                if !TOKENIZERS.contains(&t.as_str()) {
                    return Err(Error::ConfigInvalid(format!(
                        "agents.{name}.budget.tokenizer `{t}` is not one of {}",
                        TOKENIZERS.join(", ")
                    )));
                }
            }
            for (key, value) in [
                ("window", b.window),
                ("history_max", b.history_max),
                ("context_max", b.context_max),
            ] {
                if value == Some(0) {
                    return Err(Error::ConfigInvalid(format!(
                        "agents.{name}.budget.{key} must be greater than 0"
                    )));
                }
            }
            if let Some(budget) = self.budget(name) {
                if let Some(window) = budget.window {
                    if budget.reserve >= window {
                        return Err(Error::ConfigInvalid(format!(
                            "agent `{name}`: budget.reserve ({}) must be smaller than budget.window ({window})",
                            budget.reserve
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

pub(super) fn check_agent_name(name: &str, role: &str) -> Result<()> {
    let rule = if name == "global" {
        "`global` is the global scope and cannot name an agent"
    } else if !is_item_name(name) {
        "it must be non-empty printable ASCII without whitespace"
    } else {
        return Ok(());
    };
    Err(Error::InvalidAgent {
        role: role.to_string(),
        name: name.to_string(),
        rule,
    })
}

/// Refuses an OpenAI `prompt_cache_retention` the API would refuse for the agent's model (K11):
/// a word other than `in_memory` and `24h`, or one the model does not offer.
fn check_retention(
    agent: &str,
    model: &serde_json::Map<String, serde_json::Value>,
    format: Format,
) -> Result<()> {
    let settings = crate::formats::settings(model, format);
    let Some(asked) = settings.get("prompt_cache_retention") else {
        return Ok(());
    };
    let name = settings.get("model").and_then(|m| m.as_str()).unwrap_or("");
    let problem = match asked.as_str() {
        Some(word) => crate::cache::retention::check(name, word).err(),
        None => Some(format!(
            "prompt_cache_retention must be \"in_memory\" or \"24h\", got {asked}"
        )),
    };
    match problem {
        Some(p) => Err(Error::ConfigInvalid(format!(
            "agent `{agent}`, model.{}: {p}",
            format.as_str()
        ))),
        None => Ok(()),
    }
}

/// `what` must be greater than 0 when set.
fn positive(what: &str, v: Option<u64>) -> Result<()> {
    match v {
        Some(0) => Err(Error::ConfigInvalid(format!(
            "{what} must be greater than 0"
        ))),
        _ => Ok(()),
    }
}
