//! An assembly's layout: who gives each effective part for one registry snapshot, scope chain,
//! options and set of left-out plugins, in output order, with every static text already
//! rendered and what each batching plugin will be asked.
//!
//! None of it depends on the step, so a snapshot makes it once per (chain, options) and every
//! step of every session shares it: a step then only calls the plugins for their dynamic parts
//! and splices the answers in (issue 31). A layout made with plugins left out (A9) is made for that
//! assembly alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use std::sync::Mutex;

use super::calls::{call_key, Ask, Calls};
use super::effective::{effective, Picked};
use super::keys::KeyHasher;
use super::model::{Options, Origin};
use super::tools::{check_tool_order, order_tools, OrderedTools};
use crate::error::{Error, Result};
use crate::plugin::interpolate::{parse, render, Piece, Resolved};
use crate::plugin::model::Kind;
use crate::plugin::model::{Content, Context, Scope, Section, Variable};
use crate::plugin::provider::{Item, Wanted};
use crate::plugin::registry::{PluginEntry, Registry};
use crate::plugin::trust::Trust;

/// One section or context of the output, by the plugin that gives it.
pub(super) struct Part {
    pub entry: Arc<PluginEntry>,
    /// Its index in the plugin's declared sections (or contexts).
    pub index: usize,
    pub name: Arc<str>,
    /// Its text when that is the same at every step: a static text, interpolated with static
    /// variables only (or never interpolated). `None`: called or rendered per step.
    pub fixed: Option<Arc<str>>,
    /// A static text that is not fixed (it references a dynamic variable), split once.
    pub split: Option<Split>,
}

/// A static text split into literals and references once (T1–T4 checked then), so a step
/// only fills in the values: byte ranges into the text (a reference's is its name's).
pub(super) struct Split {
    spans: Vec<(bool, usize, usize)>,
    references: usize,
}

impl Split {
    /// The split of `content` when it is a static text that must be rendered per step: not
    /// `raw`, not `fixed`, and well formed (a malformed one is left to the step to report).
    fn of(content: &Content, raw: bool, fixed: &Option<Arc<str>>) -> Option<Split> {
        let (Content::Static(text), false, None) = (content, raw, fixed) else {
            return None;
        };
        let base = text.as_ptr() as usize;
        let mut split = Split {
            spans: Vec::new(),
            references: 0,
        };
        for piece in parse(text).ok()? {
            split.spans.push(match piece {
                Piece::Literal(l) => (false, l.as_ptr() as usize - base, l.len()),
                Piece::Reference { name, offset } => {
                    split.references += 1;
                    (true, offset + 2, name.len())
                }
            });
        }
        Some(split)
    }

    /// The pieces of `text`, the text this was split from.
    pub fn pieces<'t>(&'t self, text: &'t str) -> impl Iterator<Item = Piece<'t>> {
        self.spans.iter().map(move |&(reference, at, len)| {
            let part = text.get(at..at + len).unwrap_or_default();
            match reference {
                true => Piece::Reference {
                    name: part,
                    offset: at - 2,
                },
                false => Piece::Literal(part),
            }
        })
    }

    /// How many references it has.
    pub fn references(&self) -> usize {
        self.references
    }
}

/// One effective variable, by the plugin that gives it.
#[derive(Clone)]
pub(super) struct VarPart {
    pub entry: Arc<PluginEntry>,
    pub index: usize,
    /// Its effective scope (after the config's scope override).
    pub scope: Scope,
}

impl VarPart {
    pub fn item(&self) -> &Variable {
        &self.entry.declaration.variables[self.index]
    }
}

