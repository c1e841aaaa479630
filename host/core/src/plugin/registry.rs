//! The registry: an immutable snapshot of loaded plugins and their contributions (R1–R4).
//!
//! Every change returns a *new* `Registry`; a snapshot is never modified, so an assembly that
//! holds one sees a consistent set of plugins however the registry changes meanwhile (H2).

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::plugin::model::{
    Context, Contribution, Declaration, Kind, Scope, Section, Tool, Variable,
};
use crate::plugin::provider::Provider;
use crate::plugin::refresh::SetBy;
use crate::plugin::sandbox::DeclarationLimits;
use crate::plugin::trust::Trust;
use crate::plugin::validate::{self, ToolSchemas};
use crate::sync::lock;

/// How the host config treats one plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginOptions {
    /// Moves every contribution the plugin declared as global into this scope.
    pub scope_override: Option<Scope>,
    /// A failing call leaves the plugin's contributions out instead of failing the assembly (A9).
    pub optional: bool,
    /// With `optional`: a failing dynamic context leaves out that context alone, and the
    /// plugin's other contributions (its tools) keep serving. MCP servers' resources use it, so
    /// a failed read changes no tool (no cache break); plugins leave it off.
    pub contexts_fail_alone: bool,
    /// How much the plugin may declare (L8).
    pub limits: DeclarationLimits,
    /// What the config lets it contribute (R7).
    pub trust: Trust,
    /// Which of its sections and tools wait for a cache-cold point (K7).
    pub refresh: crate::plugin::refresh::Refresh,
    /// Which of its tools are deferred (K9): left out of the cached prefix, found by the
    /// provider's tool search.
    pub defer: Defer,
    /// When it fails (an MCP server down, a plugin quarantined), its tools keep their place
    /// in warm sessions until a cache-cold point (K8): on by default for MCP servers.
    pub keep_tools: bool,
}

/// Which of a plugin's tools are deferred (`[plugins.ID] defer`, K9).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defer {
    /// Every tool (`defer = true`).
    pub all: bool,
    /// These tools (`defer = ["name", ...]`, or the plugin's `defer`, world 0.3.0).
    pub tools: std::collections::BTreeSet<String>,
    /// Who set it.
    pub by: crate::plugin::refresh::SetBy,
}

impl Defer {
    /// Whether tool `name` is deferred.
    pub fn holds(&self, name: &str) -> bool {
        self.all || self.tools.contains(name)
    }
}

/// Why a gone contributor's tools are kept (K8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// When it failed, in ms since the Unix epoch.
    pub since_ms: u64,
    /// Why.
    pub cause: String,
}

/// One loaded, validated plugin.
pub struct PluginEntry {
    /// The plugin's id: its file stem unless the config sets one.
    pub id: String,
    /// Exactly what the plugin declared (its own scopes), used when calling it back.
    pub declaration: Declaration,
    /// How the config treats it.
    pub options: PluginOptions,
    /// Its dynamic half: what assembly calls.
    pub provider: Arc<dyn Provider>,
    /// Parsed tool parameters by (name, declared scope).
    pub schemas: ToolSchemas,
    /// Where it came from, e.g. the file path and its SHA-256; informational.
    pub origin: Option<String>,
    /// The SHA-256 of the file it was loaded from (recorded in each step's provenance).
    pub sha256: Option<String>,
    /// A short hash of the config values its `declare` received, when it has any (recorded
    /// in each step's provenance, so a diff can say "its config changed").
    pub config_hash: Option<String>,
}

impl std::fmt::Debug for PluginEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginEntry")
            .field("id", &self.id)
            .field("declaration", &self.declaration)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// K7: `refresh` names only what the plugin declares (a typo would otherwise hold nothing,
/// silently).
fn check_refresh(
    id: &str,
    d: &Declaration,
    refresh: &crate::plugin::refresh::Refresh,
) -> Result<()> {
    let unknown = |kind, name: &String| Error::RefreshUnknown {
        plugin: id.to_string(),
        kind,
        name: name.clone(),
    };
    if let Some(name) = refresh
        .sections
        .iter()
        .find(|n| !d.sections.iter().any(|s| &s.name == *n))
    {
        return Err(unknown("section", name));
    }
    if let Some(name) = refresh
        .tools
        .iter()
        .find(|n| !d.tools.iter().any(|t| &t.name == *n))
    {
        return Err(unknown("tool", name));
    }
    Ok(())
}

