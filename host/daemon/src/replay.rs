//! Counterfactual replay (issue 29; Q19, Q20): recorded sessions re-assembled with a
//! candidate plugin folder or config, loaded by the daemon's engine into a registry of
//! their own — never the one serving — under the limits of normal loading. Nothing is
//! written to any log, and nothing the daemon serves changes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use promptd_core::config::{AgentSettings, Config};
use promptd_core::formats::Format;
use promptd_core::ledger::Pricing;
use promptd_core::load::{self, PluginFile};
use promptd_core::plugin::registry::Registry;
use promptd_core::replay::{self, Candidate, ReplayTotals, SessionReplay};
use promptd_core::sync::{lock, read};
use serde::Serialize;

use crate::{plugin_dir, Daemon, DaemonError, Result};

/// Most sessions one replay reads.
pub const MAX_SESSIONS: usize = 1000;

/// The largest candidate config file a replay reads.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// What to replay, and with what.
#[derive(Clone, Debug, Default)]
pub struct ReplayRequest {
    /// These sessions (at most [`MAX_SESSIONS`]); when empty, the most recent ones.
    pub sessions: Vec<String>,
    /// Only this agent's sessions.
    pub agent: Option<String>,
    /// Only sessions with activity at or after this time (ms since the Unix epoch).
    pub since_ms: Option<u64>,
    /// Without `sessions`, at most this many, most recent activity first (1 to
    /// [`MAX_SESSIONS`]).
    pub limit: usize,
    /// The candidate plugin folder (absolute; default: the daemon's own).
    pub plugins: Option<PathBuf>,
    /// Plugin files (absolute) that replace the folder's file of the same plugin id, or join
    /// it.
    pub swap: Vec<PathBuf>,
    /// The candidate config file (absolute; default: the daemon's config).
    pub config: Option<PathBuf>,
    /// The provider format compared and priced (default: each session's replies').
    pub format: Option<Format>,
}

/// One plugin of the candidate set.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct CandidatePlugin {
    /// Its id.
    pub id: String,
    /// The file it was loaded from (for an MCP server: `mcp`, as it lists its tools today).
    pub file: String,
    /// The file's SHA-256.
    pub sha256: String,
}

/// What a replay compared with.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct CandidateSet {
    /// The plugin folder.
    pub plugins: String,
    /// Every plugin of the candidate registry, by id.
    pub loaded: Vec<CandidatePlugin>,
    /// The config file, or `null` for the daemon's own config.
    pub config: Option<String>,
}

/// `POST /v1/replay`'s answer.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ReplayReport {
    /// The candidate.
    pub candidate: CandidateSet,
    /// Each session replayed, most recent activity first (or as named).
    pub sessions: Vec<SessionReplay>,
    /// Every session's sums, summed.
    pub totals: ReplayTotals,
}

/// A candidate path that cannot be used.
fn candidate(
    what: &'static str,
    path: &Path,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> DaemonError {
    DaemonError::ReplayCandidate {
        what,
        path: path.to_path_buf(),
        source: source.into(),
    }
}

fn invalid(what: &'static str, path: &Path, why: &str) -> DaemonError {
    candidate(
        what,
        path,
        std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string()),
    )
}

/// `path`, when it is absolute: the daemon reads paths on its own machine, and a relative
/// one would depend on where it was started.
fn absolute<'a>(what: &'static str, path: &'a Path) -> Result<&'a Path> {
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(invalid(
            what,
            path,
            "must be an absolute path (the daemon reads it on its own machine)",
        ))
    }
}

impl Daemon {
    /// Replays the sessions `request` selects with its candidate (Q19): a fresh registry
    /// loaded from the candidate folder (and swapped files) under the candidate config, the
    /// daemon's MCP servers as they list their tools today. Never writes (Q20); one replay
    /// runs at a time, so a replay's plugin set is the only one loaded beside the serving one.
    pub fn replay(&self, request: &ReplayRequest) -> Result<ReplayReport> {
        let _one_at_a_time = lock(&self.plugins.replays);
        let ids = self.replay_sessions(request)?;
        let config = match &request.config {
            Some(path) => Arc::new(candidate_config(absolute("config", path)?)?),
            None => self.config(),
        };
        let dir = match &request.plugins {
            Some(dir) => absolute("plugin folder", dir)?.to_path_buf(),
            None => self.plugins.dir.clone(),
        };
        let (registry, loaded) = self.candidate_registry(&dir, &request.swap, &config)?;
        let pricing = Pricing {
            prices: &config.pricing,
            rules: &config.cache,
        };
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
        let mut sessions = Vec::with_capacity(ids.len());
        let mut totals = ReplayTotals::default();
        for (id, agent) in ids {
            let plan = AgentSettings::resolve(&config, &agent, |name| Some(self.counter(name)))?;
            let events = self.sessions.store.events(&id)?;
            let candidate = Candidate {
                registry: &registry,
                agent: &plan,
                pricing,
                format: request.format,
                workers,
            };
            let replayed = replay::replay(&id, &events, &candidate)?;
            totals.merge(&replayed.totals);
            sessions.push(replayed);
        }
        Ok(ReplayReport {
            candidate: CandidateSet {
                plugins: dir.display().to_string(),
                loaded,
                config: request.config.as_ref().map(|p| p.display().to_string()),
            },
            sessions,
            totals,
        })
    }

