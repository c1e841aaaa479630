//! OpenAI requests of the last minute per cache key: a key past the per-key rate is sharded.

/// OpenAI requests of the last minute per cache key (without its shard).
#[derive(Default)]
pub(crate) struct KeyRates {
    recent: std::collections::HashMap<String, std::collections::VecDeque<u64>>,
}

impl KeyRates {
    const MINUTE_MS: u64 = 60_000;
    /// Keys counted at once; past it, keys idle for a minute are forgotten first.
    const MAX_KEYS: usize = 4096;
    /// Requests kept per key: enough to say 64 shards at OpenAI's documented rate.
    const MAX_PER_KEY: usize = 64 * 15;

    /// Counts a request with key `base` at `now_ms`.
    pub(crate) fn count(&mut self, base: &str, now_ms: u64) {
        if self.recent.len() >= Self::MAX_KEYS && !self.recent.contains_key(base) {
            self.recent
                .retain(|_, times| times.back().is_some_and(|t| t + Self::MINUTE_MS > now_ms));
            if self.recent.len() >= Self::MAX_KEYS {
                return; // every key busy: this one is not sharded
            }
        }
        let times = self.recent.entry(base.to_string()).or_default();
        times.push_back(now_ms);
        while times.len() > Self::MAX_PER_KEY
            || times.front().is_some_and(|t| t + Self::MINUTE_MS <= now_ms)
        {
            times.pop_front();
        }
    }

    /// The keys past `rate` requests a minute, each with the shards that keep every shard
    /// within it; `None` when there are none (or no rate).
    pub(crate) fn shards(
        &self,
        now_ms: u64,
        rate: u32,
    ) -> Option<std::sync::Arc<std::collections::BTreeMap<String, u32>>> {
        if rate == 0 {
            return None;
        }
        let busy: std::collections::BTreeMap<String, u32> = self
            .recent
            .iter()
            .filter_map(|(key, times)| {
                let n = times
                    .iter()
                    .filter(|t| **t + Self::MINUTE_MS > now_ms)
                    .count() as u32;
                (n > rate).then(|| (key.clone(), n.div_ceil(rate)))
            })
            .collect();
        (!busy.is_empty()).then(|| std::sync::Arc::new(busy))
    }
}
