//! Errors of the engine core: loading checkpoints, tokenizing, fetching the default model.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {fault}")]
    Format { path: PathBuf, fault: String },
    #[error("{path}: tensor {name}: {fault}")]
    Tensor { path: PathBuf, name: String, fault: String },
    #[error("{path}: missing tensor {name}")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tokenizer: {fault}")]
    Tokenizer { path: PathBuf, fault: String },
    #[error("fetching the default model: {0}")]
    Fetch(String),
    #[error("GPU: {0}")]
    Device(String),
}

impl LoadError {
    pub fn format(path: impl Into<PathBuf>, fault: impl Into<String>) -> Self {
        LoadError::Format { path: path.into(), fault: fault.into() }
    }
}
