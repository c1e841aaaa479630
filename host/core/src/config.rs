//! `promptd.toml`: plugins folder, agents and their scope chains, `tool_order`, per-plugin
//! settings (R6). Unknown keys are an error, so a typo never silently does nothing.
//!
//! ```toml
//! plugin_dir = "plugins"                       # relative to this file
//! tool_order = ["read_file", "<unlisted-tools>", "bash"]
//! token = "…"                                  # bearer token for the daemon (or PROMPTD_TOKEN)
//! store = "postgres://promptd@db/promptd"      # sessions on PostgreSQL (default: SQLite in
//!                                              # the state folder); or a table:
//!                                              # [store] url_env = "PROMPTD_DATABASE_URL"
//!
//! [agents.coder]                               # chain: global → coder
//! [agents.reviewer]
//! parent = "coder"                             # chain: global → coder → reviewer
//! runtime_context = false                      # A4: no runtime context snapshot
//!
//! [model]                                      # put at the top of provider bodies
//! max_tokens = 4096                            # every format
//! [model.anthropic]                            # only Anthropic bodies (also `openai`,
//! model = "claude-x"                           # `openai-responses`)
//!
//! [plugins.persona]                            # the plugin file persona.wasm
//! scope = "coder"                              # its global contributions move to `coder`
//! optional = true                              # a failing call omits it (A9)
//! config = { name = "Ada" }                    # strings passed to its `declare`
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::limits::{self, defaults, Limits};
use crate::plugin::model::Scope;
use crate::plugin::names::{is_item_name, UNLISTED_TOOLS};
use crate::plugin::registry::PluginOptions;
use crate::plugin::sandbox::{DeclarationLimits, Sandbox};
use crate::plugin::trust::Trust;

pub mod gateway;
mod resolve;
pub mod settings;
pub mod telemetry;
mod validate;

use validate::check_agent_name;

pub use settings::AgentSettings;

pub use crate::formats::PROVIDER_TABLES;

/// The default agent's name, used when a client names none.
pub const DEFAULT_AGENT: &str = "default";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    plugin_dir: Option<PathBuf>,
    tool_order: Option<Vec<String>>,
    #[serde(default)]
    agents: BTreeMap<String, AgentConfig>,
    #[serde(default)]
    plugins: BTreeMap<String, PluginConfig>,
    model: Option<toml::Table>,
    token: Option<String>,
    #[serde(default)]
    default_trust: Trust,
    #[serde(default)]
    limits: LimitsConfig,
    #[serde(default)]
    mcp: BTreeMap<String, McpConfig>,
    /// Checked by hand ([`StoreConfig::parse`]): a string or a table, and errors that name
    /// the key.
    store: Option<toml::Value>,
    #[serde(default)]
    pricing: BTreeMap<String, crate::cache::price::Price>,
    #[serde(default)]
    cache: crate::cache::RulesConfig,
    #[serde(default)]
    fleet: FleetConfig,
    #[serde(default)]
    telemetry: telemetry::TelemetryConfig,
    #[serde(default)]
    gateway: gateway::GatewayConfig,
}

/// `[fleet]` (K10): a daemon that serves the plugin set published in its session store
/// (`promptd plugins publish`) instead of its plugin folder.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// Serve the store's latest published set (read at start only).
    #[serde(default)]
    pub follow: bool,
    /// How often the store is asked for a newer set, in ms (default 1000).
    pub poll_ms: Option<u64>,
}

/// Default of `[fleet] poll_ms`.
pub const DEFAULT_FLEET_POLL_MS: u64 = 1000;

/// Where session logs are kept (`store`): read when the daemon starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StoreConfig {
    /// SQLite in the state folder (`sessions.db`): the embedded default.
    #[default]
    Sqlite,
    /// A PostgreSQL URL written in the file (`store = "postgres://…"` or `[store] url`).
    Postgres(String),
    /// A PostgreSQL URL read from this environment variable when the daemon starts
    /// (`[store] url_env`), so the password need not be in the file.
    PostgresEnv(String),
}

