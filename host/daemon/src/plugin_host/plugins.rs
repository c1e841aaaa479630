//! The plugin lifecycle: loading the plugin folder (in parallel, a bounded number at once),
//! hot reload, unload, quarantine after repeated failures (L3) and enabling again; each
//! change publishes a new registry snapshot and a change event (R5).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use promptd_core::config::Config;
use promptd_core::load::{self, CacheLookup, PluginFile};
use promptd_core::plugin::registry::{PluginEntry, Registry};
use promptd_core::plugin::state::{ChangeKind, PluginState};
use promptd_core::request::declaration_json;
use promptd_core::sync::{lock, read, recover, write};
use promptd_core::{Error, ErrorBody};
use serde_json::Value;

use crate::events::RegistryEvent;

/// `refresh` as `GET /v1/plugins` shows it: `mode` is `step`, `boundary` (every section and
/// tool), `session` (every one, for the session) or `parts` (the sections and tools listed;
/// `session` lists those held for the session); `by` says who set it (`default`, `plugin` or
/// `config`), and `defer` which tools are deferred and by whom.
fn refresh_view(options: &promptd_core::plugin::registry::PluginOptions) -> Value {
    let refresh = &options.refresh;
    let mode = if refresh.whole {
        "boundary"
    } else if refresh.whole_session {
        "session"
    } else if refresh.is_step() {
        "step"
    } else {
        "parts"
    };
    let session: Vec<String> = (refresh.session.iter())
        .map(|(kind, name)| format!("{} {name}", kind.as_str()))
        .collect();
    serde_json::json!({
        "mode": mode,
        "sections": refresh.sections,
        "tools": refresh.tools,
        "session": session,
        "max_stale_s": refresh.max_stale_s,
        "by": refresh.by,
        "defer": {"all": options.defer.all, "tools": options.defer.tools, "by": options.defer.by},
    })
}
use crate::{plugin_dir, Daemon, PluginStatus, Result};

impl Daemon {
    /// Every plugin file's status, and every external contributor's (MCP servers).
    pub fn plugins(&self) -> Vec<PluginStatus> {
        let plugins = read(&self.plugins.files);
        let mut all: Vec<PluginStatus> = plugins.values().cloned().collect();
        drop(plugins);
        all.extend(self.external_statuses());
        let registry = self.registry();
        let held = lock(&self.cache.held);
        for status in &mut all {
            if let Some(entry) = registry.get(&status.id) {
                status.refresh = refresh_view(&entry.options);
            }
            let mut parts: Vec<crate::HeldIn> = held
                .iter()
                .flat_map(|(session, parts)| parts.iter().map(move |p| (session, p)))
                .filter(|(_, p)| p.plugin == status.id)
                .map(|(session, p)| crate::HeldIn {
                    session: session.clone(),
                    held: p.clone(),
                    said: p.to_string(),
                })
                .collect();
            parts.sort_by(|a, b| {
                (a.held.since_ms, &a.session, &a.held.name).cmp(&(
                    b.held.since_ms,
                    &b.session,
                    &b.held.name,
                ))
            });
            parts.truncate(crate::HELD_SHOWN);
            status.held = parts;
        }
        all
    }

    /// Remembers what session `id`'s last step held (K7), for `GET /v1/plugins`.
    pub(crate) fn note_held(&self, id: &str, held: &[promptd_core::held::Held]) {
        /// Sessions remembered at most; past it, a new one is not listed (its log says it).
        const MOST: usize = 65_536;
        let mut map = lock(&self.cache.held);
        if held.is_empty() {
            map.remove(id);
        } else if map.len() < MOST || map.contains_key(id) {
            map.insert(id.to_string(), held.to_vec());
        }
    }

