//! Health, metrics and the OpenAPI document.

#[allow(unused_imports)]
use super::*;

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
pub(crate) async fn health(State(state): State<Arc<AppState>>) -> Response {
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

/// Prometheus text: steps, step latency histogram, plugin errors, loaded plugins.
#[utoipa::path(get, path = "/metrics", tag = "daemon",
    responses((status = 200, description = "The metrics in Prometheus' text format", content_type = "text/plain", body = String), api::Errors))]
pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.daemon.metrics_text(),
    )
        .into_response()
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "daemon",
    responses((status = 200, description = "The document (also committed as docs/openapi.json)", body = Object), api::Errors))]
pub(crate) async fn openapi_json() -> Response {
    json_bytes(StatusCode::OK, openapi_json_text())
}
