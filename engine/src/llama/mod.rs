//! The Llama family: its configuration, its one forward pass, and the CPU and CUDA steps of that pass.

pub mod config;
pub mod cpu;
pub mod cuda;
mod deltanet;
pub mod forward;
mod load;
pub mod moe;
mod mtp;
pub(crate) mod walk;

pub use cpu::Llama;
pub(crate) use load::{rope_inv_freq, Loader};
