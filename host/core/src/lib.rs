//! promptd's core: plain data and pure functions.
//!
//! Everything that decides what a model sees lives here: plugins, what they declare and the
//! registry of loaded ones ([`plugin`]), assembly ([`assembly`]), the neutral conversation
//! ([`conversation`]), provider wire formats ([`formats`]), session planning and rebuild
//! ([`session`]), config parsing ([`config`]) and the session log's shape ([`store`]). It does
//! no IO and has no engine, database, HTTP or async runtime in its dependency tree (checked by
//! `cargo xtask test`); those sit in the crates around it, behind the [`load::Engine`] and
//! [`store::SessionStore`] traits.
//!
//! ```
//! use promptd_core::assembly;
//! use promptd_core::plugin::{model::Step, provider::NativePlugin, registry::*};
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
pub mod cache;
pub mod calendar;
pub mod config;
pub mod conversation;
pub mod error;
pub mod formats;
#[cfg(test)]
mod fuzz;
pub mod gateway;
pub mod held;
pub mod kind;
pub mod ledger;
pub mod limits;
pub mod load;
pub mod observe;
pub mod plugin;
pub mod prefix;
pub mod provenance;
pub mod replay;
pub mod request;
pub mod session;
pub mod step;
pub mod store;
pub mod sync;
pub mod usage;

pub use error::{Error, ErrorBody, Result};
