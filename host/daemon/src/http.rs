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
use axum::Router;
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use promptd_core::formats::pieces::{Pieces, Sink};
use promptd_core::formats::{self, Format};
use promptd_core::store::{Event, StoreError};
use promptd_core::Error;
use promptd_core::ErrorBody;
use sha2::{Digest, Sha256};

use crate::api;
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
    let (routes, _) = api_routes().split_for_parts();
    // The inspector's static page is not API: not in the document, and served without the
    // token (the API calls it makes need it).
    routes
        .merge(crate::ui::routes())
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

/// Every route, each with its part of the OpenAPI document.
fn api_routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::with_openapi(api::ApiDoc::openapi())
        .routes(routes!(health))
        .routes(routes!(plugins))
        .routes(routes!(reload))
        .routes(routes!(unload))
        .routes(routes!(enable))
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(step))
        .routes(routes!(record_message))
        .routes(routes!(run_tool_call))
        .routes(routes!(compact))
        .routes(routes!(usage_report))
        .routes(routes!(usage_summary))
        .routes(routes!(session_events))
        .routes(routes!(step_request))
        .routes(routes!(step_explain))
        .routes(routes!(step_diff))
        .routes(routes!(replay))
        .routes(routes!(registry_events))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
}

/// The OpenAPI 3.1 document of the HTTP API (served at `GET /v1/openapi.json`; committed as
/// `docs/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_routes().split_for_parts().1
}

/// [`openapi`] as the bytes served and committed, with what utoipa cannot say added
/// ([`api::complete`]): pretty JSON, keys in a fixed order.
pub fn openapi_json_text() -> String {
    // A document of strings and maps: writing it as a value cannot fail.
    let mut value = serde_json::json!(openapi());
    api::complete(&mut value);
    // serde_json's map sorts keys: the same document gives the same bytes.
    let mut text = format!("{value:#}");
    text.push('\n');
    text
}

/// An error response.
pub(crate) struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody::new(code, message),
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
        // The database server is down or restarting: the client may retry the same call.
        Error::Store(StoreError::Unavailable { .. }) => StatusCode::SERVICE_UNAVAILABLE,
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
        | Error::UnsupportedTool { .. }
        | Error::InvalidArguments { .. }
        | Error::ReplyBeforeStep
        | Error::MissingModelSetting { .. }
        | Error::DataPluginDeclares { .. }
        | Error::RefreshUnknown { .. }
        | Error::DeferUnknown { .. }
        | Error::ReviewRejected { .. }
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
        DaemonError::PluginFileName { .. } | DaemonError::ReplayCandidate { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        DaemonError::Loading { .. }
        | DaemonError::PluginSetBehind { .. }
        | DaemonError::PluginSetUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        // Nobody reads it: the client is gone (nginx's "client closed request").
        DaemonError::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        DaemonError::PluginSetFiles { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        DaemonError::ToolCallNotFound(_) => StatusCode::NOT_FOUND,
        DaemonError::ToolCallClosed(_) | DaemonError::ToolNotRunnable { .. } => {
            StatusCode::CONFLICT
        }
    }
}

