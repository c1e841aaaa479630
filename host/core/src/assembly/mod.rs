//! Assembly: every contribution visible to one agent at one step, resolved and ordered
//! (SPEC A1–A10, T5, T6).
//!
//! [`assemble`] is a function of (registry snapshot, step, options). Its only effects are the
//! dynamic calls it makes through each plugin's [`Provider`](crate::plugin::provider::Provider), and
//! those are made only for effective contributions, each at most once (A2). Everything it
//! iterates is ordered (`BTreeMap`, explicit sorts), so the result never depends on load
//! order, registration order or hash seeds (A1).

mod layout;
pub mod review;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::observe::{observed, Activity, Observe};
use crate::plugin::interpolate::{render, Resolved};
use crate::plugin::model::{Content, Kind, Scope, Step, Tool, Variable};
use crate::plugin::names::UNLISTED_TOOLS;
use crate::plugin::provider::{CallError, CallResult, Evaluation, Wanted};
use crate::plugin::registry::{PluginEntry, Registry};
use crate::plugin::trust::{self, Trust};
use layout::Layout;

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
    /// included), so a budget can say what each one costs. Shared: a static text is the one
    /// the layout rendered at load, not a copy per step.
    pub sections: Vec<(Arc<str>, Arc<str>)>,
    /// Each context's interpolated text by name, in output order (empty ones included).
    pub contexts: Vec<(Arc<str>, Arc<str>)>,
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
    /// Who gave each variable the texts referenced; shared with other assemblies of the same
    /// layout when only its fixed texts reference any.
    pub variables: Arc<[Origin]>,
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
    assemble_observed(registry, step, options, None)
}

/// [`assemble`], with each plugin call told to `observe` ([`crate::observe`]).
pub fn assemble_observed(
    registry: &Registry,
    step: &Step,
    options: &Options,
    observe: Option<&dyn Observe>,
) -> Result<Arc<Assembly>> {
    let key = (
        step.scope_chain.clone(),
        options.tool_order.clone(),
        options.suppress_runtime_context,
        options.keep_all_tools,
    );
    let assembly = match registry.memo.get::<Assembly>(&key) {
        Some(assembly) => assembly,
        None => assemble_fresh(registry, step, options, key, observe)?,
    };
    Ok(fence_data(registry, assembly, &options.data_secret))
}

/// T5: the non-empty texts joined by one blank line.
fn joined<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    let parts: Vec<&str> = texts.filter(|t| !t.is_empty()).collect();
    parts.join("\n\n")
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
            *text = Arc::from(trust::fence(&origin.plugin, &key, text));
        }
    }
    fenced.runtime_context = snapshot(fenced.contexts.iter().map(|(_, t)| &**t));
    Arc::new(fenced)
}

