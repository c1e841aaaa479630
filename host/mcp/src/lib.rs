//! MCP servers as promptd contributors (M1–M5).
//!
//! Each `[mcp.NAME]` server becomes the registry entry `mcp:NAME`: a native provider with a
//! declaration (its tools under mapped names, its `instructions` as a section, each configured
//! resource as a dynamic context read at the step), so
//! validation, conflicts, scopes, canonical order and provenance are the plugins' own path.
//! A supervisor task per server connects with the official SDK (`rmcp`), lists the tools,
//! re-lists on `notifications/tools/list_changed`, and restarts a lost server with backoff;
//! each list goes to [`Daemon::set_external`], which publishes nothing when the canonical
//! declaration is unchanged (M3). The daemon runs the server's tool calls through
//! [`McpRunner`] (M4). A server that fails `max_failures` times in a row is given up on
//! ([`Daemon::fail_external`]: state `failed`) until its config changes or it is enabled;
//! a config reload starts, stops and restarts servers as their `[mcp.NAME]` tables change.

pub mod names;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use promptd_core::config::{
    Config, McpConfig, DEFAULT_MCP_INSTRUCTIONS_ORDER, DEFAULT_MCP_TIMEOUT_MS,
};
use promptd_core::plugin::model::Scope;
use promptd_core::plugin::provider::{CallError, CallResult, NativePlugin};
use promptd_core::plugin::registry::PluginEntry;
use promptd_core::plugin::trust::Trust;
use promptd_core::sync::{read, write};
use promptd_core::ErrorBody;
use promptd_daemon::{Daemon, ToolOutcome, ToolRunner};
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, SubscriptionFilter};
use rmcp::service::{NotificationContext, Peer, QuitReason, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

/// The error code of every MCP server failure shown in `GET /v1/plugins`.
pub const ERROR_CODE: &str = "mcp_server";

/// First wait before restarting a failed server; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A connection that lasted this long resets the backoff and the failure count.
const STABLE: Duration = Duration::from_secs(30);
/// `[mcp.NAME] max_failures` when not set.
pub const DEFAULT_MAX_FAILURES: u32 = 10;

/// The registry id of server `name`.
pub fn plugin_id(name: &str) -> String {
    format!("mcp:{name}")
}

/// What `GET /v1/plugins` shows as the server's `file`: its command line or its URL.
pub fn label(cfg: &McpConfig) -> String {
    match (&cfg.command, &cfg.url) {
        (Some(command), _) => std::iter::once(command.as_str())
            .chain(cfg.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        (None, Some(url)) => url.clone(),
        (None, None) => String::new(),
    }
}

fn timeout_of(cfg: &McpConfig) -> Duration {
    Duration::from_millis(cfg.timeout_ms.unwrap_or(DEFAULT_MCP_TIMEOUT_MS))
}

fn failure(name: &str, message: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(ERROR_CODE, format!("MCP server `{name}`: {message}"))
}

/// Reads one resource's text for a runtime context.
pub type ResourceReader = Arc<dyn Fn(&str) -> CallResult<String> + Send + Sync>;

/// Order of the runtime contexts holding a server's resources.
pub const RESOURCES_ORDER: i32 = 1000;

/// The entry `mcp:NAME` for a listed set of tools and the server's instructions (and a
/// dynamic context per configured resource, read with `read`), with the map from each mapped
/// tool name back to the server's own.
pub fn entry(
    name: &str,
    cfg: &McpConfig,
    config: &Config,
    tools: &[rmcp::model::Tool],
    instructions: Option<&str>,
    read: &ResourceReader,
) -> Result<(PluginEntry, BTreeMap<String, String>), ErrorBody> {
    let id = plugin_id(name);
    let originals: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    let mapped = names::map_all(cfg.tool_prefix.as_deref().unwrap_or(""), &originals)
        .map_err(|e| failure(name, e))?;
    let by_original: BTreeMap<&str, &rmcp::model::Tool> =
        tools.iter().map(|t| (t.name.as_ref(), t)).collect();
    let mut plugin = NativePlugin::new();
    // Declared in mapped-name order, so the declaration (and its hash) never depends on the
    // order the server listed them in.
    for (mapped_name, original) in &mapped {
        let tool = by_original[original.as_str()];
        let parameters = serde_json::to_string(&*tool.input_schema)
            .map_err(|e| failure(name, format!("tool `{original}`: {e}")))?;
        let description = tool.description.as_deref().unwrap_or("");
        plugin = plugin.tool(mapped_name, description, &parameters);
    }
    let trust = cfg.trust.unwrap_or(config.default_trust);
    // The server wrote these, not the operator: a verbatim section (T7), so `{{` in them is
    // text, never a reference to a variable. A `data` server's are a context, fenced as data
    // (T8), as a data plugin's contexts are.
    if let Some(text) = instructions.filter(|t| !t.trim().is_empty()) {
        let order = cfg
            .instructions_order
            .unwrap_or(DEFAULT_MCP_INSTRUCTIONS_ORDER);
        let name = format!("{id}:instructions");
        plugin = match trust {
            Trust::Data => plugin.context(&name, order, text),
            Trust::Instructions => plugin.section(&name, order, text).verbatim(),
        };
    }
    for uri in &cfg.resources {
        let (read, uri_owned) = (read.clone(), uri.clone());
        plugin = plugin.dynamic_context(&format!("{id}:{uri}"), RESOURCES_ORDER, move |_| {
            read(&uri_owned)
        });
    }
    let (declaration, provider) = plugin.build();
    let mut options = config.plugin_options(&id);
    options.trust = trust;
    options.scope_override = cfg.scope.clone().map(Scope::Agent);
    options.optional = cfg.optional;
    // A resource that fails to read leaves out its context alone: the tools stay (no cache
    // break) and the step records a `plugin/omitted` event naming the context.
    options.contexts_fail_alone = true;
    // Checked when the config was validated.
    options.refresh = cfg.refresh(name).unwrap_or_default();
    options.keep_tools = cfg.keep_tools.unwrap_or(true);
    options.defer = cfg.defer(name).unwrap_or_default();
    let entry = PluginEntry::new(&id, declaration, provider, options)
        .map_err(|e| ErrorBody::from(&e))?
        .with_origin(label(cfg));
    Ok((entry, mapped))
}

/// Runs tool calls on one connection to a server; mapped names go back to the server's own.
pub struct McpRunner {
    name: String,
    peer: Peer<RoleClient>,
    names: BTreeMap<String, String>,
    timeout: Duration,
    handle: Handle,
    /// Since when (ms since the Unix epoch) and why the server is lost, while it is: its
    /// tools keep their place in requests (`stale`), and a call gets this instead of a try.
    down: Down,
}

/// The server's outage, shared by the supervisor and every runner it made.
type Down = Arc<std::sync::Mutex<Option<(u64, String)>>>;

/// What a model reads of a call to a lost server's tool.
fn unavailable(server: &str, since_ms: u64, cause: &str) -> String {
    let since = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(since_ms as i64)
        .map_or_else(
            || format!("{since_ms} ms since the epoch"),
            |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        );
    format!(
        "MCP server `{server}` is unavailable since {since} ({cause}); its tools keep their \
         place until it is back, so try again later or do without it"
    )
}

impl ToolRunner for McpRunner {
    fn run(&self, name: &str, arguments: &Value) -> ToolOutcome {
        let error = |content: String| ToolOutcome {
            content,
            is_error: true,
        };
        let Some(original) = self.names.get(name) else {
            return error(format!("MCP server `{}` has no tool `{name}`", self.name));
        };
        if let Some((since, cause)) = promptd_core::sync::lock(&self.down).clone() {
            return error(unavailable(&self.name, since, &cause));
        }
        let mut params = CallToolRequestParams::new(original.clone());
        if let Some(object) = arguments.as_object() {
            params = params.with_arguments(object.clone());
        }
        // The daemon calls this on a blocking worker thread, never inside the runtime.
        let called = self.handle.block_on(tokio::time::timeout(
            self.timeout,
            self.peer.call_tool(params),
        ));
        match called {
            Ok(Ok(result)) => match serde_json::to_value(&result) {
                Ok(value) => ToolOutcome {
                    content: result_text(&value),
                    is_error: value.get("isError").and_then(Value::as_bool) == Some(true),
                },
                Err(e) => error(format!(
                    "MCP server `{}`: the result of `{original}` could not be read: {e}",
                    self.name
                )),
            },
            Ok(Err(e)) => error(format!(
                "MCP server `{}`: {}",
                self.name,
                request_failed("tools/call", &e)
            )),
            Err(_) => error(format!(
                "MCP server `{}`: the call to `{original}` timed out after {} ms",
                self.name,
                self.timeout.as_millis()
            )),
        }
    }
}

/// The text a model reads of a `tools/call` result: its text blocks, one per line; other
/// blocks as their JSON; the structured content when there are no blocks.
fn result_text(result: &Value) -> String {
    let blocks = result.get("content").and_then(Value::as_array);
    let mut parts = Vec::new();
    for block in blocks.into_iter().flatten() {
        match block.get("text").and_then(Value::as_str) {
            Some(text) if block.get("type").and_then(Value::as_str) == Some("text") => {
                parts.push(text.to_string())
            }
            _ => parts.push(block.to_string()),
        }
    }
    if parts.is_empty() {
        if let Some(structured) = result.get("structuredContent") {
            parts.push(structured.to_string());
        }
    }
    parts.join("\n")
}

/// Receives the server's notifications: a tools list change asks the supervisor to re-list.
struct Notified {
    changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Notified {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }
}

type Connection = RunningService<RoleClient, Notified>;

/// The server's live connection, if any: the contributions' dynamic contexts read through
/// whichever connection is current, so an entry kept across a reconnect (M3) still reads.
type Current = Arc<std::sync::RwLock<Option<Peer<RoleClient>>>>;

fn reader(name: &str, current: Current, timeout: Duration, handle: Handle) -> ResourceReader {
    let name = name.to_string();
    Arc::new(move |uri: &str| {
        let peer = read(&current)
            .clone()
            .ok_or_else(|| CallError::Failed(format!("MCP server `{name}` is not connected")))?;
        let params = ReadResourceRequestParams::new(uri);
        // Assembly calls providers on blocking threads, never inside the runtime.
        let read = handle.block_on(tokio::time::timeout(timeout, peer.read_resource(params)));
        let result = match read {
            Ok(Ok(result)) => serde_json::to_value(&result).map_err(|e| {
                CallError::Failed(format!(
                    "MCP server `{name}`: resources/read {uri}: the result could not be read: {e}"
                ))
            })?,
            Ok(Err(e)) => {
                return Err(CallError::Failed(format!(
                    "MCP server `{name}`: resources/read {uri}: {e}"
                )))
            }
            Err(_) => {
                return Err(CallError::Failed(format!(
                    "MCP server `{name}`: resources/read {uri} timed out after {} ms",
                    timeout.as_millis()
                )))
            }
        };
        let texts: Vec<&str> = result
            .get("contents")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect();
        Ok(texts.join("\n"))
    })
}

async fn connect(cfg: &McpConfig, handler: Notified) -> Result<Connection, String> {
    if let Some(command) = &cfg.command {
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(&cfg.args).envs(&cfg.env);
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start `{command}`: {e}"))?;
        handler
            .serve(transport)
            .await
            .map_err(|e| format!("initialize failed: {e}"))
    } else {
        let url = cfg.url.clone().unwrap_or_default();
        let mut headers = std::collections::HashMap::new();
        for (key, value) in &cfg.headers {
            let key = http::HeaderName::try_from(key.as_str())
                .map_err(|e| format!("header `{key}`: {e}"))?;
            let value = http::HeaderValue::try_from(value.as_str())
                .map_err(|e| format!("header `{key}`: {e}"))?;
            headers.insert(key, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        handler
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .map_err(|e| format!("initialize failed: {e}"))
    }
}

/// Starts one supervisor task per `[mcp.NAME]` server of the daemon's config on `handle`, and
/// registers with the daemon to follow config reloads and `enable` calls.
pub fn start(daemon: &Arc<Daemon>, handle: &Handle) {
    let supervisors = Arc::new(Supervisors {
        daemon: Arc::downgrade(daemon),
        handle: handle.clone(),
        running: std::sync::Mutex::new(BTreeMap::new()),
    });
    supervisors.apply(&daemon.config());
    daemon.set_external_control(supervisors);
}

/// The supervisor task of each configured server, with the config it runs.
struct Supervisors {
    daemon: std::sync::Weak<Daemon>,
    handle: Handle,
    running: std::sync::Mutex<BTreeMap<String, Supervisor>>,
}

struct Supervisor {
    cfg: McpConfig,
    task: tokio::task::AbortHandle,
    restart: Arc<tokio::sync::Notify>,
}

impl Supervisors {
    /// Starts a supervisor for each server `config` adds or changes (stopping the old one)
    /// and stops those of servers it no longer has.
    fn apply(&self, config: &Config) {
        let Some(daemon) = self.daemon.upgrade() else {
            return;
        };
        let mut running = promptd_core::sync::lock(&self.running);
        let gone: Vec<String> = running
            .keys()
            .filter(|name| !config.mcp.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            if let Some(old) = running.remove(&name) {
                old.task.abort();
            }
            daemon.remove_external(&plugin_id(&name));
        }
        for (name, cfg) in &config.mcp {
            if running.get(name).is_some_and(|s| s.cfg == *cfg) {
                continue;
            }
            if let Some(old) = running.remove(name) {
                old.task.abort();
            }
            // Steps wait for its first list (within their bound), as for the first load.
            daemon.expect_first_lists([plugin_id(name)]);
            let restart = Arc::new(tokio::sync::Notify::new());
            let task = self
                .handle
                .spawn(supervise(
                    daemon.clone(),
                    name.clone(),
                    cfg.clone(),
                    self.handle.clone(),
                    restart.clone(),
                ))
                .abort_handle();
            running.insert(
                name.clone(),
                Supervisor {
                    cfg: cfg.clone(),
                    task,
                    restart,
                },
            );
        }
    }
}

impl promptd_daemon::ExternalControl for Supervisors {
    fn config_changed(&self, config: &Config) {
        self.apply(config);
    }

    fn restart(&self, id: &str) {
        let running = promptd_core::sync::lock(&self.running);
        if let Some(s) = running
            .iter()
            .find_map(|(name, s)| (plugin_id(name) == id).then_some(s))
        {
            s.restart.notify_one();
        }
    }
}

/// Reports one outcome to the daemon, off the runtime's workers (the daemon may be loading).
async fn report(
    daemon: &Arc<Daemon>,
    name: &str,
    cfg: &McpConfig,
    result: Result<(PluginEntry, Arc<dyn ToolRunner>), ErrorBody>,
) {
    let daemon = daemon.clone();
    let (id, file) = (plugin_id(name), label(cfg));
    let _ = tokio::task::spawn_blocking(move || daemon.set_external(&id, &file, result)).await;
}

/// Connects, lists, re-lists on change, and restarts with backoff, for as long as the
/// daemon runs.
async fn supervise(
    daemon: Arc<Daemon>,
    name: String,
    cfg: McpConfig,
    handle: Handle,
    restart: Arc<tokio::sync::Notify>,
) {
    let timeout = timeout_of(&cfg);
    let current: Current = Arc::default();
    let down: Down = Arc::default();
    let mut backoff = FIRST_BACKOFF;
    let most = cfg.max_failures.unwrap_or(DEFAULT_MAX_FAILURES).max(1);
    let mut failures = 0;
    loop {
        let started = Instant::now();
        let (tx, mut changed) = mpsc::unbounded_channel();
        let cause = match tokio::time::timeout(
            timeout,
            connect(
                &cfg,
                Notified {
                    changed: tx.clone(),
                },
            ),
        )
        .await
        {
            Err(_) => failure(
                &name,
                format!("no answer to initialize within {} ms", timeout.as_millis()),
            ),
            Ok(Err(cause)) => failure(&name, cause),
            Ok(Ok(connection)) => {
                listen_for_changes(&connection, tx, timeout);
                *write(&current) = Some(connection.peer().clone());
                let read = reader(&name, current.clone(), timeout, handle.clone());
                let cause = serve(
                    &daemon,
                    &name,
                    &cfg,
                    (&handle, &down),
                    connection,
                    &mut changed,
                    read,
                )
                .await;
                *write(&current) = None;
                cause
            }
        };
        promptd_core::sync::lock(&down).get_or_insert_with(|| (now_ms(), cause.message.clone()));
        if started.elapsed() >= STABLE {
            backoff = FIRST_BACKOFF;
            failures = 0;
        }
        failures += 1;
        if failures >= most {
            let body = failure(
                &name,
                format!(
                    "gave up after {failures} failures in a row (max_failures); the last: {}. \
                     It is tried again when its config changes or on \
                     POST /v1/plugins/{}/enable",
                    cause.message,
                    plugin_id(&name)
                ),
            );
            let (d, id, file) = (daemon.clone(), plugin_id(&name), label(&cfg));
            let _ = tokio::task::spawn_blocking(move || d.fail_external(&id, &file, body)).await;
            restart.notified().await;
            (failures, backoff) = (0, FIRST_BACKOFF);
            continue;
        }
        report(&daemon, &name, &cfg, Err(cause)).await;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// On protocol versions where list changes come on a listen stream, opens one that forwards
/// them to the supervisor; servers on earlier versions notify the handler directly.
fn listen_for_changes(connection: &Connection, tx: mpsc::UnboundedSender<()>, timeout: Duration) {
    let peer = connection.peer().clone();
    tokio::spawn(async move {
        let filter = SubscriptionFilter::builder().tools_list_changed().build();
        let Ok(Ok(mut subscription)) = tokio::time::timeout(timeout, peer.listen(filter)).await
        else {
            return;
        };
        while let Ok(Some(_)) = subscription.next().await {
            if tx.send(()).is_err() {
                return;
            }
        }
    });
}

/// Lists the tools now and after every change notification until the connection ends or a
/// list fails; returns why it stopped (a list the registry refuses keeps its own code).
async fn serve(
    daemon: &Arc<Daemon>,
    name: &str,
    cfg: &McpConfig,
    (handle, down): (&Handle, &Down),
    connection: Connection,
    changed: &mut mpsc::UnboundedReceiver<()>,
    read: ResourceReader,
) -> ErrorBody {
    let timeout = timeout_of(cfg);
    let peer = connection.peer().clone();
    let instructions = connection
        .peer_info()
        .and_then(|info| match serde_json::to_value(&*info) {
            Ok(info) => Some(info),
            Err(e) => {
                tracing::warn!(server = %label(cfg), "its server info could not be read, so its instructions are left out: {e}");
                None
            }
        })
        .and_then(|info| info.get("instructions")?.as_str().map(str::to_string));
    let mut quit = tokio::spawn(connection.waiting());
    loop {
        let listed = tokio::select! {
            listed = tokio::time::timeout(timeout, peer.list_all_tools()) => listed,
            quit_reason = &mut quit => return failure(name, lost(quit_reason)),
        };
        let tools = match listed {
            Err(_) => {
                quit.abort();
                return failure(
                    name,
                    format!("no answer to tools/list within {} ms", timeout.as_millis()),
                );
            }
            Ok(Err(e)) => {
                quit.abort();
                return failure(name, request_failed("tools/list", &e));
            }
            Ok(Ok(tools)) => tools,
        };
        let config = daemon.config();
        let result = entry(name, cfg, &config, &tools, instructions.as_deref(), &read).map(
            |(entry, names)| {
                let runner: Arc<dyn ToolRunner> = Arc::new(McpRunner {
                    name: name.to_string(),
                    peer: peer.clone(),
                    names,
                    timeout,
                    handle: handle.clone(),
                    down: down.clone(),
                });
                (entry, runner)
            },
        );
        if let Err(body) = result {
            quit.abort();
            return body;
        }
        *promptd_core::sync::lock(down) = None; // listed: back
        report(daemon, name, cfg, result).await;
        tokio::select! {
            Some(()) = changed.recv() => {}
            quit_reason = &mut quit => return failure(name, lost(quit_reason)),
        }
    }
}

/// What ended a connection, as its waiting task reports it: the join of that task, around
/// [`RunningService::waiting`]'s own join of the service loop, around rmcp's [`QuitReason`].
type Quit = Result<Result<QuitReason, tokio::task::JoinError>, tokio::task::JoinError>;

/// Why a server's connection ended, in words (K8: the CAUSE a model reads in "unavailable since
/// … (CAUSE)" and the held parts' `kept (unavailable: CAUSE)`, and `last_error` in `GET
/// /v1/plugins`).
fn lost(quit: Quit) -> String {
    let task = |e: tokio::task::JoinError| {
        if e.is_panic() {
            "the connection to the server failed inside promptd (its task panicked)"
        } else {
            "the connection to the server was stopped inside promptd (its task was cancelled)"
        }
    };
    match quit {
        // The server's side ended: a stdio server's output closed (it exited or crashed;
        // rmcp's child-process transport reaps it without telling its exit status), an HTTP
        // server's stream ended.
        Ok(Ok(QuitReason::Closed)) => "the server closed its connection".to_string(),
        Ok(Ok(QuitReason::Cancelled)) => "promptd cancelled the connection".to_string(),
        Ok(Ok(QuitReason::JoinError(e))) | Ok(Err(e)) | Err(e) => task(e).to_string(),
        Ok(Ok(_)) => "the connection to the server ended".to_string(),
    }
}

/// Why a request (`tools/list`, `tools/call`) to a server failed, in words: the server's own
/// JSON-RPC error by its message and code, rmcp's other failures by what happened.
fn request_failed(method: &str, e: &ServiceError) -> String {
    let what = match e {
        ServiceError::McpError(error) => {
            format!("{} (error {})", error.message, error.code.0)
        }
        ServiceError::TransportClosed => "the server closed its connection".to_string(),
        ServiceError::TransportSend(e) => format!("it could not be sent: {e}"),
        ServiceError::UnexpectedResponse => "the server answered something else".to_string(),
        ServiceError::Timeout { timeout } => {
            format!("no answer within {} ms", timeout.as_millis())
        }
        ServiceError::Cancelled { reason } => match reason {
            Some(reason) => format!("it was cancelled: {reason}"),
            None => "it was cancelled".to_string(),
        },
        // rmcp's other errors say what happened in their own words.
        other => other.to_string(),
    };
    format!("{method} failed: {what}")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rust's debug output of a `Result` or of rmcp's enums, which a model must never read.
    fn debug_free(text: &str) {
        for debug in [
            "Ok(",
            "Err(",
            "Closed)",
            "Some(",
            "JoinError",
            "McpError",
            "{ ",
        ] {
            assert!(!text.contains(debug), "{text:?} holds {debug:?}");
        }
        assert!(text.contains(' '), "{text:?} is not words");
    }

    /// A real [`tokio::task::JoinError`] of each kind: a task that panicked, one aborted.
    fn join_errors() -> [tokio::task::JoinError; 2] {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let panicked = tokio::spawn(async { panic!("on purpose") })
                .await
                .unwrap_err();
            let forever = tokio::spawn(std::future::pending::<()>());
            forever.abort();
            let aborted = forever.await.unwrap_err();
            [panicked, aborted]
        })
    }

    #[test]
    fn every_way_a_connection_ends_is_said_in_words() {
        let [p1, c1] = join_errors();
        let [p2, c2] = join_errors();
        let [p3, c3] = join_errors();
        let cases: Vec<(Quit, &str)> = vec![
            (
                Ok(Ok(QuitReason::Closed)),
                "the server closed its connection",
            ),
            (
                Ok(Ok(QuitReason::Cancelled)),
                "promptd cancelled the connection",
            ),
            (Ok(Ok(QuitReason::JoinError(p1))), "its task panicked"),
            (Ok(Ok(QuitReason::JoinError(c1))), "its task was cancelled"),
            (Ok(Err(p2)), "its task panicked"),
            (Ok(Err(c2)), "its task was cancelled"),
            (Err(p3), "its task panicked"),
            (Err(c3), "its task was cancelled"),
        ];
        for (quit, expected) in cases {
            let said = lost(quit);
            debug_free(&said);
            assert!(said.contains(expected), "{said:?}");
        }
    }

    #[test]
    fn every_way_a_request_fails_is_said_in_words() {
        use rmcp::model::{ErrorCode, ErrorData};
        let cases = [
            (
                ServiceError::McpError(ErrorData::new(
                    ErrorCode(-32601),
                    "no method tools/list",
                    None,
                )),
                "tools/list failed: no method tools/list (error -32601)",
            ),
            (
                ServiceError::TransportClosed,
                "tools/list failed: the server closed its connection",
            ),
            (
                ServiceError::UnexpectedResponse,
                "tools/list failed: the server answered something else",
            ),
            (
                ServiceError::Timeout {
                    timeout: Duration::from_secs(5),
                },
                "tools/list failed: no answer within 5000 ms",
            ),
            (
                ServiceError::Cancelled { reason: None },
                "tools/list failed: it was cancelled",
            ),
            (
                ServiceError::Cancelled {
                    reason: Some("shutting down".into()),
                },
                "tools/list failed: it was cancelled: shutting down",
            ),
            (
                ServiceError::SubscriptionLagged { capacity: 16 },
                "tools/list failed: subscription consumer lagged behind its 16-message buffer",
            ),
        ];
        for (error, expected) in cases {
            let said = request_failed("tools/list", &error);
            debug_free(&said);
            assert_eq!(said, expected);
        }
    }

    #[test]
    fn a_model_reads_since_when_and_why_in_words() {
        let said = unavailable("s", 1_790_000_000_000, &lost(Ok(Ok(QuitReason::Closed))));
        debug_free(&said);
        assert!(
            said.starts_with("MCP server `s` is unavailable since 2026-")
                && said.contains("(the server closed its connection)"),
            "{said}"
        );
    }
}
