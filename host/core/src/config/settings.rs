//! An agent's settings resolved once: [`AgentSettings`]. The config is read per agent and per
//! config version, not per step; the daemon, `promptd assemble` and the benches all take the
//! settings, so every step of an agent runs on the same resolved values.

use std::sync::Arc;

use crate::assembly::Options;
use crate::budget::{Budget, Counter};
use crate::cache::ttl::Gaps;
use crate::cache::Rules;
use crate::config::{Config, KeyPolicy, ToolSubset, TtlSetting, EMPTY_TOOL_RESULT};
use crate::conversation::content::ContentLimits;
use crate::conversation::Ttl;
use crate::formats::{self, Format};
use crate::Result;

/// How an agent's tool results are shown (`tool_result_template`, `empty_tool_result`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolResults {
    /// Wraps each result's text around `{observation}`.
    pub template: Option<String>,
    /// Shown for an empty result.
    pub empty: String,
}

/// One agent's settings, resolved from one config version.
///
/// ```
/// use promptd_core::config::{settings::AgentSettings, Config};
///
/// let config = Config::parse("[agents.coder]\nruntime_context = false\n", "promptd.toml").unwrap();
/// let plan = AgentSettings::resolve(&config, "coder", |_| None).unwrap();
/// assert_eq!(&*plan.scope_chain, ["global".to_string(), "coder".to_string()]);
/// assert!(plan.options.suppress_runtime_context);
/// assert_eq!(plan.counter.name(), "chars");
/// ```
#[derive(Clone)]
pub struct AgentSettings {
    /// The agent's name.
    pub agent: String,
    /// Farthest first: `global`, ancestors…, the agent.
    pub scope_chain: Arc<[String]>,
    /// Assembly options; `data_secret` is empty here (it is the session's: see
    /// [`AgentSettings::options_for`]).
    pub options: Options,
    /// Model settings (every provider table): [`crate::formats::settings`] picks a format's.
    pub model: serde_json::Map<String, serde_json::Value>,
    /// The budget (`chars`, never refusing, when the agent has none).
    pub budget: Budget,
    /// The counter of `budget.tokenizer`.
    pub counter: Arc<dyn Counter>,
    /// Whether the agent has a tokenizer other than `chars` (a diff then counts tokens).
    pub counts_tokens: bool,
    /// Tool results as shown.
    pub tool_results: ToolResults,
    /// How large a content block may be.
    pub content_limits: ContentLimits,
    /// How the TTL of its Anthropic breakpoints is chosen.
    pub cache_ttl: TtlPolicy,
    /// Which of its requests share OpenAI's `prompt_cache_key`.
    pub cache_key: KeyPolicy,
    /// Requests a minute one key is served by one machine, by the cache rules of its OpenAI
    /// model (`[cache.openai] per_key_per_minute`; 0: no limit): past it a key is sharded.
    pub key_rate: u32,
    /// How long the provider keeps an idle prefix, in ms, by the cache rules of the agent's
    /// models: Anthropic's 5-minute and 1-hour TTLs, then OpenAI's (K7's idle cold point).
    pub idle_ttl_ms: [u64; 3],
    /// G11: `[agents.NAME.gateway] pin_plugins`: every change of the agent's sections and
    /// tools waits for a cache-cold point (as if each plugin were `refresh = "boundary"` with
    /// no `max_stale_s`), so a warm session keeps the plugin versions its header was built
    /// from; a new session takes the current ones.
    pub pin_plugins: bool,
}

/// How an agent's Anthropic breakpoints get their TTL (`[agents.NAME.cache] ttl`).
#[derive(Clone, Debug, PartialEq)]
pub enum TtlPolicy {
    /// Always this one.
    Fixed(Ttl),
    /// Per session by [`crate::cache::ttl::choose`], at the prices of these rules (the
    /// agent's Anthropic model's, with the config's `[cache.anthropic]`).
    Auto(Box<Rules>),
}

impl TtlPolicy {
    /// The TTL a header records for a session whose replies showed `session`'s gaps (the
    /// agent's sessions: `agent`); `None` for the default 5 minutes, which headers leave out.
    pub fn header_ttl(&self, session: &Gaps, agent: Option<&Gaps>) -> Option<Ttl> {
        let ttl = match self {
            TtlPolicy::Fixed(ttl) => *ttl,
            TtlPolicy::Auto(rules) => crate::cache::ttl::choose(session, agent, rules),
        };
        (ttl != Ttl::Minutes5).then_some(ttl)
    }
}

