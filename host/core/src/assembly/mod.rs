//! Assembly: every contribution visible to one agent at one step, resolved and ordered
//! (SPEC A1–A10, T5, T6).
//!
//! [`assemble`] is a function of (registry snapshot, step, options). Its only effects are the
//! dynamic calls it makes through each plugin's [`Provider`](crate::plugin::provider::Provider), and
//! those are made only for effective contributions, each at most once (A2). Everything it
//! iterates is ordered (`BTreeMap`, explicit sorts), so the result never depends on load
//! order, registration order or hash seeds (A1).

pub mod review;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::plugin::interpolate::{render, Resolved};
use crate::plugin::model::{
    Content, Context, Contribution, Kind, Scope, Section, Step, Tool, Variable,
};
use crate::plugin::names::UNLISTED_TOOLS;
use crate::plugin::provider::{CallError, CallResult, Evaluation, Wanted};
use crate::plugin::registry::{PluginEntry, Registry};
use crate::plugin::trust::{self, Trust};

/// The fixed first line of the runtime context snapshot (T6).
pub const RUNTIME_CONTEXT_HEADER: &str =
    "[Runtime context: this snapshot supersedes any earlier runtime context.]";

/// Per-assembly choices taken from the config.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `tool_order` from the config, already validated (R6).
    pub tool_order: Option<std::sync::Arc<[String]>>,
    /// False suppresses the runtime context for this agent (A4); contexts are then not called.
    pub suppress_runtime_context: bool,
    /// The agent's `tool_subset = "allowed_tools"`: `tools` keeps every tool the agent can
    /// see, and [`Assembly::shown_tools`] says which of them this step shows (A6).
    pub keep_all_tools: bool,
    /// The secret `data` plugins' blocks are keyed with (T8): the session's, so every step
    /// of a session fences alike and no plugin can guess the key.
    pub data_secret: std::sync::Arc<str>,
}

/// The result of one assembly.
#[derive(Clone, Debug, PartialEq)]
pub struct Assembly {
    /// T5: interpolated section texts, empty ones dropped, joined by one blank line.
    pub system: String,
    /// T6: the runtime context snapshot text, or `None` when every context is empty.
    pub runtime_context: Option<String>,
    /// The tools shown this step, in `tool_order` (with [`Options::keep_all_tools`], every
    /// tool the agent can see). Shared with other assemblies of the same registry snapshot,
    /// chain and options when no plugin filters tools (they are then the same every step).
    pub tools: Arc<[AssembledTool]>,
    /// With [`Options::keep_all_tools`], the names of `tools` shown this step, in order.
    pub shown_tools: Option<Vec<String>>,
    /// Each section's and context's interpolated text by name, in output order (empty ones
    /// included), so a budget can say what each one costs.
    pub sections: Vec<(String, String)>,
    /// Each context's interpolated text by name, in output order (empty ones included).
    pub contexts: Vec<(String, String)>,
    /// Which plugin gave each effective contribution.
    pub explain: Explain,
    /// Optional plugins left out because a call failed (A9).
    pub omitted: Vec<Omission>,
}

/// One tool of a request, as assembly resolved it.
#[derive(Clone, Debug, PartialEq)]
pub struct AssembledTool {
    /// The tool's name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// The declared schema, parsed once at load (A6): shared, never mutated.
    pub parameters: Arc<serde_json::Value>,
    /// K9: the id of the plugin that gives it, when its config defers it.
    pub defer: Option<Arc<str>>,
}

/// Which plugin gave each effective contribution, in output order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Explain {
    /// Who gave each effective section, in output order; shared by every assembly of the
    /// same registry snapshot, chain and options.
    pub sections: Arc<[Origin]>,
    /// Who gave each effective context, in output order; shared as `sections` is.
    pub contexts: Arc<[Origin]>,
    /// Who gave each effective variable.
    pub variables: Vec<Origin>,
    /// Who gave each tool shown, in output order; shared as [`Assembly::tools`] is.
    pub tools: Arc<[Origin]>,
}

/// One effective contribution and the plugin that gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The contribution's name.
    pub name: String,
    /// The plugin's id.
    pub plugin: String,
    /// The effective scope key.
    pub scope: String,
}

