//! `[gateway]`, `[gateway.upstream.NAME]` and `[agents.NAME.gateway]` (docs/gateway.md):
//! where the gateway forwards a client's request, and how an agent's splice is made.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::Config;
use crate::error::{Error, Result};
use crate::gateway::keys::KeyConfig;
use crate::gateway::own_tools;
use crate::gateway::splice::{ClientSystem, SpliceSettings};
use crate::gateway::Provider;

/// Default of `[gateway] max_body_bytes`: a client's body past it is refused with 413.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 << 20;
/// Default of `[gateway] connect_timeout_ms`.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Default of `[gateway] response_timeout_ms`: from the request sent to the upstream's
/// status line (a model may think a long time before its first byte).
pub const DEFAULT_RESPONSE_TIMEOUT_MS: u64 = 600_000;
/// Default of `[gateway] idle_timeout_ms`: the longest gap between two reads of a reply.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 300_000;
/// Default of `[gateway] client_stall_ms`: how long a client that stopped reading a stream is
/// waited for before it is cut.
pub const DEFAULT_CLIENT_STALL_MS: u64 = 30_000;

/// `[gateway]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Serve the providers' endpoints under `/gateway/{agent}` (read at start only).
    #[serde(default)]
    pub enabled: bool,
    /// The largest client body taken (default 32 MiB).
    pub max_body_bytes: Option<u64>,
    /// Connecting to an upstream, in ms (default 5 000); a refused or failed connection is
    /// tried once more.
    pub connect_timeout_ms: Option<u64>,
    /// From the request sent to the upstream's status line, in ms (default 600 000).
    pub response_timeout_ms: Option<u64>,
    /// The longest gap between two reads of a reply, in ms (default 300 000).
    pub idle_timeout_ms: Option<u64>,
    /// How long a client that stopped reading a stream is waited for, in ms (default 30 000).
    pub client_stall_ms: Option<u64>,
    /// `[gateway.upstream.NAME]`, by name.
    #[serde(default)]
    pub upstream: BTreeMap<String, UpstreamConfig>,
    /// `[gateway.keys.NAME]`, by name (G12): when any is set, every gateway request presents
    /// one (read at each request, so a key is added, rotated or revoked without a restart).
    #[serde(default)]
    pub keys: BTreeMap<String, KeyConfig>,
}

/// `[gateway.upstream.NAME]`: a provider's API the gateway forwards to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Whose API it is: `openai`, `anthropic`, `gemini` or `bedrock`.
    pub provider: Provider,
    /// Where it is: `https://api.anthropic.com`, or a local stub's `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// The environment variable holding its key; none: the client's own credential is passed
    /// through.
    pub api_key_env: Option<String>,
    /// Bedrock (G9): the environment variable holding the AWS access key id the gateway
    /// re-signs with; without it (and the secret's) a Bedrock request is refused, as the
    /// client's signature cannot survive the splice.
    pub aws_access_key_id_env: Option<String>,
    /// Bedrock: the environment variable holding the secret access key.
    pub aws_secret_access_key_env: Option<String>,
    /// Bedrock: the environment variable holding a temporary credential's session token.
    pub aws_session_token_env: Option<String>,
    /// Bedrock: the region signed for (`us-east-1`); required with the credentials.
    pub aws_region: Option<String>,
}

/// `[agents.NAME.gateway]`: the agent is served by the gateway (inherited key by key along its
/// chain, like the agent's other tables).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentGatewayConfig {
    /// The upstream for OpenAI requests (default: the one upstream whose provider is
    /// `openai`, when there is one).
    pub openai: Option<String>,
    /// The upstream for Anthropic requests (default: the one `anthropic` upstream).
    pub anthropic: Option<String>,
    /// The upstream for Gemini requests (default: the one `gemini` upstream).
    pub gemini: Option<String>,
    /// The upstream for Bedrock requests (default: the one `bedrock` upstream).
    pub bedrock: Option<String>,
    /// Where the client's own system text sits among the sections: `last` (the default)
    /// or `first`.
    pub client_system: Option<ClientSystem>,
    /// What a step whose plugins failed does: `forward` (the default) or `refuse`.
    pub on_plugin_failure: Option<OnPluginFailure>,
    /// Client tools taken out of the request before it goes upstream (recorded).
    pub deny_tools: Option<Vec<String>>,
    /// Client tools marked for deferred loading (`defer_loading`) where the endpoint has it
    /// (recorded).
    pub defer_tools: Option<Vec<String>>,
    /// Whether a session keeps the plugin versions its header was built from while the
    /// provider's cache for it is warm (G11): `false` by default.
    pub pin_plugins: Option<bool>,
    /// Rounds of promptd's own tool calls one client request may take (G13; default 8).
    pub max_tool_rounds: Option<u32>,
    /// The longest one of promptd's own tool calls may run, in ms (G13; default 30 000).
    pub tool_timeout_ms: Option<u64>,
    /// The largest output one of promptd's own tool calls may give, in bytes (G13; default
    /// 1 MiB).
    pub max_tool_output_bytes: Option<u64>,
}

