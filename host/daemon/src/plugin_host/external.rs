//! Contributors that are not plugin files: MCP servers (M1–M5). Their entries join the same
//! registry snapshot as the plugins' (so validation, conflicts, scopes, canonical order and
//! provenance are the plugins' own), their status shows in `GET /v1/plugins`, and their tools
//! can be run by the daemon for a session (M4).

use std::sync::Arc;

use promptd_core::conversation::content::Content;
use promptd_core::conversation::Message;
use promptd_core::plugin::registry::PluginEntry;
use promptd_core::plugin::state::{ChangeKind, PluginState};
use promptd_core::request::declaration_json;
use promptd_core::store::EventKind;
use promptd_core::sync::{lock, read, write};
use promptd_core::ErrorBody;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::events::RegistryEvent;
use crate::{Daemon, DaemonError, PluginStatus, Result};

/// What running one tool call gave: the text the model reads, and whether the tool failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The text the model reads.
    pub content: String,
    /// Whether the tool failed.
    pub is_error: bool,
}

/// Runs the tools of one external contributor.
pub trait ToolRunner: Send + Sync {
    /// Runs `name` (the name the model saw) with `arguments`. The tool's own failure, a
    /// time-out or a lost server is an outcome with `is_error` (M4): the model reads it.
    fn run(&self, name: &str, arguments: &Value) -> ToolOutcome;
}

/// Starts, stops and restarts external contributors (the MCP crate's supervisors).
pub trait ExternalControl: Send + Sync {
    /// The config changed: start the contributors it adds or changes, stop those it drops.
    fn config_changed(&self, config: &promptd_core::config::Config);
    /// `POST /v1/plugins/{id}/enable` for a contributor in state `failed`: try it again.
    fn restart(&self, id: &str);
}

/// One external contributor as the daemon keeps it.
pub(crate) struct External {
    pub(crate) status: PluginStatus,
    runner: Option<Arc<dyn ToolRunner>>,
}

/// What `POST /v1/sessions/{id}/tool-calls/{call_id}/run` returns.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ToolRun {
    /// The sequence number of the recorded `tool/result` event.
    pub seq: u64,
    /// The contributor that ran it, e.g. `mcp:time`.
    pub plugin: String,
    /// The recorded tool message (`role`, `tool_call_id`, `content`, `is_error`).
    #[schema(value_type = Object)]
    pub message: Value,
}

impl Daemon {
    /// Publishes (or refuses) the entry of an external contributor `entry.id`; `file` names
    /// where it comes from (a command or a URL). An entry whose canonical declaration equals
    /// the serving one publishes nothing and records no event (M3): a reconnect or an
    /// unchanged re-list never changes a request. A failure keeps an older entry serving
    /// (state `stale`, as H3), so a crash never reorders the tools; its calls fail until the
    /// contributor is back.
    pub fn set_external(
        &self,
        id: &str,
        file: &str,
        result: std::result::Result<(PluginEntry, Arc<dyn ToolRunner>), ErrorBody>,
    ) -> Option<RegistryEvent> {
        let event = self.set_external_now(id, file, result);
        // After the registry holds the outcome: a waiting step then sees it.
        self.listed(id);
        event
    }