/// An optional plugin's contribution left out of an assembly because its call failed (A9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Omission {
    /// The plugin's id.
    pub plugin: String,
    /// Which of its contributions failed.
    pub contribution: String,
    /// Why the call failed.
    pub cause: String,
}

/// Assembles the request parts for `step.agent`, whose scope chain is `step.scope_chain`
/// (farthest first, starting with `global`).
///
/// An assembly that called no plugin depends only on the registry snapshot, the chain and the
/// options, not on the step: it is remembered on the snapshot and served from there next time,
/// so fully static plugins cost no assembly work per step. The result is shared (`Arc`) for
/// the same reason: a remembered assembly is handed out, not copied.
pub fn assemble(registry: &Registry, step: &Step, options: &Options) -> Result<Arc<Assembly>> {
    let key = (
        step.scope_chain.clone(),
        options.tool_order.clone(),
        options.suppress_runtime_context,
        options.keep_all_tools,
    );
    let assembly = match registry.memo.get::<Assembly>(&key) {
        Some(assembly) => assembly,
        None => assemble_fresh(registry, step, options, key)?,
    };
    Ok(fence_data(registry, assembly, &options.data_secret))
}

/// T5: the non-empty texts joined by one blank line.
fn joined<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    let parts: Vec<&str> = texts.filter(|t| !t.is_empty()).collect();
    parts.join("\n\n")
}

/// Interpolates a text that may be borrowed from the declaration or owned (a dynamic one).
fn render_owned<'t, 'v>(
    text: Cow<'t, str>,
    location: &dyn Fn() -> String,
    resolve: &mut dyn FnMut(&str) -> Result<Resolved<'v>>,
) -> Result<Cow<'t, str>> {
    match text {
        Cow::Borrowed(t) => render(t, location, resolve),
        // An owned text without a reference is moved, not copied.
        Cow::Owned(t) if !t.contains("{{") => Ok(Cow::Owned(t)),
        Cow::Owned(t) => render(&t, location, resolve).map(|r| Cow::Owned(r.into_owned())),
    }
}

/// The runtime context snapshot made of `texts` (T6): none when every one is empty.
fn snapshot<'a>(texts: impl Iterator<Item = &'a str>) -> Option<String> {
    let parts: Vec<&str> = texts.filter(|t| !t.is_empty()).collect();
    (!parts.is_empty()).then(|| format!("{RUNTIME_CONTEXT_HEADER}\n\n{}", parts.join("\n\n")))
}

/// T8: each non-empty context of a `data` plugin inside its data block. Done after the memo,
/// which is shared by every session, because the block key is the session's.
fn fence_data(registry: &Registry, assembly: Arc<Assembly>, secret: &str) -> Arc<Assembly> {
    let is_data = |plugin: &str| {
        registry
            .get(plugin)
            .is_some_and(|p| p.options.trust == Trust::Data)
    };
    let origins = &assembly.explain.contexts;
    if !origins.iter().any(|o| is_data(&o.plugin)) {
        return assembly;
    }
    let mut fenced = (*assembly).clone();
    for (origin, (_, text)) in origins.iter().zip(fenced.contexts.iter_mut()) {
        if is_data(&origin.plugin) && !text.is_empty() {
            let key = trust::block_key(secret, &origin.plugin);
            *text = trust::fence(&origin.plugin, &key, text);
        }
    }
    fenced.runtime_context = snapshot(fenced.contexts.iter().map(|(_, t)| t.as_str()));
    Arc::new(fenced)
}

fn assemble_fresh(
    registry: &Registry,
    step: &Step,
    options: &Options,
    key: crate::plugin::registry::MemoKey,
) -> Result<Arc<Assembly>> {
    let mut calls = Calls::default();
    let mut excluded = BTreeSet::new();
    let mut omitted = Vec::new();
    loop {
        match attempt(registry, step, options, &excluded, &mut calls, &key) {
            Ok(mut assembly) => {
                omitted.extend(calls.omitted.iter().cloned());
                assembly.omitted = omitted;
                let assembly = Arc::new(assembly);
                if calls.is_empty() {
                    // No call, so no omission either: a function of the key alone.
                    registry.memo.put(key, &assembly);
                }
                return Ok(assembly);
            }
            Err(err) => {
                // A9: an optional plugin's failure removes that plugin and assembly is redone
                // without it (which may unshadow another plugin's contribution). Call results
                // are memoised across attempts, so no contribution is called twice.
                let Some((plugin, contribution, cause)) = plugin_failure(&err) else {
                    return Err(err);
                };
                let optional = registry.get(plugin).is_some_and(|p| p.options.optional);
                if !optional || excluded.contains(plugin) {
                    return Err(err);
                }
                excluded.insert(plugin.to_string());
                omitted.push(Omission {
                    plugin: plugin.to_string(),
                    contribution,
                    cause,
                });
            }
        }
    }
}

