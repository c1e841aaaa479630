//! The HTTP API's bodies as types, and the OpenAPI 3.1 document generated from them and from
//! the handlers' annotations (utoipa). The router is built from the same annotated handlers
//! (`utoipa_axum::routes!`), so a route cannot be served without being in the document, and a
//! field cannot change without changing it; `docs/openapi.json` is the committed copy, kept
//! in sync by a test.

mod replies;
use replies::reply_shapes;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use promptd_core::budget::Usage;
use promptd_core::conversation::Message;
use promptd_core::formats::Format;
use promptd_core::plugin::state::{ChangeKind, PluginState};
use promptd_core::ErrorBody;

use crate::events::RegistryEvent;
use crate::PluginStatus;

/// `POST /v1/sessions`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// The agent whose plugins, scopes and budget the session's steps use (default `default`):
    /// any name but `global` made only of printable ASCII without whitespace (C5; otherwise
    /// 400 `invalid_agent`). An agent the config does not name has the global scope only.
    #[serde(default = "default_agent")]
    #[schema(schema_with = agent_name)]
    pub agent: String,
}

/// C5's rule for agent names as [`promptd_core::config`] checks it: non-empty printable ASCII
/// without whitespace (bytes 0x21–0x7E), and not `global` (the global scope).
fn agent_name() -> Schema {
    // utoipa's schema model has no `not`: it goes in as a plain key.
    let not_global: Extensions = [("not", serde_json::json!({"const": "global"}))]
        .into_iter()
        .collect();
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some("^[!-~]+$"))
        .extensions(Some(not_global))
        .default(Some("default".into()))
        .description(Some(
            "The agent whose plugins, scopes and budget the session's steps use (default \
             `default`): any name but `global` made only of printable ASCII without whitespace \
             (otherwise 400 `invalid_agent`).",
        ))
        .into()
}

/// What the generated document cannot say by itself, said in it (run on the document as
/// served and committed):
///
/// - a header or query parameter is a value or absent, never null;
/// - a u64 or usize is an integer from 0 to 2^64 − 1 (or null, when optional), not the
///   `int64` utoipa calls it (a `limit` or `from` over 2^63 is taken);
/// - serde's `deny_unknown_fields` on the internally tagged `Message` and `Block` holds for
///   each variant: no other keys (utoipa leaves it out of the variants).
pub fn complete(doc: &mut Value) {
    links(doc);
    // A parameter is left out by not sending it; a header or a query cannot be JSON null.
    let paths = doc.get_mut("paths").and_then(Value::as_object_mut);
    let operations = paths
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let parameters = operation
            .get_mut("parameters")
            .and_then(Value::as_array_mut);
        for parameter in parameters.into_iter().flatten() {
            let Some(types) = parameter.pointer_mut("/schema/type") else {
                continue;
            };
            if let Value::Array(list) = types {
                list.retain(|t| t != "null");
                if list.len() == 1 {
                    *types = list.remove(0);
                }
            }
        }
    }
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                // `integer`, or `["integer", "null"]` for an optional field of a body.
                let integer = match map.get("type") {
                    Some(Value::String(t)) => t == "integer",
                    Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                    _ => false,
                };
                let unsigned = integer
                    && map.get("format").and_then(Value::as_str) == Some("int64")
                    && map.get("minimum").and_then(Value::as_u64) == Some(0);
                if unsigned {
                    map.remove("format");
                    map.entry("maximum").or_insert(u64::MAX.into());
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(doc);
    for closed in ["Message", "Block"] {
        let variants = doc
            .pointer_mut(&format!("/components/schemas/{closed}/oneOf"))
            .and_then(Value::as_array_mut);
        for variant in variants.into_iter().flatten() {
            variant["additionalProperties"] = Value::Bool(false);
        }
    }
}

fn default_agent() -> String {
    promptd_core::config::DEFAULT_AGENT.to_string()
}

/// A new session.
#[derive(Serialize, ToSchema)]
pub struct SessionCreated {
    /// The new session's id.
    pub id: String,
    /// The agent it serves.
    pub agent: String,
}

