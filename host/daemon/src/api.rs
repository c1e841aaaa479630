//! The HTTP API's bodies as types, and the OpenAPI 3.1 document generated from them and from
//! the handlers' annotations (utoipa). The router is built from the same annotated handlers
//! (`utoipa_axum::routes!`), so a route cannot be served without being in the document, and a
//! field cannot change without changing it; `docs/openapi.json` is the committed copy, kept
//! in sync by a test.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use promptd_core::budget::Usage;
use promptd_core::conversation::Message;
use promptd_core::formats::Format;
use promptd_core::plugin_state::{ChangeKind, PluginState};
use promptd_core::ErrorBody;

use crate::events::RegistryEvent;
use crate::PluginStatus;

/// `POST /v1/sessions`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// The agent whose plugins, scopes and budget the session's steps use (default `default`).
    #[serde(default = "default_agent")]
    #[schema(default = "default")]
    pub agent: String,
}

fn default_agent() -> String {
    promptd_core::config::DEFAULT_AGENT.to_string()
}

/// A new session.
#[derive(Serialize, ToSchema)]
pub struct SessionCreated {
    pub id: String,
    pub agent: String,
}

/// `POST /v1/sessions/{id}/steps`: this step's new messages and facts.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepBody {
    /// The messages this step adds (a user turn, tool results), in order.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// Runtime facts plugins read (`cwd`, `git_branch`, …).
    #[serde(default)]
    pub facts: std::collections::BTreeMap<String, String>,
    /// The request body's shape.
    #[serde(default)]
    pub format: Format,
}

/// A step's answer: the request body to send to the provider, as is.
#[derive(Serialize, ToSchema)]
pub struct StepReply {
    /// The request body in the asked format: pass it to the provider SDK unchanged.
    #[schema(value_type = Object)]
    pub request: Value,
    /// The step's number in its session (1-based).
    pub step: u64,
    /// What the request costs, measured by the agent's tokenizer.
    pub usage: Usage,
}

/// `POST /v1/sessions/{id}/compact`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactBody {
    /// The first seq of the message events the summary replaces.
    pub from: u64,
    /// The last seq of those events.
    pub to: u64,
    pub summary: String,
}

/// Sessions, most recent activity first.
#[derive(Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<promptd_core::store::SessionSummary>,
}

/// A step's request and who gave each part.
#[derive(Serialize, ToSchema)]
pub struct StepExplain {
    pub step: u64,
    pub format: Format,
    /// The request body exactly as the step returned it in `format`.
    #[schema(value_type = Object)]
    pub request: Value,
    /// `null` for steps recorded before provenance was (0.1.0 logs).
    pub provenance: Option<promptd_core::provenance::Provenance>,
}

/// The seq of the event just recorded.
#[derive(Serialize, ToSchema)]
pub struct Recorded {
    pub seq: u64,
}

/// One event of a session's log.
#[derive(Serialize, ToSchema)]
pub struct EventView {
    pub seq: u64,
    /// `session/created`, `message/user`, `request/header`, `step`, …
    pub kind: String,
    #[schema(value_type = Object)]
    pub body: Value,
    /// When it was written, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// A session's log, in order.
#[derive(Serialize, ToSchema)]
pub struct EventList {
    pub events: Vec<EventView>,
}

/// Every plugin file the daemon knows.
#[derive(Serialize, ToSchema)]
pub struct PluginList {
    pub plugins: Vec<PluginStatus>,
}

/// The registry changes a call applied.
#[derive(Serialize, ToSchema)]
pub struct Applied {
    pub applied: Vec<RegistryEvent>,
}

/// Where the daemon stands.
#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: HealthStatus,
    /// While `loading`: plugin files done so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded: Option<usize>,
    /// While `loading`: plugin files to load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<usize>,
    /// With `error`: why the daemon cannot keep what it acknowledges.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// Plugins serving now.
    pub plugins: usize,
    pub version: String,
}

/// `ok`; `loading` until the first full registry is published; `error` when the session
/// store lost its files (503).
#[derive(Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
    Loading,
    Error,
}

/// Every error response.
#[derive(Serialize, ToSchema)]
pub struct ErrorReply {
    pub error: ErrorBody,
}

/// The error answers any route may give, each `{"error": {"code", "message"}}` with a stable
/// code (README, "The daemon"; the mapping is `http.rs`'s `status_of`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only described, never built: errors are built from `ApiError`
pub enum Errors {
    /// Malformed input (`bad_request`, `invalid_agent`, …).
    #[response(status = 400)]
    BadRequest(ErrorReply),
    /// No or a wrong bearer token.
    #[response(status = 401)]
    Unauthorized(ErrorReply),
    /// Unknown session, step, plugin or route (`not_found`, `unknown_session`, …).
    #[response(status = 404)]
    NotFound(ErrorReply),
    /// Another writer appended to the session (`store_conflict`).
    #[response(status = 409)]
    Conflict(ErrorReply),
    /// A body over `[limits] max_body_mb` (`body_too_large`).
    #[response(status = 413)]
    PayloadTooLarge(ErrorReply),
    /// Well-formed input that cannot be assembled or recorded (`unknown_variable`,
    /// `open_tool_calls`, `context_overflow`, …).
    #[response(status = 422)]
    Unprocessable(ErrorReply),
    /// Store or engine failures (`store`, `store_corrupt`, `internal`).
    #[response(status = 500)]
    Internal(ErrorReply),
    /// A plugin call failed (`plugin_call`, `plugin_trap`, …).
    #[response(status = 502)]
    PluginFailed(ErrorReply),
    /// Still loading the plugins after the wait (`loading`), or the store's database server
    /// cannot be reached (`store_unavailable`: nothing was recorded, retry later).
    #[response(status = 503)]
    Unavailable(ErrorReply),
}

/// The generated document's fixed parts: title, the bearer token, the schemas the
/// annotations name only by reference.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "promptd",
        description = "The promptd daemon's HTTP API: sessions whose steps return provider \
                       request bodies assembled from WebAssembly plugins, and the plugin \
                       registry. Every error is `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "MIT OR Apache-2.0")
    ),
    components(schemas(ChangeKind, PluginState, ErrorBody, ErrorReply)),
    modifiers(&Bearer),
    security(("bearer" = [])),
    tags(
        (name = "sessions", description = "Sessions, steps and their logs"),
        (name = "plugins", description = "The plugin registry"),
        (name = "daemon", description = "Health, metrics and this document")
    )
)]
pub struct ApiDoc;

/// With a token set (`token` in the config or `PROMPTD_TOKEN`), every route but
/// `/v1/health` needs `Authorization: Bearer <token>`.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}
