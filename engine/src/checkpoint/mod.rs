//! What the model needs from a checkpoint, whatever its file format, and the readers of each format.

pub mod gguf;
pub mod gguf_model;
pub mod hf;
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
}
