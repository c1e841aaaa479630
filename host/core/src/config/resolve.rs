//! Resolving the config for one agent or one plugin: scope chains, merged model settings and
//! budgets, inherited agent settings, and every limit with its default
//! ([`crate::limits::defaults`]). [`super::AgentSettings`] gathers an agent's in one value.

use super::*;

impl Config {
    /// The agent's scope chain, farthest first: `global`, ancestors…, the agent. An agent the
    /// config does not name has the chain `global → agent`.
    pub fn chain(&self, agent: &str) -> Result<Vec<String>> {
        check_agent_name(agent, "agent")?;
        let mut chain = vec![agent.to_string()];
        let mut current = agent;
        while let Some(parent) = self.agents.get(current).and_then(|a| a.parent.as_deref()) {
            if chain.iter().any(|a| a == parent) {
                chain.push(parent.to_string());
                chain.reverse();
                return Err(Error::ConfigInvalid(format!(
                    "agents form a cycle: {}",
                    chain.join(" → ")
                )));
            }
            chain.push(parent.to_string());
            current = parent;
        }
        chain.push("global".to_string());
        chain.reverse();
        Ok(chain)
    }

    /// The agent's model settings as JSON: the top-level `model` table, then each agent of its
    /// chain's own (farthest first), merged key by key; a provider table (`model.openai`, …)
    /// merges key by key too. The more specific scope wins, then the more specific format: a
    /// key a level sets for every format also takes that key out of the provider tables merged
    /// from the levels before it (a table left empty goes), then the level's own provider
    /// tables merge, so within one level the provider table wins. Exact keys only: a generic
    /// `max_tokens` leaves an outer `max_output_tokens` or Gemini `maxOutputTokens` where it
    /// is. [`crate::formats::settings`] picks what one format sends.
    pub fn model(&self, agent: &str) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::Value;
        let mut merged = serde_json::Map::new();
        let chain = self.chain(agent).unwrap_or_default();
        let tables = std::iter::once(self.model.as_ref()).chain(
            chain
                .iter()
                .map(|name| self.agents.get(name).and_then(|a| a.model.as_ref())),
        );
        for table in tables.flatten() {
            let Ok(Value::Object(map)) = serde_json::to_value(table) else {
                continue;
            };
            let (providers, generic): (Vec<_>, Vec<_>) = map
                .into_iter()
                .partition(|(key, _)| PROVIDER_TABLES.contains(&key.as_str()));
            for (key, value) in generic {
                for provider in PROVIDER_TABLES {
                    if let Some(Value::Object(outer)) = merged.get_mut(provider) {
                        if outer.remove(&key).is_some() && outer.is_empty() {
                            merged.remove(provider);
                        }
                    }
                }
                merged.insert(key, value);
            }
            for (key, value) in providers {
                match (merged.get_mut(&key), value) {
                    (Some(Value::Object(old)), Value::Object(new)) => old.extend(new),
                    (_, value) => {
                        merged.insert(key, value);
                    }
                }
            }
        }
        merged
    }

    /// The agent's `tool_subset`, from the nearest agent of its chain that sets one.
    pub fn tool_subset(&self, agent: &str) -> ToolSubset {
        let chain = self.chain(agent).unwrap_or_default();
        chain
            .iter()
            .rev()
            .find_map(|name| self.agents.get(name).and_then(|a| a.tool_subset))
            .unwrap_or_default()
    }

    /// The TTL setting of `agent`'s Anthropic cache breakpoints: the nearest
    /// `[agents.NAME.cache] ttl` along the chain, else 5 minutes.
    pub fn cache_ttl(&self, agent: &str) -> super::TtlSetting {
        self.inherited(agent, |a| a.cache.as_ref().and_then(|c| c.ttl))
            .unwrap_or_default()
    }

    /// `agent`'s OpenAI cache-key policy: the nearest `[agents.NAME.cache] cache_key` along
    /// the chain, else `agent`.
    pub fn cache_key(&self, agent: &str) -> super::KeyPolicy {
        self.inherited(agent, |a| a.cache.as_ref().and_then(|c| c.cache_key))
            .unwrap_or_default()
    }

    /// The nearest value of an agent setting along `agent`'s chain.
    fn inherited<T: Clone>(
        &self,
        agent: &str,
        get: impl Fn(&AgentConfig) -> Option<T>,
    ) -> Option<T> {
        let chain = self.chain(agent).unwrap_or_default();
        chain
            .iter()
            .rev()
            .find_map(|name| self.agents.get(name).and_then(&get))
    }

    /// The agent's budget, merged key by key along its chain; `None` when no agent of the
    /// chain has a `budget` table (then steps are measured by `chars`, never refused).
    pub fn budget(&self, agent: &str) -> Option<crate::budget::Budget> {
        // The chain's budget tables, nearest first: each key comes from the first that sets it.
        let chain = self.chain(agent).unwrap_or_default();
        let tables: Vec<&BudgetConfig> = chain
            .iter()
            .rev()
            .filter_map(|name| self.agents.get(name).and_then(|a| a.budget.as_ref()))
            .collect();
        if tables.is_empty() {
            return None;
        }
        let b = |f: fn(&BudgetConfig) -> Option<u64>| tables.iter().find_map(|t| f(t));
        Some(crate::budget::Budget {
            window: b(|c| c.window),
            reserve: b(|c| c.reserve).unwrap_or(0),
            tokenizer: tables
                .iter()
                .find_map(|t| t.tokenizer.clone())
                .unwrap_or_else(|| "chars".into()),
            keep_turns: b(|c| c.keep_turns).unwrap_or(crate::budget::DEFAULT_KEEP_TURNS) as usize,
            history_max: b(|c| c.history_max),
            context_max: b(|c| c.context_max),
        })
    }

    /// The agent's tool-result template and empty-result text.
    pub fn tool_results(&self, agent: &str) -> (Option<String>, String) {
        (
            self.inherited(agent, |a| a.tool_result_template.clone()),
            self.inherited(agent, |a| a.empty_tool_result.clone())
                .unwrap_or_else(|| EMPTY_TOOL_RESULT.into()),
        )
    }

    /// Whether the agent gets a runtime context snapshot (A4).
    pub fn runtime_context(&self, agent: &str) -> bool {
        self.agents.get(agent).is_none_or(|a| a.runtime_context)
    }

    /// The plugin's id: its config `id`, or the file stem.
    pub fn plugin_id(&self, stem: &str) -> String {
        self.plugins
            .get(stem)
            .and_then(|p| p.id.clone())
            .unwrap_or_else(|| stem.to_string())
    }

    /// How the registry treats the plugin with file stem `stem`.
    pub fn plugin_options(&self, stem: &str) -> PluginOptions {
        let p = self.plugins.get(stem);
        let own = p.map(PluginConfig::declaration_keys).unwrap_or_default();
        let default = self.limits.declaration_keys();
        let limit =
            |i: usize, fallback: u64| own[i].1.or(default[i].1).unwrap_or(fallback) as usize;
        PluginOptions {
            scope_override: p.and_then(|p| p.scope.clone()).map(Scope::Agent),
            optional: p.is_some_and(|p| p.optional),
            contexts_fail_alone: false,
            limits: DeclarationLimits {
                max_sections: limit(0, defaults::MAX_SECTIONS),
                max_contexts: limit(1, defaults::MAX_CONTEXTS),
                max_variables: limit(2, defaults::MAX_VARIABLES),
                max_tools: limit(3, defaults::MAX_TOOLS),
                max_name_bytes: limit(4, defaults::MAX_NAME_BYTES),
                max_declared_bytes: limit(5, defaults::MAX_DECLARED_KB) << 10,
            },
            trust: p.and_then(|p| p.trust).unwrap_or(self.default_trust),
            // Checked when the config was validated.
            refresh: p.and_then(|p| p.refresh(stem).ok()).unwrap_or_default(),
            keep_tools: p.and_then(|p| p.keep_tools).unwrap_or(false),
            defer: p.and_then(|p| p.defer(stem).ok()).unwrap_or_default(),
        }
    }

    /// The daemon-wide limits, every default filled in ([`crate::limits`]).
    pub fn limits(&self) -> Limits {
        let l = &self.limits;
        let d = Limits::default();
        Limits {
            max_body_bytes: l.max_body_mb.map_or(d.max_body_bytes, |mb| {
                (mb.min(limits::MAX_BODY_MB_CAP) << 20) as usize
            }),
            max_block_bytes: l.max_block_kb.map_or(d.max_block_bytes, |kb| {
                (kb.min(limits::MAX_BLOCK_KB_CAP) << 10) as usize
            }),
            session_cache_bytes: l
                .session_cache_mb
                .map_or(d.session_cache_bytes, |mb| (mb << 20) as usize),
            header_timeout: l
                .header_timeout_ms
                .map_or(d.header_timeout, std::time::Duration::from_millis),
            idle_timeout: l
                .idle_timeout_ms
                .map_or(d.idle_timeout, std::time::Duration::from_millis),
            body_timeout: l
                .body_timeout_ms
                .map_or(d.body_timeout, std::time::Duration::from_millis),
            compile_memory_total_bytes: l
                .compile_memory_total_mb
                .map_or(d.compile_memory_total_bytes, |mb| {
                    mb.saturating_mul(1 << 20)
                }),
            bodies_in_flight_bytes: l
                .bodies_in_flight_mb
                .map_or(d.bodies_in_flight_bytes, |mb| mb.saturating_mul(1 << 20)),
            max_connections: l.max_connections.map_or(d.max_connections, |n| {
                usize::try_from(n).unwrap_or(usize::MAX)
            }),
            quarantine_after: match l.quarantine_after {
                Some(0) => None,
                Some(n) => Some(n),
                None => d.quarantine_after,
            },
        }
    }

    /// Largest request body the daemon reads (`[limits] max_body_mb`).
    pub fn max_body_bytes(&self) -> usize {
        self.limits().max_body_bytes
    }

    /// How large a content block may be (`[limits] max_block_kb`).
    pub fn content_limits(&self) -> crate::conversation::content::ContentLimits {
        crate::conversation::content::ContentLimits {
            max_block_bytes: self.limits().max_block_bytes,
        }
    }

    /// The session cache's budget in bytes (`[limits] session_cache_mb`).
    pub fn session_cache_bytes(&self) -> usize {
        self.limits().session_cache_bytes
    }

    /// How long a daemon connection has to send a whole request head (H6).
    pub fn header_timeout(&self) -> std::time::Duration {
        self.limits().header_timeout
    }

    /// How long a daemon connection with no request in flight may wait for the next (H6).
    pub fn idle_timeout(&self) -> std::time::Duration {
        self.limits().idle_timeout
    }

    /// The bytes of request bodies read or served at once across connections (H6).
    pub fn bodies_in_flight(&self) -> u64 {
        self.limits().bodies_in_flight_bytes
    }

    /// The address space all plugin compiles may take at once, in bytes (L7).
    pub fn compile_memory_total(&self) -> u64 {
        self.limits().compile_memory_total_bytes
    }

    /// How long a request's body has to arrive whole, from the end of its head (H6).
    pub fn body_timeout(&self) -> std::time::Duration {
        self.limits().body_timeout
    }

    /// Most connections the daemon keeps open at once (H6).
    pub fn max_connections(&self) -> usize {
        self.limits().max_connections
    }

    /// Consecutive failed calls after which a plugin is quarantined; `None` means never.
    pub fn quarantine_after(&self) -> Option<u32> {
        self.limits().quarantine_after
    }

    /// Capabilities and limits of the plugin with file stem `stem` (L1, L2).
    pub fn sandbox(&self, stem: &str) -> Sandbox {
        let p = self.plugins.get(stem);
        let pick = |own: Option<u64>, default: Option<u64>, fallback: u64| {
            own.or(default).unwrap_or(fallback)
        };
        let timeout_ms = pick(
            p.and_then(|p| p.timeout_ms),
            self.limits.timeout_ms,
            defaults::TIMEOUT_MS,
        );
        let memory_mb = pick(
            p.and_then(|p| p.memory_mb),
            self.limits.memory_mb,
            defaults::MEMORY_MB,
        );
        let output_kb = pick(
            p.and_then(|p| p.max_output_kb),
            self.limits.max_output_kb,
            defaults::MAX_OUTPUT_KB,
        );
        let instances = pick(
            p.and_then(|p| p.instances),
            self.limits.instances,
            defaults::INSTANCES,
        );
        let base = self.base_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        let compile_ms = pick(
            p.and_then(|p| p.compile_timeout_ms),
            self.limits.compile_timeout_ms,
            defaults::COMPILE_TIMEOUT_MS,
        );
        let compile_mb = pick(
            p.and_then(|p| p.compile_memory_mb),
            self.limits.compile_memory_mb,
            defaults::COMPILE_MEMORY_MB,
        );
        Sandbox {
            compile_deadline: std::time::Duration::from_millis(compile_ms),
            compile_memory_bytes: compile_mb.saturating_mul(1 << 20),
            call_deadline: std::time::Duration::from_millis(timeout_ms),
            memory_bytes: (memory_mb << 20) as usize,
            max_output_bytes: (output_kb << 10) as usize,
            dirs: p
                .map(|p| {
                    p.dirs
                        .iter()
                        .map(|(host, guest)| (base.join(host), guest.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            env: p
                .map(|p| {
                    p.env
                        .iter()
                        .filter_map(|name| {
                            self.host_env.get(name).map(|v| (name.clone(), v.clone()))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            stdio_to_log: p.and_then(|p| p.stdio) != Some(Stdio::None),
            max_instances: instances as usize,
            log_bytes_per_call: (self
                .limits
                .log_kb_per_call
                .unwrap_or(defaults::LOG_KB_PER_CALL)
                << 10) as usize,
            log_lines_per_s: self
                .limits
                .log_lines_per_s
                .unwrap_or(defaults::LOG_LINES_PER_S)
                .min(u32::MAX as u64) as u32,
        }
    }

    /// The key/value strings the plugin's `declare` receives, sorted by key.
    pub fn plugin_values(&self, stem: &str) -> Vec<(String, String)> {
        self.plugins
            .get(stem)
            .map(|p| p.config.clone().into_iter().collect())
            .unwrap_or_default()
    }
}
