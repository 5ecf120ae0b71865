//! The codec layer's one error type: checkpoint faults name the file, input faults name the input.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {fault}", path.display())]
    Format { path: PathBuf, fault: String },
    #[error("{}: unsupported codec: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    #[error("{}: tensor {name} is missing", path.display())]
    MissingTensor { path: PathBuf, name: String },
    #[error("{}: tensor {name}: {fault}", path.display())]
    Tensor { path: PathBuf, name: String, fault: String },
    #[error("bad codes: {0}")]
    Codes(String),
    #[error("bad frame range: {0}")]
    Frames(String),
}
