//! What handlers share: reading a body strictly, the session, tool call or step a path names,
//! running the daemon's blocking work, and writing JSON replies.

#[allow(unused_imports)]
use super::*;

/// A JSON response from pre-serialized bytes (sorted keys: stable).
pub(crate) fn json_bytes(status: StatusCode, body: String) -> Response {
    (status, [JSON], body).into_response()
}

/// `Content-Type: application/json`, a static value: one written from a `&str` is copied into
/// an allocation on every reply.
pub(crate) const JSON: (header::HeaderName, header::HeaderValue) = (
    header::CONTENT_TYPE,
    header::HeaderValue::from_static("application/json"),
);

/// `v` as JSON with its keys sorted (through a `Value`), so a body's bytes never depend on a
/// struct's field order. A value that cannot be written (a map with non-string keys: a bug)
/// is an `internal` error, never an empty body.
pub(crate) fn to_json(v: &impl serde::Serialize) -> Result<String, ApiError> {
    serde_json::to_value(v).map(|v| v.to_string()).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("writing the reply: {e}"),
        )
    })
}

/// `v` as a 200 JSON reply, or the error writing it.
pub(crate) fn json_body(v: &impl serde::Serialize) -> Response {
    json_reply(StatusCode::OK, v)
}

/// `v` as a JSON reply with `status`, or the error writing it.
pub(crate) fn json_reply(status: StatusCode, v: &impl serde::Serialize) -> Response {
    match to_json(v) {
        Ok(text) => json_bytes(status, text),
        Err(e) => e.into_response(),
    }
}

/// The shell of every handler that calls the daemon: `work` runs on the blocking pool (plugin
/// calls, SQLite) with the daemon of `state`, off the async threads; its error is answered as
/// [`status`] and [`ErrorBody`] say, a worker that panicked as `500 internal`.
pub(crate) async fn blocking<T: Send + 'static>(
    state: &AppState,
    work: impl FnOnce(&Daemon) -> Result<T, DaemonError> + Send + 'static,
) -> Result<T, ApiError> {
    let daemon = state.daemon.clone();
    match tokio::task::spawn_blocking(move || work(&daemon)).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("worker failed: {e}"),
        )),
    }
}

/// The [`crate::server::BodyTimeout`] behind a body that could not be read, if that was why.
pub(crate) fn body_timeout<'a>(
    failure: &'a (dyn std::error::Error + 'static),
) -> Option<&'a crate::server::BodyTimeout> {
    let mut cause = Some(failure);
    while let Some(e) = cause {
        if let Some(late) = e.downcast_ref::<crate::server::BodyTimeout>() {
            return Some(late);
        }
        cause = e.source();
    }
    None
}

/// Parses a JSON body strictly, with errors that name the problem ([`parse_json`]), or
/// answers why it could not be read.
pub(crate) fn parse_body<T: for<'de> Deserialize<'de>>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| match body_timeout(&r) {
        Some(late) => late_body(late),
        None => unread_body(r.status(), &r.body_text(), limit),
    })?;
    parse_json(&bytes)
}

/// [`parse_body`]'s answer to a body read without axum's extractor that could not be read
/// whole (too long for `limit`, too slow, or cut off), worded as axum words it.
pub(crate) fn body_failure(failure: &(dyn std::error::Error + 'static), limit: usize) -> ApiError {
    if let Some(late) = body_timeout(failure) {
        return late_body(late);
    }
    let status = match failure.is::<http_body_util::LengthLimitError>() {
        true => StatusCode::PAYLOAD_TOO_LARGE,
        false => StatusCode::BAD_REQUEST,
    };
    unread_body(
        status,
        &format!("Failed to buffer the request body: {failure}"),
        limit,
    )
}

fn late_body(late: &crate::server::BodyTimeout) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        late.to_string(),
    )
}

fn unread_body(status: StatusCode, reason: &str, limit: usize) -> ApiError {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        _ => "bad_request",
    };
    ApiError::new(
        status,
        code,
        format!("{reason} (limit {limit} bytes: limits.max_body_mb)"),
    )
}

/// Parses a JSON body strictly, with errors that name the problem. Every body is a JSON
/// object: serde would also read a struct from a list of its fields' values (`[]` for a
/// session).
pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "invalid JSON body: the body must be a JSON object",
        ));
    }
    // Parsed without tracking the path first: the tracker copies every key it passes (seven
    // allocations of a short step's body, issue 50). Only a body that fails is parsed again,
    // with it, to name where: the same bytes fail the same way.
    if let Ok(value) = T::deserialize(&mut serde_json::Deserializer::from_slice(bytes)) {
        return Ok(value);
    }
    let mut json = serde_json::Deserializer::from_slice(bytes);
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

/// A JSON body read strictly ([`parse_body`]), within `[limits] max_body_mb`; the handler's
/// last argument.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: for<'de> Deserialize<'de>> axum::extract::FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let body = Bytes::from_request(request, state).await;
        parse_body(body, state.max_body).map(JsonBody)
    }
}

/// A query string, its errors a `400 bad_request` naming the problem.
pub(crate) struct QueryOf<T>(pub(crate) T);

impl<T: for<'de> Deserialize<'de>, S: Send + Sync> axum::extract::FromRequestParts<S>
    for QueryOf<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(query)) => Ok(QueryOf(query)),
            Err(e) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                e.body_text(),
            )),
        }
    }
}

/// The session a route names (`/v1/sessions/{id}/…`), as its path gives it; a path that
/// cannot be read is answered as axum's `Path` answers it. Whether the session exists is the
/// daemon's to say (`unknown_session`).
pub(crate) struct SessionId(pub(crate) String);

/// The path parameter [`SessionId`] reads (a route's other parameters are left to others).
#[derive(Deserialize)]
struct SessionParam {
    id: String,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SessionId {
    type Rejection = axum::extract::rejection::PathRejection;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let Path(SessionParam { id }) = Path::from_request_parts(parts, state).await?;
        Ok(SessionId(id))
    }
}

/// An open tool call of a session (`/v1/sessions/{id}/tool-calls/{call_id}/…`), as the path
/// gives them; a path that cannot be read is answered as axum's `Path` answers it.
#[derive(Deserialize)]
pub(crate) struct ToolCallRef {
    #[serde(rename = "id")]
    pub(crate) session: String,
    pub(crate) call_id: String,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ToolCallRef {
    type Rejection = axum::extract::rejection::PathRejection;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let Path(call) = Path::from_request_parts(parts, state).await?;
        Ok(call)
    }
}

/// A step of a session (`/v1/sessions/{id}/steps/{n}/…`) and the format asked for
/// (`?format=`, default `neutral`), checked as [`step_and_format`] says.
pub(crate) struct StepRef {
    pub(crate) session: String,
    pub(crate) n: u64,
    pub(crate) format: Format,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for StepRef {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Response> {
        let Path((session, n)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let query = Query::<FormatQuery>::from_request_parts(parts, state).await;
        let (n, format) = step_and_format(&n, query).map_err(IntoResponse::into_response)?;
        Ok(StepRef { session, n, format })
    }
}