/// `[agents.NAME.gateway] on_plugin_failure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnPluginFailure {
    /// The client's body goes upstream as it came, the step recorded as degraded.
    #[default]
    Forward,
    /// The client gets a provider-shaped 500 naming the plugin.
    Refuse,
}

/// An agent's gateway settings, resolved along its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentGateway {
    /// The upstream by provider, by name.
    pub upstreams: BTreeMap<Provider, String>,
    /// How its splice is made.
    pub splice: SpliceSettings,
    /// On a plugin failure.
    pub on_plugin_failure: OnPluginFailure,
    /// Sessions keep their header's plugin versions until a cache-cold point (G11).
    pub pin_plugins: bool,
    /// The bounds of promptd's own tool calls (G13).
    pub tool_bounds: ToolBounds,
}

/// The bounds of promptd's own tool calls in one gateway request (G13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolBounds {
    /// Rounds of promptd's own calls one client request may take.
    pub max_rounds: u32,
    /// The longest one call may run, in ms.
    pub timeout_ms: u64,
    /// The largest output one call may give, in bytes.
    pub max_output_bytes: u64,
}

impl GatewayConfig {
    /// The limits, with defaults.
    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES)
    }

    pub(super) fn check(&self, config: &Config) -> Result<()> {
        let bad = |m: String| Err(Error::ConfigInvalid(m));
        for (key, value) in [
            ("max_body_bytes", self.max_body_bytes),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("response_timeout_ms", self.response_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("client_stall_ms", self.client_stall_ms),
        ] {
            if value == Some(0) {
                return bad(format!("gateway.{key} must be greater than 0"));
            }
        }
        for (name, upstream) in &self.upstream {
            let url = upstream.base_url.as_str();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return bad(format!(
                    "gateway.upstream.{name}.base_url `{url}` must start with http:// or https://"
                ));
            }
            let vars = [
                ("api_key_env", &upstream.api_key_env),
                ("aws_access_key_id_env", &upstream.aws_access_key_id_env),
                (
                    "aws_secret_access_key_env",
                    &upstream.aws_secret_access_key_env,
                ),
                ("aws_session_token_env", &upstream.aws_session_token_env),
            ];
            for (key, var) in vars {
                if let Some(var) = var {
                    if var.is_empty() || var.contains('=') {
                        return bad(format!(
                            "gateway.upstream.{name}.{key} `{var}` is not an environment variable name"
                        ));
                    }
                }
            }
            let aws = [
                upstream.aws_access_key_id_env.is_some(),
                upstream.aws_secret_access_key_env.is_some(),
                upstream.aws_region.is_some(),
            ];
            let any_aws = aws.iter().any(|s| *s) || upstream.aws_session_token_env.is_some();
            if any_aws && upstream.provider != Provider::Bedrock {
                return bad(format!(
                    "gateway.upstream.{name}: the aws_* keys are for a provider = \"bedrock\" upstream"
                ));
            }
            if any_aws && !aws.iter().all(|s| *s) {
                return bad(format!(
                    "gateway.upstream.{name}: re-signing needs aws_access_key_id_env, aws_secret_access_key_env and aws_region together"
                ));
            }
        }
        for (name, key) in &self.keys {
            let digests = key.token_sha256.hex();
            if digests.is_empty() {
                return bad(format!("gateway.keys.{name}.token_sha256 lists no digest"));
            }
            for d in digests {
                if d.len() != 64
                    || !d
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return bad(format!(
                        "gateway.keys.{name}.token_sha256 `{d}` is not a SHA-256 in lower-case hex (64 digits): store the token's digest (`printf %s TOKEN | sha256sum`), never the token"
                    ));
                }
                let other = (self.keys.iter())
                    .find(|(n, k)| *n != name && k.token_sha256.hex().contains(d));
                if let Some((other, _)) = other {
                    return bad(format!(
                        "gateway.keys.{name} and gateway.keys.{other} have the same token"
                    ));
                }
            }
            for agent in key.agents.iter().flatten() {
                if !config.agents.contains_key(agent) {
                    return bad(format!(
                        "gateway.keys.{name}.agents names `{agent}`, which no [agents.{agent}] table defines"
                    ));
                }
            }
            for upstream in key.upstreams.iter().flatten() {
                if !self.upstream.contains_key(upstream) {
                    return bad(format!(
                        "gateway.keys.{name}.upstreams names `{upstream}`, which no [gateway.upstream.{upstream}] table defines"
                    ));
                }
            }
            if key.requests_per_minute == Some(0) {
                return bad(format!(
                    "gateway.keys.{name}.requests_per_minute must be greater than 0 (remove the key to stop it)"
                ));
            }
        }
        for agent in config.agents.keys() {
            if let Some(gateway) = self.agent(config, agent)? {
                let b = gateway.tool_bounds;
                for (key, zero) in [
                    ("max_tool_rounds", b.max_rounds == 0),
                    ("tool_timeout_ms", b.timeout_ms == 0),
                    ("max_tool_output_bytes", b.max_output_bytes == 0),
                ] {
                    if zero {
                        return bad(format!(
                            "agents.{agent}.gateway.{key} must be greater than 0"
                        ));
                    }
                }
                for provider in Provider::ALL {
                    if let Some(name) = gateway.upstreams.get(&provider) {
                        match self.upstream.get(name) {
                            None => {
                                return bad(format!(
                                    "agents.{agent}.gateway.{} names the upstream `{name}`, which no [gateway.upstream.{name}] table defines",
                                    provider.as_str()
                                ))
                            }
                            Some(u) if u.provider != provider => {
                                return bad(format!(
                                    "agents.{agent}.gateway.{} names the upstream `{name}`, whose provider is {}",
                                    provider.as_str(),
                                    u.provider.as_str()
                                ))
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `agent`'s gateway settings, when it or an agent of its chain has a `gateway` table.
    pub fn agent(&self, config: &Config, agent: &str) -> Result<Option<AgentGateway>> {
        let chain = config.chain(agent)?;
        let tables: Vec<&AgentGatewayConfig> = chain
            .iter()
            .filter_map(|a| config.agents.get(a)?.gateway.as_ref())
            .collect();
        if tables.is_empty() {
            return Ok(None);
        }
        // The chain runs farthest first: the more specific agent's key wins.
        fn pick<T>(
            tables: &[&AgentGatewayConfig],
            f: impl Fn(&AgentGatewayConfig) -> Option<T>,
        ) -> Option<T> {
            tables.iter().rev().find_map(|t| f(t))
        }
        let mut upstreams = BTreeMap::new();
        for provider in Provider::ALL {
            let named = match provider {
                Provider::Openai => pick(&tables, |t| t.openai.clone()),
                Provider::Anthropic => pick(&tables, |t| t.anthropic.clone()),
                Provider::Gemini => pick(&tables, |t| t.gemini.clone()),
                Provider::Bedrock => pick(&tables, |t| t.bedrock.clone()),
            };
            let name = named.or_else(|| {
                let mut of: Vec<&String> = self
                    .upstream
                    .iter()
                    .filter(|(_, u)| u.provider == provider)
                    .map(|(n, _)| n)
                    .collect();
                (of.len() == 1).then(|| of.remove(0).clone())
            });
            if let Some(name) = name {
                upstreams.insert(provider, name);
            }
        }
        Ok(Some(AgentGateway {
            upstreams,
            splice: SpliceSettings {
                client_system: pick(&tables, |t| t.client_system).unwrap_or_default(),
                deny_tools: pick(&tables, |t| t.deny_tools.clone()).unwrap_or_default(),
                defer_tools: pick(&tables, |t| t.defer_tools.clone()).unwrap_or_default(),
            },
            on_plugin_failure: pick(&tables, |t| t.on_plugin_failure).unwrap_or_default(),
            pin_plugins: pick(&tables, |t| t.pin_plugins).unwrap_or(false),
            tool_bounds: ToolBounds {
                max_rounds: pick(&tables, |t| t.max_tool_rounds)
                    .unwrap_or(own_tools::DEFAULT_MAX_TOOL_ROUNDS),
                timeout_ms: pick(&tables, |t| t.tool_timeout_ms)
                    .unwrap_or(own_tools::DEFAULT_TOOL_TIMEOUT_MS),
                max_output_bytes: pick(&tables, |t| t.max_tool_output_bytes)
                    .unwrap_or(own_tools::DEFAULT_MAX_TOOL_OUTPUT_BYTES),
            },
        }))
    }
}
