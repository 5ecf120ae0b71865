//! The actor runtime: what it needs from an engine, and the actors that drive it.

pub mod coordinator;
pub mod histogram;
pub mod memory;
pub mod messages;
pub mod metrics;
mod metrics_vllm;
pub mod model_slot;
pub mod outbox;
pub mod request;
pub mod request_types;
pub mod round;
pub mod runner;
pub mod runtime;
pub mod start_error;
pub mod stop;

#[cfg(test)]
mod draft_model_tests;
#[cfg(test)]
mod keep_tests;
#[cfg(test)]
mod runtime_tests;
#[cfg(test)]
mod voice_tests;