/// `POST /v1/sessions/{id}/steps`: this step's new messages and facts.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepBody {
    /// The messages this step adds (a user turn, tool results), in order.
    #[serde(default)]
    #[schema(value_type = Vec<StepMessage>)]
    pub messages: Vec<Message>,
    /// Runtime facts plugins read (`cwd`, `git_branch`, …).
    #[serde(default)]
    pub facts: std::collections::BTreeMap<String, String>,
    /// The request body's shape.
    #[serde(default)]
    pub format: Format,
    /// When you will send the request, in milliseconds since the Unix epoch (default: now):
    /// a held change's idle gap and age are measured from it, as a recorded reply's are from
    /// its `sent_at`. For clients that replay or simulate traffic on their own clock.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(maximum = 18446744073709551615_u64)]
    pub sent_at: Option<u64>,
    /// The step whose request body you hold in this format (0: none yet). The answer then
    /// carries `parts` instead of `request`: what changed since that step, from which you
    /// keep the body yourself, byte for byte (docs/http-api.md, "A step's parts").
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(maximum = 18446744073709551615_u64)]
    pub since: Option<u64>,
}

/// A message a step adds: a `Message` with the role `user` (never a `snapshot`: promptd sets
/// those) or `tool`; the model's reply is recorded with `POST /v1/sessions/{id}/messages`
/// (otherwise 400).
pub struct StepMessage;

impl ToSchema for StepMessage {}

impl PartialSchema for StepMessage {
    fn schema() -> RefOr<Schema> {
        raw_schema(serde_json::json!({
            "description": "A user message or a tool result (`Message`); never a snapshot.",
            "allOf": [{"$ref": format!("#/components/schemas/{}", Message::name())}],
            "properties": {
                "role": {"enum": ["user", "tool"]},
                "snapshot": {"const": false},
            },
        }))
    }
}

/// A step's answer: the request body to send to the provider, as is (or, with `since`, its
/// parts).
#[derive(Serialize, ToSchema)]
pub struct StepReply {
    /// The request body in the asked format: pass it to the provider SDK unchanged. Absent
    /// when the step was asked with `since`.
    #[schema(value_type = Option<Object>)]
    pub request: Option<Value>,
    /// With `since`: the body as parts relative to step `since` (0: from nothing). Join
    /// `open`, your kept items (the first `keep` of that step's) then `items`, and `close`
    /// (a `null` end: keep yours), the items separated by commas: the bytes of `request`.
    pub parts: Option<StepParts>,
    /// The step's number in its session (1-based).
    pub step: u64,
    /// What the request costs, measured by the agent's tokenizer.
    pub usage: Usage,
}

/// A step's body in parts (`since`).
#[derive(Serialize, ToSchema)]
pub struct StepParts {
    /// The step the parts are relative to; 0: from nothing (`keep` is 0, both ends given).
    pub since: u64,
    /// The body's text before its first message (through the list's `[`), when it changed.
    pub open: Option<String>,
    /// The body's text after its last message (from the list's `]`), when it changed.
    pub close: Option<String>,
    /// How many of the `since` step's messages to keep, from the first.
    pub keep: u64,
    /// The messages that follow, each as its JSON text.
    pub items: Vec<String>,
}

/// The body of `POST /v1/sessions/{id}/messages`: a model's reply as the provider SDK returned
/// it, or a neutral assistant or tool message (`promptd_core::formats::replies`), with the keys the
/// daemon tells the shapes apart by: `choices` (an OpenAI Chat Completion), else `output` (an
/// OpenAI Response), else `role`: `tool` (a neutral tool result), `assistant` with `content`
/// a list of blocks (Anthropic), with OpenAI's marks (`content: null`, `refusal`,
/// `tool_calls[].function`, …; OpenAI) or neither (neutral). A `usage` key beside any of them
/// is read as the provider's usage. `ReplyMessage` is the same without `usage` (what
/// `choices[0].message` holds).
pub struct ReplyBody;