    fn set_external_now(
        &self,
        id: &str,
        file: &str,
        result: std::result::Result<(PluginEntry, Arc<dyn ToolRunner>), ErrorBody>,
    ) -> Option<RegistryEvent> {
        let _changing = lock(&self.plugins.changes);
        let mut externals = write(&self.plugins.externals);
        let serving = self.registry().get(id).is_some();
        let outcome = result.map(|(mut entry, runner)| {
            let declares = declaration_json(&entry.declaration);
            let scope = entry.options.scope_override.as_ref().map(|s| s.key());
            let sha256 = hex(&Sha256::digest(
                json!({"declares": declares, "scope": scope}).to_string(),
            ));
            entry.sha256 = Some(sha256.clone());
            (entry, runner, declares, sha256)
        });
        match outcome {
            Ok((entry, runner, declares, sha256)) => {
                let kept = self.registry().kept(id).is_some();
                if let Some(known) = externals.get_mut(id) {
                    let same = known.status.serving_sha256.as_deref() == Some(sha256.as_str());
                    if (serving || kept) && same {
                        // Back with what it served (K8: the kept slots fill again): no
                        // change, so no event, and warm sessions' headers never moved.
                        if kept {
                            match self.registry().with_replaced(entry) {
                                Ok(next) => self.publish(next),
                                Err(error) => {
                                    return Some(self.refuse(
                                        &mut externals,
                                        id,
                                        file,
                                        false,
                                        (&error).into(),
                                        false,
                                    ))
                                }
                            }
                        }
                        known.runner = Some(runner);
                        known.status.state = PluginState::Loaded;
                        known.status.last_error = None;
                        return None;
                    }
                }
                match self.registry().with_replaced(entry) {
                    Ok(next) => {
                        self.publish(next);
                        externals.insert(
                            id.to_string(),
                            External {
                                status: PluginStatus {
                                    id: id.to_string(),
                                    file: file.to_string(),
                                    sha256: sha256.clone(),
                                    serving_sha256: Some(sha256.clone()),
                                    state: PluginState::Loaded,
                                    last_error: None,
                                    declares,
                                    refresh: Value::Null,
                                    held: Vec::new(),
                                },
                                runner: Some(runner),
                            },
                        );
                        tracing::info!(plugin = %id, sha256 = %sha256, "loaded");
                        let kind = if serving {
                            ChangeKind::Reload
                        } else {
                            ChangeKind::Load
                        };
                        Some(self.plugins.events.push(kind, id, file, &sha256, None))
                    }
                    Err(error) => {
                        Some(self.refuse(&mut externals, id, file, serving, (&error).into(), false))
                    }
                }
            }
            Err(body) => Some(self.refuse(&mut externals, id, file, serving, body, false)),
        }
    }

    /// Registers what starts and stops the external contributors.
    pub fn set_external_control(&self, control: Arc<dyn ExternalControl>) {
        *lock(&self.plugins.external_control) = Some(control);
    }

    /// Gives up on the external contributor `id` after it failed too often: it leaves the
    /// registry as a refused one does (K8: kept slots until a cold point), its state is
    /// `failed` and a `failed` event says why, until its config changes or it is enabled.
    pub fn fail_external(&self, id: &str, file: &str, body: ErrorBody) -> RegistryEvent {
        let _changing = lock(&self.plugins.changes);
        let mut externals = write(&self.plugins.externals);
        let serving = self.registry().get(id).is_some();
        let event = self.refuse(&mut externals, id, file, serving, body, true);
        drop(externals);
        self.listed(id);
        event
    }

    /// Drops the external contributor `id` (its config is gone): it leaves the registry and
    /// the status list, with an `unload` event when it was serving.
    pub fn remove_external(&self, id: &str) -> Option<RegistryEvent> {
        self.listed(id);
        let _changing = lock(&self.plugins.changes);
        let known = write(&self.plugins.externals).remove(id)?;
        let registry = self.registry();
        let serving = registry.get(id).is_some() || registry.kept(id).is_some();
        if serving {
            if let Ok(next) = registry.without(id) {
                self.publish(next);
            }
        }
        tracing::info!(plugin = %id, "unloaded: its config is gone");
        let sha = known.status.serving_sha256.unwrap_or_default();
        serving.then(|| {
            self.plugins
                .events
                .push(ChangeKind::Unload, id, &known.status.file, &sha, None)
        })
    }

    /// `enable` for an external contributor: one in state `failed` is tried again.
    pub(crate) fn enable_external(&self, id: &str) -> Option<Result<Vec<RegistryEvent>>> {
        let state = read(&self.plugins.externals)
            .get(id)
            .map(|e| e.status.state)?;
        if state == PluginState::Failed {
            let control = lock(&self.plugins.external_control).clone();
            if let Some(control) = control {
                control.restart(id);
            }
        }
        Some(Ok(Vec::new()))
    }

