//! Answers kept across a session's steps (world 0.3.0): a dynamic contribution that declares
//! what it reads ([`Reads`]) is shown only that, and asked again only when that changed; until
//! then its last answer stands, without a call.

use std::any::Any;
use std::borrow::Cow;
use std::sync::{Arc, Weak};

use super::keys::KeyMap;
use super::model::Assembly;
use crate::plugin::model::{Kind, Reads, Step, StepInputs};
use crate::plugin::registry::MemoKey;
use crate::plugin::registry::PluginEntry;

/// Most answers kept for one session: past it the kept answers start over (a cleared memo
/// costs calls, never a wrong answer).
const MAX_KEPT: usize = 4096;

/// What one contribution read when it answered: the values of what it declares, nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Read {
    facts: Vec<Option<String>>,
    inputs: StepInputs,
    step_number: u64,
}

impl Read {
    /// Whether `step` shows `reads` what it showed when this was taken, compared in place (no
    /// copy: this runs for every kept answer at every step).
    pub(super) fn same(&self, reads: &Reads, step: &Step) -> bool {
        let read = reads.inputs;
        let inputs = &step.inputs;
        self.facts.len() == reads.facts.len()
            && (self.facts.iter())
                .zip(&reads.facts)
                .all(|(was, f)| was.as_deref() == step.facts.get(f).map(String::as_str))
            && self.step_number
                == if read.step_number {
                    step.step_number
                } else {
                    0
                }
            && (!read.last_user_message
                || self.inputs.last_user_message == inputs.last_user_message)
            && (!read.model || self.inputs.model == inputs.model)
            && (!read.client_tools || self.inputs.client_tools == inputs.client_tools)
            && (!read.turn_count || self.inputs.turn_count == inputs.turn_count)
    }

    /// What `reads` reads of `step`.
    pub(super) fn of(reads: &Reads, step: &Step) -> Read {
        Read {
            facts: reads
                .facts
                .iter()
                .map(|f| step.facts.get(f).cloned())
                .collect(),
            inputs: inputs_read(reads, &step.inputs),
            step_number: if reads.inputs.step_number {
                step.step_number
            } else {
                0
            },
        }
    }
}

fn inputs_read(reads: &Reads, all: &StepInputs) -> StepInputs {
    let read = reads.inputs;
    StepInputs {
        last_user_message: all
            .last_user_message
            .clone()
            .filter(|_| read.last_user_message),
        model: all.model.clone().filter(|_| read.model),
        client_tools: all.client_tools.clone().filter(|_| read.client_tools),
        turn_count: all.turn_count.filter(|_| read.turn_count),
    }
}

/// A kept answer.
#[derive(Clone, Debug)]
pub(super) enum Answer {
    /// A section's or context's text.
    Text(Arc<str>),
    /// A variable's value.
    Value(Option<Arc<str>>),
    /// The tools a filtering plugin shows.
    Tools(Arc<[String]>),
}

/// One session's kept answers, and what its last assembly made of them.
#[derive(Clone, Debug, Default)]
pub struct Reuse {
    /// Each answer with its owner, what it read, and its name as a step's marker records it
    /// when kept (made once, not at every step that keeps it).
    kept: KeyMap<(Weak<PluginEntry>, Read, Answer, Arc<str>)>,
    /// Counts every change to `kept`: an assembly made at the same count was made of the
    /// same answers.
    changes: u64,
    /// The session's last assembly made of kept answers alone, and what it was made of.
    last: Option<Last>,
}

/// An assembly made of kept answers alone: of `layout` (held weakly, so its address is not
/// another layout's while this lives; typed `Any` so this module need not know layouts),
/// `key`, and the kept answers as they were at `changes`.
#[derive(Clone, Debug)]
struct Last {
    layout: Weak<dyn Any + Send + Sync>,
    key: MemoKey,
    changes: u64,
    assembly: Arc<Assembly>,
}

impl Reuse {
    /// The answer `entry`'s contribution gave when it last read what `reads` reads of `step`
    /// now (`None`: ask it). A plugin that was swapped since is a new plugin: its entry is
    /// another.
    pub(super) fn get(
        &self,
        entry: &Arc<PluginEntry>,
        kind: Kind,
        index: usize,
        reads: &Reads,
        step: &Step,
    ) -> Option<(&Answer, &Arc<str>)> {
        let key = (Arc::as_ptr(entry) as usize, kind, index);
        let (owner, was, answer, label) = self.kept.get(&key)?;
        (owner.as_ptr() == Arc::as_ptr(entry) && owner.strong_count() > 0 && was.same(reads, step))
            .then_some((answer, label))
    }