fn plugin_failure(err: &Error) -> Option<(&str, String, String)> {
    match err {
        Error::PluginCall {
            plugin,
            contribution,
            cause,
            ..
        } => Some((plugin, contribution.clone(), cause.clone())),
        Error::UnknownShownTool { plugin, .. } => {
            Some((plugin, "shown-tools".into(), err.to_string()))
        }
        _ => None,
    }
}

/// One effective contribution: the item, the plugin that declared it, its effective scope and
/// that scope's rank in the chain.
struct Pick<'r, T> {
    entry: &'r PluginEntry,
    item: &'r T,
    scope: &'r Scope,
    rank: usize,
}

impl<'r, T> Pick<'r, T> {
    fn new(entry: &'r PluginEntry, item: &'r T, scope: &'r Scope, rank: usize) -> Self {
        Self {
            entry,
            item,
            scope,
            rank,
        }
    }

    fn origin(&self, name: &str) -> Origin {
        Origin {
            name: name.to_string(),
            plugin: self.entry.id.clone(),
            scope: self.scope.key().to_string(),
        }
    }
}

/// Merges one kind of contribution over the chain: the nearest scope wins (R3).
fn effective<'r, T: Contribution>(
    registry: &'r Registry,
    excluded: &BTreeSet<String>,
    chain: &[String],
) -> BTreeMap<&'r str, Pick<'r, T>> {
    let mut best: BTreeMap<&str, Pick<T>> = BTreeMap::new();
    for entry in registry.plugins().filter(|p| !excluded.contains(&p.id)) {
        for item in T::all(&entry.declaration) {
            let declared = item.scope();
            let scope = match (&entry.options.scope_override, declared) {
                (Some(over), Scope::Global) => over,
                _ => declared,
            };
            let Some(rank) = chain.iter().position(|k| k == scope.key()) else {
                continue; // not visible to this agent
            };
            // Same name in the same scope from two plugins is refused at load (R2), so ranks
            // never tie; on a tie the first plugin by id would win, still deterministically.
            match best.entry(item.name()) {
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    if rank > o.get().rank {
                        o.insert(Pick::new(entry, item, scope, rank));
                    }
                }
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(Pick::new(entry, item, scope, rank));
                }
            }
        }
    }
    best
}