    /// Rescans the plugin folder: loads new files, reloads changed ones (the old version keeps
    /// serving if the new one fails), unloads removed ones. Each change is an event (R5).
    pub fn reload(&self) -> Result<Vec<RegistryEvent>> {
        let _changing = lock(&self.plugins.changes);
        let files = plugin_dir::plugin_files(&self.scan_dir())?;
        let total = files.len();
        let mut applied = Vec::new();
        let mut present = HashSet::new();
        let mut changed = Vec::new();
        let config = self.config();
        for path in files {
            let file = match plugin_dir::read(&path) {
                Ok(file) => file,
                Err(error) => {
                    let path = path.display().to_string();
                    tracing::warn!(file = %path, "refused: {error}");
                    let body = ErrorBody::from(&error);
                    applied.push(self.plugins.events.push(
                        ChangeKind::Refused,
                        "",
                        &path,
                        "",
                        Some(body),
                    ));
                    continue;
                }
            };
            present.insert(file.stem.clone());
            let unchanged = read(&self.plugins.files)
                .get(&file.stem)
                .is_some_and(|s| s.sha256 == file.sha256);
            if !unchanged {
                changed.push(file);
            }
        }
        // Compile, instantiate and declare in parallel (a slow or hostile plugin holds one
        // worker up to its deadline, not the whole load); apply in file order, so the registry
        // never depends on which finished first (R2).
        let done = AtomicUsize::new(total - changed.len());
        self.progress(done.load(Ordering::Relaxed), total);
        let outcomes = parallel_map(&changed, LOAD_WORKERS, |file| {
            let started = Instant::now();
            let result = load::load(self.plugins.engine.as_ref(), file, &config);
            self.progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
            (started.elapsed(), result)
        });
        for (file, (took, result)) in changed.iter().zip(outcomes) {
            applied.push(self.apply(file, &config, took, result));
        }
        let gone: Vec<String> = read(&self.plugins.files)
            .keys()
            .filter(|stem| !present.contains(*stem))
            .cloned()
            .collect();
        for stem in gone {
            let status = write(&self.plugins.files).remove(&stem);
            if let Some(status) = status {
                if let Ok(next) = self.registry().without(&status.id) {
                    self.publish(next);
                }
                applied.push(self.plugins.events.push(
                    ChangeKind::Unload,
                    &status.id,
                    &status.file,
                    &status.sha256,
                    None,
                ));
            }
        }
        Ok(applied)
    }

    /// Publishes one loaded (or refused) file: validates it against the other plugins first.
    pub(crate) fn apply(
        &self,
        file: &PluginFile,
        config: &Config,
        took: Duration,
        loaded: Result<(PluginEntry, Option<CacheLookup>), Error>,
    ) -> RegistryEvent {
        let id = config.plugin_id(&file.stem);
        let path = file.path.display().to_string();
        let mut current = self.registry();
        // A config change can give the file another id: the old id leaves with the new load.
        let old_id = read(&self.plugins.files)
            .get(&file.stem)
            .map(|s| s.id.clone())
            .filter(|old| *old != id);
        if let Some(old) = &old_id {
            if let Ok(without) = current.without(old) {
                current = Arc::new(without);
            }
        }
        let existed = current.get(&id).is_some();
        let result = loaded.and_then(|(entry, lookup)| {
            let declares = declaration_json(&entry.declaration);
            current
                .with_replaced(entry)
                .map(|next| (next, declares, lookup))
        });
        let mut plugins = write(&self.plugins.files);
        match result {
            Ok((next, declares, lookup)) => {
                self.publish(next);
                plugins.insert(
                    file.stem.clone(),
                    PluginStatus {
                        id: id.clone(),
                        file: path.clone(),
                        sha256: file.sha256.clone(),
                        serving_sha256: Some(file.sha256.clone()),
                        state: PluginState::Loaded,
                        last_error: None,
                        declares,
                        refresh: Value::Null,
                        held: Vec::new(),
                    },
                );
                let cache = lookup.map_or("off", |l| l.as_str());
                let ms = took.as_secs_f64() * 1000.0;
                tracing::info!(plugin = %id, sha256 = %file.sha256, cache, ms = format!("{ms:.1}"), "loaded");
                self.plugins.events.push(
                    if existed {
                        ChangeKind::Reload
                    } else {
                        ChangeKind::Load
                    },
                    &id,
                    &path,
                    &file.sha256,
                    None,
                )
            }
            Err(error) => {
                tracing::warn!(plugin = %id, "refused: {error}");
                self.observers.metrics.plugin_error();
                let status = plugins
                    .entry(file.stem.clone())
                    .or_insert_with(|| PluginStatus {
                        id: id.clone(),
                        file: path.clone(),
                        sha256: String::new(),
                        serving_sha256: None,
                        state: PluginState::Refused,
                        last_error: None,
                        declares: Value::Null,
                        refresh: Value::Null,
                        held: Vec::new(),
                    });
                // H3: an older version, if any, keeps serving; the new bytes are remembered so
                // an unchanged file is not retried on every rescan.
                status.state = if existed {
                    PluginState::Stale
                } else {
                    PluginState::Refused
                };
                status.sha256 = file.sha256.clone();
                status.last_error = Some(ErrorBody::from(&error));
                self.plugins.events.push(
                    ChangeKind::Refused,
                    &id,
                    &path,
                    &file.sha256,
                    Some(ErrorBody::from(&error)),
                )
            }
        }
    }

