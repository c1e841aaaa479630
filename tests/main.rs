//! promptd's end-to-end tests, one binary: each file of `tests/` is a module, all sharing the
//! test kit (`promptd_testkit`, host/testkit: the real daemon over HTTP, fixtures, processes),
//! which each module imports as `common`. Run one file's tests with a filter:
//! `cargo test -p promptd --test e2e budget::`.

mod agent_cli;
mod assemble_cli;
mod budget;
mod cache_policy;
mod cache_workload;
mod client_python;
mod client_typescript;
mod compile;
mod conformance;
mod contract;
mod daemon;
mod fleet;
mod gateway;
mod gateway_bedrock;
mod gateway_edges;
mod gateway_fleet;
mod gateway_gemini;
mod gateway_keys;
mod gateway_pin;
mod gateway_steps;
mod gateway_tools;
mod held_changes;
mod hot_reload;
mod inspect;
mod inspector;
mod isolation;
mod languages;
mod limits;
mod load_errors;
mod mcp;
mod module_map;
mod openapi;
mod plugin_world;
mod postgres;
mod provider_sdks;
mod replay;
mod sandbox;
mod soak;
mod step_parts;
mod telemetry;
mod usage;
