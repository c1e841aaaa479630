//! The gateway (docs/gateway.md): the providers' own endpoints, served per agent under
//! `/gateway/{agent}`, so an agent written against an official SDK reaches promptd by its base
//! URL alone. A request is read ([`promptd_core::gateway::body`]), joins a session (G3), runs
//! one step through [`Daemon::step`] with the client's body (G4: the plugins' contributions
//! spliced in), goes upstream ([`upstream`]), and its reply — whole or teed frame by frame
//! ([`tee`]) — goes back to the client and is recorded through [`Daemon::record`].
//!
//! The gateway is a front door beside the HTTP API: it calls the same two boundaries and owns
//! nothing but its upstream client and the index of conversations it has seen.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;

use promptd_core::config::gateway::{
    AgentGateway, OnPluginFailure, UpstreamConfig, DEFAULT_CLIENT_STALL_MS, DEFAULT_IDLE_TIMEOUT_MS,
};
use promptd_core::gateway::bedrock::BedrockPath;
use promptd_core::gateway::body::{ClientBody, Spans};
use promptd_core::gateway::gemini::GeminiPath;
use promptd_core::gateway::keys::Via;
use promptd_core::gateway::messages::{conversation, Conversation};
use promptd_core::gateway::record::JoinedBy;
use promptd_core::gateway::{Ingress, Provider};
use promptd_core::step::StepInput;
use promptd_core::sync::Signal;
use promptd_core::Error;

use crate::outcome::{GatewayStep, StepRequest};
use crate::{Daemon, DaemonError};

mod errors;
mod fleet;
mod index;
mod keys;
mod reply;
mod tee;
mod tools;
mod upstream;

pub use errors::GatewayRefusal;
use index::Index;
use reply::Reply;
use upstream::Upstreams;

/// The header naming the session a request joins.
pub const SESSION_HEADER: &str = "x-promptd-session";
/// The prefix of headers carrying a step's facts: `x-promptd-fact-cwd: /repo`.
pub const FACT_HEADER_PREFIX: &str = "x-promptd-fact-";
/// The largest reply body read whole (a non-streamed reply).
const MAX_REPLY_BYTES: usize = 64 << 20;

/// The gateway's state: the daemon it steps, its upstream client, and the index.
struct Gateway {
    daemon: Arc<Daemon>,
    upstreams: Upstreams,
    /// The keys at the door (G12).
    keys: keys::Keys,
    index: Mutex<Index>,
    /// What the index has read of a store other daemons share (G10).
    seen: Mutex<fleet::Seen>,
    idle: Duration,
    stall: Duration,
    /// Replies not recorded yet, by session: a session's next step waits for them (G5), so
    /// a reply's record is off the path of its answer, never out of order.
    pending: Mutex<HashMap<String, usize>>,
    /// Wakes waiting steps only when some wait: a reply is recorded once per request.
    settled: Signal,
    /// G13: what each session's later requests get back of promptd's own tool calls.
    restores: Mutex<tools::Restores>,
}

/// The longest a step waits for its session's earlier replies to be recorded.
const SETTLE_WAIT: Duration = Duration::from_secs(30);

/// A reply of `session` that is not recorded yet; dropped once it is (or cannot be).
struct Pending {
    gateway: Arc<Gateway>,
    session: String,
}

impl Pending {
    fn new(gateway: Arc<Gateway>, session: String) -> Pending {
        *crate::lock(&gateway.pending)
            .entry(session.clone())
            .or_default() += 1;
        Pending { gateway, session }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = crate::lock(&self.gateway.pending);
        if let Some(n) = pending.get_mut(&self.session) {
            *n -= 1;
            if *n == 0 {
                pending.remove(&self.session);
            }
        }
        self.gateway.settled.notify_all();
    }
}

/// Where the daemon listens, for the gateway's door (G12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Listening {
    /// On loopback or a Unix socket: without `[gateway.keys]`, gateway traffic needs no key.
    #[default]
    Local,
    /// Beyond loopback: every gateway request presents a key.
    Beyond,
}

