//! The tensorfold engine core: checkpoints, model families, speech families, tokenizer and the engine boundary; no actors, no HTTP.

pub mod boundary;
pub mod checkpoint;
pub mod error;
pub mod fetch;
pub mod generate;
pub mod llama;
pub mod memory;
pub mod model;
pub mod speech;
pub mod text;
pub mod tp;

pub use tensorfold_kernels::sampling;
