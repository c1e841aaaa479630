//! What the daemon tells telemetry (`promptd-telemetry`): a step's and a record's stages as
//! core announces them ([`Timeline`]), and the facts of each, as plain records.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use promptd_core::budget::{Counter, Size};
use promptd_core::conversation::Header;
use promptd_core::observe::{Activity, Observe};
use promptd_core::provenance::Provenance;
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

/// Most sessions whose header facts are kept (past it the map starts again).
const MAX_HEADER_FACTS: usize = 4096;

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

    /// What spans say of session `id`'s header `header`: computed when it is new (`fresh`)
    /// or not known here, else the last one's.
    pub(crate) fn header_facts(
        &self,
        id: &str,
        header: &Header,
        provenance: Option<&Provenance>,
        counter: &dyn Counter,
        fresh: bool,
    ) -> Arc<HeaderFacts> {
        if !fresh {
            if let Some(known) = lock(&self.header_facts).get(id) {
                return known.clone();
            }
        }
        let known = Arc::new(HeaderFacts::of(header, provenance, counter, |p| {
            self.telemetry()
                .map_or_else(|| Arc::from(p), |t| t.shared(p))
        }));
        let mut all = lock(&self.header_facts);
        if all.len() >= MAX_HEADER_FACTS && !all.contains_key(id) {
            all.clear();
        }
        all.insert(id.to_string(), known.clone());
        known
    }
}

/// What a step's span says of its header, computed once per header.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct HeaderFacts {
    /// The system prompt's SHA-256 (hex) and bytes.
    pub(crate) system: (String, usize),
    /// Each plugin's tools (name, description, schema) in tokens, by plugin id, sorted.
    pub(crate) tool_groups: Arc<Vec<(Arc<str>, u64)>>,
}

impl HeaderFacts {
    fn of(
        header: &Header,
        provenance: Option<&Provenance>,
        counter: &dyn Counter,
        shared: impl Fn(&str) -> Arc<str>,
    ) -> HeaderFacts {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(header.system.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let mut groups: BTreeMap<&str, u64> = BTreeMap::new();
        for tool in &header.tools {
            let plugin = provenance
                .and_then(|p| p.tools.iter().find(|g| g.name == tool.name))
                .map_or("unknown", |g| g.plugin.as_str());
            let schema = tool.parameters.to_string();
            let text = [tool.name.as_str(), &tool.description, &schema].join("\n");
            *groups.entry(plugin).or_default() += Size::of(&text, counter).tokens as u64;
        }
        HeaderFacts {
            system: (hex, header.system.len()),
            tool_groups: Arc::new(groups.into_iter().map(|(p, t)| (shared(p), t)).collect()),
        }
    }
}