    /// Unloads plugin `id` (R4): all its contributions leave the next assembly.
    pub fn unload(&self, id: &str) -> Result<RegistryEvent> {
        let _changing = lock(&self.plugins.changes);
        let next = self.registry().without(id)?;
        self.publish(next);
        let mut plugins = write(&self.plugins.files);
        let stem = plugins
            .iter()
            .find(|(_, s)| s.id == id)
            .map(|(k, _)| k.clone());
        let status = stem.and_then(|s| plugins.remove(&s));
        let (file, sha) = status.map(|s| (s.file, s.sha256)).unwrap_or_default();
        Ok(self
            .plugins
            .events
            .push(ChangeKind::Unload, id, &file, &sha, None))
    }

    /// L3: a plugin whose calls failed `quarantine_after` times in a row leaves the registry
    /// until its file changes or an operator enables it.
    pub(crate) fn quarantine_failing(&self, error: Option<&Error>) {
        let Some(limit) = self.config().quarantine_after() else {
            return;
        };
        let failing: Vec<String> = self
            .registry()
            .plugins()
            .filter(|p| p.provider.consecutive_failures() >= limit)
            .map(|p| p.id.clone())
            .collect();
        for id in failing {
            let _changing = lock(&self.plugins.changes);
            let cause = match error {
                Some(e @ Error::PluginCall { plugin, .. }) if *plugin == id => e.to_string(),
                _ => format!("{limit} consecutive calls failed"),
            };
            let message =
                format!("quarantined after {limit} consecutive failed calls; last: {cause}");
            let registry = self.registry();
            let keep = registry.get(&id).is_some_and(|e| e.options.keep_tools);
            let next = if keep {
                let kept = promptd_core::plugin::registry::Kept {
                    since_ms: crate::now_ms(),
                    cause: message.clone(),
                };
                registry.without_kept(&id, kept)
            } else {
                registry.without(&id)
            };
            let Ok(next) = next else {
                continue; // already gone
            };
            self.publish(next);
            tracing::warn!(plugin = %id, "{message}");
            let mut plugins = write(&self.plugins.files);
            let (mut file, mut sha) = (String::new(), String::new());
            if let Some(status) = plugins.values_mut().find(|s| s.id == id) {
                status.state = PluginState::Quarantined;
                status.serving_sha256 = None;
                status.declares = Value::Null;
                status.last_error = Some(ErrorBody::new("quarantined", message.clone()));
                (file, sha) = (status.file.clone(), status.sha256.clone());
            }
            let error = Error::Quarantined {
                plugin: id.clone(),
                message,
            };
            self.plugins.events.push(
                ChangeKind::Quarantine,
                &id,
                &file,
                &sha,
                Some(ErrorBody::from(&error)),
            );
        }
    }

    /// Brings a quarantined plugin back: its file is loaded again (a fresh instance).
    pub fn enable(&self, id: &str) -> Result<Vec<RegistryEvent>> {
        if let Some(done) = self.enable_external(id) {
            return done;
        }
        {
            let mut plugins = write(&self.plugins.files);
            let status = plugins
                .values_mut()
                .find(|s| s.id == id)
                .ok_or_else(|| Error::UnknownPlugin(id.to_string()))?;
            if status.state != PluginState::Quarantined {
                return Ok(Vec::new()); // nothing to do
            }
            status.sha256.clear(); // forces the rescan to load it
        }
        self.reload()
    }

    pub(crate) fn publish(&self, registry: Registry) {
        self.observers.metrics.set_plugins_loaded(registry.len());
        *write(&self.plugins.registry) = Arc::new(registry);
    }
}

/// Most plugins loaded at once: a few more than this machine's cores, so that plugins stuck
/// in a looping `declare` (each stopped at its deadline) do not hold up every other load.
pub(crate) const LOAD_WORKERS: usize = 4;

/// `f` over `items` on up to `workers` scoped threads; results in the items' order.
pub(crate) fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers.min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                *lock(&results[i]) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .filter_map(|r| recover(r.into_inner()))
        .collect()
}