fn attempt<'r>(
    registry: &'r Registry,
    step: &Step,
    options: &Options,
    excluded: &BTreeSet<String>,
    calls: &mut Calls<'r>,
    key: &crate::plugin::registry::MemoKey,
) -> Result<Assembly> {
    let chain = &step.scope_chain;
    let sections = effective::<Section>(registry, excluded, chain);
    let variables = effective::<Variable>(registry, excluded, chain);
    let tools = effective::<Tool>(registry, excluded, chain);
    // A4: without a runtime context, contexts are neither called nor rendered.
    let contexts = match options.suppress_runtime_context {
        true => BTreeMap::new(),
        false => effective::<Context>(registry, excluded, chain),
    };

    // Cheap checks first, before any plugin is called.
    if let Some(order) = &options.tool_order {
        check_tool_order(registry, order)?;
    }
    let complete: Vec<&Pick<Section>> = sections.values().filter(|p| p.item.complete).collect();
    if complete.len() > 1 {
        let names = complete.iter().map(|p| p.item.name.clone()).collect();
        return Err(Error::MultipleComplete(names)); // already sorted: BTreeMap order
    }

    // A1, A3: a single complete section stands alone; otherwise sort by (order, name).
    let mut ordered: Vec<&Pick<Section>> = match complete.first() {
        Some(only) => vec![only],
        None => sections.values().collect(),
    };
    ordered.sort_by(|a, b| (a.item.order, &a.item.name).cmp(&(b.item.order, &b.item.name)));
    let mut ordered_contexts: Vec<&Pick<Context>> = contexts.values().collect();
    ordered_contexts
        .sort_by(|a, b| (a.item.order, &a.item.name).cmp(&(b.item.order, &b.item.name)));
    calls.prefetch(step, &ordered, &ordered_contexts, &variables, &tools);

    // Which plugin gives each section, context and tool depends on the snapshot, the chain
    // and the options alone (not on what a dynamic part says): made once per key and shared,
    // unless an optional plugin was left out this time.
    let memo = excluded.is_empty();
    let skeleton = memo
        .then(|| registry.skeletons.get::<Skeleton>(key))
        .flatten();
    let mut explain = Explain {
        sections: match &skeleton {
            Some(s) => s.sections.clone(),
            None => ordered.iter().map(|p| p.origin(&p.item.name)).collect(),
        },
        contexts: match &skeleton {
            Some(s) => s.contexts.clone(),
            None => (ordered_contexts.iter())
                .map(|p| p.origin(&p.item.name))
                .collect(),
        },
        ..Explain::default()
    };
    let mut resolver = Resolver {
        variables: &variables,
        step,
        used: BTreeSet::new(),
    };
    let mut section_texts = Vec::with_capacity(ordered.len());
    for pick in &ordered {
        let s = pick.item;
        let text = calls.text(pick.entry, Kind::Section, &s.name, &s.scope, &s.text, step)?;
        let rendered = if s.verbatim {
            text
        } else {
            let location = || format!("section `{}` (plugin `{}`)", s.name, pick.entry.id);
            render_owned(text, &location, &mut |n| resolver.resolve(n, calls))?
        };
        section_texts.push((s.name.clone(), rendered.into_owned()));
    }
    let system = joined(section_texts.iter().map(|(_, t)| t.as_str()));
    let mut context_texts = Vec::new();

    for pick in ordered_contexts {
        let c = pick.item;
        let text = calls.text(pick.entry, Kind::Context, &c.name, &c.scope, &c.text, step)?;
        // A data plugin's text is never interpolated (R7): it could name a secret variable.
        let rendered = if c.verbatim || pick.entry.options.trust == Trust::Data {
            text
        } else {
            let location = || format!("context `{}` (plugin `{}`)", c.name, pick.entry.id);
            render_owned(text, &location, &mut |n| resolver.resolve(n, calls))?
        };
        context_texts.push((c.name.clone(), rendered.into_owned()));
    }
    let runtime_context = snapshot(context_texts.iter().map(|(_, t)| t.as_str()));
    explain.variables = resolver
        .used
        .iter()
        .filter_map(|n| variables.get(n).map(|p| p.origin(n)))
        .collect();

    // Without a plugin that filters tools, the tool list is a function of the key too.
    let fixed = memo && tools.values().all(|p| !p.entry.declaration.filters_tools);
    let known = skeleton.as_ref().and_then(|s| s.tools.clone());
    let ordered = match known.filter(|_| fixed) {
        Some(known) => known,
        None => Arc::new(order_tools(&tools, options, step, calls)?),
    };
    if memo && skeleton.is_none() {
        let skeleton = Skeleton {
            sections: explain.sections.clone(),
            contexts: explain.contexts.clone(),
            tools: fixed.then(|| ordered.clone()),
        };
        registry.skeletons.put(key.clone(), &Arc::new(skeleton));
    }
    let (tools, shown_tools) = (ordered.tools.clone(), ordered.shown.clone());
    explain.tools = ordered.origins.clone();

    Ok(Assembly {
        system,
        runtime_context,
        tools,
        shown_tools,
        sections: section_texts,
        contexts: context_texts,
        explain,
        omitted: Vec::new(),
    })
}

/// A8: every `tool_order` name must be known to some loaded plugin.
fn check_tool_order(registry: &Registry, order: &[String]) -> Result<()> {
    let known = registry.known_tools();
    let unknown: Vec<String> = order
        .iter()
        .filter(|n| *n != UNLISTED_TOOLS && known.binary_search(n).is_err())
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Error::UnknownToolOrderName { unknown, known })
    }
}

