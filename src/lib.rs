//! The tensorfold engine core (checkpoints, model families, tokenizer, sampling) and, apart in `server`, the HTTP layer.

pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod cuda_llama;
pub mod cuda_setup;
pub mod drama;
pub mod error;
pub mod fetch;
pub mod forward;
pub mod generate;
pub mod gguf;
pub mod gguf_model;
pub mod hf;
pub mod hibari;
pub mod llama;
pub mod model;
pub mod onnx;
pub mod server;
pub mod speak;
pub mod speech;
pub mod tokenizer;

pub use tensorfold_kernels::sampling;