    /// Keeps `answer`, given when the contribution read `read`; `label` names the
    /// contribution (made only when it was not kept before).
    pub(super) fn keep(
        &mut self,
        entry: &Arc<PluginEntry>,
        (kind, index): (Kind, usize),
        read: Read,
        answer: Answer,
        label: impl FnOnce() -> Arc<str>,
    ) {
        let key = (Arc::as_ptr(entry) as usize, kind, index);
        let label = match self.kept.get(&key) {
            Some((owner, _, _, label)) if owner.as_ptr() == Arc::as_ptr(entry) => label.clone(),
            _ => label(),
        };
        if self.kept.len() >= MAX_KEPT {
            self.kept.clear();
        }
        self.kept
            .insert(key, (Arc::downgrade(entry), read, answer, label));
        self.changes += 1;
    }

    /// The session's last assembly made of kept answers alone, when it was made of `layout`
    /// and `key` and no answer was kept since. It is this step's assembly too when every
    /// dynamic item of the layout has a kept answer for this step ([`Reuse::kept_for`]):
    /// the step would then call no plugin and be made of exactly the same answers.
    pub(super) fn last<L: Any + Send + Sync>(
        &self,
        layout: &Arc<L>,
        key: &MemoKey,
    ) -> Option<&Arc<Assembly>> {
        let last = self.last.as_ref()?;
        let same = last.changes == self.changes
            && std::ptr::eq(
                last.layout.as_ptr() as *const (),
                Arc::as_ptr(layout) as *const (),
            )
            && last.key == *key;
        same.then_some(&last.assembly)
    }

    /// Whether `entry`'s item `index` of `kind` has a kept answer for `step` (as
    /// `Calls::kept_one` finds one).
    pub(super) fn kept_for(
        &self,
        entry: &Arc<PluginEntry>,
        kind: Kind,
        index: usize,
        step: &Step,
    ) -> bool {
        reads_of(entry, kind, index)
            .filter(|r| !r.volatile)
            .is_some_and(|reads| self.get(entry, kind, index, reads, step).is_some())
    }

    /// Roughly the memory kept here that nothing else of the session holds: the last
    /// assembly's system prompt and runtime context (its other texts are the kept answers
    /// and the plugins' own, shared).
    pub fn bytes(&self) -> usize {
        self.last.as_ref().map_or(0, |last| {
            let assembly = &last.assembly;
            assembly.system.len() + assembly.runtime_context.as_ref().map_or(0, String::len)
        })
    }

    /// Remembers `assembly`, made of `layout`, `key` and kept answers alone.
    pub(super) fn remember<L: Any + Send + Sync>(
        &mut self,
        layout: &Arc<L>,
        key: MemoKey,
        assembly: &Arc<Assembly>,
    ) {
        let layout: Arc<dyn Any + Send + Sync> = layout.clone();
        self.last = Some(Last {
            layout: Arc::downgrade(&layout),
            key,
            changes: self.changes,
            assembly: assembly.clone(),
        });
    }
}

/// What `reads` of the items a call is asked for (`None`: one reads the whole step) leave of
/// `step`: the union of their facts and inputs; the step number only when read.
pub(super) fn shown<'s>(step: &'s Step, reads: &[Option<&Reads>]) -> Cow<'s, Step> {
    if reads.iter().any(Option::is_none) {
        return Cow::Borrowed(step);
    }
    let mut union = Reads::default();
    for r in reads.iter().flatten() {
        union.facts.extend(r.facts.iter().cloned());
        union.inputs = union.inputs.union(r.inputs);
    }
    Cow::Owned(Step {
        agent: step.agent.clone(),
        scope_chain: step.scope_chain.clone(),
        session_id: step.session_id.clone(),
        step_number: if union.inputs.step_number {
            step.step_number
        } else {
            0
        },
        facts: (step.facts.iter())
            .filter(|(k, _)| union.facts.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        inputs: inputs_read(&union, &step.inputs),
    })
}

/// What the item `index` of `kind` of `entry` reads: its own `reads`, else its declaration's
/// (`Kind::Tool`: the tool filter, which reads the declaration's).
pub(super) fn reads_of(entry: &PluginEntry, kind: Kind, index: usize) -> Option<&Reads> {
    let d = &entry.declaration;
    let own = match kind {
        Kind::Section => d.sections.get(index).and_then(|s| s.reads.as_ref()),
        Kind::Context => d.contexts.get(index).and_then(|c| c.reads.as_ref()),
        Kind::Variable => d.variables.get(index).and_then(|v| v.reads.as_ref()),
        Kind::Tool => None,
    };
    d.reads_of(own)
}
