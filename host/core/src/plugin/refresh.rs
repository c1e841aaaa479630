//! What `[plugins.ID] refresh` marks (K7): the sections and tools of a plugin whose changes
//! wait for the next cache-cold point, and for how long. What a step holds is decided above,
//! in `held`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The `max_stale_s` of a plugin whose config sets none: an hour, the longest TTL a provider
/// documents for a prompt cache, so a held change is never older than any cache it saves.
pub const DEFAULT_MAX_STALE_S: u64 = 3600;

/// Which of one plugin's parts wait for a cache-cold point (`[plugins.ID] refresh`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refresh {
    /// Every section and tool of the plugin (`refresh = "boundary"`).
    pub whole: bool,
    /// These sections (`refresh = { sections = [...] }`).
    pub sections: BTreeSet<String>,
    /// These tools (`refresh = { tools = [...] }`).
    pub tools: BTreeSet<String>,
    /// How long a change may be held, in seconds.
    pub max_stale_s: u64,
}

impl Default for Refresh {
    fn default() -> Self {
        Refresh {
            whole: false,
            sections: BTreeSet::new(),
            tools: BTreeSet::new(),
            max_stale_s: DEFAULT_MAX_STALE_S,
        }
    }
}

impl Refresh {
    /// Whether a change to part `name` of `kind` waits for a cold point.
    pub fn holds(&self, kind: Kind, name: &str) -> bool {
        self.whole
            || match kind {
                Kind::Section => self.sections.contains(name),
                Kind::Tool => self.tools.contains(name),
            }
    }

    /// Whether nothing of the plugin is held (`refresh = "step"`, the default).
    pub fn is_step(&self) -> bool {
        !self.whole && self.sections.is_empty() && self.tools.is_empty()
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