pub(super) struct Layout {
    pub sections: Vec<Part>,
    pub contexts: Vec<Part>,
    pub variables: BTreeMap<Arc<str>, VarPart>,
    /// `variables` again, for a step's lookups by name (a hash is cheaper than a walk).
    pub by_name: HashMap<Arc<str>, VarPart, BuildHasherDefault<KeyHasher>>,
    pub asks: Vec<Ask>,
    pub section_origins: Arc<[Origin]>,
    pub context_origins: Arc<[Origin]>,
    /// Variables the fixed texts reference, sorted (explain lists them every step), and who
    /// gives them.
    pub fixed_used: Vec<Arc<str>>,
    pub fixed_origins: Arc<[Origin]>,
    /// The ordered tools, when no effective tool's plugin filters them (they are then the same
    /// every step).
    pub tools: Option<Arc<OrderedTools>>,
    /// The plugins that filter their tools, in the order their first tool sorts.
    pub filtering: Vec<Arc<PluginEntry>>,
    /// The ordered tools the last step's filters gave, with what each filter said: a step
    /// whose filters say the same shares them.
    pub filtered: Mutex<Option<Filtered>>,
    /// The variables the last step's rendered texts referenced (in the order first used), and
    /// who gives all it referenced: a step that references the same shares the list.
    pub last_used: Mutex<Option<Used>>,
}

/// Variables a step referenced (in the order first used), and who gives all it referenced.
pub(super) type Used = (Vec<Arc<str>>, Arc<[Origin]>);

/// Ordered tools, by what each filtering plugin (by its entry's address) showed.
pub(super) type Filtered = (Vec<(usize, Arc<[String]>)>, Arc<OrderedTools>);

impl Part {
    pub fn section(&self) -> &Section {
        &self.entry.declaration.sections[self.index]
    }

    pub fn context(&self) -> &Context {
        &self.entry.declaration.contexts[self.index]
    }
}

fn origin(name: &str, entry: &PluginEntry, scope: &Scope) -> Origin {
    Origin {
        name: name.to_string(),
        plugin: entry.id.clone(),
        scope: scope.key().to_string(),
    }
}