impl StoreConfig {
    fn parse(value: &toml::Value) -> Result<StoreConfig> {
        let invalid = |m: String| Err(Error::ConfigInvalid(m));
        match value {
            toml::Value::String(s) if s == "sqlite" => Ok(StoreConfig::Sqlite),
            toml::Value::String(url) => {
                Self::check_url(url, "store")?;
                Ok(StoreConfig::Postgres(url.clone()))
            }
            toml::Value::Table(t) => {
                if let Some(key) = t.keys().find(|k| *k != "url" && *k != "url_env") {
                    return invalid(format!(
                        "store.{key}: unknown key (the [store] table takes `url` or `url_env`)"
                    ));
                }
                match (t.get("url"), t.get("url_env")) {
                    (Some(toml::Value::String(url)), None) => {
                        Self::check_url(url, "store.url")?;
                        Ok(StoreConfig::Postgres(url.clone()))
                    }
                    (None, Some(toml::Value::String(name))) if !name.is_empty() => {
                        Ok(StoreConfig::PostgresEnv(name.clone()))
                    }
                    (Some(_), Some(_)) | (None, None) => invalid(
                        "store: give exactly one of `url` and `url_env` in the [store] table"
                            .into(),
                    ),
                    (Some(_), None) => invalid("store.url must be a postgres:// URL".into()),
                    (None, Some(_)) => invalid(
                        "store.url_env must name an environment variable holding a postgres:// URL"
                            .into(),
                    ),
                }
            }
            _ => invalid("store must be \"sqlite\", a postgres:// URL or a [store] table".into()),
        }
    }

    fn check_url(url: &str, key: &str) -> Result<()> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(())
        } else {
            // Only the scheme: the rest may hold a password.
            let shown = match url.split_once("://") {
                Some((scheme, _)) => format!("{scheme}://…"),
                None if url.contains('@') => "…".to_string(),
                None => url.to_string(),
            };
            Err(Error::ConfigInvalid(format!(
                "{key} `{shown}` is not a postgres:// URL (or \"sqlite\")"
            )))
        }
    }

    /// The PostgreSQL URL to use (`None`: SQLite), reading `url_env` through `env`.
    pub fn url(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>> {
        match self {
            StoreConfig::Sqlite => Ok(None),
            StoreConfig::Postgres(url) => Ok(Some(url.clone())),
            StoreConfig::PostgresEnv(name) => {
                let url = env(name).filter(|u| !u.is_empty()).ok_or_else(|| {
                    Error::ConfigInvalid(format!(
                        "store.url_env: the environment variable `{name}` is not set"
                    ))
                })?;
                Self::check_url(&url, &format!("store.url_env (`{name}`)"))?;
                Ok(Some(url))
            }
        }
    }
}

/// One `[mcp.NAME]` table: an MCP server whose tools (and instructions) are contributions of
/// the plugin `mcp:NAME` (M1). Exactly one of `command` (stdio) and `url` (Streamable HTTP).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// The program to start, speaking MCP over its stdin/stdout.
    pub command: Option<String>,
    /// The command's arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables set for the command (the daemon's own are inherited).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A Streamable HTTP endpoint.
    pub url: Option<String>,
    /// Headers sent with every HTTP request (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The agent whose scope gets the server's contributions (default: global).
    pub scope: Option<String>,
    /// A server that fails is shown as failed; without `optional` it is also logged as an error.
    #[serde(default)]
    pub optional: bool,
    /// Deadline of connecting, listing and of one tool call, in milliseconds (default 10000).
    pub timeout_ms: Option<u64>,
    /// Put before every mapped tool name (default: none).
    pub tool_prefix: Option<String>,
    /// Order of the section holding the server's `instructions` (default 1000).
    pub instructions_order: Option<i32>,
    /// Resource URIs read at every step, each a runtime context (order 1000).
    #[serde(default)]
    pub resources: Vec<String>,
    /// K7: `"step"` (the default) or `"boundary"`: a change to the server's tools or
    /// instructions waits for a cache-cold point.
    pub refresh: Option<toml::Value>,
    /// K7: the longest such a change waits, in seconds.
    pub max_stale_s: Option<u64>,
    /// K8: while the server is down, its tools (and instructions) keep their place in warm
    /// sessions until a cache-cold point, and a call to one is answered "unavailable since"
    /// (default true); false drops them at once.
    pub keep_tools: Option<bool>,
    /// K9: `true` defers every tool of the server (found through the provider's tool search).
    pub defer: Option<toml::Value>,
    /// Failures in a row (connecting, listing, or a connection lost before it lasted 30 s)
    /// after which the server is given up on: state `failed`, a `failed` event, no more
    /// restarts until its config changes or `POST /v1/plugins/mcp:NAME/enable` (default 10).
    pub max_failures: Option<u32>,
    /// R7 for a server: `instructions` (the config's `default_trust` when absent) or `data`:
    /// then its instructions and resources are contexts fenced as data (T8), never sections,
    /// and their text is never exported as instructions.
    pub trust: Option<Trust>,
}