/// R7: a `data` plugin declares no sections and no variables.
fn check_data(id: &str, d: &Declaration) -> Result<()> {
    let refuse = |kind, names: Vec<String>| Error::DataPluginDeclares {
        plugin: id.to_string(),
        kind,
        names,
    };
    if !d.sections.is_empty() {
        let names = d.sections.iter().map(|s| format!("`{}`", s.name)).collect();
        return Err(refuse(Kind::Section, names));
    }
    if !d.variables.is_empty() {
        let names = d
            .variables
            .iter()
            .map(|v| format!("`{}`", v.name))
            .collect();
        return Err(refuse(Kind::Variable, names));
    }
    Ok(())
}

impl PluginEntry {
    /// Validates the declaration (R1); nothing is visible until the entry joins a registry.
    pub fn new(
        id: &str,
        declaration: Declaration,
        provider: Arc<dyn Provider>,
        options: PluginOptions,
    ) -> Result<Self> {
        if let Some(scope) = &options.scope_override {
            validate::check_scope(id, scope)?;
        }
        let schemas = validate::validate(
            id,
            &declaration,
            &options.limits,
            options.trust == Trust::Data,
        )?;
        if options.trust == Trust::Data {
            check_data(id, &declaration)?;
        }
        check_refresh(id, &declaration, &options.refresh)?;
        // World 0.3.0: what the plugin declares stands where the operator's config says
        // nothing.
        let mut options = options;
        if options.refresh.by != SetBy::Config {
            options.refresh = options.refresh.declared(&declaration);
        }
        if options.defer.by != SetBy::Config {
            let tools: std::collections::BTreeSet<String> = (declaration.tools.iter())
                .filter(|t| t.defer)
                .map(|t| t.name.clone())
                .collect();
            if !tools.is_empty() {
                options.defer = Defer {
                    all: false,
                    tools,
                    by: SetBy::Plugin,
                };
            }
        }
        if let Some(name) = options
            .defer
            .tools
            .iter()
            .find(|n| !declaration.tools.iter().any(|t| &t.name == *n))
        {
            return Err(Error::DeferUnknown {
                plugin: id.to_string(),
                name: name.clone(),
            });
        }
        let entry = Self {
            id: id.to_string(),
            declaration,
            options,
            provider,
            schemas,
            origin: None,
            sha256: None,
            config_hash: None,
        };
        entry.check_effective_duplicates()?;
        Ok(entry)
    }

    /// The same entry, with `origin` (where it came from).
    pub fn with_origin(mut self, origin: impl Into<String>) -> Self {
        self.origin = Some(origin.into());
        self
    }

    /// The same entry, with the SHA-256 of its file.
    pub fn with_sha256(mut self, sha256: impl Into<String>) -> Self {
        self.sha256 = Some(sha256.into());
        self
    }

    /// Records the config values the plugin was declared with (none: nothing recorded).
    pub fn with_config(mut self, values: &[(String, String)]) -> Self {
        self.config_hash = (!values.is_empty()).then(|| {
            // Each key and value behind its length, so no two configs give the same bytes.
            let mut bytes = Vec::new();
            for part in values.iter().flat_map(|(k, v)| [k, v]) {
                bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
                bytes.extend_from_slice(part.as_bytes());
            }
            short_hash(&bytes)
        });
        self
    }

    /// The scope a contribution is visible in, after the config's scope override.
    pub fn effective_scope(&self, declared: &Scope) -> Scope {
        match (&self.options.scope_override, declared) {
            (Some(over), Scope::Global) => over.clone(),
            _ => declared.clone(),
        }
    }

    /// Every (kind, name, effective scope) this plugin contributes.
    pub fn keys(&self) -> impl Iterator<Item = (Kind, &str, Scope)> + '_ {
        fn of<'a, T: Contribution + 'a>(
            e: &'a PluginEntry,
        ) -> impl Iterator<Item = (Kind, &'a str, Scope)> + 'a {
            T::all(&e.declaration)
                .iter()
                .map(move |c| (T::KIND, c.name(), e.effective_scope(c.scope())))
        }
        of::<Section>(self)
            .chain(of::<Context>(self))
            .chain(of::<Variable>(self))
            .chain(of::<Tool>(self))
    }

