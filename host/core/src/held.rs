//! Held changes (contract K7): a change to a contribution marked `refresh = "boundary"` waits
//! for the next cache-cold point instead of breaking a warm prefix.
//!
//! A plugin, or some of its sections and tools, may be marked (config `[plugins.ID] refresh`,
//! or, where the config says nothing, the plugin's own `refresh`, world 0.3.0).
//! When a step's header would change and **every** part that changed is marked, the session
//! keeps sending its recorded header, and the step's marker lists what is held ([`Held`]).
//! The change is applied — a new header, whose event says what it releases and why
//! ([`Released`]) — at the first of:
//!
//! - a change that breaks the prefix anyway: an unmarked part, the model, the TTL, the layout;
//! - a compaction or trimmed history since the last step;
//! - an idle gap since the session's last recorded reply that passed the cache's TTL;
//! - a change held for `max_stale_s` (the smallest of the plugins concerned).
//!
//! A part marked `session` is held past the last two: only a break that happens anyway
//! releases it, so a session keeps what it was first sent.
//!
//! A new session takes the current parts from its first step. Never held: a part whose
//! plugin was removed, a part that moved to another plugin, and a part whose plugin's trust
//! changed. Contexts are not held: a changed snapshot is a new message at the end of the
//! request, which breaks no cached prefix.
//!
//! Whether a step held is decided once, when it is planned; the log records the header that
//! was sent, so a rebuild never decides again.
//!
//! ```
//! use promptd_core::held::{Held, Kind};
//!
//! let held = Held {
//!     kind: Kind::Section,
//!     name: "skills".into(),
//!     plugin: "catalogue".into(),
//!     since_step: 41,
//!     since_ms: None,
//!     kept_bytes: 37_000,
//!     unavailable: None,
//! };
//! assert_eq!(
//!     held.to_string(),
//!     "section `skills` of plugin `catalogue` held since step 41, 37 kB of cached prefix kept"
//! );
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::provenance::{Given, Provenance};

pub use crate::plugin::refresh::Kind;
use crate::plugin::refresh::Refresh;

/// One changed part a step did not send yet (recorded in its marker).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Held {
    /// A section or a tool.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// The plugin that gives it.
    pub plugin: String,
    /// The first step that held it.
    pub since_step: u64,
    /// When that step was planned (ms since the Unix epoch); absent where the planner had no
    /// clock (a replay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// About how many bytes of the request a provider could keep serving from cache because
    /// the change waits: what follows the part's place in the header, and the messages.
    pub kept_bytes: u64,
    /// Set when the part is kept because its plugin failed (K8: an MCP server down, a
    /// plugin quarantined): why it is unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, name, plugin) = (self.kind.as_str(), &self.name, &self.plugin);
        match &self.unavailable {
            None => write!(f, "{kind} `{name}` of plugin `{plugin}` held")?,
            Some(cause) => write!(
                f,
                "{kind} `{name}` of plugin `{plugin}` kept (unavailable: {cause})"
            )?,
        }
        write!(
            f,
            " since step {}, {} kB of cached prefix kept",
            self.since_step,
            self.kept_bytes.div_ceil(1000)
        )
    }
}

/// What a new header applies of what was held, and why now (recorded with the header).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Released {
    /// The cold point, in words: `compaction`, `idle 312 s passed the 300 s TTL`, `held 3600
    /// s, its max_stale_s`, or the change that broke the prefix anyway.
    pub cause: String,
    /// What the last step held.
    pub held: Vec<Held>,
}

/// What a step whose header would change does.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep sending the recorded header; these parts wait.
    Hold(Vec<Held>),
    /// Record the new header; when something was held, what it releases.
    Apply(Option<Released>),
}

