//! The HTTP API (axum) over [`Daemon`]. Every error is a JSON body
//! `{"error": {"code", "message"}}` with a 4xx/5xx status (L5).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};

use promptd_core::conversation::Message;
use promptd_core::formats::{self, Format};
use promptd_core::store::{Event, StoreError};
use promptd_core::Error;
use sha2::{Digest, Sha256};

use crate::events::RegistryEvent;
use crate::{Daemon, DaemonError, StepInput};

/// A body declared larger than the limit (`[limits] max_body_mb`, read at start) but at most
/// this is read and dropped before the
/// 413 answer: a client still sending it would otherwise get a broken pipe instead of the error.
/// Larger ones are answered at once and the connection is closed.
const DRAIN_MAX: u64 = 16 << 20;

struct AppState {
    daemon: Arc<Daemon>,
    token: Option<String>,
    /// `[limits] max_body_mb` when the daemon started, in bytes.
    max_body: usize,
}

/// The router for `daemon`; `token`, when set, is required as `Authorization: Bearer …` on
/// every route but `/v1/health`.
pub fn router(daemon: Arc<Daemon>, token: Option<String>) -> Router {
    let max_body = daemon.config().max_body_bytes();
    let state = Arc::new(AppState {
        daemon,
        token,
        max_body,
    });
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/plugins", get(plugins))
        .route("/v1/plugins/reload", post(reload))
        .route("/v1/plugins/{id}", delete(unload))
        .route("/v1/plugins/{id}/enable", post(enable))
        .route("/v1/sessions", post(create_session))
        .route("/v1/sessions/{id}/steps", post(step))
        .route("/v1/sessions/{id}/messages", post(record_message))
        .route("/v1/sessions/{id}/compact", post(compact))
        .route("/v1/sessions/{id}/usage", get(usage_report))
        .route("/v1/sessions/{id}/events", get(session_events))
        .route("/v1/sessions/{id}/steps/{n}/request", get(step_request))
        .route("/v1/events", get(registry_events))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            refuse_oversized,
        ))
        .with_state(state)
}

/// An error response.
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

/// The HTTP status of a core error. Exhaustive on purpose: a new variant must be given one.
fn core_status(e: &Error) -> StatusCode {
    match e {
        Error::AtMessage { source, .. } => core_status(source),
        Error::BadRequest(_) | Error::InvalidAgent { .. } => StatusCode::BAD_REQUEST,
        Error::UnknownSession(_) | Error::UnknownStep { .. } | Error::UnknownPlugin(_) => {
            StatusCode::NOT_FOUND
        }
        Error::PluginCall { .. } | Error::UnknownShownTool { .. } => StatusCode::BAD_GATEWAY,
        Error::Store(StoreError::Conflict { .. }) => StatusCode::CONFLICT,
        Error::Store(StoreError::Corrupt { .. } | StoreError::Backend { .. })
        | Error::Engine { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        // Well-formed input that cannot be assembled or validated.
        Error::NotAComponent { .. }
        | Error::CompileLimit { .. }
        | Error::WrongWorld { .. }
        | Error::DeclareFailed { .. }
        | Error::Quarantined { .. }
        | Error::ConfigParse { .. }
        | Error::ConfigInvalid(_)
        | Error::ToolOrderDuplicate(_)
        | Error::ToolOrderMissingRest
        | Error::InvalidName { .. }
        | Error::DeclarationLimit { .. }
        | Error::ReservedToolName { .. }
        | Error::InvalidSchema { .. }
        | Error::InvalidScope { .. }
        | Error::DuplicateName { .. }
        | Error::Conflict { .. }
        | Error::DuplicatePlugin(_)
        | Error::MultipleComplete(_)
        | Error::UnknownToolOrderName { .. }
        | Error::MalformedReference { .. }
        | Error::UnknownVariable { .. }
        | Error::UnknownToolCall(_)
        | Error::ToolCallAnswered(_)
        | Error::OpenToolCalls(_)
        | Error::ToolResultsFirst { .. }
        | Error::EmptyMessage(_)
        | Error::ContextOverflow(_)
        | Error::InvalidCompaction(_)
        | Error::InvalidBlock { .. }
        | Error::UnsupportedBlock { .. }
        | Error::InvalidArguments { .. }
        | Error::ReplyBeforeStep
        | Error::MissingModelSetting { .. }
        | Error::VariableAbsent { .. } => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// The HTTP status of a daemon error; exhaustive like [`core_status`].
fn status(e: &DaemonError) -> StatusCode {
    match e {
        DaemonError::Core(e) => core_status(e),
        DaemonError::PluginDir { .. }
        | DaemonError::PluginRead { .. }
        | DaemonError::ConfigRead { .. }
        | DaemonError::Watch { .. }
        | DaemonError::WatchThread(_) => StatusCode::INTERNAL_SERVER_ERROR,
        DaemonError::PluginFileName { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        DaemonError::Loading { .. } => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl From<DaemonError> for ApiError {
    fn from(e: DaemonError) -> Self {
        ApiError::new(status(&e), e.code(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, json_body(&body)).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// A JSON response from pre-serialized bytes (sorted keys: stable).
fn json_bytes(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn json_body(v: &Value) -> Response {
    json_bytes(StatusCode::OK, v.to_string())
}

/// Runs blocking daemon work (plugin calls, SQLite) off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DaemonError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("worker failed: {e}"),
        )),
    }
}

/// Parses a JSON body strictly, with errors that name the problem.
pub(crate) fn parse_body<T: for<'de> Deserialize<'de>>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        let code = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "bad_request"
        };
        ApiError::new(
            r.status(),
            code,
            format!(
                "{} (limit {limit} bytes: limits.max_body_mb)",
                r.body_text()
            ),
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("invalid JSON body: {e}"),
        )
    })
}

async fn auth(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        if request.uri().path() != "/v1/health" {
            let given = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes())
                .and_then(|v| v.strip_prefix(b"Bearer "));
            if !given.is_some_and(|given| same_secret(given, token.as_bytes())) {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "this daemon requires `Authorization: Bearer <token>`",
                )
                .into_response();
            }
        }
    }
    next.run(request).await
}