/// The gateway's routes for `daemon`: none when `[gateway] enabled` is not set.
pub fn router(daemon: Arc<Daemon>, listening: Listening) -> Router {
    let config = daemon.config();
    if !config.gateway.enabled {
        return Router::new();
    }
    let gateway = Arc::new(Gateway {
        upstreams: Upstreams::new(&config.gateway),
        keys: keys::Keys::new(listening == Listening::Beyond),
        index: Mutex::new(Index::default()),
        seen: Mutex::new(fleet::Seen::new(now_ms())),
        pending: Mutex::new(HashMap::new()),
        settled: Signal::default(),
        restores: Mutex::new(tools::Restores::default()),
        idle: Duration::from_millis(
            config
                .gateway
                .idle_timeout_ms
                .unwrap_or(DEFAULT_IDLE_TIMEOUT_MS),
        ),
        stall: Duration::from_millis(
            config
                .gateway
                .client_stall_ms
                .unwrap_or(DEFAULT_CLIENT_STALL_MS),
        ),
        daemon,
    });
    let recovering = gateway.clone();
    let spawned = std::thread::Builder::new()
        .name("gateway-index".into())
        .spawn(move || recovering.recover());
    if let Err(e) = spawned {
        tracing::warn!("gateway: the index is not read back from the log: {e}");
    }
    let mut router = Router::new();
    for ingress in Ingress::ALL.into_iter().filter(|i| i.fixed_path()) {
        let path = format!("/gateway/{{agent}}{}", ingress.path());
        router = router.route(
            &path,
            post(
                move |state: State<Arc<Gateway>>,
                      Path(agent): Path<String>,
                      uri: Uri,
                      headers: HeaderMap,
                      body: Body| async move {
                    let path = ingress.path().to_string();
                    serve(state.0, ingress, agent, path, uri, headers, body).await
                },
            ),
        );
    }
    router
        .route("/gateway/{agent}/{*rest}", any(other_path))
        .with_state(gateway)
}

/// A path that names its model (Gemini's `/v1beta/models/{model}:generateContent`: the
/// router cannot split a segment at its `:`), else one the gateway does not serve.
async fn other_path(
    state: State<Arc<Gateway>>,
    Path((agent, rest)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = format!("/{}", rest.trim_start_matches('/'));
    if let Some(gemini) = GeminiPath::parse(&path).filter(|_| method == Method::POST) {
        return serve(state.0, gemini.ingress, agent, path, uri, headers, body).await;
    }
    // Bedrock's model id comes percent-encoded (an ARN's `/` as `%2F`): read from the raw
    // path, which the router's decoded `rest` is not, and sent upstream as the client sent it.
    let raw = (uri.path().strip_prefix("/gateway/"))
        .and_then(|p| p.split_once('/'))
        .map(|(_, rest)| format!("/{rest}"));
    if let Some(raw) = raw.filter(|_| method == Method::POST) {
        if let Some(bedrock) = BedrockPath::parse(&raw) {
            return serve(state.0, bedrock.ingress, agent, raw, uri, headers, body).await;
        }
    }
    unknown_path(uri).await
}

/// A path under `/gateway/{agent}` the gateway does not serve: a provider-shaped 404.
async fn unknown_path(uri: Uri) -> Response {
    let provider = if uri.path().contains("/models/") {
        Provider::Gemini
    } else if uri.path().contains("/model/") {
        Provider::Bedrock
    } else if uri.path().contains("/messages") {
        Provider::Anthropic
    } else {
        Provider::Openai
    };
    let served: Vec<&str> = Ingress::ALL.iter().map(|i| i.path()).collect();
    GatewayRefusal::new(
        provider,
        StatusCode::NOT_FOUND,
        "gateway_path",
        format!(
            "`{}` is not served; the gateway serves POST {} under /gateway/{{agent}}",
            uri.path(),
            served.join(", ")
        ),
    )
    .into_response()
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    crate::now_ms()
}

/// What promptd added to the request's latency, as a `server-timing` header: reading the
/// body, the step's plugins and assembly, and the durable record of the request.
struct Timing {
    parse: Duration,
    step: Duration,
    record: Duration,
}

impl Timing {
    fn header(&self) -> HeaderValue {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let total = self.parse + self.step + self.record;
        let text = format!(
            "parse;dur={:.3}, step;dur={:.3}, record;dur={:.3}, promptd;dur={:.3}",
            ms(self.parse),
            ms(self.step),
            ms(self.record),
            ms(total)
        );
        HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("promptd"))
    }
}