impl McpConfig {
    /// The server's `defer`, or a message naming what is wrong.
    pub fn defer(&self, name: &str) -> std::result::Result<crate::plugin::registry::Defer, String> {
        defer_of(&format!("mcp.{name}.defer"), self.defer.as_ref(), false)
    }
}

/// Default deadline of an MCP server's start, list and calls, in milliseconds.
pub const DEFAULT_MCP_TIMEOUT_MS: u64 = 10_000;

/// Default order of an MCP server's instructions section.
pub const DEFAULT_MCP_INSTRUCTIONS_ORDER: i32 = 1000;

/// `[limits]`: defaults for every plugin (SPEC L2, L3).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Deadline of one plugin call, in milliseconds (default 2000).
    pub timeout_ms: Option<u64>,
    /// Memory cap per plugin instance, in MiB (default 256).
    pub memory_mb: Option<u64>,
    /// Deadline of compiling one plugin, in milliseconds (default 120000; L7).
    pub compile_timeout_ms: Option<u64>,
    /// Address space of the process compiling one plugin, in MiB (default 2048; L7).
    pub compile_memory_mb: Option<u64>,
    /// Largest text one call may return, in KiB (default 1024).
    pub max_output_kb: Option<u64>,
    /// Consecutive failed calls after which a plugin is quarantined (default 3; 0 = never).
    pub quarantine_after: Option<u32>,
    /// Warm instances per plugin, so concurrent assemblies do not wait for one (default 2).
    pub instances: Option<u64>,
    /// Memory for sessions kept in memory between steps, in MiB (default 256; 0 = none: every
    /// step reads its session's log).
    pub session_cache_mb: Option<u64>,
    /// Time a daemon connection has to send a whole request head, in milliseconds (default
    /// 10000; H6).
    pub header_timeout_ms: Option<u64>,
    /// Time a daemon connection with no request in flight may wait for the next one, in
    /// milliseconds (default 60000; H6).
    pub idle_timeout_ms: Option<u64>,
    /// Time a request's body has to arrive whole, from the end of its head, in milliseconds
    /// (default 60000; H6): a body sent slowly cannot hold a connection.
    pub body_timeout_ms: Option<u64>,
    /// Address space of all plugin compiles running at once, in MiB (default 4096; L7): a
    /// compile waits until its `compile_memory_mb` fits (one larger than this runs alone).
    pub compile_memory_total_mb: Option<u64>,
    /// Bytes of request bodies being read or served at once across connections, in MiB
    /// (default 128; H6): a request whose body does not fit waits (read at start).
    pub bodies_in_flight_mb: Option<u64>,
    /// Most connections the daemon keeps open; more wait to be accepted (default 512; H6).
    pub max_connections: Option<u64>,
    /// Most sections one plugin may declare (default 1000).
    pub max_sections: Option<u64>,
    /// Most contexts one plugin may declare (default 1000).
    pub max_contexts: Option<u64>,
    /// Most variables one plugin may declare (default 1000).
    pub max_variables: Option<u64>,
    /// Most tools one plugin may declare (default 256).
    pub max_tools: Option<u64>,
    /// Longest section, context or variable name or scope key, in bytes (default 128).
    pub max_name_bytes: Option<u64>,
    /// Everything one plugin declares together, in KiB (default 4096).
    pub max_declared_kb: Option<u64>,
    /// Largest request body the daemon reads, in MiB (default 32; images travel inside).
    pub max_body_mb: Option<u64>,
    /// Largest image or document block, in KiB of base64 (default 10240).
    pub max_block_kb: Option<u64>,
    /// Log bytes one plugin call (declare included) may write, in KiB (default 64).
    pub log_kb_per_call: Option<u64>,
    /// Log records per second one plugin may write, all its instances together (default 100).
    pub log_lines_per_s: Option<u64>,
}