/// The names of a tool set in A7's order: by name, or by `tool_order`.
fn in_order<'n>(names: &BTreeSet<&'n str>, options: &Options) -> Vec<&'n str> {
    match &options.tool_order {
        None => names.iter().copied().collect(),
        Some(order) => {
            let listed: BTreeSet<&str> = order.iter().map(String::as_str).collect();
            let mut out = Vec::with_capacity(names.len());
            for entry in order.iter() {
                if entry == UNLISTED_TOOLS {
                    out.extend(names.iter().filter(|n| !listed.contains(*n)));
                } else if let Some(n) = names.get(entry.as_str()) {
                    out.push(*n);
                }
            }
            out
        }
    }
}

/// A6, A7: shown tools, by name or by `tool_order` (all known tools, and the shown names
/// apart, with [`Options::keep_all_tools`]).
/// What an assembly of one key (registry snapshot, chain, options) shares with every other:
/// who gives each section and context, and the ordered tools when no plugin filters them.
struct Skeleton {
    sections: Arc<[Origin]>,
    contexts: Arc<[Origin]>,
    tools: Option<Arc<OrderedTools>>,
}

/// The tools a step shows, in order, who gave them, and the shown names (`allowed_tools`).
struct OrderedTools {
    tools: Arc<[AssembledTool]>,
    origins: Arc<[Origin]>,
    shown: Option<Vec<String>>,
}

fn order_tools<'r>(
    tools: &BTreeMap<&'r str, Pick<'r, Tool>>,
    options: &Options,
    step: &Step,
    calls: &mut Calls<'r>,
) -> Result<OrderedTools> {
    // Each filtering plugin is asked once which of its known tools it shows this step.
    let mut shown: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for pick in tools.values() {
        let entry = pick.entry;
        if entry.declaration.filters_tools && !shown.contains_key(entry.id.as_str()) {
            let names = calls.shown_tools(entry, step)?;
            if let Some(bad) = names
                .iter()
                .find(|n| !entry.declaration.tools.iter().any(|t| &t.name == *n))
            {
                return Err(Error::UnknownShownTool {
                    plugin: entry.id.clone(),
                    tool: bad.clone(),
                });
            }
            shown.insert(&entry.id, names.into_iter().collect());
        }
    }
    let visible: BTreeMap<&str, &Pick<Tool>> = tools
        .iter()
        .filter(|(name, p)| {
            shown
                .get(p.entry.id.as_str())
                .is_none_or(|s| s.contains(**name))
        })
        .map(|(n, p)| (*n, p))
        .collect();

    let shown_names = in_order(&visible.keys().copied().collect(), options);
    let (names, shown) = if options.keep_all_tools {
        let all = in_order(&tools.keys().copied().collect(), options);
        let shown = shown_names.iter().map(|n| n.to_string()).collect();
        (all, Some(shown))
    } else {
        (shown_names, None)
    };
    let mut out = Vec::with_capacity(names.len());
    let mut origins = Vec::with_capacity(names.len());
    for name in names {
        let pick = &tools[name];
        let t = pick.item;
        let parameters = pick
            .entry
            .schemas
            .get(t.name.as_str())
            .and_then(|by_scope| by_scope.iter().find(|(s, _)| *s == t.scope))
            .map(|(_, schema)| schema.clone())
            .unwrap_or_else(|| Arc::new(serde_json::Value::Object(Default::default())));
        out.push(AssembledTool {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters,
            defer: pick
                .entry
                .options
                .defer
                .holds(&t.name)
                .then(|| Arc::from(pick.entry.id.as_str())),
        });
        origins.push(pick.origin(name));
    }
    Ok(OrderedTools {
        tools: out.into(),
        origins: origins.into(),
        shown,
    })
}

/// Resolves `{{name}}` against the effective variables, calling dynamic ones lazily.
struct Resolver<'a, 'r> {
    variables: &'a BTreeMap<&'r str, Pick<'r, Variable>>,
    step: &'a Step,
    /// Variables referenced this assembly (for `--explain`).
    used: BTreeSet<&'r str>,
}