impl From<DaemonError> for ApiError {
    fn from(e: DaemonError) -> Self {
        ApiError {
            status: status(&e),
            body: ErrorBody::from(&e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.body});
        let mut response = json_bytes(self.status, body.to_string());
        if self.status == StatusCode::REQUEST_TIMEOUT {
            // The rest of a late body may still come: the connection ends with this answer.
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

type ApiResult = Result<Response, ApiError>;

/// A JSON response from pre-serialized bytes (sorted keys: stable).
fn json_bytes(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `v` as JSON with its keys sorted (through a `Value`), so a body's bytes never depend on a
/// struct's field order. A value that cannot be written (a map with non-string keys: a bug)
/// is an `internal` error, never an empty body.
fn to_json(v: &impl serde::Serialize) -> Result<String, ApiError> {
    serde_json::to_value(v).map(|v| v.to_string()).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("writing the reply: {e}"),
        )
    })
}

/// `v` as a 200 JSON reply, or the error writing it.
fn json_body(v: &impl serde::Serialize) -> Response {
    json_reply(StatusCode::OK, v)
}

/// `v` as a JSON reply with `status`, or the error writing it.
fn json_reply(status: StatusCode, v: &impl serde::Serialize) -> Response {
    match to_json(v) {
        Ok(text) => json_bytes(status, text),
        Err(e) => e.into_response(),
    }
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

/// Parses a JSON body strictly, with errors that name the problem. Every body is a JSON object:
/// serde would also read a struct from a list of its fields' values (`[]` for a session).
/// The [`crate::server::BodyTimeout`] behind a body that could not be read, if that was why.
fn body_timeout(rejection: &BytesRejection) -> Option<&crate::server::BodyTimeout> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(e) = cause {
        if let Some(late) = e.downcast_ref::<crate::server::BodyTimeout>() {
            return Some(late);
        }
        cause = e.source();
    }
    None
}

pub(crate) fn parse_body<T: for<'de> Deserialize<'de>>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        if let Some(late) = body_timeout(&r) {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                late.to_string(),
            );
        }
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
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "invalid JSON body: the body must be a JSON object",
        ));
    }
    let mut json = serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(&mut json).map_err(|e| {
        // Name the field the error is in (`.` is the body itself).
        let at = e.path().to_string();
        let message = match at.as_str() {
            "." | "" => format!("invalid JSON body: {}", e.inner()),
            _ => format!("invalid JSON body: `{at}`: {}", e.inner()),
        };
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    })
}

async fn auth(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        let path = request.uri().path();
        let public = path == "/v1/health" || path == "/ui" || path.starts_with("/ui/");
        if !public {
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
/// `{"status": "loading", "loaded": K, "total": N, …}` (steps wait for it). A daemon following
/// the store's plugin sets that serves none though one is published (none loaded) says
/// `{"status": "no_plugin_set", "error": {"code": "plugin_set_unavailable", …}, …}`: its steps
/// are refused. A store that can no longer keep what it acknowledges (Q12) makes it 503
/// `{"status": "error", "error": {"code", "message"}, …}`, whatever the loading: the daemon
/// cannot do its job.
#[utoipa::path(get, path = "/v1/health", tag = "daemon", security(()),
    responses(
        (status = 200, description = "Serving, still loading its plugins, or following a store none of whose published plugin sets loaded (`no_plugin_set`: steps are refused)", body = api::Health),
        (status = 503, description = "The session store lost its files", body = api::Health),
    ))]
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let mut body = api::Health {
        status: api::HealthStatus::Ok,
        loaded: None,
        total: None,
        error: None,
        plugins: state.daemon.registry().len(),
        plugin_set: state.daemon.set_status(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    match state.daemon.readiness() {
        crate::Readiness::Loading { loaded, total } => {
            (body.status, body.loaded, body.total) =
                (api::HealthStatus::Loading, Some(loaded), Some(total));
        }
        // K10: loaded, but no published set serves: steps are refused, never planned on none.
        crate::Readiness::Ok => {
            if let Err(e) = state.daemon.check_serving() {
                body.status = api::HealthStatus::NoPluginSet;
                body.error = Some(ErrorBody::from(&e));
            }
        }
    }
    let mut status = StatusCode::OK;
    // One stat per file of the store, so it runs here rather than on the blocking pool.
    if let Err(e) = state.daemon.sessions.store.health() {
        status = StatusCode::SERVICE_UNAVAILABLE;
        (body.status, body.loaded, body.total) = (api::HealthStatus::Error, None, None);
        body.error = Some(ErrorBody::new(e.code(), e.to_string()));
    }
    let mut response = json_body(&body);
    *response.status_mut() = status;
    response
}

/// Each plugin file: id, file, sha256, state, last error, what it declares.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins",
    responses((status = 200, description = "Every plugin file the daemon knows", body = api::PluginList), api::Errors))]
async fn plugins(State(state): State<Arc<AppState>>) -> Response {
    json_body(&api::PluginList {
        plugins: state.daemon.plugins(),
        set: state.daemon.set_status(),
    })
}

/// Rescans the plugin folder now (the watcher does it on every change).
#[utoipa::path(post, path = "/v1/plugins/reload", tag = "plugins",
    responses((status = 200, description = "The changes applied", body = api::Applied), api::Errors))]