/// Compares a presented token with the expected one in time that does not depend on where
/// they differ (or on their lengths): both are hashed, and the digests compared in full.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(given), Sha256::digest(expected));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Refuses a body whose declared length is over the limit before any handler runs.
/// (Chunked bodies without a length still meet the limit in the body extractors.)
async fn refuse_oversized(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let limit = state.max_body;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(length) = declared.filter(|&n| n > limit as u64) else {
        return next.run(request).await;
    };
    let mut response = ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is {length} bytes (limit {limit} bytes: limits.max_body_mb)"),
    )
    .into_response();
    if length <= limit as u64 + DRAIN_MAX {
        let mut body = request.into_body().into_data_stream();
        while let Some(Ok(_)) = body.next().await {}
    } else {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route {} {}", request.method(), request.uri().path()),
    )
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// `{"status": "ok", "plugins": N, "version"}` once the first load is done; before,
/// `{"status": "loading", "loaded": K, "total": N, …}` (steps wait for it). A store that can
/// no longer keep what it acknowledges (Q12) makes it 503 `{"status": "error", "error":
/// {"code", "message"}, …}`, whatever the loading: the daemon cannot do its job.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let plugins = state.daemon.registry().len();
    let mut body = serde_json::to_value(state.daemon.readiness()).unwrap_or_default();
    let mut status = StatusCode::OK;
    // One stat per file of the store, so it runs here rather than on the blocking pool.
    if let Err(e) = state.daemon.store.health() {
        status = StatusCode::SERVICE_UNAVAILABLE;
        body = json!({"status": "error", "error": {"code": e.code(), "message": e.to_string()}});
    }
    body["plugins"] = json!(plugins);
    body["version"] = json!(env!("CARGO_PKG_VERSION"));
    let mut response = json_body(&body);
    *response.status_mut() = status;
    response
}

async fn plugins(State(state): State<Arc<AppState>>) -> Response {
    json_body(&json!({"plugins": state.daemon.plugins()}))
}

async fn reload(State(state): State<Arc<AppState>>) -> ApiResult {
    let daemon = state.daemon.clone();
    let applied = blocking(move || daemon.reload()).await?;
    Ok(json_body(&json!({"applied": applied})))
}

async fn unload(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let event = blocking(move || daemon.unload(&id)).await?;
    Ok(json_body(&json!({"applied": [event]})))
}