    /// Records a failed contributor: `refused` or `stale` (as H3), or `failed` when `failed`.
    fn refuse(
        &self,
        externals: &mut std::collections::BTreeMap<String, External>,
        id: &str,
        file: &str,
        serving: bool,
        body: ErrorBody,
        failed: bool,
    ) -> RegistryEvent {
        tracing::warn!(plugin = %id, "refused: {}", body.message);
        self.observers.metrics.plugin_error();
        let known = externals.entry(id.to_string()).or_insert_with(|| External {
            status: PluginStatus {
                id: id.to_string(),
                file: file.to_string(),
                sha256: String::new(),
                serving_sha256: None,
                state: PluginState::Refused,
                last_error: None,
                declares: Value::Null,
                refresh: Value::Null,
                held: Vec::new(),
            },
            runner: None,
        });
        let kept = self.registry().kept(id).is_some();
        known.status.state = if failed {
            PluginState::Failed
        } else if serving || kept {
            PluginState::Stale
        } else {
            PluginState::Refused
        };
        // K8: a server that served and failed leaves the registry, so a cold session's next
        // header goes without its tools; with `keep_tools` (the default) warm sessions keep
        // them until a cold point, and their calls are answered "unavailable since".
        if serving {
            let registry = self.registry();
            let keep = registry.get(id).is_some_and(|e| e.options.keep_tools);
            let next = if keep {
                let kept = promptd_core::plugin::registry::Kept {
                    since_ms: crate::now_ms(),
                    cause: body.message.clone(),
                };
                registry.without_kept(id, kept)
            } else {
                registry.without(id)
            };
            if let Ok(next) = next {
                self.publish(next);
            }
        }
        known.status.last_error = Some(body.clone());
        let sha = known.status.serving_sha256.clone().unwrap_or_default();
        let kind = if failed {
            ChangeKind::Failed
        } else {
            ChangeKind::Refused
        };
        self.plugins.events.push(kind, id, file, &sha, Some(body))
    }

    /// The external contributors' statuses, by id.
    pub(crate) fn external_statuses(&self) -> Vec<PluginStatus> {
        let externals = read(&self.plugins.externals);
        externals.values().map(|e| e.status.clone()).collect()
    }

    /// The contributor that runs tool `name` (the name the model saw), and its runner: the
    /// tool's owner in the registry serving now (a name is unique per scope chain, and an
    /// external contributor's tool names are its own), or a down server's kept tool (K8),
    /// whose runner answers "unavailable since". `None`: no runner has it (a plugin's tool).
    pub fn tool_runner(&self, name: &str) -> Option<(String, Arc<dyn ToolRunner>)> {
        let registry = self.registry();
        let externals = read(&self.plugins.externals);
        let declares = |declares: &Value| {
            declares["tools"]
                .as_array()
                .is_some_and(|tools| tools.iter().any(|t| t["name"] == name))
        };
        let found = registry
            .plugins()
            .filter(|e| e.declaration.tools.iter().any(|t| t.name == name))
            .find_map(|e| {
                let runner = externals.get(&e.id)?.runner.clone()?;
                Some((e.id.clone(), runner))
            })
            .or_else(|| {
                externals.iter().find_map(|(id, e)| {
                    (registry.kept(id).is_some() && declares(&e.status.declares))
                        .then(|| Some((id.clone(), e.runner.clone()?)))
                        .flatten()
                })
            });
        found
    }