/// [`ReplyBody`] as `choices[0].message` holds it.
pub struct ReplyMessage;

impl ToSchema for ReplyBody {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((ReplyMessage::name().into(), ReplyMessage::schema()));
    }
}

impl PartialSchema for ReplyBody {
    fn schema() -> RefOr<Schema> {
        raw_schema(reply_shapes(true))
    }
}

impl ToSchema for ReplyMessage {}

impl PartialSchema for ReplyMessage {
    fn schema() -> RefOr<Schema> {
        raw_schema(reply_shapes(false))
    }
}

/// A schema written as JSON Schema itself: utoipa's model has no `not`, `const` or
/// `contains`, so its keys go in as they are.
fn raw_schema(schema: Value) -> RefOr<Schema> {
    let Value::Object(keys) = schema else {
        unreachable!("a schema is an object")
    };
    let keys: Extensions = keys.into_iter().collect();
    let mut object = ObjectBuilder::new().extensions(Some(keys)).build();
    object.schema_type = utoipa::openapi::schema::SchemaType::AnyValue;
    RefOr::T(Schema::Object(object))
}

/// `POST /v1/sessions/{id}/compact`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactBody {
    /// The first seq of the message events the summary replaces.
    #[serde(deserialize_with = "integer")]
    pub from: u64,
    /// The last seq of those events.
    #[serde(deserialize_with = "integer")]
    pub to: u64,
    /// What the summary says in place of those events: more than white space (a blank one is
    /// 422 `invalid_compaction`). The pattern finds one character that is not Unicode
    /// White_Space, which is what `str::trim` removes.
    #[schema(
        min_length = 1,
        pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    pub summary: String,
}

/// `POST /v1/replay`: which recorded sessions to replay, and with what candidate. Paths are
/// read by the daemon, on its machine, and must be absolute (else 422 `replay_candidate`,
/// as for a folder or file that is missing or not what it must be).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    /// The sessions to replay, by id (an unknown one is 404 `unknown_session`); without
    /// them (or with none), the most recent sessions, at most `limit`.
    #[serde(default)]
    #[schema(max_items = 1000)]
    pub sessions: Option<Vec<String>>,
    /// Only this agent's sessions.
    #[serde(default)]
    pub agent: Option<String>,
    /// Only sessions with activity at or after this time, in milliseconds since the Unix
    /// epoch.
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0)]
    pub since: Option<u64>,
    /// Without `sessions`: at most this many, most recent activity first (default 100; 0
    /// reads 1, more than 1000 reads 1000).
    #[serde(default, deserialize_with = "optional_integer")]
    #[schema(minimum = 0)]
    pub limit: Option<u64>,
    /// The candidate plugin folder (default: the daemon's own).
    #[serde(default)]
    pub plugins: Option<String>,
    /// Plugin files (`.wasm`) that replace the folder's file of the same plugin id (the file
    /// name, or the config's `id`), or join the set: `promptd plugin check NEW.wasm
    /// --against SESSION`.
    #[serde(default)]
    #[schema(max_items = 256)]
    pub swap: Option<Vec<String>>,
    /// The candidate config file (default: the daemon's config).
    #[serde(default)]
    pub config: Option<String>,
    /// The provider format compared and priced: `openai`, `anthropic`, `openai-responses`,
    /// `gemini` or `bedrock` (default: the format of each session's recorded replies, else
    /// `anthropic`).
    #[serde(default)]
    #[schema(schema_with = provider_format)]
    pub format: Option<Format>,
}

/// A provider's format (not `neutral`, which no provider reads), or null.
fn provider_format() -> Schema {
    let Some(RefOr::T(schema)) = Some(raw_schema(serde_json::json!({
        "type": ["string", "null"],
        "enum": ["openai", "anthropic", "openai-responses", "gemini", "bedrock", null],
        "description": "The provider format compared and priced (default: the format of each \
                        session's recorded replies, else `anthropic`).",
    }))) else {
        unreachable!("a raw schema is inline")
    };
    schema
}

