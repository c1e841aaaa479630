//! What a step's stages and plugin calls took, for telemetry: core announces the start and end
//! of each to an [`Observe`] the caller gives ([`crate::step::Serving::observe`]), and the
//! observer reads the clock. Core itself never does, so a step planned with an observer is
//! byte for byte the step planned without one.

use crate::plugin::registry::PluginEntry;

/// One stage of a step, or one call into a plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity<'a> {
    /// Stage 1: assembling the plugins' contributions (the calls below happen inside it).
    Assembly,
    /// One call into a plugin during assembly.
    Call {
        /// The plugin's id.
        plugin: &'a str,
        /// The SHA-256 of the file it was loaded from, when known.
        sha256: Option<&'a str>,
        /// What was asked: `evaluate` (a batch), `section`, `context`, `variable` or
        /// `shown-tools`.
        what: &'static str,
    },
    /// Stage 3: one review hook (Q18), shown the step's new messages.
    Review {
        /// The hook's plugin id.
        plugin: &'a str,
        /// The SHA-256 of the file it was loaded from, when known.
        sha256: Option<&'a str>,
    },
    /// Stage 8: measuring the request against the agent's budget, and trimming history.
    Budget,
}

impl<'a> Activity<'a> {
    /// A call into `entry`.
    pub fn call(entry: &'a PluginEntry, what: &'static str) -> Activity<'a> {
        Activity::Call {
            plugin: &entry.id,
            sha256: entry.sha256.as_deref(),
            what,
        }
    }
}

/// Told when each [`Activity`] starts and ends, on the thread that plans the step, in order
/// and properly nested (a call starts and ends inside its assembly).
pub trait Observe: Sync + std::fmt::Debug {
    /// `activity` starts.
    fn begin(&self, activity: &Activity<'_>);
    /// `activity` ended; `failed` says why when it failed.
    fn end(&self, activity: &Activity<'_>, failed: Option<&str>);
}

/// Runs `f` as `activity`, told to `observe` when there is one.
pub fn observed<T, E: std::fmt::Display>(
    observe: Option<&dyn Observe>,
    activity: Activity<'_>,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let Some(observe) = observe else {
        return f();
    };
    observe.begin(&activity);
    let result = f();
    match &result {
        Ok(_) => observe.end(&activity, None),
        Err(e) => observe.end(&activity, Some(&e.to_string())),
    }
    result
}