/// Who gives each of `ordered`'s contributions, in its order.
fn origins_in_order(ordered: &[(&str, Picked<'_>)]) -> Arc<[Origin]> {
    ordered
        .iter()
        .map(|&(n, (e, _, scope, _))| origin(n, e, scope))
        .collect()
}

/// The layout of `registry` for `chain` and `options`, leaving out the plugins in `excluded`.
pub(super) fn layout(
    registry: &Registry,
    chain: &[String],
    options: &Options,
    excluded: &BTreeSet<String>,
) -> Result<Layout> {
    let sections = effective::<Section>(registry, excluded, chain);
    let variables = effective::<Variable>(registry, excluded, chain);
    // A4: without a runtime context, contexts are neither called nor rendered.
    let contexts = match options.suppress_runtime_context {
        true => BTreeMap::new(),
        false => effective::<Context>(registry, excluded, chain),
    };

    // Cheap checks first, before any plugin is called.
    if let Some(order) = &options.tool_order {
        check_tool_order(registry, order)?;
    }
    let ordered = ordered_sections(&sections)?;
    let mut ordered_contexts: Vec<(&str, _)> = contexts.iter().map(|(n, p)| (*n, *p)).collect();
    ordered_contexts.sort_by(|a, b| (context(&a.1).order, a.0).cmp(&(context(&b.1).order, b.0)));

    let variables: BTreeMap<Arc<str>, VarPart> = variables
        .into_iter()
        .map(|(name, (entry, index, scope, _))| {
            let part = VarPart {
                entry: entry.clone(),
                index,
                scope: scope.clone(),
            };
            (Arc::from(name), part)
        })
        .collect();
    // Static texts rendered once; `used` collects the variables they reference.
    let mut used: BTreeSet<Arc<str>> = BTreeSet::new();
    let mut fix = |text: &Content, raw: bool, location: &dyn Fn() -> String| -> Option<Arc<str>> {
        let Content::Static(text) = text else {
            return None;
        };
        if raw {
            return Some(Arc::from(text.as_str()));
        }
        let mut names = Vec::new();
        let rendered = render(text, location, &mut |name| {
            let Some((key, v)) = variables.get_key_value(name) else {
                // Unknown: the step's own rendering says so, with the known names.
                return Err(Error::ConfigInvalid(String::new()));
            };
            match &v.item().value {
                Content::Static(value) => {
                    names.push(key.clone());
                    Ok(Resolved::Value(std::borrow::Cow::Borrowed(value.as_str())))
                }
                Content::Dynamic => Err(Error::ConfigInvalid(String::new())),
            }
        })
        .ok()?;
        used.extend(names);
        Some(Arc::from(rendered.as_ref()))
    };
    let section_parts: Vec<Part> = ordered
        .iter()
        .map(|&(name, (entry, index, _, _))| {
            let s = &entry.declaration.sections[index];
            let location = || format!("section `{}` (plugin `{}`)", s.name, entry.id);
            let fixed = fix(&s.text, s.verbatim, &location);
            Part {
                entry: entry.clone(),
                index,
                name: Arc::from(name),
                split: Split::of(&s.text, s.verbatim, &fixed),
                fixed,
            }
        })
        .collect();
    let context_parts: Vec<Part> = ordered_contexts
        .iter()
        .map(|&(name, (entry, index, _, _))| {
            let c = &entry.declaration.contexts[index];
            // A data plugin's text is never interpolated (R7): it could name a secret variable.
            let raw = c.verbatim || entry.options.trust == Trust::Data;
            let location = || format!("context `{}` (plugin `{}`)", c.name, entry.id);
            let fixed = fix(&c.text, raw, &location);
            Part {
                entry: entry.clone(),
                index,
                name: Arc::from(name),
                split: Split::of(&c.text, raw, &fixed),
                fixed,
            }
        })
        .collect();

    let mut asks = asks_of(&section_parts, &context_parts, &variables);
    let tools = effective::<crate::plugin::model::Tool>(registry, excluded, chain);
    let (filters, filtering) = filtering_plugins(&tools, &mut asks);
    let tools = match filters {
        true => None,
        // No plugin filters: ordering makes no call, so the step plays no part.
        false => Some(Arc::new(order_tools(
            &tools,
            options,
            None,
            &mut Calls::default(),
        )?)),
    };
    let section_origins = origins_in_order(&ordered);
    let context_origins = origins_in_order(&ordered_contexts);
    let mut layout = Layout {
        sections: section_parts,
        contexts: context_parts,
        by_name: variables
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        variables,
        asks: asks.into_values().collect(),
        section_origins,
        context_origins,
        fixed_origins: Arc::from([]),
        fixed_used: used.into_iter().collect(),
        tools,
        filtering,
        filtered: Mutex::new(None),
        last_used: Mutex::new(None),
    };
    layout.fixed_origins = origins(&layout, layout.fixed_used.iter().map(|n| &**n));
    Ok(layout)
}

/// A1–A3: the sections in output order: a single complete section alone, else every
/// section by (order, name); two complete sections are refused.
fn ordered_sections<'r>(
    sections: &BTreeMap<&'r str, Picked<'r>>,
) -> Result<Vec<(&'r str, Picked<'r>)>> {
    let complete: Vec<&str> = sections
        .iter()
        .filter(|(_, p)| section(p).complete)
        .map(|(n, _)| *n)
        .collect();
    if complete.len() > 1 {
        let names = complete.iter().map(|n| n.to_string()).collect();
        return Err(Error::MultipleComplete(names)); // already sorted: BTreeMap order
    }
    // A1, A3: a single complete section stands alone; otherwise sort by (order, name).
    let mut ordered: Vec<(&str, _)> = match complete.first() {
        Some(only) => vec![(*only, sections[only])],
        None => sections.iter().map(|(n, p)| (*n, *p)).collect(),
    };
    ordered.sort_by(|a, b| (section(&a.1).order, a.0).cmp(&(section(&b.1).order, b.0)));
    Ok(ordered)
}

/// What each batching plugin is asked, in the order the per-item path would ask.
fn asks_of(
    section_parts: &[Part],
    context_parts: &[Part],
    variables: &BTreeMap<Arc<str>, VarPart>,
) -> BTreeMap<String, Ask> {
    let mut asks: BTreeMap<String, Ask> = BTreeMap::new();
    for part in section_parts {
        let s = part.section();
        if part.entry.provider.batches() && s.text == Content::Dynamic {
            let a = asks
                .entry(part.entry.id.clone())
                .or_insert_with(|| empty(&part.entry));
            a.wanted.sections.push(item(&s.name, &s.scope));
            a.text_keys
                .push(call_key(&part.entry, Kind::Section, part.index));
        }
    }
    for part in context_parts {
        let c = part.context();
        if part.entry.provider.batches() && c.text == Content::Dynamic {
            let a = asks
                .entry(part.entry.id.clone())
                .or_insert_with(|| empty(&part.entry));
            a.wanted.contexts.push(item(&c.name, &c.scope));
            a.text_keys
                .push(call_key(&part.entry, Kind::Context, part.index));
        }
    }
    for v in variables.values() {
        let item_ = v.item();
        if v.entry.provider.batches() && item_.value == Content::Dynamic {
            let a = asks
                .entry(v.entry.id.clone())
                .or_insert_with(|| empty(&v.entry));
            a.wanted.variables.push(item(&item_.name, &item_.scope));
            a.value_keys
                .push(call_key(&v.entry, Kind::Variable, v.index));
        }
    }
    asks
}

/// The plugins that filter the tools (each once), and whether any does; a batching one is
/// asked for the tools shown.
fn filtering_plugins(
    tools: &BTreeMap<&str, Picked<'_>>,
    asks: &mut BTreeMap<String, Ask>,
) -> (bool, Vec<Arc<PluginEntry>>) {
    let mut filters = false;
    let mut filtering: Vec<Arc<PluginEntry>> = Vec::new();
    for (entry, _, _, _) in tools.values() {
        if entry.declaration.filters_tools {
            filters = true;
            if !filtering.iter().any(|e| Arc::ptr_eq(e, entry)) {
                filtering.push((*entry).clone());
            }
            if entry.provider.batches() {
                let a = asks.entry(entry.id.clone()).or_insert_with(|| empty(entry));
                a.wanted.shown_tools = true;
            }
        }
    }
    (filters, filtering)
}

impl Layout {
    /// Who gives each variable a step referenced: the fixed texts' and `more` (the layout's
    /// keys, in the order the step first used them). Made once for as long as steps reference
    /// the same, which they do unless a dynamic text changes what it references.
    pub(super) fn used_origins(&self, more: &[&Arc<str>]) -> Arc<[Origin]> {
        if more.is_empty() {
            return self.fixed_origins.clone();
        }
        let mut last = super::lock(&self.last_used);
        if let Some((was, origins)) = last.as_ref() {
            if was.len() == more.len() && was.iter().zip(more).all(|(a, b)| Arc::ptr_eq(a, b)) {
                return origins.clone();
            }
        }
        let made = if more
            .iter()
            .all(|n| self.fixed_used.binary_search(n).is_ok())
        {
            self.fixed_origins.clone()
        } else {
            let mut names: Vec<&Arc<str>> =
                self.fixed_used.iter().chain(more.iter().copied()).collect();
            names.sort_unstable();
            names.dedup();
            origins(self, names.iter().map(|n| &***n))
        };
        *last = Some((more.iter().map(|n| Arc::clone(n)).collect(), made.clone()));
        made
    }
}

/// Who gives each of the variables `names` (by name order, as given).
pub(super) fn origins<'a>(layout: &Layout, names: impl Iterator<Item = &'a str>) -> Arc<[Origin]> {
    names
        .filter_map(|n| {
            let v = layout.variables.get(n)?;
            Some(Origin {
                name: n.to_string(),
                plugin: v.entry.id.clone(),
                scope: v.scope.key().to_string(),
            })
        })
        .collect()
}

fn section<'a>(&(e, i, _, _): &(&'a Arc<PluginEntry>, usize, &Scope, usize)) -> &'a Section {
    &e.declaration.sections[i]
}

fn context<'a>(&(e, i, _, _): &(&'a Arc<PluginEntry>, usize, &Scope, usize)) -> &'a Context {
    &e.declaration.contexts[i]
}

fn empty(entry: &Arc<PluginEntry>) -> Ask {
    Ask {
        entry: entry.clone(),
        wanted: Wanted::default(),
        text_keys: Vec::new(),
        value_keys: Vec::new(),
    }
}

fn item(name: &str, scope: &Scope) -> Item {
    (name.to_string(), scope.clone())
}