/// The declaration limits' keys and values, in [`PluginConfig::declaration_keys`]'s order.
type DeclarationKeys = [(&'static str, Option<u64>); 6];

impl LimitsConfig {
    fn declaration_keys(&self) -> DeclarationKeys {
        [
            ("max_sections", self.max_sections),
            ("max_contexts", self.max_contexts),
            ("max_variables", self.max_variables),
            ("max_tools", self.max_tools),
            ("max_name_bytes", self.max_name_bytes),
            ("max_declared_kb", self.max_declared_kb),
        ]
    }
}

impl PluginConfig {
    fn declaration_keys(&self) -> DeclarationKeys {
        [
            ("max_sections", self.max_sections),
            ("max_contexts", self.max_contexts),
            ("max_variables", self.max_variables),
            ("max_tools", self.max_tools),
            ("max_name_bytes", self.max_name_bytes),
            ("max_declared_kb", self.max_declared_kb),
        ]
    }
}

/// One `[agents.NAME]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent whose scope chain this one extends.
    pub parent: Option<String>,
    /// Whether this agent gets a runtime context snapshot (A4). Default true.
    #[serde(default = "yes")]
    pub runtime_context: bool,
    /// Model settings for this agent's requests, merged over the top-level `model` table.
    pub model: Option<toml::Table>,
    /// How a step that shows only some tools says so (default `array`; inherited along the
    /// chain).
    pub tool_subset: Option<ToolSubset>,
    /// The context window as a budget (inherited key by key along the chain).
    pub budget: Option<BudgetConfig>,
    /// Wraps every tool result's text: exactly one `{observation}` (inherited).
    pub tool_result_template: Option<String>,
    /// What an empty tool result says instead of nothing (inherited; default "(no output)").
    pub empty_tool_result: Option<String>,
    /// How this agent's requests use the provider's prompt cache (inherited key by key).
    pub cache: Option<AgentCacheConfig>,
    /// How the gateway serves this agent (inherited key by key); none along the chain: the
    /// gateway does not serve it.
    pub gateway: Option<gateway::AgentGatewayConfig>,
}

/// `[agents.NAME.cache]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentCacheConfig {
    /// The TTL of Anthropic's cache breakpoints: `"5m"` (the default), `"1h"` (writes cost
    /// 2× input instead of 1.25×; an entry outlives idle gaps up to an hour) or `"auto"` (per
    /// session, by [`crate::cache::ttl`]). Recorded in the request header, so a change of TTL
    /// records a new header.
    pub ttl: Option<TtlSetting>,
    /// OpenAI's `prompt_cache_key` for the agent's sessions: `"agent"` (the default),
    /// `"session"` or `"prefix"` (see [`KeyPolicy`]).
    pub cache_key: Option<KeyPolicy>,
}

/// `[agents.NAME.cache] cache_key`: which requests share OpenAI's `prompt_cache_key`, so which
/// share warm machines. A session keeps the key its header recorded until its header changes
/// for another reason (system prompt, tools, model settings, TTL): a key change alone would
/// move it away from the machine that holds its own messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyPolicy {
    /// `promptd-AGENT`: every session of the agent (the default, by the comparison in
    /// docs/cache.md).
    #[default]
    Agent,
    /// `promptd-SESSION`: each session its own (promptd's key before issue 30).
    Session,
    /// `promptd-p` and a hash of the head (tools and system prompt): every session with the
    /// same head, whichever its agent; `~N` is added past the per-key rate (a shard).
    Prefix,
}

/// `[agents.NAME.cache] ttl`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum TtlSetting {
    /// `"5m"`: Anthropic's default.
    #[default]
    #[serde(rename = "5m")]
    Minutes5,
    /// `"1h"`.
    #[serde(rename = "1h")]
    Hour1,
    /// `"auto"`: per session, the TTL the break-even arithmetic over its idle gaps favours.
    #[serde(rename = "auto")]
    Auto,
}

