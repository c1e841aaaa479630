//! What the daemon tells telemetry (`promptd-telemetry`): a step's and a record's stages as
//! core announces them ([`Timeline`]), and the facts of each, as plain records.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use promptd_core::observe::{Activity, Observe};
use promptd_core::sync::lock;
use promptd_telemetry::{Sample, Telemetry, Timed, Work};

use crate::Daemon;

/// A step's or a record's stages and plugin calls, timed as core announces them, in the order
/// they started.
#[derive(Debug)]
pub(crate) struct Timeline<'t> {
    /// The entries, and the indices of those started and not yet ended.
    entries: Mutex<(Vec<Timed>, Vec<usize>)>,
    /// Where plugin ids and hashes are shared from.
    telemetry: &'t Telemetry,
}

impl<'t> Timeline<'t> {
    pub(crate) fn new(telemetry: &'t Telemetry) -> Timeline<'t> {
        Timeline {
            entries: Mutex::new((Vec::with_capacity(16), Vec::with_capacity(4))),
            telemetry,
        }
    }

    /// Adds `work`, done from `start` to now.
    pub(crate) fn push(&self, work: Work, start: SystemTime, failed: Option<String>) {
        let end = SystemTime::now();
        lock(&self.entries).0.push(Timed {
            work,
            start,
            end,
            failed,
        });
    }

    /// The entries, in the order they started.
    pub(crate) fn take(&self) -> Vec<Timed> {
        std::mem::take(&mut lock(&self.entries).0)
    }
}

impl Observe for Timeline<'_> {
    fn begin(&self, activity: &Activity<'_>) {
        let now = SystemTime::now();
        let work = match *activity {
            Activity::Assembly => Work::Assembly,
            Activity::Call {
                plugin,
                sha256,
                what,
            } => Work::Call {
                plugin: self.telemetry.shared(plugin),
                sha256: sha256.map(|s| self.telemetry.shared(s)),
                what,
            },
            Activity::Review { plugin, sha256 } => Work::Review {
                plugin: self.telemetry.shared(plugin),
                sha256: sha256.map(|s| self.telemetry.shared(s)),
            },
            Activity::Budget => Work::Budget,
        };
        let mut entries = lock(&self.entries);
        entries.0.push(Timed {
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

/// Most sessions whose system prompt hash is kept (past it the map starts again).
const MAX_SYSTEM_HASHES: usize = 4096;

impl Daemon {
    /// Exports steps with `telemetry` from now on (once: a second call is ignored).
    pub fn set_telemetry(&self, telemetry: Arc<Telemetry>) {
        let _ = self.telemetry.set(telemetry);
    }

    /// The telemetry exporter, when telemetry is on.
    pub fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.telemetry.get()
    }

    /// What `/metrics` counts, for OTLP export: the counters and the step latency's sum and
    /// count (telemetry adds its own).
    pub fn metric_samples(&self) -> Vec<Sample> {
        let mut samples = self.metrics.samples();
        samples.extend(self.metrics.latency_samples());
        samples
    }

    /// The SHA-256 (hex) and size of `system`, session `id`'s system prompt; computed when its
    /// header is new (`fresh`) or not known here.
    pub(crate) fn system_hash(&self, id: &str, system: &str, fresh: bool) -> (String, usize) {
        if !fresh {
            if let Some(known) = lock(&self.system_hashes).get(id) {
                return known.clone();
            }
        }
        use sha2::Digest;
        let digest = sha2::Sha256::digest(system.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let known = (hex, system.len());
        let mut all = lock(&self.system_hashes);
        if all.len() >= MAX_SYSTEM_HASHES && !all.contains_key(id) {
            all.clear();
        }
        all.insert(id.to_string(), known.clone());
        known
    }
}
