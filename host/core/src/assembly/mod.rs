//! Assembly: every contribution visible to one agent at one step, resolved and ordered
//! (SPEC A1–A10, T5, T6).
//!
//! [`assemble`] is a function of (registry snapshot, step, options). Its only effects are the
//! dynamic calls it makes through each plugin's [`Provider`](crate::plugin::provider::Provider), and
//! those are made only for effective contributions, each at most once (A2). Everything it
//! iterates is ordered (`BTreeMap`, explicit sorts), so the result never depends on load
//! order, registration order or hash seeds (A1).

mod calls;
mod effective;
mod keys;
mod layout;
mod model;
mod reuse;
pub mod review;
mod tools;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::observe::Observe;
use crate::plugin::interpolate::{fill_into, render_into, Resolved};
use crate::plugin::model::{Content, Kind, Step, Tool, Variable};
use crate::plugin::registry::{PluginEntry, Registry};
use crate::plugin::trust::{self, Trust};
use calls::{Calls, Source};
use layout::{Layout, Split};
pub use model::{AssembledTool, Assembly, Explain, Omission, Options, Origin};
pub use reuse::Reuse;
use tools::{order_tools, OrderedTools};

/// The fixed first line of the runtime context snapshot (T6).
pub const RUNTIME_CONTEXT_HEADER: &str =
    "[Runtime context: this snapshot supersedes any earlier runtime context.]";

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
    assemble_reusing(registry, step, options, observe, None)
}

/// [`assemble_observed`] for a session's step: a world 0.3.0 contribution whose declared
/// inputs are what they were when it last answered in the session (`reuse`) keeps that
/// answer, without a call; the assembly says which ([`Assembly::reused`]).
pub fn assemble_reusing(
    registry: &Registry,
    step: &Step,
    options: &Options,
    observe: Option<&dyn Observe>,
    reuse: Option<&mut Reuse>,
) -> Result<Arc<Assembly>> {
    assemble_with(registry, step, options, observe, reuse, false)
}

/// [`assemble_reusing`] where no plugin may be called (a step planned on a thread that other
/// work shares, where a call could block it to its deadline): served from the memo and the
/// kept answers alone, or [`Error::WouldCall`], with nothing called and nothing kept.
pub fn assemble_without_calls(
    registry: &Registry,
    step: &Step,
    options: &Options,
    observe: Option<&dyn Observe>,
    reuse: &mut Reuse,
) -> Result<Arc<Assembly>> {
    assemble_with(registry, step, options, observe, Some(reuse), true)
}

fn assemble_with(
    registry: &Registry,
    step: &Step,
    options: &Options,
    observe: Option<&dyn Observe>,
    reuse: Option<&mut Reuse>,
    forbid: bool,
) -> Result<Arc<Assembly>> {
    let key = (
        step.scope_chain.clone(),
        options.tool_order.clone(),
        options.suppress_runtime_context,
        options.keep_all_tools,
    );
    let assembly = match registry.memo.get::<Assembly>(&key) {
        Some(assembly) => assembly,
        None => assemble_fresh(registry, step, options, key, observe, reuse, forbid)?,
    };
    Ok(fence_data(registry, assembly, &options.data_secret))
}

/// T5: the non-empty texts joined by one blank line.
fn joined<'a>(texts: impl Iterator<Item = &'a str> + Clone) -> String {
    join_onto(String::new(), texts)
}

/// The runtime context snapshot made of `texts` (T6): none when every one is empty.
fn snapshot<'a>(texts: impl Iterator<Item = &'a str> + Clone) -> Option<String> {
    let mut texts = texts.filter(|t| !t.is_empty()).peekable();
    texts.peek()?;
    Some(join_onto(format!("{RUNTIME_CONTEXT_HEADER}\n\n"), texts))
}