async fn reload(State(state): State<Arc<AppState>>) -> ApiResult {
    let daemon = state.daemon.clone();
    let applied = blocking(move || daemon.reload()).await?;
    Ok(json_body(&api::Applied { applied }))
}

/// Unloads a plugin: its contributions leave the next step (a rescan loads the file again).
#[utoipa::path(delete, path = "/v1/plugins/{id}", tag = "plugins",
    params(("id" = String, Path, description = "The plugin's id")),
    responses((status = 200, description = "The `unload` change applied", body = api::Applied), api::Errors))]
async fn unload(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let event = blocking(move || daemon.unload(&id)).await?;
    Ok(json_body(&api::Applied {
        applied: vec![event],
    }))
}

/// Brings a quarantined plugin back (loads its file again), or tries a `failed` MCP server
/// again.
#[utoipa::path(post, path = "/v1/plugins/{id}/enable", tag = "plugins",
    params(("id" = String, Path, description = "The plugin's id")),
    responses((status = 200, description = "The changes applied", body = api::Applied), api::Errors))]
async fn enable(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let applied = blocking(move || daemon.enable(&id)).await?;
    Ok(json_body(&api::Applied { applied }))
}

/// Sessions, most recent activity first; `q` keeps those whose id or agent contains it.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions",
    params(
        ("q" = Option<String>, Query, description = "Text the id or the agent must contain"),
        ("limit" = Option<u64>, Query, maximum = 18446744073709551615_u64, description = "At most this many (default 100; more than 1000 lists 1000)"),
    ),
    responses((status = 200, description = "The sessions, most recent activity first", body = api::SessionList), api::Errors))]
async fn list_sessions(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let limit = query.limit.unwrap_or(100).min(1000) as usize;
    let daemon = state.daemon.clone();
    let filter = query.q.unwrap_or_default();
    let sessions = blocking(move || daemon.sessions(&filter, limit)).await?;
    Ok(json_body(&api::SessionList { sessions }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
}

/// Opens a session for an agent.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions",
    params(("traceparent" = Option<String>, Header, description = "W3C trace context: with telemetry on, the spans join this trace (a malformed value is ignored)")),
    request_body = api::NewSession,
    responses((status = 201, description = "The new session", body = api::SessionCreated), api::Errors))]
async fn create_session(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: api::NewSession = parse_body(body, state.max_body)?;
    let daemon = state.daemon.clone();
    let agent = req.agent.clone();
    let parent = trace_parent(&headers);
    let id = blocking(move || daemon.create_session_traced(&agent, parent.as_ref())).await?;
    let body = api::SessionCreated {
        id,
        agent: req.agent,
    };
    Ok(json_reply(StatusCode::CREATED, &body))
}

/// The W3C trace context a client sent (`traceparent`, `tracestate`), as sent: an observer
/// that follows traces ignores a bad one, as W3C Trace Context asks.
fn trace_parent(headers: &HeaderMap) -> Option<crate::TraceContext> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    crate::TraceContext::from_headers(get("traceparent"), get("tracestate"))
}

/// Runs a step: assembles, records the new messages, and returns the request body.
#[utoipa::path(post, path = "/v1/sessions/{id}/steps", tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("traceparent" = Option<String>, Header, description = "W3C trace context: with telemetry on, the spans join this trace (a malformed value is ignored)")),
    request_body = api::StepBody,
    responses((status = 200, description = "The request body to send to the provider, the step's number and its measured size", body = api::StepReply), api::Errors))]