impl<'r> Resolver<'_, 'r> {
    fn resolve(&mut self, name: &str, calls: &mut Calls<'r>) -> Result<Resolved<'r>> {
        let Some((key, pick)) = self.variables.get_key_value(name) else {
            let known = self.variables.keys().map(|k| k.to_string()).collect();
            return Ok(Resolved::Unknown { known });
        };
        self.used.insert(key);
        let v: &'r Variable = pick.item;
        let value: Option<Cow<'r, str>> = match &v.value {
            Content::Static(s) => Some(Cow::Borrowed(s)),
            Content::Dynamic => calls
                .value(pick.entry, &v.name, &v.scope, self.step)?
                .map(Cow::Owned),
        };
        Ok(match value {
            Some(v) => Resolved::Value(v),
            None => Resolved::Absent {
                plugin: pick.entry.id.clone(),
            },
        })
    }
}

/// A contribution, by plugin id, kind, name and declared scope, borrowed from the registry
/// snapshot the assembly runs on (a key costs no copy).
type CallKey<'r> = (&'r str, Kind, &'r str, &'r Scope);

/// What each batching plugin is asked this step, by plugin id.
type Asks<'r> = BTreeMap<&'r str, (&'r PluginEntry, Wanted)>;

fn ask<'a, 'r>(asks: &'a mut Asks<'r>, entry: &'r PluginEntry) -> &'a mut Wanted {
    &mut asks
        .entry(&entry.id)
        .or_insert((entry, Wanted::default()))
        .1
}

fn key<'r>(entry: &'r PluginEntry, kind: Kind, name: &'r str, scope: &'r Scope) -> CallKey<'r> {
    (&entry.id, kind, name, scope)
}

/// Memoised dynamic calls: each contribution is called at most once per assembly (A2).
#[derive(Default)]
struct Calls<'r> {
    texts: BTreeMap<CallKey<'r>, CallResult<String>>,
    values: BTreeMap<CallKey<'r>, CallResult<Option<String>>>,
    tools: BTreeMap<&'r str, CallResult<Vec<String>>>,
    /// Contexts left out alone (`contexts_fail_alone`), in the order they were asked for.
    omitted: Vec<Omission>,
}