/// `[agents.NAME.budget]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// The model's context window, in tokens of `tokenizer`.
    pub window: Option<u64>,
    /// Tokens kept free for the answer (default 0).
    pub reserve: Option<u64>,
    /// `chars` (default: Unicode scalar values), `o200k` or `cl100k` (OpenAI's BPE).
    pub tokenizer: Option<String>,
    /// The latest turns never dropped when the history is trimmed (default 2).
    pub keep_turns: Option<u64>,
    /// Most tokens the messages may take, below what the window leaves (history is trimmed
    /// to fit it).
    pub history_max: Option<u64>,
    /// Most tokens this step's runtime context snapshot may take (else `context_overflow`).
    pub context_max: Option<u64>,
}

/// Tokenizers a budget may name.
pub const TOKENIZERS: [&str; 3] = ["chars", "o200k", "cl100k"];

/// Default of `empty_tool_result`.
pub const EMPTY_TOOL_RESULT: &str = "(no output)";

/// `tool_subset`: how the tools shown this step reach the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolSubset {
    /// The `tools` array is the shown tools (a change of visibility changes the array, and
    /// with it the provider's cached prefix).
    #[default]
    Array,
    /// `tools` keeps every tool the agent can see, byte-stable; OpenAI bodies narrow the call
    /// with `tool_choice: allowed_tools`. Anthropic has no such field: its array is the shown
    /// tools, as with `array`.
    AllowedTools,
}

fn yes() -> bool {
    true
}

/// One `[plugins.FILE_STEM]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The plugin's id, instead of its file stem.
    pub id: Option<String>,
    /// Moves the plugin's global contributions into this agent's scope.
    pub scope: Option<String>,
    /// A failing call leaves this plugin out instead of failing the assembly (A9).
    #[serde(default)]
    pub optional: bool,
    /// Key/value strings passed to the plugin's `declare`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Overrides `[limits] timeout_ms` for this plugin.
    pub timeout_ms: Option<u64>,
    /// Overrides `[limits] memory_mb` for this plugin.
    pub memory_mb: Option<u64>,
    /// Overrides `[limits] compile_timeout_ms` for this plugin.
    pub compile_timeout_ms: Option<u64>,
    /// Overrides `[limits] compile_memory_mb` for this plugin.
    pub compile_memory_mb: Option<u64>,
    /// Overrides `[limits] max_output_kb` for this plugin.
    pub max_output_kb: Option<u64>,
    /// Overrides `[limits] instances` for this plugin.
    pub instances: Option<u64>,
    /// Overrides `[limits] max_sections` for this plugin (L8).
    pub max_sections: Option<u64>,
    /// Overrides `[limits] max_contexts` for this plugin (L8).
    pub max_contexts: Option<u64>,
    /// Overrides `[limits] max_variables` for this plugin (L8).
    pub max_variables: Option<u64>,
    /// Overrides `[limits] max_tools` for this plugin (L8).
    pub max_tools: Option<u64>,
    /// Overrides `[limits] max_name_bytes` for this plugin (L8).
    pub max_name_bytes: Option<u64>,
    /// Overrides `[limits] max_declared_kb` for this plugin (L8).
    pub max_declared_kb: Option<u64>,
    /// Read-only directories: host path (relative to the config file) = path the plugin sees.
    #[serde(default)]
    pub dirs: BTreeMap<String, String>,
    /// Names of host environment variables the plugin may read.
    #[serde(default)]
    pub env: Vec<String>,
    /// `log` (default): the plugin's stdout/stderr go to the host log; `none`: discarded.
    pub stdio: Option<Stdio>,
    /// `instructions` or `data` (R7); absent: the config's `default_trust`.
    pub trust: Option<Trust>,
    /// K7: `"step"` (the default: a change is sent at the next step), `"boundary"` (every
    /// section and tool of the plugin waits for a cache-cold point), or
    /// `{ sections = [...], tools = [...] }` (those wait). Read by [`PluginConfig::refresh`].
    pub refresh: Option<toml::Value>,
    /// K7: the longest a change of the plugin waits, in seconds (default
    /// [`crate::plugin::refresh::DEFAULT_MAX_STALE_S`]).
    pub max_stale_s: Option<u64>,
    /// K8: when the plugin is quarantined, its tools (and sections) keep their place in warm
    /// sessions until a cache-cold point (default false).
    pub keep_tools: Option<bool>,
    /// K9: `true` (every tool of the plugin) or a list of its tool names: deferred tools,
    /// found through the provider's tool search instead of sent in every request.
    pub defer: Option<toml::Value>,
}

