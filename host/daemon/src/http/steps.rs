//! The step and record routes (the step boundary and the record boundary over HTTP), and
//! the reads of one step (its request, what explains it, its diff).

#[allow(unused_imports)]
use super::*;

/// Runs a step: assembles, records the new messages, and returns the request body.
#[utoipa::path(post, path = "/v1/sessions/{id}/steps", tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("traceparent" = Option<String>, Header, description = "W3C trace context: with telemetry on, the spans join this trace (a malformed value is ignored)")),
    request_body = api::StepBody,
    responses((status = 200, description = "The request body to send to the provider, the step's number and its measured size", body = api::StepReply), api::Errors))]
pub(crate) async fn step(
    State(state): State<Arc<AppState>>,
    SessionId(id): SessionId,
    TraceParent(parent): TraceParent,
    JsonBody(req): JsonBody<api::StepBody>,
) -> ApiResult {
    run_step(&state, id.into(), parent, req).await
}

/// A step of session `id`: what [`step`] runs, and [`App`] before the router.
pub(crate) async fn run_step(
    state: &Arc<AppState>,
    id: Arc<str>,
    parent: Option<crate::TraceContext>,
    req: api::StepBody,
) -> ApiResult {
    let input = StepInput {
        messages: req.messages,
        facts: req.facts,
        sent_at: req.sent_at,
        client_tools: None,
    };
    let (format, since) = (req.format, req.since);
    // An `api::StepReply` built by hand around the body, so the `request` bytes are exactly
    // what GET …/request returns (Q4), and the session's kept fragments (megabytes in a long
    // session) are written to the socket as they are, not copied into one buffer.
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
        // A short step is not cancelled (it runs to its end); any other gets its flag below.
        cancelled: None,
        trace: parent,
        gateway: None,
    };
    // A short step runs on the runtime's thread and waits for its append without holding it
    // (`Daemon::step_inline`); any other runs on the blocking pool (plugin calls, a session
    // read from the log). The short one is a task of its own, so a client that goes away
    // does not cut it between its append and its state's update: it holds its session until
    // both are done, and the next step of the session never meets a half-finished one.
    let daemon = state.daemon.clone();
    let inline = tokio::spawn(async move { daemon.step_inline(request).await });
    let inline = inline.await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("step failed: {e}"),
        )
    })?;
    let response = match inline {
        Ok(outcome) => step_reply(outcome?)?,
        Err(mut request) => {
            // Set when this handler is dropped before the step finished (the client
            // disconnected): the step then records nothing (issue 32, cancellation).
            let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
            request.cancelled = Some(cancelled.clone());
            let mut guard = CancelOnDrop(Some(cancelled));
            let response = blocking(state, move |daemon| step_reply(daemon.step(request)?)).await?;
            guard.0 = None; // finished: nothing to cancel
            response
        }
    };
    Ok((
        StatusCode::OK,
        [JSON],
        axum::body::Body::new(crate::reply_body::PiecesBody::from(response)),
    )
        .into_response())
}

/// A step's reply: its body's pieces closed with its number and usage.
fn step_reply(outcome: crate::StepOutcome) -> Result<Pieces, crate::DaemonError> {
    let crate::StepOutcome {
        step: n,
        usage,
        body: mut out,
        ..
    } = outcome;
    // Written straight into the body: a string of its own would be copied again.
    let written = out.text_with(|out| {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(out, ",\"step\":{n},\"usage\":");
        let written = promptd_core::formats::json_text::write_small_json_str(out, &usage);
        out.push('}');
        written
    });
    written.map_err(|e| {
        promptd_core::Error::Store(promptd_core::store::StoreError::backend(
            "writing a step's usage",
            e.to_string(),
        ))
    })?;
    Ok(out)
}

/// Sets its flag when dropped, unless disarmed: a handler dropped mid-await (hyper drops it
/// when the client disconnects) tells its blocking work to stop.
pub(crate) struct CancelOnDrop(Option<Arc<std::sync::atomic::AtomicBool>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Records the model's reply as the provider SDK returned it (OpenAI Chat Completions,
/// OpenAI Responses or Anthropic Messages, or a neutral message), or a tool's output.
#[utoipa::path(post, path = "/v1/sessions/{id}/messages", tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), SentQuery, ("traceparent" = Option<String>, Header, description = "W3C trace context: with telemetry on, the spans join this trace (a malformed value is ignored)")),
    request_body(content = api::ReplyBody, description = "A reply in any provider's own shape, or a neutral message such as `{\"role\": \"tool\", \"tool_call_id\", \"content\"}`"),
    responses((status = 201, description = "The recorded event's seq, and the tool calls a reply opened", body = api::RecordedMessage), api::Errors))]
