//! Plugins as the core sees them: what they declare ([`model`]), the rules their names and
//! templates follow ([`names`], [`interpolate`]) and the checks a declaration passes before
//! any of it is visible ([`validate`]); what the config grants them ([`sandbox`], [`trust`]);
//! the calls the host makes into them ([`provider`]); the immutable set of loaded plugins
//! ([`registry`]), what of a plugin waits for a cache-cold point ([`refresh`]) and the states a
//! plugin file can be in ([`state`]).
//!
//! Nothing here depends on assembly, formats or sessions: those sit above it.

pub mod interpolate;
pub mod model;
pub mod names;
pub mod provider;
pub mod refresh;
pub mod registry;
pub mod sandbox;
pub mod state;
pub mod trust;
pub mod validate;