/// What [`decide`] knows of the session beside the two provenances.
#[derive(Debug)]
pub struct Moment<'a> {
    /// The step being planned.
    pub step: u64,
    /// Now, in ms since the Unix epoch (none in a replay).
    pub now_ms: Option<u64>,
    /// When the last reply recorded in the session was sent.
    pub last_reply_ms: Option<u64>,
    /// How long the provider keeps the session's prefix (the TTL of its cache rules).
    pub ttl_ms: u64,
    /// History was trimmed or compacted since the last step.
    pub compacted: bool,
    /// What the last step held.
    pub held: &'a [Held],
    /// The header's system text, to place a section's change.
    pub system: &'a str,
    /// Each tool's serialized size, in the header's order.
    pub tool_bytes: &'a [usize],
    /// The bytes of the session's messages.
    pub message_bytes: u64,
}

/// What a step does when its header would change from `recorded` (the provenance of the
/// header being sent) to `current` (this step's assembly); `refresh` gives each plugin still
/// loaded its policy, and `rest_changed` names a change outside sections and tools (the
/// model, the TTL, the layout), if any.
pub fn decide(
    recorded: Option<&Provenance>,
    current: &Provenance,
    plugins: &dyn Fn(&str) -> Policy,
    rest_changed: Option<&str>,
    moment: &Moment<'_>,
) -> Decision {
    let release = |cause: String| {
        Decision::Apply((!moment.held.is_empty()).then(|| Released {
            cause,
            held: moment.held.to_vec(),
        }))
    };
    if let Some(rest) = rest_changed {
        return release(rest.to_string());
    }
    let Some(recorded) = recorded else {
        return Decision::Apply(None);
    };
    let mut changed = Vec::new();
    for (kind, old, new) in [
        (Kind::Section, &recorded.sections, &current.sections),
        (Kind::Tool, &recorded.tools, &current.tools),
    ] {
        match changes(old, new) {
            Some(names) => changed.extend(names.into_iter().map(|n| (kind, n))),
            None => return release(format!("the {}s were reordered", kind.as_str())),
        }
    }
    if changed.is_empty() {
        return Decision::Apply(None);
    }
    let mut max_stale_s = u64::MAX;
    // Parts held for the session (`refresh = "session"`) wait past any idle gap and age.
    let mut for_session = true;
    let mut parts = Vec::with_capacity(changed.len());
    for (kind, (name, plugin)) in changed {
        let Some(plugin) = plugin else {
            return release(format!(
                "{} `{name}` moved to another plugin",
                kind.as_str()
            ));
        };
        let what = format!("{} `{name}` of plugin `{plugin}`", kind.as_str());
        let (policy, unavailable) = match plugins(&plugin) {
            Policy::Loaded(policy) => (policy, None),
            // K8: every part stays, until a cold point.
            Policy::Kept(cause) => (
                Refresh {
                    whole: true,
                    max_stale_s: u64::MAX,
                    ..Refresh::default()
                },
                Some(cause),
            ),
            Policy::Removed => return release(format!("{what}: the plugin was removed")),
        };
        if !policy.holds(kind, &name) {
            return release(format!("{what} changed and is not held"));
        }
        if unavailable.is_none()
            && recorded.data.contains(&plugin) != current.data.contains(&plugin)
        {
            return release(format!("{what}: the plugin's trust changed"));
        }
        if unavailable.is_some() || !policy.for_session(kind, &name) {
            for_session = false;
            max_stale_s = max_stale_s.min(policy.max_stale_s);
        }
        parts.push((kind, name, plugin, unavailable));
    }
    if moment.compacted {
        return release("compaction".into());
    }
    if let (Some(now), Some(last), false) = (moment.now_ms, moment.last_reply_ms, for_session) {
        let idle = now.saturating_sub(last);
        if idle >= moment.ttl_ms {
            return release(format!(
                "idle {} s passed the {} s TTL",
                idle / 1000,
                moment.ttl_ms / 1000
            ));
        }
    }
    let mut held = Vec::with_capacity(parts.len());
    for (kind, name, plugin, unavailable) in parts {
        let before = moment
            .held
            .iter()
            .find(|h| h.kind == kind && h.name == name && h.plugin == plugin);
        let (since_step, since_ms) =
            before.map_or((moment.step, moment.now_ms), |h| (h.since_step, h.since_ms));
        if let (Some(now), Some(since)) = (moment.now_ms, since_ms) {
            let held_s = now.saturating_sub(since) / 1000;
            if held_s >= max_stale_s {
                return release(format!("held {held_s} s, its max_stale_s is {max_stale_s}"));
            }
        }
        let kept_bytes = kept(kind, &name, recorded, moment);
        held.push(Held {
            kind,
            name,
            plugin,
            since_step,
            since_ms,
            kept_bytes,
            unavailable,
        });
    }
    Decision::Hold(held)
}

