//! What one plugin may do and use (SPEC L1, L2): capabilities and limits, as plain data.
//!
//! Defaults grant nothing: no files, no environment variables, no arguments, no network, no
//! stdin. The config grants per plugin read-only directories and named environment variables,
//! and says whether the plugin's stdout/stderr go to the host log or nowhere.

use std::path::PathBuf;
use std::time::Duration;

use crate::limits::defaults;

/// Capabilities and limits for one plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    /// Wall-clock budget of compiling the plugin (L7); a cached compile costs nothing.
    pub compile_deadline: Duration,
    /// Address space of the process compiling the plugin, in bytes (L7).
    pub compile_memory_bytes: u64,
    /// Wall-clock budget of one call into the plugin (declare and every dynamic call).
    pub call_deadline: Duration,
    /// Largest linear memory one instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Largest text or value one call may return, in bytes.
    pub max_output_bytes: usize,
    /// Read-only directories: (host path, path the plugin sees).
    pub dirs: Vec<(PathBuf, String)>,
    /// Environment variables the plugin sees: (name, value read from the host at load).
    pub env: Vec<(String, String)>,
    /// Whether the plugin's stdout/stderr go to the host log (tagged with its id).
    pub stdio_to_log: bool,
    /// Most warm instances kept at once, so that many assemblies can call the plugin at the
    /// same time (each has its own memory, up to `memory_bytes`).
    pub max_instances: usize,
    /// Most bytes one call (declare included) may write to the host log (L9).
    pub log_bytes_per_call: usize,
    /// Most log records per second from this plugin, all instances together (L9).
    pub log_lines_per_s: u32,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            compile_deadline: Duration::from_millis(defaults::COMPILE_TIMEOUT_MS),
            compile_memory_bytes: defaults::COMPILE_MEMORY_MB << 20,
            call_deadline: Duration::from_millis(defaults::TIMEOUT_MS),
            memory_bytes: (defaults::MEMORY_MB << 20) as usize,
            max_output_bytes: (defaults::MAX_OUTPUT_KB << 10) as usize,
            dirs: Vec::new(),
            env: Vec::new(),
            stdio_to_log: true,
            max_instances: defaults::INSTANCES as usize,
            log_bytes_per_call: (defaults::LOG_KB_PER_CALL << 10) as usize,
            log_lines_per_s: defaults::LOG_LINES_PER_S as u32,
        }
    }
}

/// How much one plugin may declare (L8), checked at load before anything else, so a hostile
/// declaration is refused before it costs the registry, every header and every log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeclarationLimits {
    /// Most sections one plugin may declare.
    pub max_sections: usize,
    /// Most contexts one plugin may declare.
    pub max_contexts: usize,
    /// Most variables one plugin may declare.
    pub max_variables: usize,
    /// Most tools one plugin may declare.
    pub max_tools: usize,
    /// Longest section, context or variable name and scope key, in bytes (tool names have
    /// their own rule, C4).
    pub max_name_bytes: usize,
    /// All names, static texts, tool descriptions and parameters together, in bytes.
    pub max_declared_bytes: usize,
}

impl Default for DeclarationLimits {
    fn default() -> Self {
        Self {
            max_sections: defaults::MAX_SECTIONS as usize,
            max_contexts: defaults::MAX_CONTEXTS as usize,
            max_variables: defaults::MAX_VARIABLES as usize,
            max_tools: defaults::MAX_TOOLS as usize,
            max_name_bytes: defaults::MAX_NAME_BYTES as usize,
            max_declared_bytes: (defaults::MAX_DECLARED_KB << 10) as usize,
        }
    }
}
