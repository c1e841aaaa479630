//! Every limit's default, in one place, and the daemon-wide limits resolved from `[limits]`
//! ([`Limits`]). docs/configuration.md's limits table lists the same values; the per-plugin
//! limits resolve into [`crate::plugin::sandbox::Sandbox`] and [`crate::plugin::sandbox::DeclarationLimits`]
//! from these defaults too.
//!
//! ```
//! use promptd_core::config::Config;
//! use promptd_core::limits::{defaults, Limits};
//!
//! let config = Config::parse("[limits]\nquarantine_after = 0\nmax_body_mb = 8\n", "promptd.toml").unwrap();
//! let limits = config.limits();
//! assert_eq!(limits.quarantine_after, None); // 0 = never
//! assert_eq!(limits.max_body_bytes, 8 << 20);
//! assert_eq!(limits.max_connections, defaults::MAX_CONNECTIONS as usize);
//! assert_eq!(Limits::default(), Config::parse("", "promptd.toml").unwrap().limits());
//! ```

use std::time::Duration;

/// The default of each `[limits]` key (the key's name, upper-cased).
pub mod defaults {
    /// `timeout_ms`: deadline of one plugin call.
    pub const TIMEOUT_MS: u64 = 2_000;
    /// `memory_mb`: memory cap per plugin instance.
    pub const MEMORY_MB: u64 = 256;
    /// `compile_timeout_ms`: the bundled JavaScript and Python plugins take 10-30 s on 2 cores.
    pub const COMPILE_TIMEOUT_MS: u64 = 120_000;
    /// `compile_memory_mb`: address space of the process compiling one plugin.
    pub const COMPILE_MEMORY_MB: u64 = 2048;
    /// `compile_memory_total_mb`: address space of all compiling processes at once.
    pub const COMPILE_MEMORY_TOTAL_MB: u64 = 4096;
    /// `max_output_kb`: largest text one call may return.
    pub const MAX_OUTPUT_KB: u64 = 1024;
    /// `quarantine_after`: consecutive failed calls before a plugin is quarantined.
    pub const QUARANTINE_AFTER: u32 = 3;
    /// `instances`: warm instances per plugin.
    pub const INSTANCES: u64 = 2;
    /// `session_cache_mb`: memory for sessions kept between steps.
    pub const SESSION_CACHE_MB: u64 = 256;
    /// `header_timeout_ms`: time a connection has to send a whole request head (H6).
    pub const HEADER_TIMEOUT_MS: u64 = 10_000;
    /// `idle_timeout_ms`: time an idle connection may wait for its next request (H6).
    pub const IDLE_TIMEOUT_MS: u64 = 60_000;
    /// `body_timeout_ms`: time a request's body has to arrive whole, from its head (H6).
    pub const BODY_TIMEOUT_MS: u64 = 60_000;
    /// `bodies_in_flight_mb`: bytes of request bodies being read or served at once (H6).
    pub const BODIES_IN_FLIGHT_MB: u64 = 128;
    /// `max_connections`: connections kept open at once (H6).
    pub const MAX_CONNECTIONS: u64 = 512;
    /// `max_sections`: sections one plugin may declare.
    pub const MAX_SECTIONS: u64 = 1000;
    /// `max_contexts`: contexts one plugin may declare.
    pub const MAX_CONTEXTS: u64 = 1000;
    /// `max_variables`: variables one plugin may declare.
    pub const MAX_VARIABLES: u64 = 1000;
    /// `max_tools`: tools one plugin may declare.
    pub const MAX_TOOLS: u64 = 256;
    /// `max_name_bytes`: longest name or scope key.
    pub const MAX_NAME_BYTES: u64 = 128;
    /// `max_declared_kb`: everything one plugin declares together.
    pub const MAX_DECLARED_KB: u64 = 4096;
    /// `max_body_mb`: largest request body the daemon reads (images travel inside).
    pub const MAX_BODY_MB: u64 = 32;
    /// `max_block_kb`: largest image or document block, of its base64 text (about 7.5 MiB
    /// of image or PDF).
    pub const MAX_BLOCK_KB: u64 = 10 << 10;
    /// `log_kb_per_call`: log bytes one plugin call may write.
    pub const LOG_KB_PER_CALL: u64 = 64;
    /// `log_lines_per_s`: log records per second of one plugin.
    pub const LOG_LINES_PER_S: u64 = 100;

