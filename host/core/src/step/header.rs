//! The header of a step: the recorded one kept (the same header, or a change held for a
//! cache-cold point, K7) or a new one with its cache key (K6); and the provenance recorded
//! with it.

use std::collections::BTreeMap;

use super::Serving;
use crate::assembly::Assembly;
use crate::config::{AgentSettings, KeyPolicy};
use crate::conversation::{Header, Ttl};
use crate::formats::Format;
use crate::held;
use crate::plugin::model::Step;
use crate::plugin::registry::Registry;
use crate::provenance::Provenance;
use crate::session::{self, SessionState};

/// What the header stage chose.
pub(super) struct Choice {
    /// The new header to record; `None`: the recorded one stands (the same, or held).
    pub(super) header: Option<Header>,
    /// This step's provenance, when choosing worked it out (a held change compares it).
    current: Option<Provenance>,
    /// What the step holds for a cache-cold point (K7).
    pub(super) held: Vec<held::Held>,
    /// What a new header releases, when something was held.
    pub(super) released: Option<held::Released>,
}

/// The header only when it differs from the recorded one ([`session::same_header`], the key
/// kept): else, when a plugin may hold a change, whether it waits for a cache-cold point
/// (K7, K8); else a new header with its cache key.
pub(super) fn choose(
    state: &SessionState,
    registry: &Registry,
    agent: &AgentSettings,
    assembled: &Assembly,
    step: &Step,
    serving: Serving<'_>,
    format: Format,
) -> Choice {
    // The header only when it differs from the recorded one: an unchanged header is neither
    // built nor compared field by field twice.
    let ttl = agent.cache_ttl.header_ttl(state.gaps(), serving.agent_gaps);
    let mut current = None;
    let mut held = Vec::new();
    let mut released = None;
    let header: Option<Header> = match state.header() {
        Some(h)
            if session::same_header(
                h,
                session::Proposed {
                    model: &agent.model,
                    system: &assembled.system,
                    tools: session::ToolsOf::Assembled(&assembled.tools),
                    layout: crate::conversation::LAYOUT,
                    cache_ttl: ttl,
                    key: session::KeyRule::Kept,
                },
            ) =>
        {
            None
        }
        Some(h) if agent.pin_plugins || holds_any(registry, assembled) => {
            let now = Provenance::of(registry, assembled);
            let change = Change {
                recorded: h,
                now: &now,
                ttl,
            };
            let decision =
                decide_held(state, change, (registry, assembled), agent, serving, format);
            current = Some(now);
            match decision {
                held::Decision::Hold(parts) => {
                    held = parts;
                    None
                }
                held::Decision::Apply(release) => {
                    released = release;
                    let key = cache_key(agent, &step.session_id, assembled, serving.key_shards);
                    Some(new_header(assembled, agent, key, ttl))
                }
            }
        }
        _ => {
            let key = cache_key(agent, &step.session_id, assembled, serving.key_shards);
            Some(new_header(assembled, agent, key, ttl))
        }
    };
    Choice {
        header,
        current,
        held,
        released,
    }
}

impl Choice {
    /// Stage 6, the provenance to record with the step: only when it may have changed (a new
    /// header or plugin set). A held step sends the recorded header: its provenance still says
    /// who gave what it sends, so none is recorded for it.
    pub(super) fn provenance(
        &mut self,
        state: &SessionState,
        registry: &Registry,
        assembled: &Assembly,
    ) -> Option<Provenance> {
        let known = self.header.is_none()
            && state.provenance().is_some_and(|p| {
                p.plugins.len() == registry.len()
                    && registry.plugins().all(|e| {
                        p.plugins.get(&e.id).map(String::as_str)
                            == Some(e.sha256.as_deref().unwrap_or(""))
                    })
            });
        let current = self.current.take();
        (!known && self.held.is_empty())
            .then(|| current.unwrap_or_else(|| Provenance::of(registry, assembled)))
    }
}

/// The `prompt_cache_key` a new header of `session` records under `agent`'s policy
/// ([`KeyPolicy`]): `promptd-SESSION`, `promptd-AGENT` or `promptd-p` and the head's hash, the
/// last two with `~N` (the session's shard of `N`) when the daemon says requests with that
/// key pass the per-key rate (`shards`).
pub fn cache_key(
    agent: &AgentSettings,
    session: &str,
    assembled: &Assembly,
    shards: Option<&BTreeMap<String, u32>>,
) -> String {
    let base = match agent.cache_key {
        KeyPolicy::Session => return format!("promptd-{session}"),
        KeyPolicy::Agent => format!("promptd-{}", agent.agent),
        KeyPolicy::Prefix => {
            let mut head = assembled.system.as_bytes().to_vec();
            for t in assembled.tools.iter() {
                head.push(0);
                head.extend_from_slice(t.name.as_bytes());
                head.push(0);
                head.extend_from_slice(t.description.as_bytes());
                head.push(0);
                head.extend_from_slice(t.parameters.to_string().as_bytes());
            }
            format!("promptd-p{:016x}", crate::cache::fnv(&head))
        }
    };
    match shards.and_then(|s| s.get(&base)) {
        Some(&n) if n > 1 => {
            let shard = crate::cache::fnv(session.as_bytes()) % u64::from(n);
            format!("{base}~{shard}")
        }
        _ => base,
    }
}

