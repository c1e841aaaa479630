//! The plugin routes: status, reload, unload, enable, and the registry's events.

#[allow(unused_imports)]
use super::*;

/// Each plugin file: id, file, sha256, state, last error, what it declares.
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins",
    responses((status = 200, description = "Every plugin file the daemon knows", body = api::PluginList), api::Errors))]
pub(crate) async fn plugins(State(state): State<Arc<AppState>>) -> Response {
    json_body(&api::PluginList {
        plugins: state.daemon.plugins(),
        set: state.daemon.set_status(),
    })
}

/// Rescans the plugin folder now (the watcher does it on every change).
#[utoipa::path(post, path = "/v1/plugins/reload", tag = "plugins",
    responses((status = 200, description = "The changes applied", body = api::Applied), api::Errors))]
pub(crate) async fn reload(State(state): State<Arc<AppState>>) -> ApiResult {
    let applied = blocking(&state, Daemon::reload).await?;
    Ok(json_body(&api::Applied { applied }))
}

/// Unloads a plugin: its contributions leave the next step (a rescan loads the file again).
#[utoipa::path(delete, path = "/v1/plugins/{id}", tag = "plugins",
    params(("id" = String, Path, description = "The plugin's id")),
    responses((status = 200, description = "The `unload` change applied", body = api::Applied), api::Errors))]
pub(crate) async fn unload(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult {
    let event = blocking(&state, move |daemon| daemon.unload(&id)).await?;
    Ok(json_body(&api::Applied {
        applied: vec![event],
    }))
}

/// Brings a quarantined plugin back (loads its file again), or tries a `failed` MCP server
/// again.
#[utoipa::path(post, path = "/v1/plugins/{id}/enable", tag = "plugins",
    params(("id" = String, Path, description = "The plugin's id")),
    responses((status = 200, description = "The changes applied", body = api::Applied), api::Errors))]
pub(crate) async fn enable(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult {
    let applied = blocking(&state, move |daemon| daemon.enable(&id)).await?;
    Ok(json_body(&api::Applied { applied }))
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
pub(crate) async fn registry_events(
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
