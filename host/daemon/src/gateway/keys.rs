//! Gateway keys at the door (G12): the key a request presents is found by its digest, held to
//! the agents and upstreams it may use, and to its rate and spend limits, before the body is
//! read. The config is read at each request, so keys are added, rotated and revoked without a
//! restart; a key's spend is counted in the store when each reply is recorded.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, HeaderValue, StatusCode};

use promptd_core::config::Config;
use promptd_core::gateway::keys::{self, Counts, KeyIndex, NotAllowed, Periods, SpendRead, Via};
use promptd_core::gateway::Provider;
use promptd_core::store::SessionStore;

use super::GatewayRefusal;

/// The gateway's keys: the index of the config in force, and each key's counts.
pub(super) struct Keys {
    /// Whether the daemon listens beyond loopback: then every request presents a key.
    exposed: bool,
    /// The index, with the config it was built from.
    index: Mutex<Option<(Arc<Config>, Arc<KeyIndex>)>>,
    counts: Arc<Mutex<Counts>>,
}

/// A request a key admitted.
#[derive(Debug, Clone)]
pub(super) struct Admitted {
    /// The key's name.
    pub name: String,
    /// Where the client sent it.
    pub via: Via,
}

/// Who a request is, before its agent is known: its key found by digest (G12).
pub(super) enum Door {
    /// No key needed and none presented.
    Open,
    /// The key presented, found.
    Admit(Admitted),
}

impl Keys {
    pub(super) fn new(exposed: bool) -> Keys {
        Keys {
            exposed,
            index: Mutex::new(None),
            counts: Arc::new(Mutex::new(Counts::default())),
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

    /// Admits `door`'s key to `agent` through `upstream` by its lists and its limits (the
    /// request counted in its minute), or refuses it in the provider's shape. `Ok(None)`: the
    /// door was open (no key needed, none presented).
    pub(super) async fn admit(
        &self,
        config: &Arc<Config>,
        store: &Arc<dyn SessionStore>,
        provider: Provider,
        door: Door,
        agent: &str,
        upstream: &str,
    ) -> Result<Option<Admitted>, GatewayRefusal> {
        let admitted = match door {
            Door::Open => return Ok(None),
            Door::Admit(admitted) => admitted,
        };
        let index = self.index(config);
        let name = admitted.name.as_str();
        // Revoked between the door and here (a reload): as at the door.
        let Some(key) = index.get(name) else {
            return Err(GatewayRefusal::new(
                provider,
                StatusCode::UNAUTHORIZED,
                "key_invalid",
                format!("gateway key `{name}` was revoked"),
            ));
        };
        let refuse = |status, code, message: String| {
            Err(GatewayRefusal::new(provider, status, code, message))
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
        let periods = Periods::at(crate::now_ms());
        if key.usd_per_day.is_some() || key.usd_per_month.is_some() {
            self.read_spend(store, name, &periods, provider).await?;
        }
        let admitted_now = crate::lock(&self.counts).admit(key, name, &periods);
        match admitted_now {
            Ok(()) => Ok(Some(admitted)),
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

    /// The door, first of all (G12): whether a key is needed, and the one presented found by
    /// its digest; a client without a valid key learns nothing of the config.
    pub(super) fn door(
        &self,
        config: &Arc<Config>,
        provider: Provider,
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
        let Some((name, _)) = index.find(presented.token) else {
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
        Ok(Door::Admit(Admitted {
            name: name.to_string(),
            via: presented.via,
        }))
    }

    /// Reads the key's spend of `periods` from the store when it was not read for them (the
    /// request waits for it), or, on a shared store, when it is over a second old (read in
    /// the background: the request is judged with the count held).
    async fn read_spend(
        &self,
        store: &Arc<dyn SessionStore>,
        name: &str,
        periods: &Periods,
        provider: Provider,
    ) -> Result<(), GatewayRefusal> {
        let now = crate::now_ms();
        let need = crate::lock(&self.counts).spend_read(name, periods, now, store.is_shared());
        if need == SpendRead::No {
            return Ok(());
        }
        let read = {
            let (store, name, periods) = (store.clone(), name.to_string(), periods.clone());
            tokio::task::spawn_blocking(move || store.spend(&name, &[&periods.day, &periods.month]))
        };
        if need == SpendRead::Background {
            let (counts, name, periods) = (self.counts.clone(), name.to_string(), periods.clone());
            tokio::spawn(async move {
                let totals = read.await.ok().and_then(Result::ok);
                crate::lock(&counts).read(&name, &periods, totals.as_deref(), crate::now_ms());
            });
            return Ok(());
        }
        match read.await {
            Ok(Ok(totals)) => {
                crate::lock(&self.counts).read(name, periods, Some(&totals), crate::now_ms());
                Ok(())
            }
            Ok(Err(e)) => Err(GatewayRefusal::new(
                provider,
                StatusCode::SERVICE_UNAVAILABLE,
                "key_spend_unavailable",
                format!("gateway key `{name}`'s spend cannot be read, so its limit cannot be checked: {e}"),
            )),
            Err(e) => Err(GatewayRefusal::new(
                provider,
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("reading gateway key `{name}`'s spend did not finish: {e}"),
            )),
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
        crate::lock(&self.counts).read(name, &periods, Some(&totals), crate::now_ms());
        Ok((
            totals.first().copied().unwrap_or(0),
            totals.get(1).copied().unwrap_or(0),
        ))
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