/// A key without its shard: what the rate past which requests are sharded counts.
pub fn key_base(key: &str) -> &str {
    key.split_once('~').map_or(key, |(base, _)| base)
}

/// Whether any plugin holds a change for a cache-cold point (K7), or a failed one's tools are
/// kept (K8): when none is, a changed header is recorded without comparing provenances.
fn holds_any(registry: &Registry, assembled: &Assembly) -> bool {
    registry.has_kept()
        || registry.plugins().any(|p| !p.options.refresh.is_step())
        || failed_keeping(registry, assembled, "").is_some()
}

/// K8: why plugin `id` (any plugin, when `id` is empty) with `keep_tools` was left out of
/// this assembly because a call failed (A9), if it was.
fn failed_keeping(registry: &Registry, assembled: &Assembly, id: &str) -> Option<String> {
    assembled
        .omitted
        .iter()
        .filter(|o| id.is_empty() || o.plugin == id)
        .find(|o| {
            registry
                .get(&o.plugin)
                .is_some_and(|e| e.options.keep_tools)
        })
        .map(|o| format!("{} failed: {}", o.contribution, o.cause))
}

/// A header change a plugin may hold (K7): from the recorded header to this step's assembly,
/// whose provenance is `now`, under the TTL the new header would have.
#[derive(Clone, Copy)]
struct Change<'a> {
    recorded: &'a Header,
    now: &'a Provenance,
    ttl: Option<Ttl>,
}

/// K7: whether `change` waits for a cache-cold point.
fn decide_held(
    state: &SessionState,
    change: Change<'_>,
    (registry, assembled): (&Registry, &Assembly),
    agent: &AgentSettings,
    serving: Serving<'_>,
    format: Format,
) -> held::Decision {
    let Change {
        recorded: header,
        now,
        ttl,
    } = change;
    let rest_changed = if header.layout != crate::conversation::LAYOUT {
        Some("the body layout changed")
    } else if header.cache_key.is_none() {
        Some("the header had no cache key")
    } else if header.cache_ttl != ttl {
        Some("the cache TTL changed")
    } else if header.model != agent.model {
        Some("the model settings changed")
    } else {
        None
    };
    let tool_bytes: Vec<usize> = header
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .collect();
    let moment = held::Moment {
        step: state.steps() + 1,
        now_ms: serving.now_ms,
        last_reply_ms: state.last_reply_ms(),
        ttl_ms: agent.idle_ttl_ms(format, header.cache_ttl),
        compacted: state.compacted(),
        held: state.held(),
        system: &header.system,
        tool_bytes: &tool_bytes,
        message_bytes: state.message_bytes() as u64,
    };
    let policy = |id: &str| match (registry.get(id), registry.kept(id)) {
        (Some(e), _) => match failed_keeping(registry, assembled, id) {
            Some(cause) => held::Policy::Kept(cause),
            None if agent.pin_plugins => {
                // G11: the agent pins its sessions' plugins: every part waits for a cold
                // point; a plugin's own `max_stale_s` still applies when it set a refresh.
                let mut refresh = e.options.refresh.clone();
                if refresh.is_step() {
                    refresh.max_stale_s = u64::MAX;
                }
                refresh.whole = true;
                held::Policy::Loaded(refresh)
            }
            None => held::Policy::Loaded(e.options.refresh.clone()),
        },
        (None, Some(kept)) => held::Policy::Kept(kept.cause.clone()),
        (None, None) => held::Policy::Removed,
    };
    held::decide(
        state.header_provenance(),
        now,
        &policy,
        rest_changed,
        &moment,
    )
}

/// A new header for this step's assembly: built whole, its cache key and TTL set.
fn new_header(
    assembled: &Assembly,
    agent: &AgentSettings,
    key: String,
    ttl: Option<Ttl>,
) -> Header {
    let mut header = session::header(assembled, agent.model.clone());
    header.cache_key = Some(key);
    header.cache_ttl = ttl;
    header
}
