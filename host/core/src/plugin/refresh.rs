//! What `[plugins.ID] refresh` marks (K7): the sections and tools of a plugin whose changes
//! wait for the next cache-cold point, and for how long. What a step holds is decided above,
//! in `held`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The `max_stale_s` of a plugin whose config sets none: an hour, the longest TTL a provider
/// documents for a prompt cache, so a held change is never older than any cache it saves.
pub const DEFAULT_MAX_STALE_S: u64 = 3600;

/// Which of one plugin's parts wait for a cache-cold point (`[plugins.ID] refresh`, or what
/// the plugin declares, world 0.3.0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refresh {
    /// Every section and tool of the plugin (`refresh = "boundary"`).
    pub whole: bool,
    /// These sections (`refresh = { sections = [...] }`).
    pub sections: BTreeSet<String>,
    /// These tools (`refresh = { tools = [...] }`).
    pub tools: BTreeSet<String>,
    /// Parts held for the whole session (`refresh = "session"`: every one): a cold point of
    /// idleness or age does not release them, only a break of the prefix that happens anyway.
    pub session: BTreeSet<(Kind, String)>,
    /// Every part held for the whole session (`refresh = "session"`).
    pub whole_session: bool,
    /// How long a change may be held, in seconds (session parts aside).
    pub max_stale_s: u64,
    /// Who set it.
    pub by: SetBy,
}

/// Who set a plugin's `refresh` or `defer`: `promptd plugins` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SetBy {
    /// Nobody: the default (`step`; nothing deferred).
    #[default]
    Default,
    /// The plugin's declaration (world 0.3.0).
    Plugin,
    /// The operator's `[plugins.ID]` table, which overrides the plugin.
    Config,
}

impl Default for Refresh {
    fn default() -> Self {
        Refresh {
            whole: false,
            sections: BTreeSet::new(),
            tools: BTreeSet::new(),
            session: BTreeSet::new(),
            whole_session: false,
            max_stale_s: DEFAULT_MAX_STALE_S,
            by: SetBy::Default,
        }
    }
}

impl Refresh {
    /// Whether a change to part `name` of `kind` waits for a cold point.
    pub fn holds(&self, kind: Kind, name: &str) -> bool {
        self.whole
            || self.for_session(kind, name)
            || match kind {
                Kind::Section => self.sections.contains(name),
                Kind::Tool => self.tools.contains(name),
            }
    }

    /// Whether a change to part `name` of `kind` waits for the session's end.
    pub fn for_session(&self, kind: Kind, name: &str) -> bool {
        self.whole_session || self.session.contains(&(kind, name.to_string()))
    }

    /// Whether nothing of the plugin is held (`refresh = "step"`, the default).
    pub fn is_step(&self) -> bool {
        !self.whole
            && !self.whole_session
            && self.sections.is_empty()
            && self.tools.is_empty()
            && self.session.is_empty()
    }

    /// What `declaration` says of its parts' refresh (world 0.3.0), with this policy's
    /// `max_stale_s`: for a plugin whose config sets no `refresh`.
    pub fn declared(&self, declaration: &crate::plugin::model::Declaration) -> Refresh {
        use crate::plugin::model::RefreshMode;
        let mut out = Refresh {
            max_stale_s: self.max_stale_s,
            ..Refresh::default()
        };
        let parts = (declaration.sections.iter())
            .map(|s| (Kind::Section, &s.name, s.refresh))
            .chain((declaration.tools.iter()).map(|t| (Kind::Tool, &t.name, t.refresh)));
        for (kind, name, mode) in parts {
            match (mode, kind) {
                (Some(RefreshMode::Boundary), Kind::Section) => {
                    out.sections.insert(name.clone());
                }
                (Some(RefreshMode::Boundary), Kind::Tool) => {
                    out.tools.insert(name.clone());
                }
                (Some(RefreshMode::Session), _) => {
                    out.session.insert((kind, name.clone()));
                }
                _ => continue,
            }
            out.by = SetBy::Plugin;
        }
        out
    }
}

/// The kind of a held part: the two that make a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A section of the system prompt.
    Section,
    /// A tool.
    Tool,
}

impl Kind {
    /// The name used in messages and config.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Section => "section",
            Kind::Tool => "tool",
        }
    }
}
