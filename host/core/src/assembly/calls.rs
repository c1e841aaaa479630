//! Plugin calls of one assembly: each dynamic contribution called at most once (A2), what a
//! batching plugin is asked in one call (W3), a failed call as an error or an omission (A9).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use super::keys::{CallKey, KeyHasher, KeyMap};
use super::model::Omission;
use super::reuse::{reads_of, shown, Answer, Read, Reuse};
use crate::error::{Error, Result};
use crate::observe::{observed, Activity, Observe};
use crate::plugin::model::{Content, Kind, Reads, Step};
use crate::plugin::provider::{CallError, CallResult, Evaluation, Wanted};
use crate::plugin::registry::PluginEntry;

/// What one batching plugin (world 0.2.0) is asked each step: its effective dynamic sections
/// and contexts in output order, its effective dynamic variables by name, its shown tools.
pub(super) struct Ask {
    pub entry: Arc<PluginEntry>,
    pub wanted: Wanted,
    /// The memo keys of `wanted`'s texts (sections, then contexts) and variables.
    pub text_keys: Vec<CallKey>,
    pub value_keys: Vec<CallKey>,
}

pub(super) fn call_key(entry: &Arc<PluginEntry>, kind: Kind, index: usize) -> CallKey {
    (Arc::as_ptr(entry) as usize, kind, index)
}

/// A text as a step renders it: a static one borrowed from the declaration, or one a plugin
/// gave this step.
pub(super) enum Source<'p> {
    Static(&'p str),
    Called(Arc<str>),
}

/// Memoised dynamic calls: each contribution is called at most once per assembly (A2).
#[derive(Default)]
pub(super) struct Calls<'o> {
    /// Told of each call, when telemetry watches the step.
    pub(super) observe: Option<&'o dyn Observe>,
    pub(super) texts: KeyMap<CallResult<Arc<str>>>,
    pub(super) values: KeyMap<CallResult<Option<Arc<str>>>>,
    pub(super) tools: HashMap<usize, CallResult<Arc<[String]>>, BuildHasherDefault<KeyHasher>>,
    /// Contexts left out alone (`contexts_fail_alone`), in the order they were asked for.
    pub(super) omitted: Vec<Omission>,
    /// The session's kept answers (world 0.3.0), when the assembly is a session's step.
    pub(super) reuse: Option<&'o mut Reuse>,
    /// The plugin calls made.
    pub(super) called: usize,
    /// The contributions answered from `reuse`, without a call: `plugin kind \`name\``.
    pub(super) reused: Vec<Arc<str>>,
    /// No plugin may be called: an item that needs a call fails the assembly with
    /// [`Error::WouldCall`] instead (a step planned where a call could block other work).
    pub(super) forbid: bool,
}

/// The name of `entry`'s item `index` of `kind` (`Kind::Tool`: its tool filter).
/// How a step's marker names a contribution that kept its answer: `plugin kind \`name\``.
fn reuse_label(entry: &PluginEntry, kind: Kind, index: usize) -> Arc<str> {
    let name = item_name(entry, kind, index);
    Arc::from(format!("{} {kind} `{name}`", entry.id))
}

fn item_name(entry: &PluginEntry, kind: Kind, index: usize) -> &str {
    let d = &entry.declaration;
    match kind {
        Kind::Section => &d.sections[index].name,
        Kind::Context => &d.contexts[index].name,
        Kind::Variable => &d.variables[index].name,
        Kind::Tool => "shown-tools",
    }
}