impl<'r> Calls<'r> {
    /// W3: asks each batching plugin (world 0.2.0) once for every effective dynamic value it gives
    /// this step and has not given yet: its sections and contexts in use, its effective
    /// variables (referenced or not: which ones a dynamic text references is only known after
    /// the call), and its shown tools. Shadowed contributions are never asked for. The answers
    /// join the memo, so the lazy per-item path below finds them; an error stays with its item
    /// and fails the assembly only if the item is used.
    fn prefetch(
        &mut self,
        step: &Step,
        sections: &[&Pick<'r, Section>],
        contexts: &[&Pick<'r, Context>],
        variables: &BTreeMap<&str, Pick<'r, Variable>>,
        tools: &BTreeMap<&str, Pick<'r, Tool>>,
    ) {
        let mut asks: Asks = BTreeMap::new();
        // The keys of what each plugin is asked, in the order of its `Wanted` lists: texts
        // (its sections, then its contexts, as `texts` below yields them) and variables.
        type Asked<'r> = (Vec<CallKey<'r>>, Vec<CallKey<'r>>);
        let mut keys: BTreeMap<&'r str, Asked<'r>> = BTreeMap::new();
        let item = |name: &str, scope: &Scope| (name.to_string(), scope.clone());
        let texts = sections
            .iter()
            .map(|p| {
                (
                    Kind::Section,
                    p.entry,
                    &p.item.name,
                    &p.item.scope,
                    &p.item.text,
                )
            })
            .chain(contexts.iter().map(|p| {
                (
                    Kind::Context,
                    p.entry,
                    &p.item.name,
                    &p.item.scope,
                    &p.item.text,
                )
            }));
        for (kind, entry, name, scope, text) in texts {
            if entry.provider.batches()
                && *text == Content::Dynamic
                && !self.texts.contains_key(&key(entry, kind, name, scope))
            {
                let w = ask(&mut asks, entry);
                let list = if kind == Kind::Section {
                    &mut w.sections
                } else {
                    &mut w.contexts
                };
                list.push(item(name, scope));
                keys.entry(&entry.id)
                    .or_default()
                    .0
                    .push(key(entry, kind, name, scope));
            }
        }
        for p in variables.values().filter(|p| p.entry.provider.batches()) {
            let v = p.item;
            if v.value == Content::Dynamic
                && !self
                    .values
                    .contains_key(&key(p.entry, Kind::Variable, &v.name, &v.scope))
            {
                ask(&mut asks, p.entry)
                    .variables
                    .push(item(&v.name, &v.scope));
                keys.entry(&p.entry.id).or_default().1.push(key(
                    p.entry,
                    Kind::Variable,
                    &v.name,
                    &v.scope,
                ));
            }
        }
        for p in tools.values().filter(|p| p.entry.provider.batches()) {
            if p.entry.declaration.filters_tools && !self.tools.contains_key(p.entry.id.as_str()) {
                ask(&mut asks, p.entry).shown_tools = true;
            }
        }
        for (entry, wanted) in asks.into_values() {
            let answer = entry
                .provider
                .evaluate(step, &wanted)
                .and_then(|e| e.check(&wanted).map(|()| e))
                .unwrap_or_else(|e| Evaluation::failed(&wanted, e));
            // The answers come back in the order of `wanted`, which is the keys' order.
            let (text_keys, value_keys) = keys.remove(entry.id.as_str()).unwrap_or_default();
            let texts = answer.sections.into_iter().chain(answer.contexts);
            for (k, text) in text_keys.into_iter().zip(texts) {
                self.texts.insert(k, text);
            }
            for (k, value) in value_keys.into_iter().zip(answer.variables) {
                self.values.insert(k, value);
            }
            if let Some(shown) = answer.shown_tools {
                self.tools.insert(&entry.id, shown);
            }
        }
    }

    /// Whether no plugin was called.
    fn is_empty(&self) -> bool {
        self.texts.is_empty() && self.values.is_empty() && self.tools.is_empty()
    }

    fn text(
        &mut self,
        entry: &'r PluginEntry,
        kind: Kind,
        name: &'r str,
        scope: &'r Scope,
        content: &'r Content,
        step: &Step,
    ) -> Result<Cow<'r, str>> {
        if let Content::Static(s) = content {
            return Ok(Cow::Borrowed(s)); // static text costs no call
        }
        let key = key(entry, kind, name, scope);
        let result = self.texts.entry(key).or_insert_with(|| match kind {
            Kind::Section => entry.provider.section_text(name, scope, step),
            _ => entry.provider.context_text(name, scope, step),
        });
        match result {
            Ok(text) => Ok(Cow::Owned(text.clone())),
            Err(e)
                if kind == Kind::Context
                    && entry.options.optional
                    && entry.options.contexts_fail_alone =>
            {
                // Left out as an empty context; the omission is recorded once.
                let contribution = format!("{kind} `{name}`");
                let cause = e.cause().to_string();
                if !self
                    .omitted
                    .iter()
                    .any(|o| o.plugin == entry.id && o.contribution == contribution)
                {
                    self.omitted.push(Omission {
                        plugin: entry.id.clone(),
                        contribution,
                        cause,
                    });
                }
                Ok(Cow::Borrowed(""))
            }
            Err(e) => Err(call_error(entry, &format!("{kind} `{name}`"), e.clone())),
        }
    }

    fn value(
        &mut self,
        entry: &'r PluginEntry,
        name: &'r str,
        scope: &'r Scope,
        step: &Step,
    ) -> Result<Option<String>> {
        let key = key(entry, Kind::Variable, name, scope);
        let result = self
            .values
            .entry(key)
            .or_insert_with(|| entry.provider.variable_value(name, scope, step));
        result
            .clone()
            .map_err(|e| call_error(entry, &format!("variable `{name}`"), e))
    }

    fn shown_tools(&mut self, entry: &'r PluginEntry, step: &Step) -> Result<Vec<String>> {
        let result = self
            .tools
            .entry(&entry.id)
            .or_insert_with(|| entry.provider.shown_tools(step));
        result
            .clone()
            .map_err(|e| call_error(entry, "shown-tools", e))
    }
}

fn call_error(entry: &PluginEntry, contribution: &str, e: CallError) -> Error {
    Error::PluginCall {
        plugin: entry.id.clone(),
        contribution: contribution.to_string(),
        cause: e.cause().to_string(),
        trapped: matches!(e, CallError::Trapped(_)),
    }
}

#[cfg(test)]
mod tests;