impl PluginConfig {
    /// The plugin's `defer`, or a message naming what is wrong.
    pub fn defer(&self, stem: &str) -> std::result::Result<crate::plugin::registry::Defer, String> {
        defer_of(&format!("plugins.{stem}.defer"), self.defer.as_ref(), true)
    }
}

/// `defer` at `at` (K9): `true`, `false` or (with `names`) a list of tool names.
fn defer_of(
    at: &str,
    value: Option<&toml::Value>,
    names: bool,
) -> std::result::Result<crate::plugin::registry::Defer, String> {
    let mut defer = crate::plugin::registry::Defer::default();
    if value.is_some() {
        defer.by = crate::plugin::refresh::SetBy::Config;
    }
    match value {
        None | Some(toml::Value::Boolean(false)) => {}
        Some(toml::Value::Boolean(true)) => defer.all = true,
        Some(toml::Value::Array(list)) if names => {
            for n in list {
                let name = n
                    .as_str()
                    .ok_or_else(|| format!("{at} must be true, false or a list of tool names"))?;
                defer.tools.insert(name.to_string());
            }
        }
        Some(other) => {
            let forms = if names {
                "true, false or a list of tool names"
            } else {
                "true or false"
            };
            return Err(format!("{at} must be {forms}, not a {}", other.type_str()));
        }
    }
    Ok(defer)
}

impl PluginConfig {
    /// The plugin's `refresh` and `max_stale_s`, or a message naming what is wrong under
    /// `[plugins.STEM]`.
    pub fn refresh(
        &self,
        stem: &str,
    ) -> std::result::Result<crate::plugin::refresh::Refresh, String> {
        refresh_of(
            &format!("plugins.{stem}"),
            self.refresh.as_ref(),
            self.max_stale_s,
            true,
        )
    }
}

impl McpConfig {
    /// The server's `refresh` and `max_stale_s`, or a message naming what is wrong under
    /// `[mcp.NAME]`.
    pub fn refresh(
        &self,
        name: &str,
    ) -> std::result::Result<crate::plugin::refresh::Refresh, String> {
        refresh_of(
            &format!("mcp.{name}"),
            self.refresh.as_ref(),
            self.max_stale_s,
            false,
        )
    }
}

/// `refresh` and `max_stale_s` of the table at `at` (K7); `parts` allows the table form
/// naming sections and tools (not for an MCP server, whose tools come and go).
pub(crate) fn refresh_of(
    at: &str,
    value: Option<&toml::Value>,
    max_stale_s: Option<u64>,
    parts: bool,
) -> std::result::Result<crate::plugin::refresh::Refresh, String> {
    let mut refresh = crate::plugin::refresh::Refresh {
        max_stale_s: max_stale_s.unwrap_or(crate::plugin::refresh::DEFAULT_MAX_STALE_S),
        ..Default::default()
    };
    if max_stale_s == Some(0) {
        return Err(format!("{at}.max_stale_s must be greater than 0"));
    }
    let at = format!("{at}.refresh");
    let forms = if parts {
        "\"step\", \"boundary\", \"session\" or { sections = [...], tools = [...] }"
    } else {
        "\"step\", \"boundary\" or \"session\""
    };
    let names = |key: &str,
                 v: &toml::Value|
     -> std::result::Result<std::collections::BTreeSet<String>, String> {
        let bad = || format!("{at}.{key} must be a list of names");
        v.as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|n| n.as_str().map(str::to_string).ok_or_else(bad))
            .collect()
    };
    if value.is_some() {
        refresh.by = crate::plugin::refresh::SetBy::Config;
    }
    match value {
        None => {}
        Some(toml::Value::String(word)) => match word.as_str() {
            "step" => {}
            "boundary" => refresh.whole = true,
            "session" => refresh.whole_session = true,
            other => return Err(format!("{at} = {other:?}: use {forms}")),
        },
        Some(toml::Value::Table(table)) if parts => {
            for (key, value) in table {
                match key.as_str() {
                    "sections" => refresh.sections = names(key, value)?,
                    "tools" => refresh.tools = names(key, value)?,
                    "contexts" => return Err(format!(
                        "{at}.contexts: contexts are never held; a changed context is a new snapshot message at the end of the request, which breaks no cached prefix"
                    )),
                    other => {
                        return Err(format!(
                            "{at}: unknown key `{other}`; use `sections` and `tools`"
                        ))
                    }
                }
            }
        }
        Some(other) => return Err(format!("{at} must be {forms}, not a {}", other.type_str())),
    }
    Ok(refresh)
}

