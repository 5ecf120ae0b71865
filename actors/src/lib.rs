//! The actor runtime: what it needs from an engine, and (next) the actors that drive it.

pub mod engine;
