//! The seam between HTTP and the runtime: a validated request in, a stream of events out.

use tensorfold_kernels::sampling::SamplingParams;

use crate::engine::{CodecJob, ModelId};

/// Turns a lane's token ids into text as they arrive.
pub trait TextDecoder: Send {
    /// Text completed by this token (may be empty while a character is incomplete).
    fn push(&mut self, id: u32) -> String;
    /// Whatever is held back at the end.
    fn finish(&mut self) -> String;
}

/// Turns a speech lane's tokens into codec jobs; owned by the request actor, so it dies with the request.
pub trait FrameSink: Send {
    /// Takes one generated token; returns a job when more audio can be decoded exactly.
    fn push(&mut self, id: u32) -> Option<CodecJob>;
    /// At the end of generation: the job for whatever audio is left.
    fn finish(&mut self) -> Option<CodecJob>;
}

/// What a lane's tokens become.
pub enum Output {
    Text(Box<dyn TextDecoder>),
    Speech(Box<dyn FrameSink>),
    /// Audio made by a voice lane, which has no tokens.
    None,
}

/// A request that passed validation; nothing downstream re-checks it.
pub struct ValidRequest {
    pub model: ModelId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (EOS and end-of-turn).
    pub stop_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    /// Log-probabilities: `None` off, `Some(n)` the chosen token's and the top n.
    pub logprobs: Option<usize>,
    pub output: Output,
}

/// Why a request ended; `as_str` is the API's `finish_reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
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
}

/// What the runtime streams back for one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token and the text it completed (text held back by stop strings comes later).
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Mono samples at the codec's rate, in order; a speech request's audio is the concatenation.
    Audio {
        pcm: Vec<f32>,
    },
    Done {
        finish: FinishReason,
        usage: Usage,
    },
    /// A failure after the stream started; the last event.
    Error {
        message: String,
    },
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("too many waiting requests ({0}); retry later")]
    QueueFull(usize),
    #[error("the request needs {needed} KV pages but the pool has {total}")]
    TooLarge { needed: usize, total: usize },
    #[error("no model {0} is loaded")]
    NoModel(ModelId),
    #[error("the runtime is shutting down")]
    Closed,
}