    /// Every `[limits]` key and its default, in docs/configuration.md's order.
    pub const ALL: [(&str, u64); 24] = [
        ("timeout_ms", TIMEOUT_MS),
        ("memory_mb", MEMORY_MB),
        ("max_output_kb", MAX_OUTPUT_KB),
        ("instances", INSTANCES),
        ("quarantine_after", QUARANTINE_AFTER as u64),
        ("max_sections", MAX_SECTIONS),
        ("max_contexts", MAX_CONTEXTS),
        ("max_variables", MAX_VARIABLES),
        ("max_tools", MAX_TOOLS),
        ("max_name_bytes", MAX_NAME_BYTES),
        ("max_declared_kb", MAX_DECLARED_KB),
        ("log_kb_per_call", LOG_KB_PER_CALL),
        ("log_lines_per_s", LOG_LINES_PER_S),
        ("compile_timeout_ms", COMPILE_TIMEOUT_MS),
        ("compile_memory_mb", COMPILE_MEMORY_MB),
        ("compile_memory_total_mb", COMPILE_MEMORY_TOTAL_MB),
        ("max_body_mb", MAX_BODY_MB),
        ("max_block_kb", MAX_BLOCK_KB),
        ("session_cache_mb", SESSION_CACHE_MB),
        ("header_timeout_ms", HEADER_TIMEOUT_MS),
        ("idle_timeout_ms", IDLE_TIMEOUT_MS),
        ("body_timeout_ms", BODY_TIMEOUT_MS),
        ("bodies_in_flight_mb", BODIES_IN_FLIGHT_MB),
        ("max_connections", MAX_CONNECTIONS),
    ];
}

/// Most `max_body_mb` honoured: 4 GiB.
pub const MAX_BODY_MB_CAP: u64 = 4096;
/// Most `max_block_kb` honoured: 4 GiB of base64.
pub const MAX_BLOCK_KB_CAP: u64 = 4 << 20;

/// The daemon-wide limits, resolved from `[limits]` (see [`crate::config::Config::limits`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body the daemon reads, in bytes.
    pub max_body_bytes: usize,
    /// Largest image or document block, in bytes of base64.
    pub max_block_bytes: usize,
    /// Memory for sessions kept between steps, in bytes (0: none).
    pub session_cache_bytes: usize,
    /// Time a connection has to send a whole request head (H6).
    pub header_timeout: Duration,
    /// Time a connection with no request in flight may wait for the next one (H6).
    pub idle_timeout: Duration,
    /// Time a request's body has to arrive whole, from the end of its head (H6).
    pub body_timeout: Duration,
    /// Address space of all compiling processes at once, in bytes (L7).
    pub compile_memory_total_bytes: u64,
    /// Bytes of request bodies being read or served at once (H6).
    pub bodies_in_flight_bytes: u64,
    /// Most connections kept open at once (H6).
    pub max_connections: usize,
    /// Consecutive failed calls after which a plugin is quarantined; `None`: never (L3).
    pub quarantine_after: Option<u32>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: (defaults::MAX_BODY_MB << 20) as usize,
            max_block_bytes: (defaults::MAX_BLOCK_KB << 10) as usize,
            session_cache_bytes: (defaults::SESSION_CACHE_MB << 20) as usize,
            header_timeout: Duration::from_millis(defaults::HEADER_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(defaults::IDLE_TIMEOUT_MS),
            body_timeout: Duration::from_millis(defaults::BODY_TIMEOUT_MS),
            compile_memory_total_bytes: defaults::COMPILE_MEMORY_TOTAL_MB << 20,
            bodies_in_flight_bytes: defaults::BODIES_IN_FLIGHT_MB << 20,
            max_connections: defaults::MAX_CONNECTIONS as usize,
            quarantine_after: Some(defaults::QUARANTINE_AFTER),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::defaults;

    /// docs/configuration.md's limits table: each key, and the first number of its default.
    fn documented() -> Vec<(String, u64)> {
        let doc = include_str!("../../../docs/configuration.md");
        let table = doc.split("## Limits").nth(1).expect("a Limits section");
        let mut out = Vec::new();
        for row in table.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let default: u64 = cells[2]
                .split(|c: char| !c.is_ascii_digit())
                .find(|n| !n.is_empty())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no number in the default of {row}"));
            for key in cells[1].split('`').skip(1).step_by(2) {
                out.push((key.to_string(), default));
            }
        }
        out
    }

    #[test]
    fn the_limits_table_in_the_docs_states_every_default_in_the_code() {
        let documented = documented();
        let code: Vec<(String, u64)> = defaults::ALL
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        assert_eq!(documented, code);
    }
}
