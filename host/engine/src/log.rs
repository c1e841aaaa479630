//! What a plugin writes to the host log — the `log` import, and stdout/stderr when forwarded —
//! under a budget (L9): at most `log_kb_per_call` bytes per call (declare included) and
//! `log_lines_per_s` records per second per plugin. What goes over is dropped and counted, and
//! one line says how much was dropped, so a looping logger costs a bounded amount of log.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use promptd_core::plugin::sandbox::Sandbox;
use promptd_core::sync::lock;

/// A log record's level, as the plugin asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// One plugin's budget, shared by all its instances: the per-second rate is per plugin.
pub(crate) struct PluginLog {
    plugin: Arc<str>,
    per_call_bytes: usize,
    per_second: u32,
    shared: Mutex<Shared>,
}

struct Shared {
    /// Records left in the current second, and when that second began.
    left: u32,
    window: Instant,
    dropped_records: u64,
    dropped_bytes: u64,
    /// Whether the dropped counts were over the per-call budget, the rate, or both.
    over_call: bool,
    over_rate: bool,
}

impl PluginLog {
    pub(crate) fn new(plugin: &str, sandbox: &Sandbox) -> Arc<Self> {
        Arc::new(Self {
            plugin: plugin.into(),
            per_call_bytes: sandbox.log_bytes_per_call,
            per_second: sandbox.log_lines_per_s,
            shared: Mutex::new(Shared {
                left: sandbox.log_lines_per_s,
                window: Instant::now(),
                dropped_records: 0,
                dropped_bytes: 0,
                over_call: false,
                over_rate: false,
            }),
        })
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        lock(&self.shared)
    }
}

/// The budget of the call an instance is running; a store's state and its stdout/stderr
/// streams share one.
pub(crate) struct CallLog {
    log: Arc<PluginLog>,
    used: Mutex<usize>,
}

impl CallLog {
    pub(crate) fn new(log: Arc<PluginLog>) -> Arc<Self> {
        Arc::new(Self {
            log,
            used: Mutex::new(0),
        })
    }

    /// A call starts: its byte budget is full again.
    pub(crate) fn begin(&self) {
        *lock(&self.used) = 0;
    }

    /// A call ended: if anything was dropped, one line says how much (`what` names the call).
    pub(crate) fn end(&self, what: &str) {
        let log = &self.log;
        let mut shared = log.shared();
        if shared.dropped_records == 0 {
            return;
        }
        let why = match (shared.over_call, shared.over_rate) {
            (true, true) => format!(
                "over {} KiB per call (limits.log_kb_per_call) and {} lines per second (limits.log_lines_per_s)",
                log.per_call_bytes >> 10,
                log.per_second
            ),
            (true, false) => format!(
                "over {} KiB per call (limits.log_kb_per_call)",
                log.per_call_bytes >> 10
            ),
            _ => format!(
                "over {} lines per second (limits.log_lines_per_s)",
                log.per_second
            ),
        };
        tracing::warn!(
            plugin = %log.plugin,
            "{what}: dropped {} log records ({} bytes) {why}",
            shared.dropped_records,
            shared.dropped_bytes
        );
        shared.dropped_records = 0;
        shared.dropped_bytes = 0;
        shared.over_call = false;
        shared.over_rate = false;
    }

    /// Writes one record if the budget allows, else counts it as dropped.
    pub(crate) fn write(&self, level: Level, stream: Option<&'static str>, message: &str) {
        let log = &self.log;
        let fits_call = {
            let mut used = lock(&self.used);
            let fits = *used + message.len() <= log.per_call_bytes;
            if fits {
                *used += message.len();
            }
            fits
        };
        let mut shared = log.shared();
        let now = Instant::now();
        if now.duration_since(shared.window) >= Duration::from_secs(1) {
            shared.window = now;
            shared.left = log.per_second;
        }
        let fits_rate = shared.left > 0;
        if !(fits_call && fits_rate) {
            shared.dropped_records += 1;
            shared.dropped_bytes += message.len() as u64;
            shared.over_call |= !fits_call;
            shared.over_rate |= !fits_rate;
            return;
        }
        shared.left -= 1;
        drop(shared);
        let plugin = &*log.plugin;
        match (level, stream) {
            (_, Some(stream)) => tracing::info!(plugin = %plugin, stream, "{message}"),
            (Level::Trace, None) => tracing::trace!(plugin = %plugin, "{message}"),
            (Level::Debug, None) => tracing::debug!(plugin = %plugin, "{message}"),
            (Level::Info, None) => tracing::info!(plugin = %plugin, "{message}"),
            (Level::Warn, None) => tracing::warn!(plugin = %plugin, "{message}"),
            (Level::Error, None) => tracing::error!(plugin = %plugin, "{message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(per_call_bytes: usize, per_second: u32) -> Sandbox {
        Sandbox {
            log_bytes_per_call: per_call_bytes,
            log_lines_per_s: per_second,
            ..Sandbox::default()
        }
    }

    #[test]
    fn l9_records_over_the_call_budget_are_counted_and_reported_once() {
        let call = CallLog::new(PluginLog::new("p", &sandbox(100, 1000)));
        call.begin();
        for _ in 0..10 {
            call.write(Level::Info, None, &"x".repeat(30));
        }
        {
            let shared = call.log.shared();
            assert_eq!((shared.dropped_records, shared.dropped_bytes), (7, 210));
            assert!(shared.over_call && !shared.over_rate);
        }
        call.end("declare");
        assert_eq!(call.log.shared().dropped_records, 0, "reported and reset");
        call.begin();
        call.write(Level::Info, None, &"x".repeat(90));
        assert_eq!(
            call.log.shared().dropped_records,
            0,
            "a new call has a new budget"
        );
    }

    #[test]
    fn l9_the_rate_is_per_plugin_across_instances() {
        let log = PluginLog::new("p", &sandbox(1 << 20, 5));
        let (a, b) = (CallLog::new(log.clone()), CallLog::new(log.clone()));
        a.begin();
        b.begin();
        for _ in 0..4 {
            a.write(Level::Warn, None, "a");
            b.write(Level::Warn, Some("stdout"), "b");
        }
        let shared = log.shared();
        assert_eq!(shared.dropped_records, 3);
        assert!(shared.over_rate && !shared.over_call);
    }
}
