//! promptd's core: plain data and pure functions.
//!
//! Everything that decides what a model sees lives here: what plugins declare ([`model`]),
//! the registry of loaded plugins ([`registry`]), assembly ([`assembly`]), interpolation
//! ([`interpolate`]), provider formats ([`formats`]), session planning and rebuild
//! ([`session`]), config parsing ([`config`]) and the session log's shape ([`store`]). It does
//! no IO and has no engine, database, HTTP or async runtime in its dependency tree (checked by
//! `cargo xtask test`); those sit in the crates around it, behind the [`load::Engine`] and
//! [`store::SessionStore`] traits.
//!
//! ```
//! use promptd_core::{assembly, model::Step, provider::NativePlugin, registry::*};
//!
//! let (decl, provider) = NativePlugin::new()
//!     .section("persona", 0, "You are {{name}}.")
//!     .variable("name", "Ada")
//!     .build();
//! let entry = PluginEntry::new("persona", decl, provider, PluginOptions::default()).unwrap();
//! let registry = Registry::new().with_plugin(entry).unwrap();
//! let step = Step { agent: "default".into(), scope_chain: vec!["global".into(), "default".into()].into(), ..Step::default() };
//! let out = assembly::assemble(&registry, &step, &assembly::Options::default()).unwrap();
//! assert_eq!(out.system, "You are Ada.");
//! ```

pub mod assembly;
pub mod budget;
pub mod config;
pub mod content;
pub mod conversation;
pub mod error;
pub mod formats;
#[cfg(test)]
mod fuzz;
pub mod interpolate;
pub mod load;
pub mod model;
pub mod names;
pub mod plugin_state;
pub mod provenance;
pub mod provider;
pub mod registry;
pub mod replies;
pub mod request;
pub mod review;
pub mod sandbox;
pub mod session;
pub mod step;
pub mod store;
pub mod transcript;
pub mod trust;
pub mod validate;

pub use error::{Error, ErrorBody, Result};
