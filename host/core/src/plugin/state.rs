//! The states a plugin file can be in and the registry changes clients are told about (R5),
//! with their stable string forms (shown in `GET /v1/plugins` and the event stream).

use std::fmt;

use serde::{Serialize, Serializer};

/// Where one plugin file stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::ToSchema),
    schema(rename_all = "lowercase")
)]
pub enum PluginState {
    /// The file's current bytes serve.
    Loaded,
    /// The file never loaded; nothing of it serves.
    Refused,
    /// The file's new bytes were refused; an older version keeps serving (H3).
    Stale,
    /// It failed too often and left the registry until its file changes or it is enabled (L3).
    Quarantined,
    /// An MCP server that failed `max_failures` times in a row: no longer retried until its
    /// config changes or it is enabled.
    Failed,
}

impl PluginState {
    /// The state's name in the API: `loaded`, `refused`, `stale`, `quarantined` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginState::Loaded => "loaded",
            PluginState::Refused => "refused",
            PluginState::Stale => "stale",
            PluginState::Quarantined => "quarantined",
            PluginState::Failed => "failed",
        }
    }
}

/// One kind of applied registry change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "openapi",
    derive(utoipa::ToSchema),
    schema(rename_all = "lowercase")
)]
pub enum ChangeKind {
    /// A new file loaded.
    Load,
    /// A changed file (or a changed MCP server) loaded in place of its old version.
    Reload,
    /// A plugin left the registry: its file was removed, or a call unloaded it.
    Unload,
    /// A file's bytes were refused.
    Refused,
    /// A plugin left the registry after failing too often (L3).
    Quarantine,
    /// An MCP server was given up on after failing `max_failures` times in a row.
    Failed,
}

impl ChangeKind {
    /// The change's name in the API: `load`, `reload`, `unload`, `refused`, `quarantine` or
    /// `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Load => "load",
            ChangeKind::Reload => "reload",
            ChangeKind::Unload => "unload",
            ChangeKind::Refused => "refused",
            ChangeKind::Quarantine => "quarantine",
            ChangeKind::Failed => "failed",
        }
    }
}

macro_rules! as_string {
    ($($ty:ty),*) => {$(
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    )*};
}

as_string!(PluginState, ChangeKind);
