//! The session routes: create, list, read the log, usage, compaction.

#[allow(unused_imports)]
use super::*;

/// Sessions, most recent activity first; `q` keeps those whose id or agent contains it.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions",
    params(
        ("q" = Option<String>, Query, description = "Text the id or the agent must contain"),
        ("limit" = Option<u64>, Query, maximum = 18446744073709551615_u64, description = "At most this many (default 100; more than 1000 lists 1000)"),
    ),
    responses((status = 200, description = "The sessions, most recent activity first", body = api::SessionList), api::Errors))]
pub(crate) async fn list_sessions(
    State(state): State<Arc<AppState>>,
    QueryOf(query): QueryOf<ListQuery>,
) -> ApiResult {
    let limit = query.limit.unwrap_or(100).min(1000) as usize;
    let filter = query.q.unwrap_or_default();
    let sessions = blocking(&state, move |daemon| daemon.sessions(&filter, limit)).await?;
    Ok(json_body(&api::SessionList { sessions }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
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
pub(crate) async fn create_session(
    State(state): State<Arc<AppState>>,
    TraceParent(parent): TraceParent,
    JsonBody(req): JsonBody<api::NewSession>,
) -> ApiResult {
    let agent = req.agent.clone();
    let id = blocking(&state, move |daemon| {
        daemon.create_session_traced(&agent, parent.as_ref())
    })
    .await?;
    let body = api::SessionCreated {
        id,
        agent: req.agent,
    };
    Ok(json_reply(StatusCode::CREATED, &body))
}

/// The W3C trace context a client sent (`traceparent`, `tracestate`), as sent: an observer
/// that follows traces ignores a bad one, as W3C Trace Context asks.
pub(crate) fn trace_parent(headers: &HeaderMap) -> Option<crate::TraceContext> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    crate::TraceContext::from_headers(get("traceparent"), get("tracestate"))
}

/// A handler's [`trace_parent`], read where the headers are (a `HeaderMap` argument would
/// copy every header of every request).
pub(crate) struct TraceParent(pub(crate) Option<crate::TraceContext>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for TraceParent {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(TraceParent(trace_parent(&parts.headers)))
    }
}

/// Per step, the budget's estimate against the usage the provider reported; totals.
#[utoipa::path(get, path = "/v1/sessions/{id}/usage", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "`{\"session\", \"steps\": [...], \"totals\"}`", body = Object), api::Errors))]
pub(crate) async fn usage_report(
    State(state): State<Arc<AppState>>,
    SessionId(id): SessionId,
) -> ApiResult {
    let report = blocking(&state, move |daemon| daemon.usage_report(&id)).await?;
    Ok(json_body(&report))
}

/// The cost ledger across sessions: replies, tokens, cache outcomes, misses by cause and by
/// plugin, and cost by the config's `[pricing]`, in total, per agent and per gateway key; with a
/// window, per UTC day; and the most expensive sessions.
#[utoipa::path(get, path = "/v1/usage", tag = "sessions",
    params(UsageQuery),
    responses((status = 200, description = "`{\"since_ms\", \"sessions\", \"total\", \"agents\", \"window\", \"key\", \"days\", \"keys\", \"top_sessions\"}`", body = Object), api::Errors))]
pub(crate) async fn usage_summary(
    State(state): State<Arc<AppState>>,
    QueryOf(query): QueryOf<UsageQuery>,
) -> ApiResult {
    use promptd_core::usage;
    let limit = query.limit.unwrap_or(1000).clamp(1, 10_000) as usize;
    let checked = (|| {
        if let Some(a) = &query.agent {
            usage::check_name("agent", a)?;
        }
        let today = usage::Day::of_ms(crate::now_ms());
        let window = usage::Window::resolve(
            query.from.as_deref(),
            query.to.as_deref(),
            query.days,
            today,
        )?;
        usage::Query::new(window, query.since, query.key.clone(), query.top)
    })();
    let counted =
        checked.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.code(), e.to_string()))?;
    let agent = query.agent;
    let report = blocking(&state, move |daemon| {
        daemon.usage_summary(agent.as_deref(), counted, limit)
    })
    .await?;
    Ok(json_body(&report))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct UsageQuery {
    /// Only this agent's sessions.
    #[serde(default)]
    #[param(min_length = 1, max_length = 256)]
    agent: Option<String>,
    /// Only replies served with this gateway key (the `key` their `gateway/request` names).
    #[serde(default)]
    #[param(min_length = 1, max_length = 256)]
    key: Option<String>,
    /// Only replies to requests sent at or after this time, in milliseconds since the Unix
    /// epoch.
    #[serde(default)]
    #[param(maximum = 18446744073709551615_u64)]
    since: Option<u64>,
    /// The window's first UTC day, `YYYY-MM-DD` (default: 30 days ending at `to`); with a
    /// window the answer has one bucket per day.
    #[serde(default)]
    #[param(pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    from: Option<String>,
    /// The window's last UTC day, `YYYY-MM-DD` (default: today).
    #[serde(default)]
    #[param(pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    to: Option<String>,
    /// The window as the N UTC days ending today (1 to 366; not with `from`/`to`).
    #[serde(default)]
    #[param(minimum = 1, maximum = 366)]
    days: Option<u64>,
    /// The most expensive sessions listed (default 10, 1 to 100).
    #[serde(default)]
    #[param(minimum = 1, maximum = 100)]
    top: Option<u64>,
    /// At most this many sessions read, most recent activity first (default 1000, at most
    /// 10000).
    #[serde(default)]
    #[param(maximum = 18446744073709551615_u64)]
    limit: Option<u64>,
}

/// Later requests show `summary` in place of the message events `from..=to`.
#[utoipa::path(post, path = "/v1/sessions/{id}/compact", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    request_body = api::CompactBody,
    responses((status = 201, description = "The `history/compacted` event's seq", body = api::Recorded), api::Errors))]
pub(crate) async fn compact(
    State(state): State<Arc<AppState>>,
    SessionId(id): SessionId,
    JsonBody(req): JsonBody<api::CompactBody>,
) -> ApiResult {
    let seq = blocking(&state, move |daemon| {
        daemon.compact(&id, req.from, req.to, &req.summary)
    })
    .await?;
    Ok(json_reply(StatusCode::CREATED, &api::Recorded { seq }))
}

/// An event as the API shows it: its body as a JSON value (keys sorted). A body that is not
/// JSON is `store_corrupt`, as every reader of the log says.
pub(crate) fn event_view(session: &str, e: &Event) -> Result<api::EventView, DaemonError> {
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
pub(crate) async fn session_events(
    State(state): State<Arc<AppState>>,
    SessionId(id): SessionId,
) -> ApiResult {
    let events = blocking(&state, move |daemon| {
        let events = daemon.session_events(&id)?;
        events
            .iter()
            .map(|e| event_view(&id, e))
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    Ok(json_body(&api::EventList { events }))
}