async fn enable(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let applied = blocking(move || daemon.enable(&id)).await?;
    Ok(json_body(&json!({"applied": applied})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewSession {
    #[serde(default = "default_agent")]
    agent: String,
}

fn default_agent() -> String {
    promptd_core::config::DEFAULT_AGENT.to_string()
}

async fn create_session(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: NewSession = parse_body(body, state.max_body)?;
    let daemon = state.daemon.clone();
    let agent = req.agent.clone();
    let id = blocking(move || daemon.create_session(&agent)).await?;
    let body = json!({"id": id, "agent": req.agent});
    Ok(json_bytes(StatusCode::CREATED, body.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepBody {
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    facts: BTreeMap<String, String>,
    #[serde(default)]
    format: Format,
}

async fn step(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: StepBody = parse_body(body, state.max_body)?;
    let daemon = state.daemon.clone();
    let input = StepInput {
        messages: req.messages,
        facts: req.facts,
    };
    let format = req.format;
    // Assembly, the append and rendering all run on the blocking pool.
    // Built by hand, the body between its envelope's two pieces in one buffer, so the
    // `request` bytes are exactly what GET …/request returns (Q4) and the body (megabytes in
    // a long session) is written once, not copied.
    let response = blocking(move || {
        let mut out = String::from("{\"request\":");
        let (n, usage) = daemon.step_into(&id, &input, format, &mut out)?;
        out.push_str(&format!(",\"step\":{n},\"usage\":{}}}", json!(usage)));
        Ok(out)
    })
    .await?;
    Ok(json_bytes(StatusCode::OK, response))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactBody {
    /// The first and last seq of the message events the summary replaces.
    from: u64,
    to: u64,
    summary: String,
}

async fn usage_report(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let report = blocking(move || daemon.usage_report(&id)).await?;
    Ok(json_bytes(StatusCode::OK, report.to_string()))
}

async fn compact(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: CompactBody = parse_body(body, state.max_body)?;
    let daemon = state.daemon.clone();
    let seq = blocking(move || daemon.compact(&id, req.from, req.to, &req.summary)).await?;
    Ok(json_bytes(
        StatusCode::CREATED,
        json!({"seq": seq}).to_string(),
    ))
}

async fn record_message(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    // Any of the shapes the SDKs return (promptd_core::replies), not only the neutral one.
    let value: Value = parse_body(body, state.max_body)?;
    let (message, usage) =
        promptd_core::replies::reply_with_usage(value).map_err(DaemonError::from)?;
    let daemon = state.daemon.clone();
    let seq = blocking(move || daemon.record_reply(&id, &message, usage.as_ref())).await?;
    Ok(json_bytes(
        StatusCode::CREATED,
        json!({"seq": seq}).to_string(),
    ))
}

fn event_json(e: &Event) -> Value {
    json!({"seq": e.seq, "kind": e.kind, "body": e.body, "at_ms": e.at_ms})
}

async fn session_events(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let events = blocking(move || daemon.session_events(&id)).await?;
    let events: Vec<Value> = events.iter().map(event_json).collect();
    Ok(json_body(&json!({"events": events})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FormatQuery {
    #[serde(default)]
    format: Option<String>,
}

async fn step_request(
    State(state): State<Arc<AppState>>,
    Path((id, n)): Path<(String, String)>,
    query: Result<Query<FormatQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let format = match query.format.as_deref() {
        None => Format::Neutral,
        Some(f) => Format::parse(f).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("unknown format `{f}`; use neutral, openai or anthropic"),
            )
        })?,
    };
    let n: u64 = n.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("step `{n}` is not a number"),
        )
    })?;
    let daemon = state.daemon.clone();
    let frozen = blocking(move || daemon.request(&id, n)).await?;
    Ok(json_bytes(
        StatusCode::OK,
        formats::render(&frozen, format).to_string(),
    ))
}

/// Server-sent events of registry changes (R5). Replays the history after `Last-Event-ID`
/// (or `?since=N`), then streams live changes. When events were lost (the history no longer
/// holds them, or this client read too slowly) it sends one `lagged` event saying how many and
/// ends the stream: the client resyncs from `GET /v1/plugins` and reconnects.
async fn registry_events(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let since = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .or(query.get("since").map(String::as_str))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let subscription = state.daemon.events.subscribe(since);
    let to_sse = |e: RegistryEvent| {
        let data = serde_json::to_string(&e).unwrap_or_default();
        SseEvent::default()
            .id(e.seq.to_string())
            .event(e.kind.as_str())
            .data(data)
    };
    let lagged = |missed: u64| {
        SseEvent::default()
            .event("lagged")
            .data(json!({"missed": missed}).to_string())
    };
    let head: Vec<SseEvent> = if subscription.missed > 0 {
        vec![lagged(subscription.missed)]
    } else {
        subscription.past.into_iter().map(to_sse).collect()
    };
    let live = (subscription.missed == 0).then_some(subscription.live);
    let live = stream::unfold(live, move |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Ok(event) => Some((to_sse(event), Some(rx))),
            // Tell the client, then end: it must resync.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => Some((lagged(n), None)),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
        }
    });
    let events = stream::iter(head).chain(live).map(Ok);
    Sse::new(events).keep_alive(KeepAlive::default())
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.daemon.metrics_text(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// See promptd-core's fuzz module for the other harnesses and PROPTEST_CASES.
    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4096)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_request_bodies_are_errors_not_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let bytes = axum::body::Bytes::from(body);
        let _ = parse_body::<StepBody>(Ok(bytes.clone()), 1 << 20);
        let _ = parse_body::<NewSession>(Ok(bytes.clone()), 1 << 20);
        if let Ok(value) = parse_body::<Value>(Ok(bytes), 1 << 20) {
            let _ = promptd_core::replies::reply(value);
        }
    }

    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"s3cret", b"s3cres"));
        assert!(!same_secret(b"", b"s3cret"));
    }
}
