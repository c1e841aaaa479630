//! A gateway step's splice (G4): the step's contributions, as the step leaves them, joined to
//! the client's body, and the `gateway/request` event that records it.

use promptd_core::gateway::body::ClientBody;
use promptd_core::gateway::messages::StepMessages;
use promptd_core::gateway::record::GatewayRecord;
use promptd_core::gateway::splice::{self, Contributions};
use promptd_core::gateway::GatewayError;
use promptd_core::session::log::Body;
use promptd_core::session::SessionState;

use promptd_core::config::gateway::OnPluginFailure;
use promptd_core::gateway::splice::Splice;
use promptd_core::Error;

use crate::outcome::GatewayStep;
use crate::{DaemonError, Result};

/// G6: the code a failed gateway step is forwarded under — its plugins failed (a call, a
/// load, a plugin set) and the agent's `on_plugin_failure` is `"forward"` — or `None` when the
/// failure is the client's to hear (an overflowing budget, a review's rejection, a config or
/// store error) or the step already went without its plugins.
pub(super) fn forwards(e: &DaemonError, gateway: &GatewayStep) -> Option<&'static str> {
    let plugins = matches!(
        e,
        DaemonError::Core(Error::PluginCall { .. })
            | DaemonError::Loading { .. }
            | DaemonError::PluginSetUnavailable { .. }
            | DaemonError::PluginSetBehind { .. }
    );
    let forward = gateway.on_plugin_failure == OnPluginFailure::Forward;
    (plugins && forward && gateway.degraded.is_none()).then(|| e.code())
}

/// The upstream body, the record without the client's body (the caller has it), and the
/// event's body. `bodies` are the step's events, not yet applied to `state`: the header and
/// snapshot they record win over the state's.
pub(super) fn splice(
    state: &SessionState,
    bodies: &[Body],
    agent: &str,
    mut gateway: GatewayStep,
    joined: &StepMessages,
) -> Result<(String, GatewayRecord, Body)> {
    if let Some(code) = gateway.degraded {
        return Ok(degraded(gateway, joined, code));
    }
    let header = bodies
        .iter()
        .rev()
        .find_map(|b| match b {
            Body::RequestHeader(record) => Some(&record.header),
            _ => None,
        })
        .or_else(|| state.header());
    if let Some(h) = header.filter(|h| !h.tools.is_empty()) {
        return Err(DaemonError::GatewayPluginTools {
            agent: agent.to_string(),
            tools: h.tools.iter().map(|t| t.name.clone()).collect(),
        });
    }
    let snapshot = bodies.iter().rev().find_map(|b| match b {
        Body::ContextSnapshot(s) => Some((!s.cleared).then(|| s.content.clone())),
        _ => None,
    });
    let contributions = Contributions {
        system: header.map(|h| h.system.clone()).unwrap_or_default(),
        runtime_context: snapshot.unwrap_or_else(|| state.snapshot_text().map(str::to_string)),
    };
    // Parsed once, when the request was read.
    let spans = std::mem::take(&mut gateway.spans);
    let body = ClientBody::with_spans(&gateway.client_body, spans);
    let edits = splice::plan(gateway.ingress, &body, &contributions, &gateway.splice)?;
    let mut record = recorded(&gateway, joined, edits, None);
    // Edits join whole JSON values at value boundaries: the result is UTF-8.
    let upstream = String::from_utf8(record.splice.apply(gateway.client_body.as_bytes()))
        .map_err(|_| GatewayError::InvalidBody("the spliced body is not UTF-8".into()))?;
    let summary = record.clone();
    record.client_body = gateway.client_body;
    Ok((upstream, summary, Body::GatewayRequest(Box::new(record))))
}

/// A step forwarded without its plugins (G6): the client's body goes upstream as it came, and
/// the record says why.
fn degraded(
    gateway: GatewayStep,
    joined: &StepMessages,
    code: &'static str,
) -> (String, GatewayRecord, Body) {
    let mut record = recorded(&gateway, joined, Splice::default(), Some(code));
    let summary = record.clone();
    let upstream = gateway.client_body;
    record.client_body = upstream.clone();
    (upstream, summary, Body::GatewayRequest(Box::new(record)))
}

/// The record of a gateway step, but for the client's body (moved in last).
fn recorded(
    gateway: &GatewayStep,
    joined: &StepMessages,
    splice: Splice,
    degraded: Option<&str>,
) -> GatewayRecord {
    let conversation = &gateway.conversation;
    GatewayRecord {
        ingress: gateway.ingress,
        upstream: gateway.upstream.clone(),
        joined_by: gateway.joined_by,
        splice,
        messages: conversation.messages.len(),
        digest: conversation.digest(conversation.messages.len()).to_string(),
        new_from: joined.new_from,
        rewrote_at: joined.rewrote.then_some(joined.new_from),
        degraded: degraded.map(str::to_string),
        client_body: String::new(),
    }
}