/// A request read and checked, ready for its step.
#[derive(Clone)]
struct Read {
    agent: String,
    settings: AgentGateway,
    upstream_name: String,
    upstream: UpstreamConfig,
    client_body: String,
    spans: Spans,
    conversation: Conversation,
    streamed: bool,
    previous_response: Option<String>,
    model: Option<String>,
    /// The names of the client's tools.
    client_tools: Vec<String>,
    /// The gateway key that admitted it (G12).
    key: Option<keys::Admitted>,
    /// G13: 0 for the client's request; `n` for the n-th round of promptd's own tool calls
    /// within it (its body the client's with the rounds before appended).
    round: u32,
}

/// Gemini's stream is read as server-sent events: without `alt=sse` it comes as one JSON
/// array, which the gateway does not fold, so that call is refused.
fn sse_only(ingress: Ingress, path: &str, uri: &Uri) -> Result<(), GatewayRefusal> {
    let sse = (uri.query().unwrap_or("").split('&')).any(|p| p == "alt=sse");
    match ingress == Ingress::StreamGenerateContent && !sse {
        true => Err(GatewayRefusal::new(
            ingress.provider(),
            StatusCode::BAD_REQUEST,
            "stream_not_sse",
            format!("`{path}` is served as server-sent events only: add `?alt=sse`"),
        )),
        false => Ok(()),
    }
}

/// Bedrock's signature rule (G9): the client's SigV4 signature covers the host, path and body
/// the gateway changes, so it is never forwarded; the request goes re-signed with the
/// upstream's configured credentials, or with its configured API key, else it is refused
/// before anything is read or recorded.
fn signature_rule(gateway: &Gateway, ingress: Ingress, agent: &str) -> Result<(), GatewayRefusal> {
    if ingress.provider() != Provider::Bedrock {
        return Ok(());
    }
    let config = gateway.daemon.config();
    let upstream = match config.gateway.agent(&config, agent) {
        Ok(Some(settings)) => (settings.upstreams.get(&Provider::Bedrock))
            .and_then(|name| Some((name.clone(), config.gateway.upstream.get(name)?.clone()))),
        _ => None,
    };
    // No agent or no upstream: `read` refuses it, naming which.
    let Some((name, upstream)) = upstream else {
        return Ok(());
    };
    let refuse = |message: String| {
        Err(GatewayRefusal::new(
            Provider::Bedrock,
            StatusCode::FORBIDDEN,
            "bedrock_signature",
            message,
        ))
    };
    match upstream::aws_credentials(&upstream) {
        Some(Ok(_)) => Ok(()),
        Some(Err(why)) => refuse(format!(
            "upstream `{name}` cannot re-sign the request (SigV4): {why}"
        )),
        None if upstream.api_key_env.is_some() => Ok(()),
        None => refuse(format!(
            "the client's SigV4 signature covers the body, host and path the gateway changes, so it is never forwarded, and upstream `{name}` has no credentials to re-sign with: set [gateway.upstream.{name}] aws_access_key_id_env, aws_secret_access_key_env and aws_region (or api_key_env for a Bedrock API key)"
        )),
    }
}