pub(crate) async fn record_message(
    State(state): State<Arc<AppState>>,
    SessionId(id): SessionId,
    sent: Sent,
    TraceParent(parent): TraceParent,
    JsonBody(value): JsonBody<Value>,
) -> ApiResult {
    // Any of the shapes the SDKs return (promptd_core::formats::replies), not only the neutral one.
    let mut request = crate::RecordRequest::reply(id, value, sent.format, sent.at)?;
    request.trace = parent;
    let recorded = blocking(&state, move |daemon| daemon.record(request)).await?;
    let (seq, tool_calls) = (recorded.seq, recorded.tool_calls);
    Ok(json_reply(
        StatusCode::CREATED,
        &api::RecordedMessage { seq, tool_calls },
    ))
}

/// A recorded reply's `?format=&sent_at=`, the format checked.
pub(crate) struct Sent {
    format: Option<Format>,
    at: Option<u64>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Sent {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let QueryOf(query) = QueryOf::<SentQuery>::from_request_parts(parts, state).await?;
        let format = match query.format.as_deref() {
            None => None,
            Some(f) => Some(f.parse::<Format>().map_err(|e| {
                ApiError::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string())
            })?),
        };
        Ok(Sent {
            format,
            at: query.sent_at,
        })
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct SentQuery {
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
pub(crate) async fn run_tool_call(
    State(state): State<Arc<AppState>>,
    ToolCallRef { session, call_id }: ToolCallRef,
) -> ApiResult {
    let run = blocking(&state, move |daemon| {
        daemon.run_tool_call(&session, &call_id)
    })
    .await?;
    Ok(json_reply(StatusCode::CREATED, &run))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct FormatQuery {
    /// The body's shape (default `neutral`).
    #[serde(default)]
    #[param(value_type = Option<Format>)]
    format: Option<String>,
}

/// A step of a session, as its routes name it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // only described: the handlers take the path as strings to word its errors
pub(crate) struct StepPath {
    /// The session's id.
    id: String,
    /// The step's number (1-based).
    n: u64,
}

/// Step `n`'s request, rebuilt from the log alone: byte-identical to what the step returned.
#[utoipa::path(get, path = "/v1/sessions/{id}/steps/{n}/request", tag = "sessions",
    params(StepPath, FormatQuery),
    responses((status = 200, description = "The request body", body = Object), api::Errors))]
pub(crate) async fn step_request(
    State(state): State<Arc<AppState>>,
    StepRef {
        session: id,
        n,
        format,
    }: StepRef,
) -> ApiResult {
    let frozen = blocking(&state, move |daemon| daemon.request(&id, n)).await?;
    Ok(json_bytes(
        StatusCode::OK,
        formats::render(&frozen, format).to_string(),
    ))
}

/// The bytes a gateway step sent upstream (G4), rebuilt from the log: the client's body with
/// what promptd spliced in. 404 `not_a_gateway_step` for a step that did not come through
/// the gateway.
#[utoipa::path(get, path = "/v1/sessions/{id}/steps/{n}/upstream", tag = "sessions",
    params(StepPath),
    responses((status = 200, description = "The body that went upstream, byte for byte", body = Object), api::Errors))]
pub(crate) async fn step_upstream(
    State(state): State<Arc<AppState>>,
    StepRef { session: id, n, .. }: StepRef,
) -> ApiResult {
    let found = blocking(&state, move |daemon| daemon.gateway_request(&id, n)).await?;
    match found {
        Some(record) => Ok(json_bytes(
            StatusCode::OK,
            String::from_utf8_lossy(&record.upstream_body()).into_owned(),
        )),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_a_gateway_step",
            format!("step {n} did not come through the gateway: its request is at .../steps/{n}/request"),
        )),
    }
}

/// A step's number from its path and the `format` query (default `neutral`).
pub(crate) fn step_and_format(
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
pub(crate) async fn step_explain(
    State(state): State<Arc<AppState>>,
    StepRef {
        session: id,
        n,
        format,
    }: StepRef,
) -> ApiResult {
    let explained = blocking(&state, move |daemon| daemon.explain(&id, n, format)).await?;
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
pub(crate) async fn step_diff(
    State(state): State<Arc<AppState>>,
    StepRef {
        session: id,
        n,
        format,
    }: StepRef,
) -> ApiResult {
    let diff = blocking(&state, move |daemon| daemon.diff(&id, n, format)).await?;
    Ok(json_body(&diff))
}
