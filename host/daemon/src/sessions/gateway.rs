//! A gateway step's splice (G4): the step's contributions, as the step leaves them, joined to
//! the client's body, and the `gateway/request` event that records it.

use promptd_core::assembly::review::Redaction;
use promptd_core::gateway::body::ClientBody;
use promptd_core::gateway::messages::StepMessages;
use promptd_core::gateway::record::GatewayRecord;
use promptd_core::gateway::redact::redacted;
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

/// Most distinct redactions a gateway session applies to its client's texts: the rules every
/// request of it carries, and records.
pub const MAX_SESSION_REDACTIONS: usize = 1024;

/// What the step planned that its splice reads.
pub(super) struct Step<'a> {
    /// The session as the step found it.
    pub state: &'a SessionState,
    /// The step's events, not yet applied to `state`: the header and snapshot they record win
    /// over the state's.
    pub bodies: &'a [Body],
    /// The agent.
    pub agent: &'a str,
    /// The client's messages the step appends.
    pub joined: &'a StepMessages,
    /// The redactions the step's review hooks made.
    pub redactions: &'a [Redaction],
    /// Whether promptd has a runner for the tool of this name (G13: an MCP server's).
    pub runnable: &'a dyn Fn(&str) -> bool,
}

/// The upstream body, the record without the client's body (the caller has it), and the
/// event's body.
pub(super) fn splice(
    step: &Step<'_>,
    mut gateway: GatewayStep,
) -> Result<(String, GatewayRecord, Body)> {
    let Step {
        state,
        bodies,
        joined,
        ..
    } = *step;
    let redactions = redactions(state.gateway_redactions(), step.redactions)?;
    // Parsed once, when the request was read (again only when a redaction changed it).
    let spans = std::mem::take(&mut gateway.spans);
    let body = ClientBody::with_spans(&gateway.client_body, spans);
    let strings = match redacted(gateway.ingress, &body, &redactions)? {
        Some((text, strings)) => {
            drop(body);
            gateway.spans = ClientBody::parse(text.as_bytes())?.spans();
            gateway.client_body = text;
            strings
        }
        None => {
            gateway.spans = body.into_spans();
            0
        }
    };
    if let Some(code) = gateway.degraded {
        let mut record = recorded(&gateway, joined, Splice::default(), Some(code), redactions);
        record.redacted = strings;
        return finish(record, gateway.client_body);
    }
    let header = bodies
        .iter()
        .rev()
        .find_map(|b| match b {
            Body::RequestHeader(record) => Some(&record.header),
            _ => None,
        })
        .or_else(|| state.header());
    let tools = match header.filter(|h| !h.tools.is_empty()) {
        Some(h) => own_tools(step, &gateway, &h.tools)?,
        None => Vec::new(),
    };
    let snapshot = bodies.iter().rev().find_map(|b| match b {
        Body::ContextSnapshot(s) => Some((!s.cleared).then(|| s.content.clone())),
        _ => None,
    });
    let contributions = Contributions {
        system: header.map(|h| h.system.clone()).unwrap_or_default(),
        runtime_context: snapshot.unwrap_or_else(|| state.snapshot_text().map(str::to_string)),
        tools,
    };
    let spans = std::mem::take(&mut gateway.spans);
    let body = ClientBody::with_spans(&gateway.client_body, spans);
    let edits = splice::plan(gateway.ingress, &body, &contributions, &gateway.splice)?;
    drop(body);
    let mut record = recorded(&gateway, joined, edits, None, redactions);
    record.redacted = strings;
    // G11: the versions of the header this request sends (a new one's, else the recorded).
    let built_from = bodies
        .iter()
        .rev()
        .find_map(|b| match b {
            Body::RequestHeader(r) => r.provenance.as_ref(),
            _ => None,
        })
        .or_else(|| state.header_provenance());
    record.plugins = built_from.map(|p| p.plugins.clone()).unwrap_or_default();
    finish(record, gateway.client_body)
}

/// G13: the agent's tools, when promptd runs each itself for this request; else why not,
/// naming the tools: a plugin's tool has no runner, and an endpoint not covered yet leaves
/// the client with tools it cannot run.
fn own_tools(
    step: &Step<'_>,
    gateway: &GatewayStep,
    tools: &[promptd_core::conversation::ToolSpec],
) -> Result<Vec<promptd_core::conversation::ToolSpec>> {
    let names = |tools: Vec<&promptd_core::conversation::ToolSpec>| {
        tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
    };
    let refuse = |tools: Vec<String>, why: String| {
        Err(DaemonError::GatewayPluginTools {
            agent: step.agent.to_string(),
            tools,
            why,
        })
    };
    let unrunnable: Vec<_> = tools.iter().filter(|t| !(step.runnable)(&t.name)).collect();
    if !unrunnable.is_empty() {
        return refuse(
            names(unrunnable),
            "promptd runs an MCP server's tools itself, but a plugin's tool has no runner; take them out of its scope (plugin scopes or the agent's chain)".into(),
        );
    }
    if !promptd_core::gateway::own_tools::covers(gateway.ingress) {
        return refuse(
            names(tools.iter().collect()),
            format!(
                "promptd runs its own tools for Anthropic Messages, Chat Completions, Responses and Gemini (streamed or not) and Bedrock Converse (unstreamed) only, not for {:?} yet",
                gateway.ingress
            ),
        );
    }
    Ok(tools.to_vec())
}

/// The upstream body `record`'s edits make of `client_body`, the record without it, and the
/// event's body with it.
fn finish(mut record: GatewayRecord, client_body: String) -> Result<(String, GatewayRecord, Body)> {
    // Edits join whole JSON values at value boundaries: the result is UTF-8.
    let upstream = String::from_utf8(record.splice.apply(client_body.as_bytes()))
        .map_err(|_| GatewayError::InvalidBody("the spliced body is not UTF-8".into()))?;
    let summary = record.clone();
    record.client_body = client_body;
    Ok((upstream, summary, Body::GatewayRequest(Box::new(record))))
}

/// The session's redactions so far and the step's new ones, each once, in order.
fn redactions(held: &[Redaction], new: &[Redaction]) -> Result<Vec<Redaction>> {
    let mut all = held.to_vec();
    for rule in new {
        if !all.contains(rule) {
            all.push(rule.clone());
        }
    }
    if all.len() > MAX_SESSION_REDACTIONS {
        return Err(GatewayError::Redaction(format!(
            "the session's review hooks made {} distinct redactions, more than {MAX_SESSION_REDACTIONS}",
            all.len()
        ))
        .into());
    }
    Ok(all)
}

/// The record of a gateway step, but for the client's body (moved in last).
fn recorded(
    gateway: &GatewayStep,
    joined: &StepMessages,
    splice: Splice,
    degraded: Option<&str>,
    redactions: Vec<Redaction>,
) -> GatewayRecord {
    let conversation = &gateway.conversation;
    GatewayRecord {
        ingress: gateway.ingress,
        upstream: gateway.upstream.clone(),
        model: gateway.model.clone(),
        key: gateway.key.clone(),
        joined_by: gateway.joined_by,
        splice,
        messages: conversation.messages.len(),
        digest: conversation.digest(conversation.messages.len()).to_string(),
        new_from: joined.new_from,
        rewrote_at: joined.rewrote.then_some(joined.new_from),
        degraded: degraded.map(str::to_string),
        redacted: 0,
        redactions,
        client_body: String::new(),
        plugins: Default::default(),
        round: gateway.round,
        restored: gateway.restored.clone(),
    }
}