/// Serves one request to `ingress`; `path` is what goes upstream (after the base URL, before
/// the client's query).
async fn serve(
    gateway: Arc<Gateway>,
    ingress: Ingress,
    agent: String,
    path: String,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let provider = ingress.provider();
    let started = Instant::now();
    if let Err(refusal) = sse_only(ingress, &path, &uri) {
        return refusal.into_response();
    }
    // The door comes first (G12): a client without a valid key learns nothing of the config.
    let door = match gateway
        .keys
        .door(&gateway.daemon.config(), provider, &headers)
    {
        Ok(door) => door,
        Err(refusal) => return refusal.into_response(),
    };
    if let Err(refusal) = signature_rule(&gateway, ingress, &agent) {
        return refusal.into_response();
    }
    let model = (GeminiPath::parse(&path).map(|g| g.model))
        .or_else(|| BedrockPath::parse(&path).map(|b| b.model));
    let read = match read(&gateway, ingress, agent, model, door, body).await {
        Ok(read) => read,
        Err(refusal) => return refusal.into_response(),
    };
    // A gateway key sent as the provider's credential stands in for it: never forwarded
    // (the upstream's configured credential goes instead, G12).
    let mut headers = headers;
    if let Some(keys::Admitted {
        via: Via::Credential(name),
        ..
    }) = &read.key
    {
        headers.remove(*name);
    }
    let parse = started.elapsed();
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let step_started = Instant::now();
    // A token count is no step: it counts what a step would send, and records nothing.
    if ingress == Ingress::CountTokens {
        return count_tokens(gateway, read, &path_and_query, &headers, parse).await;
    }
    let stepped = {
        let gateway = gateway.clone();
        let headers = headers.clone();
        let read = read.clone();
        tokio::task::spawn_blocking(move || gateway.step(ingress, &headers, read)).await
    };
    let stepped = match stepped {
        Ok(stepped) => stepped,
        Err(e) => {
            return GatewayRefusal::new(
                provider,
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("the step did not finish: {e}"),
            )
            .into_response()
        }
    };
    let (session, upstream_body, usage_added, degraded, append) = match stepped {
        // G13: the agent has tools promptd runs itself: its loop answers the client.
        Ok(Stepped::Spliced {
            session,
            body,
            append,
            own_tools,
            restored_body,
            usage_added,
            ..
        }) if !own_tools.is_empty() => {
            let timing = Timing {
                parse,
                step: step_started.elapsed().saturating_sub(append),
                record: append,
            };
            let base = restored_body.unwrap_or_else(|| read.client_body.clone());
            let run = tools::Loop {
                gateway,
                ingress,
                session,
                read,
                headers,
                path_and_query,
                own: own_tools,
                base,
                usage_added,
                timing,
            };
            return run.run(body).await;
        }
        Ok(Stepped::Spliced {
            session,
            body,
            usage_added,
            degraded,
            append,
            ..
        }) => (Some(session), body, usage_added, degraded, append),
        Ok(Stepped::Degraded(code)) => (
            None,
            read.client_body.clone(),
            false,
            Some(code.to_string()),
            Duration::ZERO,
        ),
        Err(refusal) => return refusal.into_response(),
    };
    let step = step_started.elapsed().saturating_sub(append);
    // From here until its reply is recorded, the session's next step waits.
    let pending = session
        .as_ref()
        .map(|s| Pending::new(gateway.clone(), s.clone()));
    let reply = Reply {
        gateway,
        ingress,
        session,
        scope: index::scope(&read.agent, read.key.as_ref().map(|k| k.name.as_str())),
        key: read.key.as_ref().map(|k| k.name.clone()),
        sent_at: now_ms(),
        degraded,
        _pending: pending,
        timing: Timing {
            parse,
            step,
            record: append,
        },
    };
    let sent = reply
        .gateway
        .upstreams
        .send(
            &read.upstream,
            &path_and_query,
            &headers,
            Bytes::from(upstream_body),
        )
        .await;
    match sent {
        Ok(response) => reply.answer(response, usage_added).await,
        Err(failure) => {
            tracing::warn!(agent = %read.agent, upstream = %read.upstream_name, "gateway: upstream gave no reply");
            let refusal = failure.refusal(provider, &read.upstream_name);
            // The request is in the log: its missing reply is recorded with why (G2).
            let reason = refusal.message.clone();
            tokio::spawn(async move { reply.record(Value::Null, Some(&reason)).await });
            refusal.into_response()
        }
    }
}

/// A token count (G6): the client's body with what the agent's plugins would add now spliced
/// in as a step's would be, so the count includes it; forwarded, recorded nowhere. When the
/// plugins cannot say, the body goes as it came, marked degraded.
async fn count_tokens(
    gateway: Arc<Gateway>,
    read: Read,
    path_and_query: &str,
    headers: &HeaderMap,
    parse: Duration,
) -> Response {
    let provider = Provider::Anthropic;
    let started = Instant::now();
    let counted = {
        let gateway = gateway.clone();
        let headers = headers.clone();
        tokio::task::spawn_blocking(move || {
            let body = gateway.count_body(&headers, &read);
            (read, body)
        })
        .await
    };
    let Ok((read, body)) = counted else {
        return GatewayRefusal::new(
            provider,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the token count's splice did not finish",
        )
        .into_response();
    };
    let (body, degraded) = match body {
        Ok(body) => (body, None),
        Err(code) => (read.client_body.clone(), Some(code.to_string())),
    };
    let step = started.elapsed();
    let sent = gateway
        .upstreams
        .send(&read.upstream, path_and_query, headers, Bytes::from(body))
        .await;
    match sent {
        Ok(response) => {
            let reply = Reply {
                gateway,
                ingress: Ingress::CountTokens,
                session: None,
                scope: String::new(),
                key: None,
                sent_at: now_ms(),
                degraded,
                _pending: None,
                timing: Timing {
                    parse,
                    step,
                    record: Duration::ZERO,
                },
            };
            reply.answer(response, false).await
        }
        Err(failure) => failure
            .refusal(provider, &read.upstream_name)
            .into_response(),
    }
}