impl std::fmt::Debug for AgentSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSettings")
            .field("agent", &self.agent)
            .field("scope_chain", &self.scope_chain)
            .field("budget", &self.budget)
            .field("counter", &self.counter.name())
            .finish_non_exhaustive()
    }
}

impl AgentSettings {
    /// Resolves `agent`'s settings from `config`. `counter` gives the counter for a tokenizer
    /// name the config validated (tokenizers live outside core); `None` falls back to
    /// [`crate::budget::Chars`].
    pub fn resolve(
        config: &Config,
        agent: &str,
        counter: impl Fn(&str) -> Option<Arc<dyn Counter>>,
    ) -> Result<AgentSettings> {
        let scope_chain: Arc<[String]> = config.chain(agent)?.into();
        let budget = config.budget(agent).unwrap_or_default();
        let counts_tokens = !budget.tokenizer.is_empty() && budget.tokenizer != "chars";
        let counter = counter(&budget.tokenizer).unwrap_or_else(|| Arc::new(crate::budget::Chars));
        let (template, empty) = config.tool_results(agent);
        // The cache rules of the agent's model in a provider format, with the config's
        // overrides (a provider format always has rules).
        let model = config.model(agent);
        let rules = |format: Format| {
            let settings = formats::settings(&model, format);
            let name = settings.get("model").and_then(|m| m.as_str()).unwrap_or("");
            let asked = settings
                .get("prompt_cache_retention")
                .and_then(|r| r.as_str());
            Rules::of(format, name, &config.cache)
                .map(|r| r.asked(name, asked))
                .unwrap_or_else(|| Rules::anthropic(name))
        };
        Ok(AgentSettings {
            agent: agent.to_string(),
            scope_chain,
            options: Options {
                tool_order: config.tool_order.clone().map(Into::into),
                suppress_runtime_context: !config.runtime_context(agent),
                keep_all_tools: config.tool_subset(agent) == ToolSubset::AllowedTools,
                data_secret: Arc::from(""),
            },
            model: model.clone(),
            budget,
            counter,
            counts_tokens,
            tool_results: ToolResults { template, empty },
            content_limits: config.content_limits(),
            cache_key: config.cache_key(agent),
            key_rate: rules(Format::Openai).per_key_per_minute,
            idle_ttl_ms: {
                let (anthropic, openai) = (rules(Format::Anthropic), rules(Format::Openai));
                [
                    anthropic.ttl_ms,
                    anthropic.ttl_1h_ms,
                    openai.longest_ttl_ms(),
                ]
            },
            pin_plugins: matches!(
                config.gateway.agent(config, agent),
                Ok(Some(g)) if g.pin_plugins
            ),
            cache_ttl: match config.cache_ttl(agent) {
                TtlSetting::Minutes5 => TtlPolicy::Fixed(Ttl::Minutes5),
                TtlSetting::Hour1 => TtlPolicy::Fixed(Ttl::Hour1),
                TtlSetting::Auto => TtlPolicy::Auto(Box::new(rules(Format::Anthropic))),
            },
        })
    }

    /// How long a request in `format` whose header records `ttl` stays cached while idle, in
    /// ms ([`AgentSettings::idle_ttl_ms`]); the neutral format, which no provider reads, takes
    /// the shortest.
    pub fn idle_ttl_ms(&self, format: Format, ttl: Option<Ttl>) -> u64 {
        let [five, hour, openai] = self.idle_ttl_ms;
        match format {
            Format::Anthropic | Format::Bedrock if ttl == Some(Ttl::Hour1) => hour,
            Format::Anthropic | Format::Bedrock | Format::Gemini => five,
            Format::Openai | Format::OpenaiResponses => openai,
            Format::Neutral => five.min(openai),
        }
    }

    /// The assembly options for a session whose data blocks are keyed with `secret` (T8).
    pub fn options_for(&self, secret: Arc<str>) -> Options {
        Options {
            data_secret: secret,
            ..self.options.clone()
        }
    }
}

impl Default for ToolResults {
    fn default() -> Self {
        ToolResults {
            template: None,
            empty: EMPTY_TOOL_RESULT.to_string(),
        }
    }
}
