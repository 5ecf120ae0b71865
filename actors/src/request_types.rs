//! The seam between HTTP and the runtime: a validated request in, a stream of events out.

pub use tensorfold_engine::boundary::{
    EmbedWork, EngineError, FinishReason, FrameSink, Output, TextDecoder, TokenWork, VoiceInput, Work,
};

/// A request that passed validation, for the registered model it names; nothing downstream re-checks it.
pub struct ValidRequest {
    pub model: String,
    pub work: Work,
}

/// The log-probability of a chosen token and of the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// (token id, log-probability), most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// What the runtime streams back for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token and the text it completed (text held back by stop strings comes later).
    Token { id: u32, text: String, logprob: Option<TokenLogprob> },
    /// Mono samples at the codec's rate, in order; a speech request's audio is the concatenation.
    Audio { pcm: Vec<f32> },
    Done {
        finish: FinishReason,
        usage: Usage,
        /// The stop string that ended the text, when one did.
        stop_sequence: Option<String>,
    },
    /// An embedding request's pooled vector (mean of the prompt's final hidden states, unit L2 norm); the last event.
    Embedding { vector: Vec<f32>, usage: Usage },
    /// A failure after the stream started, named by the engine's error; the last event.
    Error(EngineError),
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("too many waiting requests ({0}); retry later")]
    QueueFull(usize),
    #[error("the request needs {needed} KV pages but the pool has {total}")]
    TooLarge { needed: usize, total: usize },
    #[error("no model {0:?} is loaded")]
    NoModel(String),
    #[error("model {model:?} runs {runs}, not this request's work")]
    WrongKind { model: String, runs: &'static str },
    #[error("model {model:?} cannot make {what} on its device")]
    Unsupported { model: String, what: &'static str },
    #[error("the runtime is shutting down")]
    Closed,
}