impl Calls<'_> {
    /// W3: asks each batching plugin (world 0.2.0) once for every effective dynamic value it
    /// gives this step and has not given yet: its sections and contexts in use, its effective
    /// variables (referenced or not: which ones a dynamic text references is only known after
    /// the call), and its shown tools ([`Ask`]s, made once per layout). Shadowed contributions are
    /// never asked for. The answers join the memo, so the lazy per-item path below finds
    /// them; an error stays with its item and fails the assembly only if the item is used.
    pub(super) fn prefetch(&mut self, step: &Step, asks: &[Ask]) {
        for ask in asks {
            let entry = &ask.entry;
            self.kept_answers(step, ask);
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
            if self.forbid {
                // Not asked: the per-item path refuses the first item it needs.
                continue;
            }
            // The call is shown what its items read (world 0.3.0; all of it before).
            let reads: Vec<Option<&Reads>> = (texts.iter().chain(values))
                .map(|&(_, kind, i)| reads_of(entry, kind, i))
                .chain(wanted.shown_tools.then(|| reads_of(entry, Kind::Tool, 0)))
                .collect();
            let shown_step = shown(step, &reads);
            self.called += 1;
            let answer = observed(self.observe, Activity::call(entry, "evaluate"), || {
                entry.provider.evaluate(&shown_step, wanted)
            })
            .and_then(|e| e.check(wanted).map(|()| e))
            .unwrap_or_else(|e| Evaluation::failed(wanted, e));
            // The answers come back in the order of `wanted`, which is the keys' order.
            let answered = answer.sections.into_iter().chain(answer.contexts);
            for (&k, text) in texts.iter().zip(answered) {
                let text: CallResult<Arc<str>> = text.map(Arc::from);
                if let Ok(t) = &text {
                    self.keep(step, entry, k, Answer::Text(t.clone()));
                }
                self.texts.insert(k, text);
            }
            for (&k, value) in values.iter().zip(answer.variables) {
                let value: CallResult<Option<Arc<str>>> = value.map(|v| v.map(Arc::from));
                if let Ok(v) = &value {
                    self.keep(step, entry, k, Answer::Value(v.clone()));
                }
                self.values.insert(k, value);
            }
            if let Some(shown) = answer.shown_tools {
                let shown: CallResult<Arc<[String]>> = shown.map(Arc::from);
                if let Ok(names) = &shown {
                    let k = (ptr, Kind::Tool, 0);
                    self.keep(step, entry, k, Answer::Tools(names.clone()));
                }
                self.tools.insert(ptr, shown);
            }
        }
    }

    /// World 0.3.0: the answers `ask`'s items gave at an earlier step of the session when
    /// they read what they read now, taken as this step's (no call for them).
    fn kept_answers(&mut self, step: &Step, ask: &Ask) {
        if self.reuse.is_none() {
            return;
        }
        let entry = &ask.entry;
        let ptr = Arc::as_ptr(entry) as usize;
        let tools = ask.wanted.shown_tools.then_some((ptr, Kind::Tool, 0));
        for key in (ask.text_keys.iter().chain(&ask.value_keys).copied()).chain(tools) {
            let (_, kind, index) = key;
            let known = match kind {
                Kind::Variable => self.values.contains_key(&key),
                Kind::Tool => self.tools.contains_key(&ptr),
                _ => self.texts.contains_key(&key),
            };
            if known {
                continue;
            }
            match self.kept_one(entry, kind, index, step) {
                Some(Answer::Text(t)) => self.texts.insert(key, Ok(t)).map(drop),
                Some(Answer::Value(v)) => self.values.insert(key, Ok(v)).map(drop),
                Some(Answer::Tools(names)) => self.tools.insert(ptr, Ok(names)).map(drop),
                None => None,
            };
        }
    }

    /// The answer a contribution gave at an earlier step of the session when it read what it
    /// reads now, named in `reused` (`None`: ask it).
    fn kept_one(
        &mut self,
        entry: &Arc<PluginEntry>,
        kind: Kind,
        index: usize,
        step: &Step,
    ) -> Option<Answer> {
        let reuse = self.reuse.as_deref()?;
        let reads = reads_of(entry, kind, index).filter(|r| !r.volatile)?;
        let (answer, label) = reuse.get(entry, kind, index, reads, step)?;
        if self.reused.capacity() == 0 {
            // Room for a step's usual few at once, not grown one doubling at a time.
            self.reused.reserve(8);
        }
        self.reused.push(label.clone());
        Some(answer.clone())
    }

    /// Keeps an answer for the session's next steps, when its item declares what it reads.
    fn keep(&mut self, step: &Step, entry: &Arc<PluginEntry>, key: CallKey, answer: Answer) {
        let Some(reuse) = self.reuse.as_deref_mut() else {
            return;
        };
        let (_, kind, index) = key;
        if let Some(reads) = reads_of(entry, kind, index).filter(|r| !r.volatile) {
            let label = || reuse_label(entry, kind, index);
            reuse.keep(entry, (kind, index), Read::of(reads, step), answer, label);
        }
    }

    /// Refuses a call when calls are forbidden ([`Calls::forbid`]).
    fn may_call(&self) -> Result<()> {
        match self.forbid {
            true => Err(Error::WouldCall),
            false => Ok(()),
        }
    }

    /// Whether no plugin was called.
    pub(super) fn is_empty(&self) -> bool {
        self.texts.is_empty() && self.values.is_empty() && self.tools.is_empty()
    }

    pub(super) fn text<'p>(
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
        let key = call_key(entry, kind, index);
        let result = match self.texts.get(&key) {
            Some(known) => known.clone(),
            None => {
                let answer = match self.kept_one(entry, kind, index, step) {
                    Some(Answer::Text(kept)) => Ok(kept),
                    _ => {
                        self.may_call()?;
                        self.called += 1;
                        let shown = &*shown(step, &[reads_of(entry, kind, index)]);
                        let called = match kind {
                            Kind::Section => {
                                observed(self.observe, Activity::call(entry, "section"), || {
                                    entry.provider.section_text(name, scope, shown)
                                })
                            }
                            _ => observed(self.observe, Activity::call(entry, "context"), || {
                                entry.provider.context_text(name, scope, shown)
                            }),
                        };
                        let called = called.map(Arc::<str>::from);
                        if let Ok(text) = &called {
                            self.keep(step, entry, key, Answer::Text(text.clone()));
                        }
                        called
                    }
                };
                self.texts.insert(key, answer.clone());
                answer
            }
        };
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
            Err(e) => Err(call_error(entry, &format!("{kind} `{name}`"), &e)),
        }
    }

    pub(super) fn value(
        &mut self,
        entry: &Arc<PluginEntry>,
        index: usize,
        step: &Step,
    ) -> Result<Option<Arc<str>>> {
        let v = &entry.declaration.variables[index];
        let key = call_key(entry, Kind::Variable, index);
        let result = match self.values.get(&key) {
            Some(known) => known.clone(),
            None => {
                let answer = match self.kept_one(entry, Kind::Variable, index, step) {
                    Some(Answer::Value(kept)) => Ok(kept),
                    _ => {
                        self.may_call()?;
                        self.called += 1;
                        let shown = &*shown(step, &[reads_of(entry, Kind::Variable, index)]);
                        let called =
                            observed(self.observe, Activity::call(entry, "variable"), || {
                                entry.provider.variable_value(&v.name, &v.scope, shown)
                            })
                            .map(|v| v.map(Arc::<str>::from));
                        if let Ok(value) = &called {
                            self.keep(step, entry, key, Answer::Value(value.clone()));
                        }
                        called
                    }
                };
                self.values.insert(key, answer.clone());
                answer
            }
        };
        result.map_err(|e| call_error(entry, &format!("variable `{}`", v.name), &e))
    }

    /// The tools `entry` shows this step (asked once).
    pub(super) fn shown_tools(
        &mut self,
        entry: &Arc<PluginEntry>,
        step: &Step,
    ) -> Result<&Arc<[String]>> {
        let ptr = Arc::as_ptr(entry) as usize;
        if !self.tools.contains_key(&ptr) {
            let key = (ptr, Kind::Tool, 0);
            let answer = match self.kept_one(entry, Kind::Tool, 0, step) {
                Some(Answer::Tools(kept)) => Ok(kept),
                _ => {
                    self.may_call()?;
                    self.called += 1;
                    let shown = &*shown(step, &[reads_of(entry, Kind::Tool, 0)]);
                    let called: CallResult<Arc<[String]>> =
                        observed(self.observe, Activity::call(entry, "shown-tools"), || {
                            entry.provider.shown_tools(shown)
                        })
                        .map(Arc::from);
                    if let Ok(names) = &called {
                        self.keep(step, entry, key, Answer::Tools(names.clone()));
                    }
                    called
                }
            };
            self.tools.insert(ptr, answer);
        }
        match self.tools.get(&ptr) {
            Some(Ok(names)) => Ok(names),
            Some(Err(e)) => Err(call_error(entry, "shown-tools", e)),
            None => Err(call_error(
                entry,
                "shown-tools",
                &CallError::Failed("no answer".into()),
            )),
        }
    }
}

pub(super) fn call_error(entry: &PluginEntry, contribution: &str, e: &CallError) -> Error {
    Error::PluginCall {
        plugin: entry.id.clone(),
        contribution: contribution.to_string(),
        cause: e.cause().to_string(),
        trapped: matches!(e, CallError::Trapped(_)),
    }
}