impl ReplayBody {
    /// The request the daemon replays.
    pub fn into_request(self) -> crate::replay::ReplayRequest {
        let path = |p: String| std::path::PathBuf::from(p);
        crate::replay::ReplayRequest {
            sessions: self.sessions.unwrap_or_default(),
            agent: self.agent,
            since_ms: self.since,
            limit: self
                .limit
                .unwrap_or(100)
                .min(crate::replay::MAX_SESSIONS as u64) as usize,
            plugins: self.plugins.map(path),
            swap: self
                .swap
                .unwrap_or_default()
                .into_iter()
                .map(path)
                .collect(),
            config: self.config.map(path),
            format: self.format,
        }
    }
}

/// [`integer`], or null or absent.
fn optional_integer<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Wrapped(#[serde(deserialize_with = "integer")] u64);
    Ok(Option::<Wrapped>::deserialize(deserializer)?.map(|Wrapped(n)| n))
}

/// A JSON integer as JSON Schema counts them: `840` and `840.0` alike (a number with no
/// fractional part), within u64.
fn integer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    use serde::de::Error;
    match serde_json::Number::deserialize(deserializer)? {
        n if n.is_u64() => Ok(n.as_u64().unwrap_or_default()),
        n => match n.as_f64() {
            // 2^64 is the first float past u64::MAX.
            Some(f) if f.fract() == 0.0 && (0.0..18446744073709551616.0).contains(&f) => {
                Ok(f as u64)
            }
            _ => Err(D::Error::custom(format!(
                "invalid value: {n}, expected a non-negative integer (u64)"
            ))),
        },
    }
}

/// Sessions, most recent activity first.
#[derive(Serialize, ToSchema)]
pub struct SessionList {
    /// The sessions that match, most recent activity first.
    pub sessions: Vec<promptd_core::store::SessionSummary>,
}

/// A step's request and who gave each part.
#[derive(Serialize, ToSchema)]
pub struct StepExplain {
    /// The step's number.
    pub step: u64,
    /// The format `request` is in.
    pub format: Format,
    /// The request body exactly as the step returned it in `format`.
    #[schema(value_type = Object)]
    pub request: Value,
    /// `null` for steps recorded before provenance was (0.1.0 logs).
    pub provenance: Option<promptd_core::provenance::Provenance>,
    /// K7: changed parts the step did not send yet, waiting for a cache-cold point.
    pub held: Vec<promptd_core::held::Held>,
    /// K7: what a header of this step applied of what earlier steps held, and why then.
    pub released: Option<promptd_core::held::Released>,
    /// `held` and `released` in words, e.g. "section `skills` of plugin `catalogue` held
    /// since step 41, 37 kB of cached prefix kept".
    pub said: Vec<String>,
}

/// The seq of the event just recorded.
#[derive(Serialize, ToSchema)]
pub struct Recorded {
    /// The event's seq in the session's log.
    pub seq: u64,
}

/// `POST /v1/sessions/{id}/messages`: the seq of the recorded event, and the tool calls a
/// recorded reply opened, with the ids the daemon gave calls that came without (Gemini's).
#[derive(Serialize, ToSchema)]
pub struct RecordedMessage {
    /// The event's seq in the session's log.
    pub seq: u64,
    /// The calls the reply made, as recorded (none for a final answer or a tool result).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<promptd_core::conversation::ToolCall>,
}

