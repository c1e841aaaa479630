//! Replaying sessions against another plugin set.

#[allow(unused_imports)]
use super::*;

/// Replays recorded sessions step by step with a candidate plugin folder or config (Q19):
/// per step, where the candidate's request first differs from the recorded one and why, the
/// token delta, and under the cache model what both would read, write and miss, and cost.
/// The candidate is loaded into a registry of its own; nothing is written to any log and
/// nothing the daemon serves changes (Q20).
#[utoipa::path(post, path = "/v1/replay", tag = "sessions",
    request_body = api::ReplayBody,
    responses((status = 200, description = "Each session replayed, and the sums", body = crate::replay::ReplayReport), api::Errors))]
pub(crate) async fn replay(
    State(state): State<Arc<AppState>>,
    JsonBody(req): JsonBody<api::ReplayBody>,
) -> ApiResult {
    let request = req.into_request();
    let report = blocking(&state, move |daemon| daemon.replay(&request)).await?;
    Ok(json_body(&report))
}