/// What [`decide`] is told of the plugin a changed part came from.
#[derive(Debug)]
pub enum Policy {
    /// Loaded, with its `refresh`.
    Loaded(Refresh),
    /// Gone for a failure, its tools kept until a cold point (K8), with why.
    Kept(String),
    /// Gone: its parts are never held.
    Removed,
}

/// The names whose part changed between `old` and `new` (added, removed, other text or
/// plugin), each with its plugin (`None` when it moved between plugins); `None` when the
/// parts both have are in another order.
fn changes(old: &[Given], new: &[Given]) -> Option<Vec<(String, Option<String>)>> {
    let old_by: BTreeMap<&str, &Given> = old.iter().map(|g| (g.name.as_str(), g)).collect();
    let new_by: BTreeMap<&str, &Given> = new.iter().map(|g| (g.name.as_str(), g)).collect();
    let common_old = old.iter().filter(|g| new_by.contains_key(g.name.as_str()));
    let common_new = new.iter().filter(|g| old_by.contains_key(g.name.as_str()));
    if !common_old.map(|g| &g.name).eq(common_new.map(|g| &g.name)) {
        return None;
    }
    let mut changed = Vec::new();
    for name in old_by.keys().chain(new_by.keys()).collect::<BTreeSet<_>>() {
        let (o, n) = (old_by.get(name), new_by.get(name));
        let plugin = match (o, n) {
            (Some(o), Some(n))
                if o.plugin == n.plugin && o.scope == n.scope && o.text == n.text =>
            {
                continue
            }
            (Some(o), Some(n)) if o.plugin != n.plugin => None,
            (Some(g), _) | (_, Some(g)) => Some(g.plugin.clone()),
            (None, None) => continue,
        };
        changed.push((name.to_string(), plugin));
    }
    Some(changed)
}