/// The step's facts: `model`, the model the client named, and each `x-promptd-fact-NAME`
/// header's value.
fn facts(headers: &HeaderMap, model: Option<String>) -> BTreeMap<String, String> {
    let mut facts = BTreeMap::new();
    if let Some(model) = model {
        facts.insert("model".to_string(), model);
    }
    for (name, value) in headers {
        if let Some(fact) = name.as_str().strip_prefix(FACT_HEADER_PREFIX) {
            if let Ok(value) = value.to_str() {
                facts.insert(fact.to_string(), value.to_string());
            }
        }
    }
    facts
}

/// Reads the client's body and what the step needs of it.
async fn read(
    gateway: &Gateway,
    ingress: Ingress,
    agent: String,
    path_model: Option<String>,
    door: keys::Door,
    body: Body,
) -> Result<Read, GatewayRefusal> {
    let provider = ingress.provider();
    let config = gateway.daemon.config();
    let refuse =
        |status, code, message: String| GatewayRefusal::new(provider, status, code, message);
    let settings = match config.gateway.agent(&config, &agent) {
        Ok(Some(settings)) => settings,
        Ok(None) | Err(_) => {
            let served: Vec<&str> = config
                .agents
                .keys()
                .filter(|a| matches!(config.gateway.agent(&config, a), Ok(Some(_))))
                .map(String::as_str)
                .collect();
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "unknown_agent",
                format!(
                    "no agent `{agent}` is served by the gateway (served: {}); an agent is served when it or its chain has an [agents.NAME.gateway] table",
                    if served.is_empty() { "none".to_string() } else { served.join(", ") }
                ),
            ));
        }
    };
    let Some(upstream_name) = settings.upstreams.get(&provider).cloned() else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "no_upstream",
            format!(
                "agent `{agent}` has no {} upstream: set [agents.{agent}.gateway] {} = \"NAME\" for a [gateway.upstream.NAME] whose provider is {}",
                provider.as_str(),
                provider.as_str(),
                provider.as_str()
            ),
        ));
    };
    let Some(upstream) = config.gateway.upstream.get(&upstream_name).cloned() else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "no_upstream",
            format!("no [gateway.upstream.{upstream_name}] table"),
        ));
    };
    // The key's lists and limits, before the body is read (G12).
    let store = gateway.daemon.sessions.store.clone();
    let key = (gateway.keys)
        .admit(&config, &store, provider, door, &agent, &upstream_name)
        .await?;
    if let Some(keys::Admitted {
        via: Via::Credential(header),
        name,
    }) = &key
    {
        let has_own = upstream.api_key_env.is_some()
            || (provider == Provider::Bedrock && upstream.aws_access_key_id_env.is_some());
        if !has_own {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                "key_no_upstream_credential",
                format!(
                    "gateway key `{name}` came in `{header}`, where the provider's own key goes, and upstream `{upstream_name}` has no api_key_env to send instead: set [gateway.upstream.{upstream_name}] api_key_env, or send the gateway key as `x-promptd-key` beside the provider's key"
                ),
            ));
        }
    }
    let limit = config.gateway.max_body_bytes();
    let bytes = match http_body_util::Limited::new(body, limit as usize)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let too_large = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            return Err(if too_large {
                refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("the request body is over {limit} bytes ([gateway] max_body_bytes)"),
                )
            } else {
                refuse(
                    StatusCode::BAD_REQUEST,
                    "body_unreadable",
                    format!("the request body could not be read: {e}"),
                )
            });
        }
    };
    let invalid = |e: promptd_core::gateway::GatewayError| {
        refuse(StatusCode::BAD_REQUEST, e.code(), e.to_string())
    };
    let parsed = ClientBody::parse(&bytes).map_err(invalid)?;
    parsed.check(ingress).map_err(invalid)?;
    let streamed = parsed.streamed() || ingress.streams();
    let conversation = conversation(ingress, &parsed);
    let previous_response = parsed
        .decode::<String>("previous_response_id")
        .ok()
        .flatten();
    // Gemini names the model in the path, not the body.
    let model = path_model.or_else(|| parsed.model());
    // Read out of the body only when a plugin reads them (a large tools list costs a scan).
    let client_tools = match gateway.daemon.registry().reads_input(|i| i.client_tools) {
        true => promptd_core::gateway::splice::tool_names(ingress, &parsed),
        false => Vec::new(),
    };
    let spans = parsed.spans();
    drop(parsed);
    // UTF-8, checked by the parse.
    let client_body = String::from_utf8(bytes.to_vec()).map_err(|_| {
        refuse(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the body is not UTF-8".into(),
        )
    })?;
    Ok(Read {
        agent,
        settings,
        upstream_name,
        upstream,
        client_body,
        spans,
        conversation,
        streamed,
        previous_response,
        model,
        client_tools,
        key,
        round: 0,
    })
}