    /// Runs the open tool call `call_id` of session `id` on the contributor whose tool it
    /// names, and records the outcome as the call's `tool/result` (M4).
    pub fn run_tool_call(&self, id: &str, call_id: &str) -> Result<ToolRun> {
        let events = self.session_events(id)?;
        let mut call = None;
        for event in &events {
            if !matches!(
                event.kind,
                EventKind::AssistantMessage | EventKind::ToolResult
            ) {
                continue;
            }
            match promptd_core::session::decode(id, event)?.as_message() {
                Some(Message::Assistant { tool_calls, .. }) => {
                    if let Some(found) = tool_calls.iter().find(|c| c.id == call_id) {
                        call = Some(found.clone());
                    }
                }
                Some(Message::Tool { tool_call_id, .. }) if tool_call_id == call_id => {
                    return Err(DaemonError::ToolCallClosed(call_id.to_string()));
                }
                _ => {}
            }
        }
        let call = call.ok_or_else(|| DaemonError::ToolCallNotFound(call_id.to_string()))?;
        let name = call.name.as_str();
        let arguments = call.arguments.clone();
        let (plugin, runner) =
            self.tool_runner(name)
                .ok_or_else(|| DaemonError::ToolNotRunnable {
                    call: call_id.to_string(),
                    tool: name.to_string(),
                })?;
        let outcome = runner.run(name, &arguments);
        let message = Message::Tool {
            tool_call_id: call_id.to_string(),
            content: Content::Text(outcome.content),
            is_error: outcome.is_error,
        };
        let seq = self
            .record(crate::RecordRequest::message(id, message.clone()))?
            .seq;
        Ok(ToolRun {
            seq,
            plugin,
            message: json!({
                "role": "tool",
                "tool_call_id": call_id,
                "content": match &message { Message::Tool { content, .. } => json!(content), _ => Value::Null },
                "is_error": outcome.is_error,
            }),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use promptd_core::config::Config;
    use promptd_core::load::{Engine, Instantiated, LoadRequest};
    use promptd_core::plugin::provider::NativePlugin;
    use promptd_core::store::MemoryStore;

    /// No plugin files: only external contributors.
    struct NoFiles;
    impl Engine for NoFiles {
        fn instantiate(&self, _: LoadRequest<'_>) -> promptd_core::Result<Instantiated> {
            unreachable!("the folder is empty")
        }
    }

    struct Echo;
    impl ToolRunner for Echo {
        fn run(&self, name: &str, _: &Value) -> ToolOutcome {
            ToolOutcome {
                content: name.to_string(),
                is_error: false,
            }
        }
    }

    fn entry(tools: &[&str]) -> std::result::Result<(PluginEntry, Arc<dyn ToolRunner>), ErrorBody> {
        let mut plugin = NativePlugin::new();
        for t in tools {
            plugin = plugin.tool(t, "", r#"{"type":"object"}"#);
        }
        let (declaration, provider) = plugin.build();
        // As an MCP server's entry is (promptd_mcp::entry): its tools kept when it fails.
        let mut options = Config::default().plugin_options("mcp:x");
        options.keep_tools = true;
        let entry = PluginEntry::new("mcp:x", declaration, provider, options).unwrap();
        Ok((entry, Arc::new(Echo)))
    }

    /// M3, M5, K8: an identical declaration publishes nothing; a changed one is a `reload`; a
    /// failure leaves the registry as `stale`, its tools kept for warm sessions, and a return
    /// with the same declaration fills the slots again without an event.
    #[test]
    fn only_a_changed_declaration_is_published() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::new(
            Arc::new(MemoryStore::new()),
            Arc::new(NoFiles),
            Config::default(),
            dir.path(),
        )
        .unwrap();
        let first = daemon.set_external("mcp:x", "x", entry(&["a"])).unwrap();
        assert_eq!(first.kind, ChangeKind::Load);
        let snapshot = daemon.registry();
        assert!(daemon.set_external("mcp:x", "x", entry(&["a"])).is_none());
        assert!(
            Arc::ptr_eq(&snapshot, &daemon.registry()),
            "nothing published"
        );
        let failed = daemon.set_external("mcp:x", "x", Err(ErrorBody::new("mcp_server", "gone")));
        assert_eq!(failed.unwrap().kind, ChangeKind::Refused);
        assert_eq!(daemon.plugins()[0].state, PluginState::Stale);
        assert!(
            daemon.registry().get("mcp:x").is_none(),
            "out of new sessions"
        );
        assert!(
            daemon.registry().kept("mcp:x").is_some(),
            "kept for warm ones"
        );
        assert!(daemon.set_external("mcp:x", "x", entry(&["a"])).is_none());
        assert_eq!(daemon.plugins()[0].state, PluginState::Loaded);
        assert!(daemon.registry().get("mcp:x").is_some(), "serving again");
        assert!(daemon.registry().kept("mcp:x").is_none());
        let changed = daemon
            .set_external("mcp:x", "x", entry(&["a", "b"]))
            .unwrap();
        assert_eq!(changed.kind, ChangeKind::Reload);
    }
}
