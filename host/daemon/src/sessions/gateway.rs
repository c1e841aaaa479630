//! A gateway step's splice (G4): the step's contributions, as the step leaves them, joined to
//! the client's body, and the `gateway/request` event that records it.

use promptd_core::gateway::body::ClientBody;
use promptd_core::gateway::messages::StepMessages;
use promptd_core::gateway::record::GatewayRecord;
use promptd_core::gateway::splice::{self, Contributions};
use promptd_core::gateway::GatewayError;
use promptd_core::session::log::Body;
use promptd_core::session::SessionState;

use crate::outcome::GatewayStep;
use crate::{DaemonError, Result};

/// The upstream body, the record without the client's body (the caller has it), and the
/// event's body. `bodies` are the step's events, not yet applied to `state`: the header and
/// snapshot they record win over the state's.
pub(super) fn splice(
    state: &SessionState,
    bodies: &[Body],
    agent: &str,
    gateway: GatewayStep,
    joined: &StepMessages,
) -> Result<(String, GatewayRecord, Body)> {
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
    let body = ClientBody::with_spans(&gateway.client_body, gateway.spans);
    let edits = splice::plan(gateway.ingress, &body, &contributions, &gateway.splice)?;
    let conversation = &gateway.conversation;
    let mut record = GatewayRecord {
        ingress: gateway.ingress,
        upstream: gateway.upstream,
        joined_by: gateway.joined_by,
        splice: edits,
        messages: conversation.messages.len(),
        digest: conversation.digest(conversation.messages.len()).to_string(),
        new_from: joined.new_from,
        rewrote_at: joined.rewrote.then_some(joined.new_from),
        degraded: None,
        client_body: String::new(),
    };
    // Edits join whole JSON values at value boundaries: the result is UTF-8.
    let upstream = String::from_utf8(record.splice.apply(gateway.client_body.as_bytes()))
        .map_err(|_| GatewayError::InvalidBody("the spliced body is not UTF-8".into()))?;
    let summary = record.clone();
    record.client_body = gateway.client_body;
    Ok((upstream, summary, Body::GatewayRequest(Box::new(record))))
}