async fn step(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: api::StepBody = parse_body(body, state.max_body)?;
    let parent = trace_parent(&headers);
    let daemon = state.daemon.clone();
    let input = StepInput {
        messages: req.messages,
        facts: req.facts,
        sent_at: req.sent_at,
    };
    let (format, since) = (req.format, req.since);
    // Assembly, the append and rendering all run on the blocking pool.
    // An `api::StepReply` built by hand around the body, so the `request` bytes are exactly
    // what GET …/request returns (Q4), and the session's kept fragments (megabytes in a long
    // session) are written to the socket as they are, not copied into one buffer.
    // Set when this handler is dropped before the step finished (the client disconnected):
    // the step then records nothing (issue 32, cancellation).
    let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut guard = CancelOnDrop(Some(cancelled.clone()));
    let response = blocking(move || {
        let mut out = Pieces::default();
        out.text(match since {
            Some(_) => "{\"parts\":",
            None => "{\"request\":",
        });
        let request = crate::StepRequest {
            session: id,
            input,
            format,
            since,
            out,
            cancelled: Some(cancelled),
            trace: parent,
        };
        let crate::StepOutcome {
            step: n,
            usage,
            body: mut out,
            ..
        } = daemon.step(request)?;
        let usage = serde_json::to_string(&usage).map_err(|e| {
            promptd_core::Error::Store(promptd_core::store::StoreError::backend(
                "writing a step's usage",
                e.to_string(),
            ))
        })?;
        out.text_with(|out| {
            use std::fmt::Write;
            // Writing to a String cannot fail.
            let _ = write!(out, ",\"step\":{n},\"usage\":{usage}}}");
        });
        Ok(out)
    })
    .await?;
    guard.0 = None; // finished: nothing to cancel
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::new(crate::reply_body::PiecesBody::from(response)),
    )
        .into_response())
}

/// Sets its flag when dropped, unless disarmed: a handler dropped mid-await (hyper drops it
/// when the client disconnects) tells its blocking work to stop.
struct CancelOnDrop(Option<Arc<std::sync::atomic::AtomicBool>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Per step, the budget's estimate against the usage the provider reported; totals.
#[utoipa::path(get, path = "/v1/sessions/{id}/usage", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "`{\"session\", \"steps\": [...], \"totals\"}`", body = Object), api::Errors))]
async fn usage_report(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let report = blocking(move || daemon.usage_report(&id)).await?;
    Ok(json_body(&report))
}

/// The cost ledger across sessions: replies, tokens, cache outcomes, misses by cause and by
/// plugin, and cost by the config's `[pricing]`, in total and per agent.
#[utoipa::path(get, path = "/v1/usage", tag = "sessions",
    params(UsageQuery),
    responses((status = 200, description = "`{\"since_ms\", \"sessions\", \"total\", \"agents\"}`", body = Object), api::Errors))]
async fn usage_summary(
    State(state): State<Arc<AppState>>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let limit = query.limit.unwrap_or(1000).clamp(1, 10_000) as usize;
    let daemon = state.daemon.clone();
    let summary =
        blocking(move || daemon.usage_summary(query.agent.as_deref(), query.since, limit)).await?;
    Ok(json_body(&summary))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct UsageQuery {
    /// Only this agent's sessions.
    #[serde(default)]
    agent: Option<String>,
    /// Only replies to requests sent at or after this time, in milliseconds since the Unix
    /// epoch.
    #[serde(default)]
    #[param(maximum = 18446744073709551615_u64)]
    since: Option<u64>,
    /// At most this many sessions, most recent activity first (default 1000, at most 10000).
    #[serde(default)]
    #[param(maximum = 18446744073709551615_u64)]
    limit: Option<u64>,
}

/// Later requests show `summary` in place of the message events `from..=to`.
#[utoipa::path(post, path = "/v1/sessions/{id}/compact", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    request_body = api::CompactBody,
    responses((status = 201, description = "The `history/compacted` event's seq", body = api::Recorded), api::Errors))]
async fn compact(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: api::CompactBody = parse_body(body, state.max_body)?;
    let daemon = state.daemon.clone();
    let seq = blocking(move || daemon.compact(&id, req.from, req.to, &req.summary)).await?;
    Ok(json_reply(StatusCode::CREATED, &api::Recorded { seq }))
}

/// Records the model's reply as the provider SDK returned it (OpenAI Chat Completions,
/// OpenAI Responses or Anthropic Messages, or a neutral message), or a tool's output.
#[utoipa::path(post, path = "/v1/sessions/{id}/messages", tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), SentQuery, ("traceparent" = Option<String>, Header, description = "W3C trace context: with telemetry on, the spans join this trace (a malformed value is ignored)")),
    request_body(content = api::ReplyBody, description = "A reply in any provider's own shape, or a neutral message such as `{\"role\": \"tool\", \"tool_call_id\", \"content\"}`"),
    responses((status = 201, description = "The recorded event's seq, and the tool calls a reply opened", body = api::RecordedMessage), api::Errors))]