/// What a step made of a gateway request.
enum Stepped {
    /// The session, the upstream body, and whether usage was asked for.
    Spliced {
        session: String,
        body: String,
        usage_added: bool,
        /// Why the plugins' contributions were left out (G6: they failed, and the agent
        /// forwards), when they were.
        degraded: Option<String>,
        /// How long the request's record took, within the step.
        append: Duration,
        /// G13: the tools promptd runs itself, spliced in (none: the reply goes as it came).
        own_tools: Vec<String>,
        /// G13: the client's body with promptd's earlier calls and results put back, when
        /// the step took that instead of the body the client sent.
        restored_body: Option<String>,
    },
    /// The step failed and the agent forwards: the client's body goes as it came.
    Degraded(&'static str),
}

impl Gateway {
    /// A token count's body (G6): the agent's sections and runtime context as its plugins give
    /// them now, for a first step with the request's facts, spliced in; the code of why not
    /// when they cannot be had (the body then goes as it came).
    fn count_body(&self, headers: &HeaderMap, read: &Read) -> Result<String, &'static str> {
        let daemon = &self.daemon;
        let plan = daemon.agent_settings(&read.agent).map_err(|e| e.code())?;
        let mut step = promptd_core::step::step_for(
            &plan,
            "count_tokens",
            1,
            facts(headers, read.model.clone()),
        );
        // What a first step of this conversation would show a world 0.3.0 plugin.
        let users: Vec<&promptd_core::conversation::content::Content> =
            (read.conversation.messages.iter())
                .filter_map(|m| match m {
                    promptd_core::conversation::Message::User { content, .. } => Some(content),
                    _ => None,
                })
                .collect();
        step.inputs = promptd_core::plugin::model::StepInputs {
            last_user_message: users.last().map(|c| c.text()),
            model: read.model.clone(),
            client_tools: Some(read.client_tools.clone()),
            turn_count: Some(users.len() as u64),
        };
        // Data blocks are keyed per session (T8); a count has none, and a key's length is
        // the same whatever it is.
        let secret: Arc<str> = Arc::from("count_tokens");
        let assembly = promptd_core::step::assemble(&daemon.registry(), &plan, &step, &secret)
            .map_err(|e| e.code())?;
        // G13: tools promptd runs itself are counted as a step sends them; a plugin's tool
        // (no runner) makes the step refuse, so the count cannot say.
        if (assembly.tools.iter()).any(|t| daemon.tool_runner(&t.name).is_none()) {
            return Err("gateway_plugin_tools");
        }
        let contributions = promptd_core::gateway::splice::Contributions {
            system: assembly.system.clone(),
            runtime_context: assembly.runtime_context.clone(),
            tools: (assembly.tools.iter())
                .map(|t| promptd_core::conversation::ToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: std::sync::Arc::clone(&t.parameters),
                    defer: None,
                })
                .collect(),
        };
        let body = ClientBody::with_spans(&read.client_body, read.spans.clone());
        let splice = promptd_core::gateway::splice::plan(
            Ingress::CountTokens,
            &body,
            &contributions,
            &read.settings.splice,
        )
        .map_err(|e| e.code())?;
        String::from_utf8(splice.apply(read.client_body.as_bytes())).map_err(|_| "invalid_body")
    }

    /// Reads back the conversation each recent gateway session reached (G3), so a daemon that
    /// restarted joins a client's next request to its session by prefix.
    fn recover(&self) {
        let daemon = &self.daemon;
        let config = daemon.config();
        let sessions = match daemon.sessions("", index::RECOVERED) {
            Ok(sessions) => sessions,
            Err(e) => {
                tracing::warn!(code = e.code(), "gateway: the index is not read back: {e}");
                return;
            }
        };
        let mut read = 0;
        for summary in sessions {
            if !matches!(config.gateway.agent(&config, &summary.agent), Ok(Some(_))) {
                continue;
            }
            let Ok(events) = daemon.session_events(&summary.id) else {
                continue;
            };
            let last = events
                .iter()
                .rev()
                .find(|e| e.kind == promptd_core::store::EventKind::GatewayRequest);
            let decoded = last.and_then(|e| promptd_core::session::decode(&summary.id, e).ok());
            let Some(promptd_core::session::log::Body::GatewayRequest(record)) = decoded else {
                continue;
            };
            let scope = index::scope(&summary.agent, record.key.as_deref());
            crate::lock(&self.index).recovered(&scope, &record.digest, &summary.id);
            read += 1;
        }
        tracing::info!(sessions = read, "gateway: index read back from the log");
    }

    /// Whether `session` is `key`'s: its last `gateway/request` was sent with that key (or
    /// with none, when `key` is none). A session with no gateway request yet is anyone's.
    fn owned_by(&self, session: &str, key: Option<&str>) -> bool {
        // Without keys in play every session is the one tenant's.
        if key.is_none() && self.daemon.config().gateway.keys.is_empty() {
            return true;
        }
        match self.daemon.gateway_owner(session) {
            Ok(Some(owner)) => owner.as_deref() == key,
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Waits until `session`'s earlier replies are recorded (at most [`SETTLE_WAIT`]).
    fn settle(&self, session: &str) {
        let pending = crate::lock(&self.pending);
        let waited = self
            .settled
            .wait_timeout_while(pending, SETTLE_WAIT, |p| p.contains_key(session));
        drop(waited);
    }

    /// Joins the request's session and runs its step (blocking).
    fn step(
        &self,
        ingress: Ingress,
        headers: &HeaderMap,
        read: Read,
    ) -> Result<Stepped, GatewayRefusal> {
        let provider = ingress.provider();
        let refuse =
            |status, code, message: String| GatewayRefusal::new(provider, status, code, message);
        let daemon = &self.daemon;
        let Read {
            agent,
            settings,
            upstream_name,
            client_body,
            spans,
            conversation,
            previous_response,
            model,
            client_tools,
            key,
            round,
            ..
        } = read;
        let key = key.map(|k| k.name);
        // A key's sessions are its own (G12): joined by prefix or response id only among
        // them, and one named by header only when the key sent it.
        let scope = index::scope(&agent, key.as_deref());
        let named = headers
            .get(SESSION_HEADER)
            .map(|v| v.to_str().unwrap_or("").to_string());
        let (session, joined_by) = match named {
            Some(id) => match daemon.agent_of(&id) {
                Ok(a) if a == agent && !self.owned_by(&id, key.as_deref()) => {
                    return Err(refuse(
                        StatusCode::NOT_FOUND,
                        "unknown_session",
                        format!("no session `{id}` ({SESSION_HEADER}) of this key"),
                    ))
                }
                Ok(a) if a == agent => (id, JoinedBy::Header),
                Ok(a) => {
                    return Err(refuse(
                        StatusCode::NOT_FOUND,
                        "unknown_session",
                        format!(
                            "session `{id}` ({SESSION_HEADER}) is agent `{a}`'s, not `{agent}`'s"
                        ),
                    ))
                }
                Err(_) => {
                    return Err(refuse(
                        StatusCode::NOT_FOUND,
                        "unknown_session",
                        format!("no session `{id}` ({SESSION_HEADER})"),
                    ))
                }
            },
            None => {
                // G10: what other daemons recorded since, so their sessions are joined too.
                self.catch_up();
                let index = crate::lock(&self.index);
                let by_response = previous_response
                    .as_deref()
                    .and_then(|id| index.response(&scope, id));
                let by_prefix = || index.prefix(&scope, &conversation.digests);
                match (by_response, by_prefix()) {
                    (Some(s), _) => (s, JoinedBy::PreviousResponse),
                    (None, Some(s)) => (s, JoinedBy::Prefix),
                    (None, None) => {
                        drop(index);
                        let id = daemon.create_session(&agent).map_err(|e| {
                            refuse(
                                StatusCode::SERVICE_UNAVAILABLE,
                                e.code(),
                                format!("no session could be created: {e}"),
                            )
                        })?;
                        (id, JoinedBy::New)
                    }
                }
            }
        };
        self.settle(&session);
        // The index holds the conversation as the client sends it (G3): its later requests
        // lack what is put back below.
        let digest = conversation.digest(conversation.messages.len()).to_string();
        // G13: promptd's own calls and results the client's history lacks, put back.
        let restored = if round == 0 {
            let held = crate::lock(&self.restores).of(&session);
            tools::restored(ingress, client_body, spans, conversation, &held)
                .map_err(|e| refuse(StatusCode::BAD_REQUEST, e.code(), e.to_string()))?
        } else {
            tools::Restored {
                body: client_body,
                spans,
                conversation,
                edits: Vec::new(),
                again: None,
            }
        };
        let tools::Restored {
            body: client_body,
            spans,
            conversation,
            edits: restored,
            again: restored_body,
        } = restored;
        let facts = facts(headers, model.clone());
        let request = StepRequest {
            gateway: Some(Box::new(GatewayStep {
                ingress,
                upstream: upstream_name,
                model,
                key: key.clone(),
                joined_by,
                client_body,
                spans,
                conversation,
                splice: settings.splice.clone(),
                on_plugin_failure: settings.on_plugin_failure,
                degraded: None,
                round,
                restored,
            })),
            ..StepRequest::new(
                session.clone(),
                StepInput {
                    facts,
                    client_tools: Some(client_tools),
                    ..StepInput::default()
                },
                // The client's body carries its own model settings: promptd's step
                // checks none of a provider's (it renders nothing of its own for it).
                promptd_core::formats::Format::Neutral,
            )
        };
        match daemon.step(request) {
            Ok(outcome) => {
                crate::lock(&self.index).reached(&scope, &digest, &session);
                let record = outcome.gateway.as_deref();
                let usage_added = record.is_some_and(|g| g.splice.usage_added);
                let degraded = record.and_then(|g| g.degraded.clone());
                let own_tools = record
                    .map(|g| g.splice.own_tools.clone())
                    .unwrap_or_default();
                Ok(Stepped::Spliced {
                    session,
                    usage_added,
                    degraded,
                    append: outcome.append,
                    body: outcome.body.into_string(),
                    own_tools,
                    restored_body,
                })
            }
            Err(e) => self.failed(provider, &agent, &settings, &e),
        }
    }

    /// What a failed step does: refuse what the client must hear of (an overflowing budget,
    /// a config error, a store that cannot record), else forward by the agent's
    /// `on_plugin_failure`.
    fn failed(
        &self,
        provider: Provider,
        agent: &str,
        settings: &AgentGateway,
        e: &DaemonError,
    ) -> Result<Stepped, GatewayRefusal> {
        let code = e.code();
        let refuse = |status| Err(GatewayRefusal::new(provider, status, code, e.to_string()));
        match e {
            // A review hook's rejection stands whatever the policy: forwarding would send
            // what it rejected.
            DaemonError::Core(Error::ContextOverflow(_) | Error::ReviewRejected { .. })
            | DaemonError::Gateway(_) => refuse(StatusCode::BAD_REQUEST),
            DaemonError::GatewayPluginTools { .. } => refuse(StatusCode::INTERNAL_SERVER_ERROR),
            DaemonError::Core(Error::Store(_)) => refuse(StatusCode::SERVICE_UNAVAILABLE),
            DaemonError::Core(Error::PluginCall { .. })
            | DaemonError::Loading { .. }
            | DaemonError::PluginSetUnavailable { .. }
                if settings.on_plugin_failure == OnPluginFailure::Refuse =>
            {
                refuse(StatusCode::INTERNAL_SERVER_ERROR)
            }
            _ => {
                tracing::warn!(
                    agent,
                    code,
                    "gateway: the step failed; forwarding the client's body as it came: {e}"
                );
                Ok(Stepped::Degraded(code))
            }
        }
    }
}
