//! Which session a gateway request joins when it does not say (G3): the daemon remembers,
//! per agent, the conversation digest each session's last request reached and the replies'
//! ids (Responses' `previous_response_id`). In memory and bounded; a daemon that starts reads
//! back, in the background, the conversation each of the [`RECOVERED`] most recent gateway
//! sessions reached, so a client that goes on after a restart joins its session by prefix.

use std::collections::HashMap;

/// Entries kept before the index starts over (a cleared index costs new sessions, never a
/// wrong one).
const MAX_ENTRIES: usize = 100_000;

/// The most recent sessions whose conversation a starting daemon reads back.
pub(crate) const RECOVERED: usize = 1000;

/// The index's scope of a request: its agent, and its gateway key when it has one (G12), so
/// one key's conversations are never joined to another's.
pub(crate) fn scope(agent: &str, key: Option<&str>) -> String {
    match key {
        Some(key) => format!("{agent}\u{0}{key}"),
        None => agent.to_string(),
    }
}

/// The index.
#[derive(Default)]
pub(crate) struct Index {
    by_digest: HashMap<(String, String), String>,
    /// By (scope, reply id).
    by_response: HashMap<(String, String), String>,
}

impl Index {
    /// The session of `agent` whose recorded conversation the one whose chain is `digests`
    /// extends: the longest strict prefix, so a conversation that starts again the way
    /// another did is a new one. Of sessions that reached the same digest, the latest wins.
    pub(crate) fn prefix(&self, agent: &str, digests: &[String]) -> Option<String> {
        let shorter = digests.len().saturating_sub(1);
        digests[..shorter]
            .iter()
            .rev()
            .find_map(|d| self.by_digest.get(&(agent.to_string(), d.clone())).cloned())
    }

    /// Notes that `session` of `agent` reached `digest`.
    pub(crate) fn reached(&mut self, agent: &str, digest: &str, session: &str) {
        if digest.is_empty() {
            return;
        }
        if self.by_digest.len() >= MAX_ENTRIES {
            self.by_digest.clear();
        }
        self.by_digest
            .insert((agent.to_string(), digest.to_string()), session.to_string());
    }

    /// Notes that `session` of `agent` reached `digest`, unless a request since said where it
    /// went (what a starting daemon reads back never overrides live traffic).
    pub(crate) fn recovered(&mut self, agent: &str, digest: &str, session: &str) {
        if digest.is_empty() || self.by_digest.len() >= MAX_ENTRIES {
            return;
        }
        self.by_digest
            .entry((agent.to_string(), digest.to_string()))
            .or_insert_with(|| session.to_string());
    }

    /// The session of `scope` that recorded the reply `id`.
    pub(crate) fn response(&self, scope: &str, id: &str) -> Option<String> {
        (self.by_response)
            .get(&(scope.to_string(), id.to_string()))
            .cloned()
    }

    /// Notes that `session` of `scope` recorded the reply `id`.
    pub(crate) fn replied(&mut self, scope: &str, id: &str, session: &str) {
        if self.by_response.len() >= MAX_ENTRIES {
            self.by_response.clear();
        }
        (self.by_response).insert((scope.to_string(), id.to_string()), session.to_string());
    }
}