async fn record_message(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    query: Result<Query<SentQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let parent = trace_parent(&headers);
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let named =
        match query.format.as_deref() {
            None => None,
            Some(f) => Some(f.parse::<Format>().map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string())
            })?),
        };
    // Any of the shapes the SDKs return (promptd_core::formats::replies), not only the neutral one.
    let value: Value = parse_body(body, state.max_body)?;
    let mut request = crate::RecordRequest::reply(id, value, named, query.sent_at)?;
    request.trace = parent;
    let daemon = state.daemon.clone();
    let recorded = blocking(move || daemon.record(request)).await?;
    let (seq, tool_calls) = (recorded.seq, recorded.tool_calls);
    Ok(json_reply(
        StatusCode::CREATED,
        &api::RecordedMessage { seq, tool_calls },
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct SentQuery {
    /// The format the request was sent in, when the reply's shape does not say (a neutral
    /// message with a `usage`): its cache outcome is judged by that provider's rules.
    #[serde(default)]
    #[param(value_type = Option<Format>)]
    format: Option<String>,
    /// When the request this reply answers was sent, in milliseconds since the Unix epoch
    /// (default: when the reply is recorded): the cache outcome measures idle gaps by it.
    #[serde(default)]
    #[param(maximum = 18446744073709551615_u64)]
    sent_at: Option<u64>,
}

/// Runs an open tool call of the session on the MCP server whose tool it names, within the
/// server's `timeout_ms`, and records the outcome as the call's `tool/result` (M4). A tool
/// error, a time-out or a lost server is recorded with `is_error: true`, for the model to read.
#[utoipa::path(post, path = "/v1/sessions/{id}/tool-calls/{call_id}/run", tag = "sessions",
    params(("id" = String, Path, description = "The session's id"),
           ("call_id" = String, Path, description = "The open tool call's id")),
    responses((status = 201, description = "The recorded result", body = crate::ToolRun),
              api::Errors))]
async fn run_tool_call(
    State(state): State<Arc<AppState>>,
    Path((id, call_id)): Path<(String, String)>,
) -> ApiResult {
    let daemon = state.daemon.clone();
    let run = blocking(move || daemon.run_tool_call(&id, &call_id)).await?;
    Ok(json_reply(StatusCode::CREATED, &run))
}

/// An event as the API shows it: its body as a JSON value (keys sorted). A body that is not
/// JSON is `store_corrupt`, as every reader of the log says.
fn event_view(session: &str, e: Event) -> Result<api::EventView, DaemonError> {
    let body = serde_json::from_str(&e.body).map_err(|problem| {
        promptd_core::Error::Store(promptd_core::store::StoreError::Corrupt {
            session: session.to_string(),
            seq: e.seq,
            problem: format!("{} event: the body is not JSON: {problem}", e.kind),
        })
    })?;
    Ok(api::EventView {
        seq: e.seq,
        kind: e.kind.as_str().to_string(),
        body,
        at_ms: e.at_ms,
    })
}

/// The session's log, in order.
#[utoipa::path(get, path = "/v1/sessions/{id}/events", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The session's events, in order", body = api::EventList), api::Errors))]
async fn session_events(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let daemon = state.daemon.clone();
    let events = blocking(move || {
        let events = daemon.session_events(&id)?;
        events
            .into_iter()
            .map(|e| event_view(&id, e))
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    Ok(json_body(&api::EventList { events }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct FormatQuery {
    /// The body's shape (default `neutral`).
    #[serde(default)]
    #[param(value_type = Option<Format>)]
    format: Option<String>,
}

/// A step of a session, as its routes name it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // only described: the handlers take the path as strings to word its errors
struct StepPath {
    /// The session's id.
    id: String,
    /// The step's number (1-based).
    n: u64,
}

/// Step `n`'s request, rebuilt from the log alone: byte-identical to what the step returned.
#[utoipa::path(get, path = "/v1/sessions/{id}/steps/{n}/request", tag = "sessions",
    params(StepPath, FormatQuery),
    responses((status = 200, description = "The request body", body = Object), api::Errors))]
async fn step_request(
    State(state): State<Arc<AppState>>,
    Path((id, n)): Path<(String, String)>,
    query: Result<Query<FormatQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let (n, format) = step_and_format(&n, query)?;
    let daemon = state.daemon.clone();
    let frozen = blocking(move || daemon.request(&id, n)).await?;
    Ok(json_bytes(
        StatusCode::OK,
        formats::render(&frozen, format).to_string(),
    ))
}

/// A step's number from its path and the `format` query (default `neutral`).
fn step_and_format(
    n: &str,
    query: Result<Query<FormatQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(u64, Format), ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let format = match query.format.as_deref() {
        None => Format::Neutral,
        Some(f) => f
            .parse::<Format>()
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?,
    };
    let n: u64 = n.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("step `{n}` is not a number"),
        )
    })?;
    Ok((n, format))
}

