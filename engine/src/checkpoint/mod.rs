//! What the model needs from a checkpoint, whatever its file format, and the readers of each format.

pub mod gguf;
pub mod gguf_model;
#[cfg(test)]
mod gguf_moe_tests;
mod gguf_names;
pub mod hf;
mod hf_config;
pub mod onnx;

use std::path::Path;

use tensorfold_kernels::Weight;

use crate::error::LoadError;
use crate::llama::config::ModelConfig;

/// A loaded checkpoint: its configuration and its tensors by Hugging Face name.
pub trait Checkpoint: Send + Sync {
    /// The file or directory the checkpoint came from, for error messages.
    fn path(&self) -> &Path;
    fn config(&self) -> &ModelConfig;
    /// Whether a tensor of this Hugging Face name exists.
    fn contains(&self, name: &str) -> bool;
    /// The tensor as a matrix (a 1-D tensor is one row); fails naming the tensor and the fault.
    fn weight(&self, name: &str) -> Result<Weight, LoadError>;
    /// The tensor's stored bf16 values, where the checkpoint holds it in bf16, without a copy.
    fn bf16_rows(&self, name: &str) -> Option<Bf16Rows<'_>> {
        let _ = name;
        None
    }
}

/// A bf16 matrix as the checkpoint stores it: `rows` x `cols` little-endian values, row after row.
#[derive(Clone, Copy, Debug)]
pub struct Bf16Rows<'a> {
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}
