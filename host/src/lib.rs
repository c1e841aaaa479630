//! promptd: a host for WebAssembly prompt plugins.
//!
//! Plugins declare named, ordered, scoped sections, contexts, variables and tools; the host
//! assembles them into one canonically ordered, byte-stable request. The core is plain data
//! and pure functions ([`model`], [`registry`], [`assembly`], [`interpolate`], [`request`]); the
//! engine ([`wasm`]) and files ([`loader`]) sit at the edges.
//!
//! ```
//! use promptd::{assembly, model::Step, provider::NativePlugin, registry::*};
//!
//! let (decl, provider) = NativePlugin::new()
//!     .section("persona", 0, "You are {{name}}.")
//!     .variable("name", "Ada")
//!     .build();
//! let entry = PluginEntry::new("persona", decl, provider, PluginOptions::default()).unwrap();
//! let registry = Registry::new().with_plugin(entry).unwrap();
//! let step = Step { agent: "default".into(), scope_chain: vec!["global".into(), "default".into()], ..Step::default() };
//! let out = assembly::assemble(&registry, &step, &assembly::Options::default()).unwrap();
//! assert_eq!(out.system, "You are Ada.");
//! ```

pub mod assembly;
pub mod cache;
pub mod config;
pub mod conversation;
pub mod daemon;
pub mod error;
pub mod events;
pub mod formats;
#[cfg(test)]
mod fuzz;
pub mod http;
pub mod interpolate;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod names;
pub mod provider;
pub mod registry;
pub mod request;
pub mod sandbox;
pub mod session;
pub mod store;
pub mod validate;
pub mod wasm;
pub mod watch;

pub use error::{Error, Result};
