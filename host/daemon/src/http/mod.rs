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

mod error;
mod extract;
mod front;
mod health;
mod plugins;
mod replay;
mod sessions;
mod steps;

use error::*;
use extract::*;
use front::*;
use health::*;
use plugins::*;
use replay::*;
use sessions::*;
use steps::*;

/// A body declared larger than the limit (`[limits] max_body_mb`, read at start) but at most
/// this is read and dropped before the
/// 413 answer: a client still sending it would otherwise get a broken pipe instead of the error.
/// Larger ones are answered at once and the connection is closed.
const DRAIN_MAX: u64 = 16 << 20;

pub use front::{Answer, App};

struct AppState {
    pub(crate) daemon: Arc<Daemon>,
    pub(crate) token: Option<String>,
    /// `[limits] max_body_mb` when the daemon started, in bytes.
    pub(crate) max_body: usize,
}

/// The router for `daemon`; `token`, when set, is required as `Authorization: Bearer …` on
/// every route but `/v1/health`.
pub fn router(daemon: Arc<Daemon>, token: Option<String>) -> Router {
    router_listening(daemon, token, crate::gateway::Listening::Local)
}

/// [`router`] for a daemon listening as `listening` says: beyond loopback, gateway traffic
/// presents a gateway key (G12).
pub fn router_listening(
    daemon: Arc<Daemon>,
    token: Option<String>,
    listening: crate::gateway::Listening,
) -> Router {
    routed(daemon, token, listening).0
}

/// The API as the daemon serves it: [`router_listening`]'s router with a step answered
/// before it, the same answers at less cost ([`App`]).
pub fn app(
    daemon: Arc<Daemon>,
    token: Option<String>,
    listening: crate::gateway::Listening,
) -> App {
    let (router, state) = routed(daemon, token, listening);
    App::new(router, state)
}

/// The router, and the state its API routes share.
fn routed(
    daemon: Arc<Daemon>,
    token: Option<String>,
    listening: crate::gateway::Listening,
) -> (Router, Arc<AppState>) {
    let max_body = daemon.config().max_body_bytes();
    // The gateway's routes: promptd's token and body limit are not theirs (the client's
    // Authorization is the provider's credential; [gateway] max_body_bytes bounds bodies).
    let gateway = crate::gateway::router(daemon.clone(), listening);
    let state = Arc::new(AppState {
        daemon,
        token,
        max_body,
    });
    let (routes, _) = api_routes().split_for_parts();
    // The inspector's static page is not API: not in the document, and served without the
    // token (the API calls it makes need it).
    let routes = routes
        .merge(crate::ui::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        .with_state(state.clone());
    (routes.merge(gateway), state)
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
        .routes(routes!(step_upstream))
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

/// What every API request passes before its handler: a body declared too large is refused
/// first (and drained), then one without the token. One middleware, not two: each costs
/// allocations on every request (issue 50).
async fn gate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match oversized(&state, request).await {
        Ok(request) => match unauthorized(&state, &request) {
            Some(refused) => refused,
            None => next.run(request).await,
        },
        Err(refused) => refused,
    }
}

/// The refusal of a request without the daemon's token, if it has none.
fn unauthorized(state: &AppState, request: &Request) -> Option<Response> {
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
                let refused = ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "this daemon requires `Authorization: Bearer <token>`",
                );
                return Some(refused.into_response());
            }
        }
    }
    None
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

/// Refuses a body whose declared length is over the limit before any handler runs (the
/// request back when it is not). (Chunked bodies without a length still meet the limit in
/// the body extractors.)
async fn oversized(state: &AppState, request: Request) -> Result<Request, Response> {
    let limit = state.max_body;
    let declared = declared_length(request.headers());
    let Some(length) = declared.filter(|&n| n > limit as u64) else {
        return Ok(request);
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
    Err(response)
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

    /// `SessionId` and `ToolCallRef` read a path as `Path<String>` and `Path<(String, String)>`
    /// did, and refuse one that cannot be read (not UTF-8) with the same answer.
    #[tokio::test]
    async fn session_and_tool_call_paths_read_as_axum_path_reads_them() {
        use axum::routing::get;
        use hyper::service::Service;
        let app = Router::new()
            .route("/a/{id}", get(|SessionId(id): SessionId| async move { id }))
            .route("/b/{id}", get(|Path(id): Path<String>| async move { id }))
            .route(
                "/a/{id}/c/{call_id}",
                get(|ToolCallRef { session, call_id }: ToolCallRef| async move {
                    format!("{session} {call_id}")
                }),
            )
            .route(
                "/b/{id}/c/{call_id}",
                get(|Path((id, call_id)): Path<(String, String)>| async move {
                    format!("{id} {call_id}")
                }),
            );
        let service = hyper_util::service::TowerToHyperService::new(app);
        let answer = |uri: String| {
            let request = axum::http::Request::builder()
                .uri(uri)
                .body(axum::body::Body::empty())
                .unwrap();
            let response = service.call(request);
            async move {
                let response = response.await.unwrap();
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                    .await
                    .unwrap();
                (status, body)
            }
        };
        for path in [
            "s1",
            "%E2%9C%93",
            "%FF",
            "s1/c/call_1",
            "%FF/c/x",
            "s/c/%FF",
        ] {
            let ours = answer(format!("/a/{path}")).await;
            assert_eq!(ours, answer(format!("/b/{path}")).await, "{path}");
            let readable = !path.contains("%FF");
            assert_eq!(ours.0.is_success(), readable, "{path}: {ours:?}");
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
