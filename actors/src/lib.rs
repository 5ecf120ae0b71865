//! The actor runtime: what it needs from an engine, and the actors that drive it.

pub mod engine;
pub mod stop;
pub mod request_types;
pub mod runtime;
pub mod ledger;
pub mod device;
pub mod metrics;
