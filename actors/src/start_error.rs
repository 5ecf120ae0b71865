//! Why the runtime could not start.

use crate::memory::ledger::LedgerError;

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("memory: {0}")]
    Memory(#[from] LedgerError),
    #[error("no room for KV pages: the memory limit leaves {room} bytes and one page needs {page_bytes}")]
    NoRoom { room: usize, page_bytes: usize },
    #[error("starting the engine thread: {0}")]
    Io(#[from] std::io::Error),
    #[error("the device actor stopped during start-up")]
    DeviceGone,
    #[error("two models are registered as {0:?}")]
    DuplicateName(String),
    #[error("the draft model {draft:?} drafts for {target:?}, which is not a token model loaded beside it")]
    NoDraftTarget { draft: String, target: String },
    #[error("the draft model {draft:?} has {draft_vocab} tokens and its target {target_vocab}: they must be the same")]
    DraftVocabulary { draft: String, draft_vocab: usize, target_vocab: usize },
}
