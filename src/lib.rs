//! The tensorfold engine core: checkpoints, model families, tokenizer and sampling; no HTTP, no actix.

pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod tokenizer;
