//! The cache policy's state across sessions: each agent's idle gaps (for `ttl = "auto"`),
//! the OpenAI cache keys' request rates (sharded past the per-key rate), and the changes
//! sessions' last steps held back for a cache-cold point (K7).

mod key_rates;

use std::collections::BTreeMap;
use std::sync::Mutex;

pub(crate) use key_rates::KeyRates;

/// What the cache policy owns.
#[derive(Default)]
pub struct CachePolicy {
    /// Each agent's idle gaps over the replies this process recorded (`ttl = "auto"` for a
    /// session with too few of its own); one entry per agent that has sessions.
    pub(crate) agent_gaps: Mutex<BTreeMap<String, promptd_core::cache::ttl::Gaps>>,
    /// OpenAI requests of the last minute per cache key (without its shard), so a key past
    /// the per-key rate is sharded in new headers.
    pub(crate) key_rates: Mutex<KeyRates>,
    /// K7: what each session's last step held, by session (sessions holding nothing are
    /// absent, so it is bounded by the sessions that step).
    pub(crate) held: Mutex<BTreeMap<String, Vec<promptd_core::held::Held>>>,
}