/// One event of a session's log.
#[derive(Serialize, ToSchema)]
pub struct EventView {
    /// Its 1-based seq in the session's log.
    pub seq: u64,
    /// `session/created`, `user/message`, `assistant/message`, `tool/result`,
    /// `context/snapshot`, `request/header`, `step`, …
    pub kind: String,
    /// Its body, as recorded.
    #[schema(value_type = Object)]
    pub body: Value,
    /// When it was written, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// A session's log, in order.
#[derive(Serialize, ToSchema)]
pub struct EventList {
    /// The events.
    pub events: Vec<EventView>,
}

/// Every plugin file the daemon knows.
#[derive(Serialize, ToSchema)]
pub struct PluginList {
    /// Each file, and each external contributor (MCP server).
    pub plugins: Vec<PluginStatus>,
    /// K10: the published plugin set served, when the daemon follows its store's (`[fleet]
    /// follow`): which, the latest the store holds, and why a newer one did not load; null
    /// for a daemon serving its folder.
    pub set: Option<crate::fleet::SetStatus>,
}

/// The registry changes a call applied.
#[derive(Serialize, ToSchema)]
pub struct Applied {
    /// The events, one per change.
    pub applied: Vec<RegistryEvent>,
}

/// The data of the `lagged` event that ends a `GET /v1/events` stream: this client missed
/// changes (the history no longer holds them, or it read too slowly). Resync from `GET
/// /v1/plugins`, then reconnect.
#[derive(Serialize, ToSchema)]
pub struct Lagged {
    /// How many changes it missed.
    pub missed: u64,
}

/// One server-sent event of `GET /v1/events`, as a client reads it: its `id`, `event` and
/// `data` lines. Before OpenAPI 3.2 a `text/event-stream` schema describes each event; the
/// JSON each `data` line carries is a [`RegistryEvent`] or, ending the stream, a [`Lagged`].
pub struct RegistryStreamEvent;

impl ToSchema for RegistryStreamEvent {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((RegistryEvent::name().into(), RegistryEvent::schema()));
        <RegistryEvent as ToSchema>::schemas(schemas);
        schemas.push((Lagged::name().into(), Lagged::schema()));
    }
}

impl PartialSchema for RegistryStreamEvent {
    fn schema() -> RefOr<Schema> {
        let text = || ObjectBuilder::new().schema_type(Type::String);
        let json_of = |name: &str| {
            text()
                .content_media_type("application/json")
                .content_schema(Some(Ref::from_schema_name(name)))
        };
        let event = |kinds: RefOr<Schema>, data: ObjectBuilder| {
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property("event", kinds)
                .required("event")
                .property("data", data)
                .required("data")
        };
        let change = event(
            // The change's kind, as in its data.
            Ref::from_schema_name(ChangeKind::name()).into(),
            json_of(RegistryEvent::name().as_ref()),
        )
        .property(
            "id",
            text().pattern(Some("^[1-9][0-9]*$")).description(Some(
                "The change's seq: resume after it with `Last-Event-ID`.",
            )),
        )
        .required("id")
        .description(Some("A registry change."));
        let lagged = event(
            text().enum_values(Some(["lagged"])).into(),
            json_of(Lagged::name().as_ref()),
        )
        .description(Some(
            "Changes were missed; the stream ends. (It carries no `id` of its own: a client \
             reports the last one it read.)",
        ));
        let one_of = OneOfBuilder::new()
            .item(change)
            .item(lagged)
            .description(Some(
                "One event of the stream: `id`, `event` and `data` lines, the data a JSON object.",
            ));
        RefOr::T(one_of.into())
    }
}

/// Where the daemon stands.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// Whether the daemon serves.
    pub status: HealthStatus,
    /// While `loading`: plugin files done so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loaded: Option<usize>,
    /// While `loading`: plugin files to load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<usize>,
    /// With `error`: why the daemon cannot keep what it acknowledges; with `no_plugin_set`:
    /// why no published plugin set serves (`plugin_set_unavailable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// Plugins serving now.
    pub plugins: usize,
    /// K10: the published plugin set served, when the daemon follows its store's; null for
    /// a daemon serving its folder.
    pub plugin_set: Option<crate::fleet::SetStatus>,
    /// The daemon's version.
    pub version: String,
}