/// About what a change to `name` would have made a provider write again: the header after
/// the part's place (tools come before the system text in every provider's prefix), and
/// every message.
fn kept(kind: Kind, name: &str, recorded: &Provenance, moment: &Moment<'_>) -> u64 {
    let after_system = match kind {
        Kind::Section => {
            // Sections are joined in order: the text before this one is kept either way.
            let before: usize = recorded
                .sections
                .iter()
                .take_while(|g| g.name != name)
                .count();
            let skip = moment
                .system
                .split("\n\n")
                .take(before)
                .map(|p| p.len() + 2)
                .sum::<usize>();
            moment.system.len().saturating_sub(skip)
        }
        Kind::Tool => {
            let at = recorded
                .tools
                .iter()
                .position(|g| g.name == name)
                .unwrap_or(0);
            moment.tool_bytes.iter().skip(at).sum::<usize>() + moment.system.len()
        }
    };
    after_system as u64 + moment.message_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(name: &str, plugin: &str, text: &str) -> Given {
        Given {
            name: name.into(),
            plugin: plugin.into(),
            scope: "global".into(),
            text: Some(text.into()),
        }
    }

    fn provenance(sections: Vec<Given>, tools: Vec<Given>) -> Provenance {
        Provenance {
            sections,
            tools,
            ..Provenance::default()
        }
    }

    fn moment(held: &[Held]) -> Moment<'_> {
        Moment {
            step: 5,
            now_ms: Some(1_000_000),
            last_reply_ms: Some(990_000),
            ttl_ms: 300_000,
            compacted: false,
            held,
            system: "a\n\nbb",
            tool_bytes: &[10, 20],
            message_bytes: 100,
        }
    }

    /// The `skills` section of plugin `cat` changed, the rest as [`old`].
    fn skills_changed() -> Provenance {
        provenance(
            vec![given("persona", "p", "1"), given("skills", "cat", "2")],
            vec![given("grep", "t", "1")],
        )
    }

    /// That change, held since step 3 (at 900 s).
    fn skills_held_since_step_3() -> Held {
        Held {
            kind: Kind::Section,
            name: "skills".into(),
            plugin: "cat".into(),
            since_step: 3,
            since_ms: Some(900_000),
            kept_bytes: 1,
            unavailable: None,
        }
    }

    fn boundary(plugin: &str) -> Policy {
        match plugin {
            "gone" => Policy::Removed,
            "down" => Policy::Kept("server `down` exited".into()),
            _ => Policy::Loaded(Refresh {
                sections: ["skills".to_string()].into(),
                tools: BTreeSet::new(),
                ..Refresh::default()
            }),
        }
    }

    fn old() -> Provenance {
        provenance(
            vec![given("persona", "p", "1"), given("skills", "cat", "1")],
            vec![given("grep", "t", "1")],
        )
    }

    #[test]
    fn k7_a_change_only_to_marked_parts_is_held_with_what_it_keeps() {
        let new = provenance(
            vec![given("persona", "p", "1"), given("skills", "cat", "2")],
            vec![given("grep", "t", "1")],
        );
        let Decision::Hold(held) = decide(Some(&old()), &new, &boundary, None, &moment(&[])) else {
            panic!("held")
        };
        assert_eq!(held.len(), 1);
        assert_eq!((held[0].since_step, held[0].since_ms), (5, Some(1_000_000)));
        // "bb" after "a\n\n", and the messages.
        assert_eq!(held[0].kept_bytes, 2 + 100);
        // The next step keeps the first step's since.
        let mut later = moment(&held);
        later.step = 6;
        later.now_ms = Some(1_001_000);
        let Decision::Hold(again) = decide(Some(&old()), &new, &boundary, None, &later) else {
            panic!("held")
        };
        assert_eq!(
            (again[0].since_step, again[0].since_ms),
            (5, Some(1_000_000))
        );
    }

    #[test]
    fn k7_an_unmarked_change_a_move_a_removal_or_a_trust_change_applies_everything() {
        let held = [Held {
            kind: Kind::Section,
            name: "skills".into(),
            plugin: "cat".into(),
            since_step: 3,
            since_ms: Some(0),
            kept_bytes: 1,
            unavailable: None,
        }];
        let m = moment(&held);
        let cases = [
            (
                provenance(
                    vec![given("persona", "p", "2"), given("skills", "cat", "2")],
                    vec![given("grep", "t", "1")],
                ),
                "section `persona` of plugin `p` changed and is not held",
            ),
            (
                provenance(
                    vec![given("persona", "p", "1"), given("skills", "other", "1")],
                    vec![given("grep", "t", "1")],
                ),
                "moved to another plugin",
            ),
            (
                provenance(
                    vec![given("persona", "p", "1"), given("skills", "gone", "2")],
                    vec![given("grep", "t", "1")],
                ),
                "moved to another plugin",
            ),
            (
                provenance(
                    vec![given("skills", "cat", "1"), given("persona", "p", "1")],
                    vec![given("grep", "t", "1")],
                ),
                "reordered",
            ),
        ];
        for (new, cause) in cases {
            match decide(Some(&old()), &new, &boundary, None, &m) {
                Decision::Apply(Some(r)) => {
                    assert!(r.cause.contains(cause), "{} vs {cause}", r.cause);
                    assert_eq!(r.held, held);
                }
                other => panic!("{cause}: {other:?}"),
            }
        }
        // A removed plugin's parts are never held.
        let removed = |_: &str| Policy::Removed;
        let new = provenance(
            vec![given("persona", "p", "1")],
            vec![given("grep", "t", "1")],
        );
        let Decision::Apply(Some(r)) = decide(Some(&old()), &new, &removed, None, &m) else {
            panic!("applied")
        };
        assert!(r.cause.contains("the plugin was removed"), "{}", r.cause);
        // A trust change is never held.
        let mut new = old();
        new.sections[1].text = Some("2".into());
        new.data.insert("cat".into());
        let Decision::Apply(Some(r)) = decide(Some(&old()), &new, &boundary, None, &m) else {
            panic!("applied")
        };
        assert!(r.cause.contains("trust changed"), "{}", r.cause);
        // A change outside sections and tools.
        let Decision::Apply(Some(r)) =
            decide(Some(&old()), &new, &boundary, Some("the model changed"), &m)
        else {
            panic!("applied")
        };
        assert_eq!(r.cause, "the model changed");
    }

    #[test]
    fn k7_a_cold_point_applies_what_was_held() {
        let (new, held) = (skills_changed(), [skills_held_since_step_3()]);
        let cause = |m: Moment<'_>| match decide(Some(&old()), &new, &boundary, None, &m) {
            Decision::Apply(Some(r)) => r.cause,
            other => panic!("{other:?}"),
        };
        let mut m = moment(&held);
        m.compacted = true;
        assert_eq!(cause(m), "compaction");
        let mut m = moment(&held);
        m.last_reply_ms = Some(600_000);
        assert_eq!(cause(m), "idle 400 s passed the 300 s TTL");
        let mut m = moment(&held);
        m.now_ms = Some(900_000 + 3_600_000);
        m.last_reply_ms = m.now_ms;
        assert_eq!(cause(m), "held 3600 s, its max_stale_s is 3600");
        // Without a clock (a replay), only the other cold points apply.
        let mut m = moment(&held);
        m.now_ms = None;
        assert!(matches!(
            decide(Some(&old()), &new, &boundary, None, &m),
            Decision::Hold(_)
        ));
    }

    #[test]
    fn k8_a_failed_plugins_parts_are_kept_until_a_cold_point_whatever_its_refresh() {
        let old = provenance(
            vec![given("persona", "p", "1")],
            vec![given("grep", "t", "1"), given("down_tool", "down", "1")],
        );
        // The server is gone: its tool is missing from the assembly.
        let new = provenance(
            vec![given("persona", "p", "1")],
            vec![given("grep", "t", "1")],
        );
        let Decision::Hold(kept) = decide(Some(&old), &new, &boundary, None, &moment(&[])) else {
            panic!("kept")
        };
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].unavailable.as_deref(), Some("server `down` exited"));
        assert!(
            kept[0]
                .to_string()
                .starts_with("tool `down_tool` of plugin `down` kept (unavailable: server `down` exited) since step 5, "),
            "{}",
            kept[0]
        );
        // No max_stale_s: a year later, still kept while the session is warm.
        let mut later = moment(&kept);
        later.now_ms = Some(1_000_000 + 365 * 86_400_000);
        later.last_reply_ms = later.now_ms;
        assert!(matches!(
            decide(Some(&old), &new, &boundary, None, &later),
            Decision::Hold(_)
        ));
        // A cold point drops it.
        let mut cold = moment(&kept);
        cold.compacted = true;
        assert!(matches!(
            decide(Some(&old), &new, &boundary, None, &cold),
            Decision::Apply(Some(_))
        ));
    }

    #[test]
    fn w4_a_part_held_for_the_session_outlasts_idleness_and_age_but_not_a_compaction() {
        let session = |_: &str| {
            Policy::Loaded(Refresh {
                session: [(Kind::Section, "skills".to_string())].into(),
                ..Refresh::default()
            })
        };
        let (new, held) = (skills_changed(), [skills_held_since_step_3()]);
        // Idle past the TTL and held a day: still held.
        let mut m = moment(&held);
        m.now_ms = Some(900_000 + 86_400_000);
        m.last_reply_ms = Some(900_000);
        assert!(matches!(
            decide(Some(&old()), &new, &session, None, &m),
            Decision::Hold(_)
        ));
        let mut m = moment(&held);
        m.compacted = true;
        assert!(matches!(
            decide(Some(&old()), &new, &session, None, &m),
            Decision::Apply(Some(_))
        ));
    }
}