    /// The sessions to replay, with their agents: those named (each must exist), else the
    /// most recent ones (at most `limit`); either way only those of `agent` with activity
    /// since `since_ms`, when given.
    fn replay_sessions(&self, request: &ReplayRequest) -> Result<Vec<(String, String)>> {
        let agent = request.agent.as_deref();
        let wanted = |agent_of: &str, last_ms: u64| {
            agent.is_none_or(|a| a == agent_of) && request.since_ms.is_none_or(|t| last_ms >= t)
        };
        if !request.sessions.is_empty() {
            let mut out = Vec::new();
            for id in request.sessions.iter().take(MAX_SESSIONS) {
                let session_agent = self.agent_of(id)?;
                let last_ms = match request.since_ms {
                    Some(_) => self
                        .sessions
                        .store
                        .events(id)?
                        .last()
                        .map_or(0, |e| e.at_ms),
                    None => 0,
                };
                if wanted(&session_agent, last_ms) {
                    out.push((id.clone(), session_agent));
                }
            }
            return Ok(out);
        }
        let limit = request.limit.clamp(1, MAX_SESSIONS);
        // The store filters by substring; the exact agent is checked here.
        let listed = self.sessions.store.sessions(agent.unwrap_or(""), limit)?;
        Ok(listed
            .into_iter()
            .filter(|s| wanted(&s.agent, s.last_ms))
            .map(|s| (s.id, s.agent))
            .collect())
    }

    /// The candidate plugin set: `dir`'s plugin files with `swap` in place of the files of
    /// the same plugin ids (or added), loaded in file-name order (R2) as the daemon loads
    /// (in parallel, each under `config`'s limits: L2, L7, L8), strictly — a plugin that
    /// does not load or conflicts refuses the replay, naming it —, then the daemon's MCP
    /// servers. Nothing of it is published.
    fn candidate_registry(
        &self,
        dir: &Path,
        swap: &[PathBuf],
        config: &Config,
    ) -> Result<(Registry, Vec<CandidatePlugin>)> {
        if !dir.is_dir() {
            return Err(invalid("plugin folder", dir, "is not a folder"));
        }
        let wrap = |e: DaemonError| match e {
            DaemonError::PluginDir { path, source } => candidate("plugin folder", &path, source),
            DaemonError::PluginRead { path, source } => candidate("plugin file", &path, source),
            other => other,
        };
        let paths = plugin_dir::plugin_files(dir).map_err(wrap)?;
        let mut files: Vec<PluginFile> = paths
            .iter()
            .map(|p| plugin_dir::read(p))
            .collect::<Result<_>>()
            .map_err(wrap)?;
        for path in swap {
            let path = absolute("plugin file", path)?;
            if path.extension().is_none_or(|e| e != "wasm") || !path.is_file() {
                return Err(invalid(
                    "plugin file",
                    path,
                    "is not a `.wasm` file (a plugin component)",
                ));
            }
            let file = plugin_dir::read(path).map_err(wrap)?;
            let id = config.plugin_id(&file.stem);
            files.retain(|f| config.plugin_id(&f.stem) != id);
            files.push(file);
        }
        files.sort_by(|a, b| a.stem.cmp(&b.stem));
        let outcomes = crate::plugin_host::plugins::parallel_map(
            &files,
            crate::plugin_host::plugins::LOAD_WORKERS,
            |f| load::load(self.plugins.engine.as_ref(), f, config),
        );
        let mut registry = Registry::new();
        let mut loaded = Vec::with_capacity(files.len());
        for (file, outcome) in files.iter().zip(outcomes) {
            let (entry, _) = outcome?;
            loaded.push(CandidatePlugin {
                id: entry.id.clone(),
                file: file.path.display().to_string(),
                sha256: file.sha256.clone(),
            });
            registry = registry.with_plugin(entry)?;
        }
        // MCP servers: as they list their tools today (a replay does not start them again).
        let serving = self.registry();
        for id in read(&self.plugins.externals).keys() {
            if let Some(entry) = serving.get(id) {
                loaded.push(CandidatePlugin {
                    id: id.clone(),
                    file: "mcp".into(),
                    sha256: entry.sha256.clone().unwrap_or_default(),
                });
                registry = registry.with_shared(entry.clone())?;
            }
        }
        loaded.sort_by(|a, b| a.id.cmp(&b.id));
        Ok((registry, loaded))
    }
}

/// Reads the candidate config at `path`: a file, not too large, valid (R6).
fn candidate_config(path: &Path) -> Result<Config> {
    let meta = std::fs::metadata(path).map_err(|e| candidate("config", path, e))?;
    if !meta.is_file() {
        return Err(invalid("config", path, "is not a file"));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(invalid("config", path, "is larger than 16 MiB"));
    }
    // The config's own errors are said with the file they are in.
    plugin_dir::read_config(path).map_err(|e| match e {
        DaemonError::ConfigRead { path, source } => candidate("config", &path, source),
        DaemonError::Core(e) => candidate("config", path, e),
        other => other,
    })
}