/// `ok`; `loading` until the first full registry is published; `no_plugin_set` when the
/// daemon follows the store's plugin sets and none of those published loaded (steps are
/// refused); `error` when the session store lost its files (503).
#[derive(Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// Serving.
    Ok,
    /// Loading the plugin folder for the first time.
    Loading,
    /// Following the store's plugin sets, a set is published but none loaded (or the
    /// store's sets could not be read): steps are refused with 503 `plugin_set_unavailable`.
    #[serde(rename = "no_plugin_set")]
    NoPluginSet,
    /// The session store cannot keep what it acknowledges.
    Error,
}

/// Every error response.
#[derive(Serialize, ToSchema)]
pub struct ErrorReply {
    /// The code and message.
    pub error: ErrorBody,
}

/// OpenAPI links between the session routes (issue 32): what a response gives the next call
/// of a session's life — create → step → record → run a tool call; request, explain, diff,
/// events, usage, compact — so a client generator or a stateful fuzzer (schemathesis) walks
/// real sessions instead of guessed ids.
fn links(doc: &mut Value) {
    let session = |op: &str| serde_json::json!({"operationId": op, "parameters": {"id": "$response.body#/id"}});
    let same =
        |op: &str| serde_json::json!({"operationId": op, "parameters": {"id": "$request.path.id"}});
    let step = |op: &str| {
        serde_json::json!({"operationId": op, "parameters": {
            "id": "$request.path.id", "n": "$response.body#/step"}})
    };
    let table = [
        (
            "/v1/sessions",
            "post",
            "201",
            serde_json::json!({
                "StepTheSession": session("step"),
                "RecordAMessage": session("record_message"),
                "CompactTheSession": session("compact"),
                "TheSessionsEvents": session("session_events"),
                "TheSessionsUsage": session("usage_report"),
            }),
        ),
        (
            "/v1/sessions/{id}/steps",
            "post",
            "200",
            serde_json::json!({
                "NextStep": same("step"),
                "RecordTheReply": same("record_message"),
                "TheStepsRequest": step("step_request"),
                "ExplainTheStep": step("step_explain"),
                "DiffTheStep": step("step_diff"),
            }),
        ),
        (
            "/v1/sessions/{id}/messages",
            "post",
            "201",
            serde_json::json!({
                "RunTheToolCall": {"operationId": "run_tool_call", "parameters": {
                    "id": "$request.path.id", "call_id": "$request.body#/tool_calls/0/id"}},
                "NextStep": same("step"),
                "TheSessionsEvents": same("session_events"),
            }),
        ),
        (
            "/v1/sessions/{id}/compact",
            "post",
            "201",
            serde_json::json!({"NextStep": same("step"), "TheSessionsEvents": same("session_events")}),
        ),
    ];
    for (path, method, status, links) in table {
        let pointer = format!(
            "/paths/{}/{method}/responses/{status}",
            path.replace('~', "~0").replace('/', "~1")
        );
        if let Some(Value::Object(response)) = doc.pointer_mut(&pointer) {
            response.insert("links".into(), links);
        }
    }
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
    /// A request body that did not arrive whole within `[limits] body_timeout_ms`
    /// (`body_timeout`); the connection is closed.
    #[response(status = 408)]
    RequestTimeout(ErrorReply),
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
    /// Still loading the plugins after the wait (`loading`), a following daemon behind the
    /// session's plugin set (`plugin_set_behind`) or serving none (`plugin_set_unavailable`),
    /// or the store's database server cannot be reached (`store_unavailable`: nothing was
    /// recorded, retry later).
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
    components(schemas(ChangeKind, PluginState, ErrorBody, ErrorReply, Message)),
    modifiers(&Bearer),
    // A daemon without a token (loopback only) serves without one: none, or the bearer token.
    security((), ("bearer" = [])),
    tags(
        (name = "sessions", description = "Sessions, steps and their logs"),
        (name = "plugins", description = "The plugin registry"),
        (name = "daemon", description = "Health, metrics and this document")
    )
)]
pub struct ApiDoc;

/// With a token set (`token` in the config or `PROMPTD_TOKEN`), every route but
/// `/v1/health` needs `Authorization: Bearer <token>`; without one (a loopback daemon), none
/// does.
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