/// Step `n`'s request in a format, and which plugin (id, sha256) and scope gave each section,
/// context, variable and tool: recorded with the step, so it holds after the plugins changed.
#[utoipa::path(get, path = "/v1/sessions/{id}/steps/{n}/explain", tag = "sessions",
    params(StepPath, FormatQuery),
    responses((status = 200, description = "The request and who gave each part", body = api::StepExplain), api::Errors))]
async fn step_explain(
    State(state): State<Arc<AppState>>,
    Path((id, n)): Path<(String, String)>,
    query: Result<Query<FormatQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let (n, format) = step_and_format(&n, query)?;
    let daemon = state.daemon.clone();
    let explained = blocking(move || daemon.explain(&id, n, format)).await?;
    let mut said: Vec<String> = explained.held.iter().map(ToString::to_string).collect();
    if let Some(r) = &explained.released {
        said.push(format!(
            "applied {} held change{} ({})",
            r.held.len(),
            if r.held.len() == 1 { "" } else { "s" },
            r.cause
        ));
    }
    Ok(json_body(&api::StepExplain {
        step: n,
        format,
        request: explained.request,
        provenance: explained.provenance,
        held: explained.held,
        released: explained.released,
        said,
    }))
}

/// How much of step `n`'s request a provider's prompt cache could reuse from step n−1 (and
/// from the last step with the same header), where the prefix broke and why.
#[utoipa::path(get, path = "/v1/sessions/{id}/steps/{n}/diff", tag = "sessions",
    params(StepPath, FormatQuery),
    responses((status = 200, description = "How much of the request a prompt cache could reuse, and why not more", body = promptd_core::prefix::StepDiff), api::Errors))]
async fn step_diff(
    State(state): State<Arc<AppState>>,
    Path((id, n)): Path<(String, String)>,
    query: Result<Query<FormatQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let (n, format) = step_and_format(&n, query)?;
    let daemon = state.daemon.clone();
    let diff = blocking(move || daemon.diff(&id, n, format)).await?;
    Ok(json_body(&diff))
}

/// Replays recorded sessions step by step with a candidate plugin folder or config (Q19):
/// per step, where the candidate's request first differs from the recorded one and why, the
/// token delta, and under the cache model what both would read, write and miss, and cost.
/// The candidate is loaded into a registry of its own; nothing is written to any log and
/// nothing the daemon serves changes (Q20).
#[utoipa::path(post, path = "/v1/replay", tag = "sessions",
    request_body = api::ReplayBody,
    responses((status = 200, description = "Each session replayed, and the sums", body = crate::replay::ReplayReport), api::Errors))]
async fn replay(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: api::ReplayBody = parse_body(body, state.max_body)?;
    let request = req.into_request();
    let daemon = state.daemon.clone();
    let report = blocking(move || daemon.replay(&request)).await?;
    Ok(json_body(&report))
}

/// Server-sent events of registry changes (R5). Replays the history after `Last-Event-ID`
/// (or `?since=N`), then streams live changes. When events were lost (the history no longer
/// holds them, or this client read too slowly) it sends one `lagged` event saying how many and
/// ends the stream: the client resyncs from `GET /v1/plugins` and reconnects.
#[utoipa::path(get, path = "/v1/events", tag = "plugins",
    params(
        ("since" = Option<String>, Query, pattern = "^([0-9]{1,19}|now)$", description = "Replay the events after this seq (or send `Last-Event-ID`); `now`: only events from now on, nothing replayed; anything else: 400"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event (before `since`); not a seq: 400"),
    ),
    responses((status = 200, description = "A server-sent event stream (the schema describes each event): a registry change's `id` is its seq, its `event` the change kind (`load`, `reload`, `unload`, `refused`, `quarantine`, `failed`) and its `data` the change as JSON (`RegistryEvent`); a `lagged` event, whose `data` is `{\"missed\": N}` (`Lagged`), ends the stream", content_type = "text/event-stream", body = api::RegistryStreamEvent), api::Errors))]