/// Where a plugin's stdout/stderr go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stdio {
    /// To the host log.
    Log,
    /// Discarded.
    None,
}

/// A validated configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// The plugins folder, resolved against the config file's folder.
    pub plugin_dir: Option<PathBuf>,
    /// The order of tools in requests (A7); absent: sorted by name.
    pub tool_order: Option<Vec<String>>,
    /// `[agents.NAME]` tables, by name.
    pub agents: BTreeMap<String, AgentConfig>,
    /// Keyed by file stem.
    pub plugins: BTreeMap<String, PluginConfig>,
    /// Model settings (`model`, `max_tokens`…) put at the top of provider request bodies.
    pub model: Option<toml::Table>,
    /// The bearer token the daemon requires (L5); `PROMPTD_TOKEN` overrides it.
    pub token: Option<String>,
    /// The trust of plugins whose table sets none (R7): `instructions` unless set.
    pub default_trust: Trust,
    /// The `[limits]` table.
    pub limits: LimitsConfig,
    /// `[mcp.NAME]` servers, by name.
    pub mcp: BTreeMap<String, McpConfig>,
    /// Where session logs are kept (read at start only: a reload does not move them).
    pub store: StoreConfig,
    /// The config file's folder: relative `dirs` grants resolve against it.
    pub base_dir: Option<PathBuf>,
    /// The values of the host environment variables granted to plugins, captured when the
    /// config was read (see [`Config::from_file`]).
    pub host_env: BTreeMap<String, String>,
    /// `[pricing."MODEL"]`: the cost ledger's prices, by model name (none by default).
    pub pricing: BTreeMap<String, crate::cache::price::Price>,
    /// `[cache.anthropic]`, `[cache.openai]`: overrides of the cache model's rules.
    pub cache: crate::cache::RulesConfig,
    /// `[fleet]`: whether the daemon serves the store's published plugin set (K10).
    pub fleet: FleetConfig,
    /// `[telemetry]`: OpenTelemetry export (read at start only).
    pub telemetry: telemetry::TelemetryConfig,
    /// `[gateway]`: the providers' own endpoints, served per agent (docs/gateway.md).
    pub gateway: gateway::GatewayConfig,
}

impl Config {
    /// Parses config text read from the file `path` (relative paths in it resolve against the
    /// file's folder) and captures the host environment variables it grants to plugins,
    /// looked up with `env`. The caller reads the file: no IO happens here.
    pub fn from_file(
        text: &str,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config> {
        let mut config = Self::parse(text, &path.display().to_string())?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.plugin_dir = config.plugin_dir.map(|d| base.join(d));
        config.base_dir = Some(base.to_path_buf());
        config.host_env = config
            .plugins
            .values()
            .flat_map(|p| &p.env)
            .filter_map(|name| env(name).map(|v| (name.clone(), v)))
            .collect();
        Ok(config)
    }

    /// Parses and validates config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| Error::ConfigParse {
            path: origin.to_string(),
            message: describe_toml_error(text, &e),
            source: Box::new(e),
        })?;
        let config = Config {
            plugin_dir: raw.plugin_dir,
            tool_order: raw.tool_order,
            agents: raw.agents,
            plugins: raw.plugins,
            model: raw.model,
            token: raw.token,
            default_trust: raw.default_trust,
            limits: raw.limits,
            mcp: raw.mcp,
            store: raw
                .store
                .as_ref()
                .map(StoreConfig::parse)
                .transpose()?
                .unwrap_or_default(),
            base_dir: None,
            host_env: BTreeMap::new(),
            pricing: raw.pricing,
            cache: raw.cache,
            fleet: raw.fleet,
            telemetry: raw.telemetry,
            gateway: raw.gateway,
        };
        config.telemetry.validate()?;
        config.validate()?;
        config.gateway.check(&config)?;
        Ok(config)
    }
}

/// One line: `line L, column C: message`, instead of toml's multi-line caret diagram.
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests;
