//! Gateway keys at the door (G10): the key a request presents is found by its digest, held to
//! the agents and upstreams it may use, and to its rate and spend limits, before the body is
//! read. The config is read at each request, so keys are added, rotated and revoked without a
//! restart; a key's spend is counted in the store when each reply is recorded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode};

use promptd_core::config::Config;
use promptd_core::gateway::keys::KeyConfig;
use promptd_core::gateway::keys::{self, KeyIndex, NotAllowed, Periods, Used, Via};
use promptd_core::gateway::Provider;
use promptd_core::store::SessionStore;

use super::GatewayRefusal;

/// How old a shared store's count of a key's spend may be before it is read again (other
/// daemons of the fleet spend too). Read in the background: a request never waits for it.
const SHARED_REFRESH: Duration = Duration::from_secs(1);

/// Keys counted at most (a key removed from the config leaves its count until this bound
/// clears them all; the store keeps the spend).
const MAX_COUNTED: usize = 10_000;

/// The gateway's keys: the index of the config in force, and each key's counts.
pub(super) struct Keys {
    /// Whether the daemon listens beyond loopback: then every request presents a key.
    exposed: bool,
    /// The index, with the config it was built from.
    index: Mutex<Option<(Arc<Config>, Arc<KeyIndex>)>>,
    counts: Arc<Mutex<HashMap<String, Count>>>,
}

/// A key's counts in the periods of now.
#[derive(Default)]
struct Count {
    day: String,
    month: String,
    day_micro_usd: u64,
    month_micro_usd: u64,
    /// When the spend was last read from the store; none: not read for these periods.
    read_at: Option<Instant>,
    refreshing: bool,
    minute: u64,
    requests: u32,
}

/// A request a key admitted.
#[derive(Debug, Clone)]
pub(super) struct Admitted {
    /// The key's name.
    pub name: String,
    /// Where the client sent it.
    pub via: Via,
}

/// What the door decided before counting.
enum Door {
    Open,
    Admit(Admitted),
}

