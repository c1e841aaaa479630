//! Stage 3, the review hooks (Q18): a step's new messages, or a message recorded between
//! steps, shown to every hook in order; rejected, redacted or accepted.

use std::collections::BTreeMap;

use super::{content_of, step_for};
use crate::assembly::review::{Redaction, Verdict};
use crate::assembly::Assembly;
use crate::config::AgentSettings;
use crate::conversation::Message;
use crate::error::{Error, Result};
use crate::observe::{observed, Activity, Observe};
use crate::plugin::model::Step;
use crate::plugin::registry::{PluginEntry, Registry};
use crate::session::SessionState;

/// Stage 3: the new messages as the hooks leave them, and the redactions that made them;
/// redacted ones are checked against the content limits again (a redaction may lengthen a
/// text).
pub(super) fn reviewed(
    registry: &Registry,
    step: &Step,
    assembled: &Assembly,
    agent: &AgentSettings,
    messages: Vec<Message>,
    observe: Option<&dyn Observe>,
) -> Result<(Vec<Message>, Vec<Redaction>)> {
    let limits = &agent.content_limits;
    let shown = |current: &[Message]| crate::assembly::review::input(current, assembled);
    match review(registry, step, &messages, shown, observe)? {
        Some((redacted, rules)) => {
            for (i, m) in redacted.iter().enumerate() {
                content_of(m).check(limits).map_err(|e| e.at_message(i))?;
            }
            Ok((redacted, rules))
        }
        None => Ok((messages, Vec::new())),
    }
}

/// Q18: every review hook, by (order, plugin id), each shown the messages as the hooks before
/// it left them; the messages as redacted and the rules applied, in order, or none when no hook
/// redacted (the common case, so a step without hooks copies nothing). A rejection, a failed hook or a bad verdict fails
/// the step: a hook guards what is recorded, so it fails closed, `optional` or not.
fn review(
    registry: &Registry,
    step: &Step,
    messages: &[Message],
    shown: impl Fn(&[Message]) -> crate::plugin::provider::ReviewInput,
    observe: Option<&dyn Observe>,
) -> Result<Option<(Vec<Message>, Vec<Redaction>)>> {
    if !registry
        .plugins()
        .any(|p| p.declaration.review_order.is_some())
    {
        return Ok(None);
    }
    let mut hooks: Vec<(i32, &PluginEntry)> = registry
        .plugins()
        .filter_map(|p| p.declaration.review_order.map(|o| (o, &**p)))
        .collect();
    hooks.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
    let mut redacted: Option<(Vec<Message>, Vec<Redaction>)> = None;
    for (_, hook) in hooks {
        let current = redacted.as_ref().map_or(messages, |(m, _)| m.as_slice());
        let failed = |cause: String, trapped: bool| Error::PluginCall {
            plugin: hook.id.clone(),
            contribution: "review".into(),
            cause,
            trapped,
        };
        let input = shown(current);
        let activity = Activity::Review {
            plugin: &hook.id,
            sha256: hook.sha256.as_deref(),
        };
        let verdict = observed(observe, activity, || hook.provider.review(step, &input));
        let verdict = verdict.map_err(|e| {
            let trapped = matches!(e, crate::plugin::provider::CallError::Trapped(_));
            failed(e.cause().to_string(), trapped)
        })?;
        match verdict {
            Verdict::Accept => {}
            Verdict::Reject(reason) => {
                return Err(Error::ReviewRejected {
                    plugin: hook.id.clone(),
                    reason,
                })
            }
            Verdict::Redact(rules) => {
                let next = crate::assembly::review::redact(current, &rules)
                    .map_err(|cause| failed(cause, false))?;
                let mut applied = redacted.map(|(_, applied)| applied).unwrap_or_default();
                applied.extend(rules);
                redacted = Some((next, applied));
            }
        }
    }
    Ok(redacted)
}

/// Q18 for a message recorded between steps (the model's reply, or a tool's output sent to
/// `POST …/messages`): the same hooks, in the same order and within the same bounds as a
/// step's, shown `message` with what the session's last step was assembled with (its system
/// prompt, runtime context and tools shown) and that step's number. A rejection or a failed
/// hook refuses the message; a redaction applies to a tool's output (a reply is shown, never
/// changed: the provider sent it) and is checked against the content limits again.
pub fn review_recorded(
    registry: &Registry,
    agent: &AgentSettings,
    state: &SessionState,
    message: Message,
    observe: Option<&dyn Observe>,
) -> Result<Message> {
    let step = step_for(agent, state.session_id(), state.steps(), BTreeMap::new());
    let header = state.header();
    let shown = |current: &[Message]| crate::plugin::provider::ReviewInput {
        messages: crate::assembly::review::shown_messages(current),
        system: header.map(|h| h.system.clone()).unwrap_or_default(),
        runtime_context: state.snapshot_text().map(str::to_string),
        tools: match (state.shown_tools(), header) {
            (Some(shown), _) => shown.to_vec(),
            (None, Some(h)) => h.tools.iter().map(|t| t.name.clone()).collect(),
            (None, None) => Vec::new(),
        },
    };
    match review(
        registry,
        &step,
        std::slice::from_ref(&message),
        shown,
        observe,
    )? {
        Some((mut redacted, _)) if redacted.len() == 1 => {
            let message = redacted.remove(0);
            content_of(&message).check(&agent.content_limits)?;
            Ok(message)
        }
        _ => Ok(message),
    }
}
