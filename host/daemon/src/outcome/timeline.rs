//! A step's or a record's stages and plugin calls, timed as core announces them.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use promptd_core::observe::{Activity, Observe};
use promptd_core::sync::lock;

/// One stage of a step or of a record, or one plugin call.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    /// Assembling the plugins' contributions.
    Assembly,
    /// One call into a plugin during assembly.
    Call {
        /// The plugin's id.
        plugin: Arc<str>,
        /// The SHA-256 of its file.
        sha256: Option<Arc<str>>,
        /// What was asked (`evaluate`, `section`, …).
        what: &'static str,
    },
    /// One review hook.
    Review {
        /// The hook's plugin id.
        plugin: Arc<str>,
        /// The SHA-256 of its file.
        sha256: Option<Arc<str>>,
    },
    /// Measuring against the budget and trimming history.
    Budget,
    /// Appending to the session store.
    Append {
        /// Events appended.
        events: usize,
    },
}

/// A [`Work`] with its times.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    /// What was done.
    pub work: Work,
    /// When it started.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Why it failed, when it did.
    pub failed: Option<String>,
}

/// The stages of one step or record, in the order they started.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    /// The entries, and the indices of those started and not yet ended.
    entries: Mutex<(Vec<Stage>, Vec<usize>)>,
}

impl Timeline {
    pub(crate) fn new() -> Timeline {
        Timeline {
            entries: Mutex::new((Vec::with_capacity(16), Vec::with_capacity(4))),
        }
    }

    /// Adds `work`, done from `start` to now.
    pub(crate) fn push(&self, work: Work, start: SystemTime, failed: Option<String>) {
        let end = SystemTime::now();
        lock(&self.entries).0.push(Stage {
            work,
            start,
            end,
            failed,
        });
    }

    /// The entries, in the order they started.
    pub(crate) fn take(&self) -> Vec<Stage> {
        std::mem::take(&mut lock(&self.entries).0)
    }
}

impl Observe for Timeline {
    fn begin(&self, activity: &Activity<'_>) {
        let now = SystemTime::now();
        let work = match *activity {
            Activity::Assembly => Work::Assembly,
            Activity::Call {
                plugin,
                sha256,
                what,
            } => Work::Call {
                plugin: Arc::from(plugin),
                sha256: sha256.map(Arc::from),
                what,
            },
            Activity::Review { plugin, sha256 } => Work::Review {
                plugin: Arc::from(plugin),
                sha256: sha256.map(Arc::from),
            },
            Activity::Budget => Work::Budget,
        };
        let mut entries = lock(&self.entries);
        entries.0.push(Stage {
            work,
            start: now,
            end: now,
            failed: None,
        });
        let at = entries.0.len() - 1;
        entries.1.push(at);
    }

    fn end(&self, _activity: &Activity<'_>, failed: Option<&str>) {
        let now = SystemTime::now();
        let mut entries = lock(&self.entries);
        if let Some(at) = entries.1.pop() {
            let entry = &mut entries.0[at];
            entry.end = now;
            entry.failed = failed.map(str::to_string);
        }
    }
}