impl Keys {
    pub(super) fn new(exposed: bool) -> Keys {
        Keys {
            exposed,
            index: Mutex::new(None),
            counts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn index(&self, config: &Arc<Config>) -> Arc<KeyIndex> {
        let mut held = crate::lock(&self.index);
        if let Some((built_from, index)) = held.as_ref() {
            if Arc::ptr_eq(built_from, config) {
                return index.clone();
            }
        }
        let index = Arc::new(KeyIndex::new(&config.gateway.keys));
        *held = Some((config.clone(), index.clone()));
        index
    }

    /// Admits a request of `provider` for `agent` through `upstream`, or refuses it in the
    /// provider's shape. `Ok(None)`: no key is needed (loopback, no key configured) and none
    /// was presented as `x-promptd-key`.
    pub(super) async fn admit(
        &self,
        config: &Arc<Config>,
        store: &Arc<dyn SessionStore>,
        provider: Provider,
        agent: &str,
        upstream: &str,
        headers: &HeaderMap,
    ) -> Result<Option<Admitted>, GatewayRefusal> {
        let admitted = match self.door(config, provider, agent, upstream, headers)? {
            Door::Open => return Ok(None),
            Door::Admit(admitted) => admitted,
        };
        let index = self.index(config);
        let Some(key) = index.get(&admitted.name) else {
            return Ok(None);
        };
        if key.usd_per_day.is_some() || key.usd_per_month.is_some() {
            self.read_spend(store, &admitted.name, provider).await?;
        }
        self.count(key, &admitted.name, provider)?;
        Ok(Some(admitted))
    }

    /// The key presented, found and allowed (nothing counted yet).
    fn door(
        &self,
        config: &Arc<Config>,
        provider: Provider,
        agent: &str,
        upstream: &str,
        headers: &HeaderMap,
    ) -> Result<Door, GatewayRefusal> {
        let index = self.index(config);
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let presented = keys::presented(provider, &header);
        let refuse = |status, code, message: String| {
            Err(GatewayRefusal::new(provider, status, code, message))
        };
        let required = self.exposed || !index.is_empty();
        let presented = match presented {
            Some(p) if required || p.via == Via::KeyHeader => p,
            _ if !required => return Ok(Door::Open),
            _ => {
                let why = if index.is_empty() {
                    "the daemon listens beyond loopback and no [gateway.keys.NAME] is configured"
                } else {
                    "gateway keys are configured"
                };
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    "key_required",
                    format!(
                        "{why}: send a gateway key as `{}` or in {}",
                        keys::KEY_HEADER,
                        credential_header(provider)
                    ),
                );
            }
        };
        let Some((name, key)) = index.find(presented.token) else {
            let place = match presented.via {
                Via::KeyHeader => keys::KEY_HEADER,
                Via::Credential(h) => h,
            };
            return refuse(
                StatusCode::UNAUTHORIZED,
                "key_invalid",
                format!("the key in `{place}` is no gateway key of this daemon (unknown, revoked or rotated out)"),
            );
        };
        match key.allows(agent, upstream) {
            Ok(()) => {}
            Err(NotAllowed::Agent) => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "key_agent",
                    format!("gateway key `{name}` may not use agent `{agent}` (its `agents` do not list it)"),
                )
            }
            Err(NotAllowed::Upstream) => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "key_upstream",
                    format!("gateway key `{name}` may not use upstream `{upstream}` (its `upstreams` do not list it)"),
                )
            }
        }
        Ok(Door::Admit(Admitted {
            name: name.to_string(),
            via: presented.via,
        }))
    }

    /// Reads the key's spend of the periods of now from the store, when it was not read for
    /// them (then the request waits for it), or, on a shared store, when the count is older
    /// than [`SHARED_REFRESH`] (then it is read in the background).
    async fn read_spend(
        &self,
        store: &Arc<dyn SessionStore>,
        name: &str,
        provider: Provider,
    ) -> Result<(), GatewayRefusal> {
        let periods = Periods::at(crate::now_ms());
        let (fresh, stale) = {
            let counts = crate::lock(&self.counts);
            match counts.get(name) {
                Some(c) if c.day == periods.day && c.read_at.is_some() => {
                    let old = c.read_at.is_some_and(|at| at.elapsed() > SHARED_REFRESH);
                    (true, old && store.is_shared() && !c.refreshing)
                }
                _ => (false, false),
            }
        };
        if fresh && !stale {
            return Ok(());
        }
        if stale {
            if let Some(c) = crate::lock(&self.counts).get_mut(name) {
                c.refreshing = true;
            }
        }
        let read = {
            let (store, name, periods) = (store.clone(), name.to_string(), periods.clone());
            tokio::task::spawn_blocking(move || store.spend(&name, &[&periods.day, &periods.month]))
        };
        if stale {
            let counts = self.counts.clone();
            let name = name.to_string();
            tokio::spawn(async move {
                let totals = read.await.ok().and_then(Result::ok);
                let mut counts = crate::lock(&counts);
                if let Some(c) = counts.get_mut(&name) {
                    c.refreshing = false;
                    if let Some(totals) = totals {
                        c.set_spend(&periods, &totals);
                    }
                }
            });
            return Ok(());
        }
        let totals = match read.await {
            Ok(Ok(totals)) => totals,
            Ok(Err(e)) => {
                return Err(GatewayRefusal::new(
                    provider,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "key_spend_unavailable",
                    format!("gateway key `{name}`'s spend cannot be read, so its limit cannot be checked: {e}"),
                ))
            }
            Err(e) => {
                return Err(GatewayRefusal::new(
                    provider,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("reading gateway key `{name}`'s spend did not finish: {e}"),
                ))
            }
        };
        let mut counts = crate::lock(&self.counts);
        if counts.len() >= MAX_COUNTED && !counts.contains_key(name) {
            counts.clear();
        }
        counts
            .entry(name.to_string())
            .or_default()
            .set_spend(&periods, &totals);
        Ok(())
    }

    /// Judges the key's limits and counts the request in its minute.
    fn count(&self, key: &KeyConfig, name: &str, provider: Provider) -> Result<(), GatewayRefusal> {
        let periods = Periods::at(crate::now_ms());
        let mut counts = crate::lock(&self.counts);
        if counts.len() >= MAX_COUNTED && !counts.contains_key(name) {
            counts.clear();
        }
        let count = counts.entry(name.to_string()).or_default();
        if count.minute != periods.minute {
            count.minute = periods.minute;
            count.requests = 0;
        }
        let spend_counted = count.day == periods.day;
        let used = Used {
            day_micro_usd: if spend_counted {
                count.day_micro_usd
            } else {
                0
            },
            month_micro_usd: if count.month == periods.month {
                count.month_micro_usd
            } else {
                0
            },
            requests_this_minute: count.requests,
        };
        match key.judge(&used, &periods) {
            Ok(()) => {
                count.requests += 1;
                Ok(())
            }
            Err(over) => {
                let mut refusal = GatewayRefusal::new(
                    provider,
                    StatusCode::TOO_MANY_REQUESTS,
                    over.limit.code(),
                    format!("gateway key `{name}` is at its limit of {}", over.detail),
                );
                refusal.retry_after = HeaderValue::from_str(&over.retry_after_s.to_string()).ok();
                Err(refusal)
            }
        }
    }

    /// Counts `micro_usd` a reply of key `name` cost, in the store (durably, before it is
    /// counted here), and returns the day's and month's totals.
    pub(super) fn spent(
        &self,
        store: &dyn SessionStore,
        name: &str,
        micro_usd: u64,
    ) -> Result<(u64, u64), promptd_core::store::StoreError> {
        let periods = Periods::at(crate::now_ms());
        let totals = store.add_spend(name, &[&periods.day, &periods.month], micro_usd)?;
        let mut counts = crate::lock(&self.counts);
        if counts.len() >= MAX_COUNTED && !counts.contains_key(name) {
            counts.clear();
        }
        counts
            .entry(name.to_string())
            .or_default()
            .set_spend(&periods, &totals);
        Ok((totals[0], totals[1]))
    }
}

impl Count {
    fn set_spend(&mut self, periods: &Periods, totals: &[u64]) {
        let (day, month) = (
            totals.first().copied().unwrap_or(0),
            totals.get(1).copied().unwrap_or(0),
        );
        self.day.clone_from(&periods.day);
        self.month.clone_from(&periods.month);
        self.day_micro_usd = day;
        self.month_micro_usd = month;
        self.read_at = Some(Instant::now());
    }
}

/// Where `provider`'s SDKs send their key, for a refusal's message.
fn credential_header(provider: Provider) -> &'static str {
    match provider {
        Provider::Anthropic => "`x-api-key`",
        Provider::Gemini => "`x-goog-api-key`",
        Provider::Openai => "`Authorization: Bearer`",
        Provider::Bedrock => "`Authorization: Bearer` (a Bedrock API key)",
    }
}