async fn registry_events(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    // Each given is checked; the header, which a reconnecting EventSource sends, wins.
    let seq = |what: &str, v: Option<&str>| -> Result<Option<u64>, ApiError> {
        v.map(|v| {
            v.parse::<u64>().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!(
                        "{what} `{}` is not an event's seq",
                        promptd_core::plugin::names::shortened(v, 40)
                    ),
                )
            })
        })
        .transpose()
    };
    let header = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let header = seq("Last-Event-ID", header)?;
    // `since=now`: only events after the last one given out, with nothing replayed.
    let since = match query.get("since").map(String::as_str) {
        Some("now") => None,
        given => Some(seq("since", given)?.unwrap_or(0)),
    };
    let since = header.map(Some).unwrap_or(since);
    let subscription = state.daemon.plugins.events.subscribe(since);
    let to_sse = |e: RegistryEvent| {
        // Strings and numbers only: writing an event cannot fail.
        let data = serde_json::json!(e).to_string();
        SseEvent::default()
            .id(e.seq.to_string())
            .event(e.kind.as_str())
            .data(data)
    };
    let lagged = |missed: u64| {
        SseEvent::default()
            .event("lagged")
            .data(format!("{{\"missed\":{missed}}}"))
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
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// Prometheus text: steps, step latency histogram, plugin errors, loaded plugins.
#[utoipa::path(get, path = "/metrics", tag = "daemon",
    responses((status = 200, description = "The metrics in Prometheus' text format", content_type = "text/plain", body = String), api::Errors))]
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.daemon.metrics_text(),
    )
        .into_response()
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "daemon",
    responses((status = 200, description = "The document (also committed as docs/openapi.json)", body = Object), api::Errors))]
async fn openapi_json() -> Response {
    json_bytes(StatusCode::OK, openapi_json_text())
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
        let _ = parse_body::<api::StepBody>(Ok(bytes.clone()), 1 << 20);
        let _ = parse_body::<api::NewSession>(Ok(bytes.clone()), 1 << 20);
        if let Ok(value) = parse_body::<Value>(Ok(bytes), 1 << 20) {
            let _ = promptd_core::formats::replies::reply(value);
        }
    }

    }

    /// H7: `docs/openapi.json` is the document the server's types and annotations generate:
    /// a route or a field changed without regenerating it fails here.
    #[test]
    fn the_committed_openapi_document_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
        let generated = openapi_json_text();
        if std::env::var_os("PROMPTD_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json is not the document the server generates: run \
             `PROMPTD_BLESS=1 cargo test -p promptd-daemon openapi` and commit docs/openapi.json"
        );
        let doc: Value = serde_json::from_str(&generated).unwrap();
        assert!(
            doc["openapi"].as_str().unwrap().starts_with("3.1"),
            "{}",
            doc["openapi"]
        );
        let paths = doc["paths"].as_object().unwrap();
        for route in [
            "/v1/health",
            "/v1/plugins",
            "/v1/plugins/reload",
            "/v1/plugins/{id}",
            "/v1/plugins/{id}/enable",
            "/v1/sessions",
            "/v1/sessions/{id}/steps",
            "/v1/sessions/{id}/messages",
            "/v1/sessions/{id}/compact",
            "/v1/sessions/{id}/usage",
            "/v1/sessions/{id}/events",
            "/v1/sessions/{id}/steps/{n}/request",
            "/v1/events",
            "/metrics",
            "/v1/openapi.json",
        ] {
            assert!(paths.contains_key(route), "{route} is not in the document");
        }
        // The step's body names its fields and the message shapes.
        let schemas = &doc["components"]["schemas"];
        for field in ["messages", "facts", "format"] {
            assert!(
                schemas["StepBody"]["properties"].get(field).is_some(),
                "StepBody.{field}"
            );
        }
        assert!(schemas.get("Message").is_some() && schemas.get("Usage").is_some());
    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"s3cret", b"s3cres"));
        assert!(!same_secret(b"", b"s3cret"));
    }
}
