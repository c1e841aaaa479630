//! Who watches steps and records: the [`StepObserver`] trait, the outcomes it reads
//! ([`StepOutcome`], [`RecordOutcome`]) and the daemon's own types for what they carry
//! (stage timings, header and prefix facts). The daemon names no exporter: the metrics it
//! shows at `/metrics` are one observer, telemetry (`promptd-telemetry`) another, wired in by
//! the binary ([`Observers::add`]).

use std::sync::{Arc, RwLock};
use std::time::SystemTime;

// What the outcomes carry lives with them (below the observers that read them).
pub(crate) use crate::outcome::facts::HeaderFactsCache;
pub use crate::outcome::facts::{HeaderFacts, PrefixFacts, ReplyFacts, StepFacts};
pub(crate) use crate::outcome::timeline::Timeline;
pub use crate::outcome::timeline::{Stage, Work};
pub use crate::outcome::TraceContext;

use crate::metrics::{Metrics, Sample};
use crate::outcome::{RecordOutcome, StepOutcome};
use crate::DaemonError;
use promptd_core::sync::read;

/// What an observer wants measured of a step or record beyond its outcome: these cost time on
/// the step's path, so they are gathered only when some observer asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Detail {
    /// Stage timings, header facts, and (for a step that broke its prefix) the prefix diff.
    pub traced: bool,
    /// Message and system texts.
    pub content: bool,
}

impl std::ops::BitOr for Detail {
    type Output = Detail;
    fn bitor(self, other: Detail) -> Detail {
        Detail {
            traced: self.traced || other.traced,
            content: self.content || other.content,
        }
    }
}

/// Whoever watches the daemon's steps and records (metrics, telemetry). Every method has a
/// default that does nothing; none may block (they run on the step's thread).
pub trait StepObserver: Send + Sync {
    /// What it wants gathered for a step of `session` (with the client's `trace`).
    fn step_detail(&self, _session: &str, _trace: Option<&TraceContext>) -> Detail {
        Detail::default()
    }

    /// What it wants gathered for a message recorded in `session`.
    fn record_detail(&self, _session: &str, _trace: Option<&TraceContext>) -> Detail {
        Detail::default()
    }

    /// A session was created for `agent` at `at`.
    fn session_created(
        &self,
        _session: &str,
        _agent: &str,
        _at: SystemTime,
        _trace: Option<&TraceContext>,
    ) {
    }

    /// A step ended: served (`error` is `None`), refused or cancelled (`outcome` then holds
    /// what was known when it stopped).
    fn step(&self, _outcome: &StepOutcome, _error: Option<&DaemonError>) {}

    /// A message was recorded, or refused.
    fn record(&self, _outcome: &RecordOutcome, _error: Option<&DaemonError>) {}

    /// Counters of its own that `/metrics` shows.
    fn samples(&self) -> Vec<Sample> {
        Vec::new()
    }
}

/// The daemon's observers: its metrics (always, a [`StepObserver`] too) and those the binary
/// adds.
#[derive(Default)]
pub struct Observers {
    /// The counters `GET /metrics` shows.
    pub metrics: Metrics,
    added: RwLock<Arc<[Arc<dyn StepObserver>]>>,
    /// What spans say of each session's last header (bounded, refilled on a miss).
    pub(crate) header_facts: HeaderFactsCache,
}

impl Observers {
    /// Adds `observer`: it sees every step and record from now on.
    pub fn add(&self, observer: Arc<dyn StepObserver>) {
        let mut added = self.added.write().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = added.iter().cloned().collect();
        all.push(observer);
        *added = all.into();
    }

    /// The observers added, in the order they were.
    pub fn added(&self) -> Arc<[Arc<dyn StepObserver>]> {
        read(&self.added).clone()
    }

    pub(crate) fn step_detail(&self, session: &str, trace: Option<&TraceContext>) -> Detail {
        self.added()
            .iter()
            .fold(Detail::default(), |d, o| d | o.step_detail(session, trace))
    }

    pub(crate) fn record_detail(&self, session: &str, trace: Option<&TraceContext>) -> Detail {
        self.added().iter().fold(Detail::default(), |d, o| {
            d | o.record_detail(session, trace)
        })
    }

    pub(crate) fn session_created(&self, session: &str, agent: &str, trace: Option<&TraceContext>) {
        let added = self.added();
        if added.is_empty() {
            return;
        }
        let at = SystemTime::now();
        for o in added.iter() {
            o.session_created(session, agent, at, trace);
        }
    }

    pub(crate) fn step(&self, outcome: &StepOutcome, error: Option<&DaemonError>) {
        StepObserver::step(&self.metrics, outcome, error);
        for o in self.added().iter() {
            o.step(outcome, error);
        }
    }

    pub(crate) fn record(&self, outcome: &RecordOutcome, error: Option<&DaemonError>) {
        StepObserver::record(&self.metrics, outcome, error);
        for o in self.added().iter() {
            o.record(outcome, error);
        }
    }

    /// The samples every added observer shows at `/metrics`.
    pub(crate) fn samples(&self) -> Vec<Sample> {
        self.added().iter().flat_map(|o| o.samples()).collect()
    }
}