/// `out` followed by the non-empty `texts` joined by one blank line, grown once.
fn join_onto<'a>(mut out: String, texts: impl Iterator<Item = &'a str> + Clone) -> String {
    let texts = texts.filter(|t| !t.is_empty());
    out.reserve(texts.clone().map(|t| t.len() + 2).sum());
    for (i, t) in texts.enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        out.push_str(t);
    }
    out
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
    reuse: Option<&mut Reuse>,
    forbid: bool,
) -> Result<Arc<Assembly>> {
    // A session's step that would be made of the answers its last one was made of is that
    // one's assembly (no text rendered again).
    // The shared layout, looked up once: the loop's first attempt uses it too.
    let mut skeleton = registry.skeletons.get::<Layout>(&key);
    if let (Some(reuse), Some(layout)) = (reuse.as_deref(), &skeleton) {
        if let Some(same) = same_as_last(reuse, layout, &key, step) {
            return Ok(same);
        }
    }
    let mut calls = Calls {
        observe,
        reuse,
        forbid,
        ..Calls::default()
    };
    let mut excluded = BTreeSet::new();
    let mut omitted = Vec::new();
    loop {
        // The layout of every step of this key is made once and shared; one that leaves
        // plugins out (A9) is this assembly's alone.
        let planned = match excluded.is_empty() {
            true => match skeleton.take() {
                Some(layout) => Ok(layout),
                None => layout::layout(registry, &step.scope_chain, options, &excluded).map(|p| {
                    let p = Arc::new(p);
                    registry.skeletons.put(key.clone(), &p);
                    p
                }),
            },
            false => layout::layout(registry, &step.scope_chain, options, &excluded).map(Arc::new),
        };
        let result = planned.and_then(|layout| {
            attempt(registry, &layout, step, options, &excluded, &mut calls).map(|a| (layout, a))
        });
        match result {
            Ok((layout, mut assembly)) => {
                omitted.extend(calls.omitted.iter().cloned());
                assembly.omitted = omitted;
                assembly.called = calls.called;
                assembly.reused = std::mem::take(&mut calls.reused);
                let assembly = Arc::new(assembly);
                if calls.is_empty() {
                    // No call, so no omission either: a function of the key alone.
                    registry.memo.put(key, &assembly);
                } else if let Some(reuse) = calls.reuse.as_deref_mut() {
                    let alone = assembly.called == 0 && assembly.omitted.is_empty();
                    if alone && excluded.is_empty() {
                        reuse.remember(&layout, key, &assembly);
                    }
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

/// The session's last assembly ([`Reuse::last`]), when this step's would be the same: every
/// dynamic item of `layout` (sections, contexts, variables, tool filters) has a kept answer
/// for `step`. (More than a step may use, which only makes the check stricter: a variable
/// no text references is checked too.)
fn same_as_last(
    reuse: &Reuse,
    layout: &Arc<Layout>,
    key: &crate::plugin::registry::MemoKey,
    step: &Step,
) -> Option<Arc<Assembly>> {
    let last = reuse.last(layout, key)?;
    let kept = |entry: &Arc<PluginEntry>, kind: Kind, index: usize| {
        reuse.kept_for(entry, kind, index, step)
    };
    let sections = (layout.sections.iter())
        .filter(|p| p.section().text == Content::Dynamic)
        .all(|p| kept(&p.entry, Kind::Section, p.index));
    let contexts = (layout.contexts.iter())
        .filter(|p| p.context().text == Content::Dynamic)
        .all(|p| kept(&p.entry, Kind::Context, p.index));
    let variables = (layout.variables.values())
        .filter(|v| v.item().value == Content::Dynamic)
        .all(|v| kept(&v.entry, Kind::Variable, v.index));
    let tools = layout.tools.is_some() || (layout.filtering.iter()).all(|e| kept(e, Kind::Tool, 0));
    (sections && contexts && variables && tools).then(|| last.clone())
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

/// `source`, interpolated unless `raw` (from its `split` when the layout made one); a text
/// without a reference is shared, not copied.
fn finish<'v>(
    source: Source<'_>,
    raw: bool,
    split: Option<&Split>,
    location: &dyn Fn() -> String,
    resolve: &mut dyn FnMut(&str) -> Result<Resolved<'v>>,
) -> Result<Arc<str>> {
    let rendered = match (&source, split) {
        (_, _) if raw => None,
        (Source::Static(text), Some(split)) => scratch(|out| {
            out.reserve(text.len() + 16 * split.references());
            fill_into(out, split.pieces(text), location, resolve).map(|()| true)
        })?,
        (Source::Static(text), None) => scratch(|out| render_into(text, out, location, resolve))?,
        (Source::Called(text), _) => scratch(|out| render_into(text, out, location, resolve))?,
    };
    Ok(match (rendered, source) {
        (Some(text), _) => text,
        (None, Source::Static(t)) => Arc::from(t),
        (None, Source::Called(t)) => t,
    })
}

/// What `render` writes, shared as a new text when it writes one (true). It writes into this
/// thread's one buffer, so a step's texts cost one allocation each, not three; a buffer
/// grown past 1 MiB is let go, so no thread holds more after one big text.
fn scratch(render: impl FnOnce(&mut String) -> Result<bool>) -> Result<Option<Arc<str>>> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    SCRATCH.with(|cell| {
        // A plugin's call inside a render may render too: it gets its own buffer.
        let mut own = String::new();
        let mut kept = cell.try_borrow_mut();
        let out = match &mut kept {
            Ok(buffer) => &mut **buffer,
            Err(_) => &mut own,
        };
        out.clear();
        let written = render(out)?.then(|| Arc::from(out.as_str()));
        if out.capacity() > 1 << 20 {
            *out = String::new();
        }
        Ok(written)
    })
}

fn attempt(
    registry: &Registry,
    layout: &Layout,
    step: &Step,
    options: &Options,
    excluded: &BTreeSet<String>,
    calls: &mut Calls,
) -> Result<Assembly> {
    // Room for every call up front: growing the memo mid-step costs more than it saves.
    calls
        .texts
        .reserve(layout.sections.len() + layout.contexts.len());
    calls.values.reserve(layout.variables.len());
    calls.prefetch(step, &layout.asks);
    let mut resolver = Resolver {
        layout,
        step,
        used: Vec::new(),
    };
    let mut section_texts = Vec::with_capacity(layout.sections.len());
    for part in &layout.sections {
        let text = match &part.fixed {
            Some(text) => text.clone(),
            None => {
                let s = part.section();
                let source = calls.text(&part.entry, Kind::Section, part.index, &s.text, step)?;
                let location = || format!("section `{}` (plugin `{}`)", s.name, part.entry.id);
                let split = part.split.as_ref();
                finish(source, s.verbatim, split, &location, &mut |n| {
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
                let split = part.split.as_ref();
                finish(source, raw, split, &location, &mut |n| {
                    resolver.resolve(n, calls)
                })?
            }
        };
        context_texts.push((part.name.clone(), text));
    }
    let runtime_context = snapshot(context_texts.iter().map(|(_, t)| &**t));
    let variables = layout.used_origins(&resolver.used);
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
        called: 0,
        reused: Vec::new(),
    })
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
    let tools = effective::effective::<Tool>(registry, excluded, &step.scope_chain);
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

/// Resolves `{{name}}` against the layout's variables, calling dynamic ones lazily.
struct Resolver<'p> {
    layout: &'p Layout,
    step: &'p Step,
    /// Variables referenced this assembly by the texts rendered now (for `--explain`).
    used: Vec<&'p Arc<str>>,
}

impl<'p> Resolver<'p> {
    fn resolve(&mut self, name: &str, calls: &mut Calls) -> Result<Resolved<'p>> {
        let Some((key, v)) = self.layout.by_name.get_key_value(name) else {
            let known = self
                .layout
                .variables
                .keys()
                .map(|k| k.to_string())
                .collect();
            return Ok(Resolved::Unknown { known });
        };
        if !self.used.iter().any(|u| Arc::ptr_eq(u, key)) {
            self.used.push(key);
        }
        let item: &'p Variable = v.item();
        let value = match &item.value {
            Content::Static(s) => Some(Resolved::Value(Cow::Borrowed(s))),
            Content::Dynamic => calls
                .value(&v.entry, v.index, self.step)?
                .map(Resolved::Shared),
        };
        Ok(value.unwrap_or_else(|| Resolved::Absent {
            plugin: v.entry.id.clone(),
        }))
    }
}

#[cfg(test)]
mod tests;