fn assemble_fresh(
    registry: &Registry,
    step: &Step,
    options: &Options,
    key: crate::plugin::registry::MemoKey,
    observe: Option<&dyn Observe>,
) -> Result<Arc<Assembly>> {
    let mut calls = Calls {
        observe,
        ..Calls::default()
    };
    let mut excluded = BTreeSet::new();
    let mut omitted = Vec::new();
    loop {
        // The layout of every step of this key is made once and shared; one that leaves
        // plugins out (A9) is this assembly's alone.
        let planned = match excluded.is_empty() {
            true => match registry.skeletons.get::<Layout>(&key) {
                Some(layout) => Ok(layout),
                None => layout::layout(registry, &step.scope_chain, options, &excluded).map(|p| {
                    let p = Arc::new(p);
                    registry.skeletons.put(key.clone(), &p);
                    p
                }),
            },
            false => layout::layout(registry, &step.scope_chain, options, &excluded).map(Arc::new),
        };
        let result = planned
            .and_then(|layout| attempt(registry, &layout, step, options, &excluded, &mut calls));
        match result {
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

/// An effective contribution as [`layout::effective`] gives it: the plugin, the item's index in
/// its declaration, the effective scope and that scope's rank in the chain.
type Picked<'r> = (&'r Arc<PluginEntry>, usize, &'r Scope, usize);

/// A text as a step renders it: a static one borrowed from the declaration, or one a plugin
/// gave this step.
enum Source<'p> {
    Static(&'p str),
    Called(Arc<str>),
}

/// `source`, interpolated unless `raw`; a text without a reference is shared, not copied.
fn finish<'v>(
    source: Source<'_>,
    raw: bool,
    location: &dyn Fn() -> String,
    resolve: &mut dyn FnMut(&str) -> Result<Resolved<'v>>,
) -> Result<Arc<str>> {
    let text = match &source {
        Source::Static(t) => *t,
        Source::Called(t) => t,
    };
    if raw || !text.contains("{{") {
        return Ok(match source {
            Source::Static(t) => Arc::from(t),
            Source::Called(t) => t,
        });
    }
    Ok(Arc::from(render(text, location, resolve)?.as_ref()))
}

fn attempt(
    registry: &Registry,
    layout: &Layout,
    step: &Step,
    options: &Options,
    excluded: &BTreeSet<String>,
    calls: &mut Calls,
) -> Result<Assembly> {
    calls.prefetch(step, layout);
    let mut resolver = Resolver {
        layout,
        step,
        used: layout.fixed_used.iter().map(|n| &**n).collect(),
    };
    let mut section_texts = Vec::with_capacity(layout.sections.len());
    for part in &layout.sections {
        let text = match &part.fixed {
            Some(text) => text.clone(),
            None => {
                let s = part.section();
                let source = calls.text(&part.entry, Kind::Section, part.index, &s.text, step)?;
                let location = || format!("section `{}` (plugin `{}`)", s.name, part.entry.id);
                finish(source, s.verbatim, &location, &mut |n| {
                    resolver.resolve(n, calls)
                })?
            }
        };
        section_texts.push((part.name.clone(), text));
    }
    let system = joined(section_texts.iter().map(|(_, t)| &**t));
    let mut context_texts = Vec::with_capacity(layout.contexts.len());
    for part in &layout.contexts {
        let text = match &part.fixed {
            Some(text) => text.clone(),
            None => {
                let c = part.context();
                let source = calls.text(&part.entry, Kind::Context, part.index, &c.text, step)?;
                // A data plugin's text is never interpolated (R7): it could name a secret.
                let raw = c.verbatim || part.entry.options.trust == Trust::Data;
                let location = || format!("context `{}` (plugin `{}`)", c.name, part.entry.id);
                finish(source, raw, &location, &mut |n| resolver.resolve(n, calls))?
            }
        };
        context_texts.push((part.name.clone(), text));
    }
    let runtime_context = snapshot(context_texts.iter().map(|(_, t)| &**t));
    let variables = match resolver.used.len() == layout.fixed_used.len() {
        // Only the fixed texts referenced variables: the layout's list.
        true => layout.fixed_origins.clone(),
        false => layout::origins(layout, resolver.used.iter().copied()),
    };
    let ordered = match &layout.tools {
        Some(known) => known.clone(),
        None => filtered_tools(registry, layout, options, excluded, step, calls)?,
    };
    Ok(Assembly {
        system,
        runtime_context,
        tools: ordered.tools.clone(),
        shown_tools: ordered.shown.clone(),
        sections: section_texts,
        contexts: context_texts,
        explain: Explain {
            sections: layout.section_origins.clone(),
            contexts: layout.context_origins.clone(),
            variables,
            tools: ordered.origins.clone(),
        },
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

/// The ordered tools of a step whose tools some plugin filters: those of the last step whose
/// filters said the same, else made again (and remembered for the next).
fn filtered_tools(
    registry: &Registry,
    layout: &Layout,
    options: &Options,
    excluded: &BTreeSet<String>,
    step: &Step,
    calls: &mut Calls,
) -> Result<Arc<OrderedTools>> {
    for entry in &layout.filtering {
        calls.shown_tools(entry, step)?;
    }
    let said = |calls: &Calls, e: &Arc<PluginEntry>| {
        let ptr = Arc::as_ptr(e) as usize;
        let names = calls.tools.get(&ptr).and_then(|r| r.as_ref().ok()).cloned();
        (ptr, names)
    };
    if let Some((key, ordered)) = lock(&layout.filtered).as_ref() {
        let same = key.len() == layout.filtering.len()
            && key.iter().zip(&layout.filtering).all(|((ptr, names), e)| {
                let p = Arc::as_ptr(e) as usize;
                p == *ptr && calls.tools.get(&p).and_then(|r| r.as_ref().ok()) == Some(names)
            });
        if same {
            return Ok(ordered.clone());
        }
    }
    let tools = layout::effective::<Tool>(registry, excluded, &step.scope_chain);
    let ordered = Arc::new(order_tools(&tools, options, Some(step), calls)?);
    let key = (layout.filtering.iter())
        .filter_map(|e| {
            let (ptr, names) = said(calls, e);
            Some((ptr, names?))
        })
        .collect();
    *lock(&layout.filtered) = Some((key, ordered.clone()));
    Ok(ordered)
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The tools a step shows, in order, who gave them, and the shown names (`allowed_tools`).
struct OrderedTools {
    tools: Arc<[AssembledTool]>,
    origins: Arc<[Origin]>,
    shown: Option<Vec<String>>,
}

/// A6, A7: shown tools, by name or by `tool_order` (all known tools, and the shown names
/// apart, with [`Options::keep_all_tools`]). `step` is `None` when no plugin filters tools
/// (a layout's ordering, which calls nothing).
fn order_tools(
    tools: &BTreeMap<&str, Picked<'_>>,
    options: &Options,
    step: Option<&Step>,
    calls: &mut Calls,
) -> Result<OrderedTools> {
    // Each filtering plugin is asked once which of its known tools it shows this step.
    let mut shown: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for &(entry, _, _, _) in tools.values() {
        if entry.declaration.filters_tools && !shown.contains_key(entry.id.as_str()) {
            let Some(step) = step else {
                continue;
            };
            let names = calls.shown_tools(entry, step)?.clone();
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
    let visible: BTreeSet<&str> = tools
        .iter()
        .filter(|(name, (e, _, _, _))| shown.get(e.id.as_str()).is_none_or(|s| s.contains(**name)))
        .map(|(n, _)| *n)
        .collect();

    let shown_names = in_order(&visible, options);
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
        let (entry, index, scope, _) = tools[name];
        let t = &entry.declaration.tools[index];
        let parameters = entry
            .schemas
            .get(t.name.as_str())
            .and_then(|by_scope| by_scope.iter().find(|(s, _)| *s == t.scope))
            .map(|(_, schema)| schema.clone())
            .unwrap_or_else(|| Arc::new(serde_json::Value::Object(Default::default())));
        out.push(AssembledTool {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters,
            defer: entry
                .options
                .defer
                .holds(&t.name)
                .then(|| Arc::from(entry.id.as_str())),
        });
        origins.push(Origin {
            name: name.to_string(),
            plugin: entry.id.clone(),
            scope: scope.key().to_string(),
        });
    }
    Ok(OrderedTools {
        tools: out.into(),
        origins: origins.into(),
        shown,
    })
}

/// Resolves `{{name}}` against the layout's variables, calling dynamic ones lazily.
struct Resolver<'p> {
    layout: &'p Layout,
    step: &'p Step,
    /// Variables referenced this assembly (for `--explain`).
    used: BTreeSet<&'p str>,
}

impl<'p> Resolver<'p> {
    fn resolve(&mut self, name: &str, calls: &mut Calls) -> Result<Resolved<'p>> {
        let Some((key, v)) = self.layout.variables.get_key_value(name) else {
            let known = self
                .layout
                .variables
                .keys()
                .map(|k| k.to_string())
                .collect();
            return Ok(Resolved::Unknown { known });
        };
        self.used.insert(key);
        let item: &'p Variable = v.item();
        let value: Option<Cow<'p, str>> = match &item.value {
            Content::Static(s) => Some(Cow::Borrowed(s)),
            Content::Dynamic => calls
                .value(&v.entry, v.index, self.step)?
                .map(|v| Cow::Owned(v.to_string())),
        };
        Ok(match value {
            Some(v) => Resolved::Value(v),
            None => Resolved::Absent {
                plugin: v.entry.id.clone(),
            },
        })
    }
}

/// A contribution: its plugin (by the address of its shared entry, the same in every layout of
/// one snapshot), kind and index in the declaration. Only ever looked up, never iterated.
type CallKey = (usize, Kind, usize);

fn call_key(entry: &Arc<PluginEntry>, kind: Kind, index: usize) -> CallKey {
    (Arc::as_ptr(entry) as usize, kind, index)
}

/// Memoised dynamic calls: each contribution is called at most once per assembly (A2).
#[derive(Default)]
struct Calls<'o> {
    /// Told of each call, when telemetry watches the step.
    observe: Option<&'o dyn Observe>,
    texts: HashMap<CallKey, CallResult<Arc<str>>>,
    values: HashMap<CallKey, CallResult<Option<Arc<str>>>>,
    tools: HashMap<usize, CallResult<Vec<String>>>,
    /// Contexts left out alone (`contexts_fail_alone`), in the order they were asked for.
    omitted: Vec<Omission>,
}

impl Calls<'_> {
    /// W3: asks each batching plugin (world 0.2.0) once for every effective dynamic value it
    /// gives this step and has not given yet: its sections and contexts in use, its effective
    /// variables (referenced or not: which ones a dynamic text references is only known after
    /// the call), and its shown tools (the layout's [`layout::Ask`]s). Shadowed contributions are
    /// never asked for. The answers join the memo, so the lazy per-item path below finds
    /// them; an error stays with its item and fails the assembly only if the item is used.
    fn prefetch(&mut self, step: &Step, layout: &Layout) {
        for ask in &layout.asks {
            let entry = &ask.entry;
            let (texts, values) = (&ask.text_keys, &ask.value_keys);
            let ptr = Arc::as_ptr(entry) as usize;
            let fresh = !texts.iter().any(|k| self.texts.contains_key(k))
                && !values.iter().any(|k| self.values.contains_key(k))
                && (!ask.wanted.shown_tools || !self.tools.contains_key(&ptr));
            // A second attempt (A9) asks only for what the first did not get.
            let filtered;
            let owned: (Vec<CallKey>, Vec<CallKey>);
            let (wanted, texts, values): (&Wanted, &[CallKey], &[CallKey]) = if fresh {
                (&ask.wanted, texts, values)
            } else {
                let (mut w, mut t, mut v) = (Wanted::default(), Vec::new(), Vec::new());
                let n_sections = ask.wanted.sections.len();
                for (i, &k) in texts.iter().enumerate() {
                    if self.texts.contains_key(&k) {
                        continue;
                    }
                    match i < n_sections {
                        true => w.sections.push(ask.wanted.sections[i].clone()),
                        false => w.contexts.push(ask.wanted.contexts[i - n_sections].clone()),
                    }
                    t.push(k);
                }
                for (i, &k) in values.iter().enumerate() {
                    if !self.values.contains_key(&k) {
                        w.variables.push(ask.wanted.variables[i].clone());
                        v.push(k);
                    }
                }
                w.shown_tools = ask.wanted.shown_tools && !self.tools.contains_key(&ptr);
                if w.is_empty() {
                    continue;
                }
                filtered = w;
                owned = (t, v);
                (&filtered, &owned.0, &owned.1)
            };
            let answer = observed(self.observe, Activity::call(entry, "evaluate"), || {
                entry.provider.evaluate(step, wanted)
            })
            .and_then(|e| e.check(wanted).map(|()| e))
            .unwrap_or_else(|e| Evaluation::failed(wanted, e));
            // The answers come back in the order of `wanted`, which is the keys' order.
            let answered = answer.sections.into_iter().chain(answer.contexts);
            for (&k, text) in texts.iter().zip(answered) {
                self.texts.insert(k, text.map(Arc::from));
            }
            for (&k, value) in values.iter().zip(answer.variables) {
                self.values.insert(k, value.map(|v| v.map(Arc::from)));
            }
            if let Some(shown) = answer.shown_tools {
                self.tools.insert(ptr, shown);
            }
        }
    }

    /// Whether no plugin was called.
    fn is_empty(&self) -> bool {
        self.texts.is_empty() && self.values.is_empty() && self.tools.is_empty()
    }

    fn text<'p>(
        &mut self,
        entry: &Arc<PluginEntry>,
        kind: Kind,
        index: usize,
        content: &'p Content,
        step: &Step,
    ) -> Result<Source<'p>> {
        if let Content::Static(s) = content {
            return Ok(Source::Static(s)); // static text costs no call
        }
        let (name, scope) = match kind {
            Kind::Section => {
                let s = &entry.declaration.sections[index];
                (&s.name, &s.scope)
            }
            _ => {
                let c = &entry.declaration.contexts[index];
                (&c.name, &c.scope)
            }
        };
        let observe = self.observe;
        let result = (self.texts.entry(call_key(entry, kind, index))).or_insert_with(|| {
            match kind {
                Kind::Section => observed(observe, Activity::call(entry, "section"), || {
                    entry.provider.section_text(name, scope, step)
                }),
                _ => observed(observe, Activity::call(entry, "context"), || {
                    entry.provider.context_text(name, scope, step)
                }),
            }
            .map(Arc::from)
        });
        match result {
            Ok(text) => Ok(Source::Called(text.clone())),
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
                Ok(Source::Static(""))
            }
            Err(e) => Err(call_error(entry, &format!("{kind} `{name}`"), e.clone())),
        }
    }

    fn value(
        &mut self,
        entry: &Arc<PluginEntry>,
        index: usize,
        step: &Step,
    ) -> Result<Option<Arc<str>>> {
        let v = &entry.declaration.variables[index];
        let observe = self.observe;
        let result =
            (self.values.entry(call_key(entry, Kind::Variable, index))).or_insert_with(|| {
                observed(observe, Activity::call(entry, "variable"), || {
                    entry.provider.variable_value(&v.name, &v.scope, step)
                })
                .map(|v| v.map(Arc::from))
            });
        result
            .clone()
            .map_err(|e| call_error(entry, &format!("variable `{}`", v.name), e))
    }

    /// The tools `entry` shows this step (asked once).
    fn shown_tools(&mut self, entry: &Arc<PluginEntry>, step: &Step) -> Result<&Vec<String>> {
        let observe = self.observe;
        let result = self
            .tools
            .entry(Arc::as_ptr(entry) as usize)
            .or_insert_with(|| {
                observed(observe, Activity::call(entry, "shown-tools"), || {
                    entry.provider.shown_tools(step)
                })
            });
        result
            .as_ref()
            .map_err(|e| call_error(entry, "shown-tools", e.clone()))
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