    /// A scope override can merge a global and an agent-scoped item of the same name.
    fn check_effective_duplicates(&self) -> Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        for (kind, name, scope) in self.keys() {
            if !seen.insert((kind, name, scope.clone())) {
                return Err(Error::DuplicateName {
                    plugin: self.id.clone(),
                    kind,
                    name: name.into(),
                    scope: scope.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// An immutable set of loaded plugins, keyed by id.
#[derive(Default, Debug)]
pub struct Registry {
    plugins: BTreeMap<String, Arc<PluginEntry>>,
    /// Contributors gone for a failure whose tools keep their place in warm sessions until a
    /// cache-cold point (K8): an MCP server that is down, a quarantined plugin with
    /// `keep_tools`. A contributor loaded again leaves this list.
    kept: BTreeMap<String, Kept>,
    /// The published plugin set this snapshot serves (K10), when the daemon follows a store.
    set: Option<u64>,
    /// Assemblies that made no plugin call, so they are a function of this snapshot, the
    /// chain and the options alone (see [`crate::assembly::assemble`]). Every clone starts
    /// empty: a changed registry never sees another snapshot's results.
    pub(crate) memo: Memo,
    /// What every assembly of this snapshot by (chain, options) shares, dynamic or not (who
    /// gives each part, the ordered tools): made once (see [`crate::assembly::assemble`]).
    pub(crate) skeletons: Memo,
}

/// Static assemblies of one registry snapshot, by (chain, options); bounded. The registry holds
/// them without naming their type (assembly puts and gets them, see
/// [`crate::assembly::assemble`]), so the plugin side does not depend on assembly.
#[derive(Default, Debug)]
pub(crate) struct Memo(std::sync::Mutex<BTreeMap<MemoKey, Arc<dyn Any + Send + Sync>>>);

pub(crate) type MemoKey = (Arc<[String]>, Option<Arc<[String]>>, bool, bool);

/// Distinct (chain, options) a snapshot remembers before it starts over.
const MEMO_ENTRIES: usize = 256;

impl Memo {
    pub(crate) fn get<T: Any + Send + Sync>(&self, key: &MemoKey) -> Option<Arc<T>> {
        lock(&self.0)
            .get(key)
            .cloned()
            .and_then(|value| value.downcast().ok())
    }

    pub(crate) fn put<T: Any + Send + Sync>(&self, key: MemoKey, value: &Arc<T>) {
        let mut memo = lock(&self.0);
        if memo.len() >= MEMO_ENTRIES {
            memo.clear(); // agents come from clients: never let their names grow this
        }
        memo.insert(key, value.clone());
    }
}

impl Clone for Registry {
    fn clone(&self) -> Self {
        Self {
            plugins: self.plugins.clone(),
            kept: self.kept.clone(),
            set: self.set,
            memo: Memo::default(),
            skeletons: Memo::default(),
        }
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loaded plugins in id order.
    pub fn plugins(&self) -> impl Iterator<Item = &Arc<PluginEntry>> {
        self.plugins.values()
    }

    /// The plugin with id `id`, if loaded.
    pub fn get(&self, id: &str) -> Option<&Arc<PluginEntry>> {
        self.plugins.get(id)
    }

    /// Whether any loaded plugin reads the request input `input` picks (world 0.3.0), so a
    /// front door knows whether to read it out of a client's body at all.
    pub fn reads_input(&self, input: impl Fn(&crate::plugin::model::Inputs) -> bool) -> bool {
        self.plugins.values().any(|p| {
            let d = &p.declaration;
            let reads = (d.sections.iter().map(|s| s.reads.as_ref()))
                .chain(d.contexts.iter().map(|c| c.reads.as_ref()))
                .chain(d.variables.iter().map(|v| v.reads.as_ref()))
                .chain(std::iter::once(d.reads.as_ref()));
            reads.flatten().any(|r| input(&r.inputs))
        })
    }

    /// How many plugins are loaded.
    pub fn len(&self) -> usize {
        self.plugins.len()
    }

    /// Whether no plugin is loaded.
    pub fn is_empty(&self) -> bool {
        self.plugins.is_empty()
    }

    /// A new snapshot with `entry` added (R2): refused if the id is taken or any contribution
    /// conflicts with another plugin's in the same scope. `self` is unchanged either way.
    pub fn with_plugin(&self, entry: PluginEntry) -> Result<Registry> {
        if self.plugins.contains_key(&entry.id) {
            return Err(Error::DuplicatePlugin(entry.id.clone()));
        }
        self.check_conflicts(&entry, None)?;
        let mut next = self.clone();
        next.kept.remove(&entry.id);
        next.plugins.insert(entry.id.clone(), Arc::new(entry));
        Ok(next)
    }

    /// A new snapshot where `entry` replaces the plugin with the same id (or is added). The
    /// old version's contributions do not count as conflicts with the new one.
    pub fn with_replaced(&self, entry: PluginEntry) -> Result<Registry> {
        self.check_conflicts(&entry, Some(&entry.id))?;
        let mut next = self.clone();
        next.kept.remove(&entry.id);
        next.plugins.insert(entry.id.clone(), Arc::new(entry));
        Ok(next)
    }

    /// A new snapshot with an entry another snapshot holds (shared, not loaded again), under
    /// the same rules as [`Registry::with_plugin`] (R2).
    pub fn with_shared(&self, entry: Arc<PluginEntry>) -> Result<Registry> {
        if self.plugins.contains_key(&entry.id) {
            return Err(Error::DuplicatePlugin(entry.id.clone()));
        }
        self.check_conflicts(&entry, None)?;
        let mut next = self.clone();
        next.kept.remove(&entry.id);
        next.plugins.insert(entry.id.clone(), entry);
        Ok(next)
    }

    /// A new snapshot without plugin `id` (R4): all its contributions go at once.
    pub fn without(&self, id: &str) -> Result<Registry> {
        let mut next = self.clone();
        next.plugins
            .remove(id)
            .ok_or_else(|| Error::UnknownPlugin(id.into()))?;
        Ok(next)
    }

    /// A new snapshot without plugin `id`, whose tools warm sessions keep until a cache-cold
    /// point (K8) because it failed (`kept` says since when and why).
    pub fn without_kept(&self, id: &str, kept: Kept) -> Result<Registry> {
        let mut next = self.without(id)?;
        next.kept.insert(id.to_string(), kept);
        Ok(next)
    }

    /// The same snapshot, serving published plugin set `version` (K10).
    pub fn with_set(mut self, version: u64) -> Registry {
        self.set = Some(version);
        self
    }

    /// The published plugin set this snapshot serves, if the daemon follows a store (K10).
    pub fn set(&self) -> Option<u64> {
        self.set
    }

    /// Whether any gone contributor's tools are kept (K8).
    pub fn has_kept(&self) -> bool {
        !self.kept.is_empty()
    }

    /// Why plugin `id`'s tools are kept though it is gone, if they are (K8).
    pub fn kept(&self, id: &str) -> Option<&Kept> {
        self.kept.get(id)
    }

    fn check_conflicts(&self, entry: &PluginEntry, skip: Option<&str>) -> Result<()> {
        for other in self.plugins.values() {
            if Some(other.id.as_str()) == skip {
                continue;
            }
            let theirs: std::collections::BTreeSet<_> = other.keys().collect();
            // Report the first conflict in a stable order: kind, then name, then scope.
            let mut ours: Vec<_> = entry.keys().collect();
            ours.sort();
            if let Some((kind, name, scope)) = ours.into_iter().find(|k| theirs.contains(k)) {
                return Err(Error::Conflict {
                    plugin: entry.id.clone(),
                    existing: other.id.clone(),
                    kind,
                    name: name.into(),
                    scope: scope.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Every tool name any loaded plugin knows, sorted and deduplicated (A8).
    pub fn known_tools(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<String> = self
            .plugins
            .values()
            .flat_map(|p| p.declaration.tools.iter().map(|t| t.name.clone()))
            .collect();
        names.into_iter().collect()
    }
}

/// 16 hex digits of FNV-1a 64: stable across runs and builds, cheap, and enough to tell two
/// texts of one part apart (not a security measure).
pub(crate) fn short_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}
