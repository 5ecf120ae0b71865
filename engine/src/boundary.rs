//! The engine boundary: what the runtime drives (token engines, codecs, voices) and the plain data of one step.

pub use tensorfold_kernels::attention::{KvLayout, KvPool};
use tensorfold_kernels::ops::argmax;
use tensorfold_kernels::sampling::SamplingParams;

/// Why an engine step failed; the runtime ends that step's lanes with it and goes on with the next round.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("the GPU failed: {0}")]
    Device(String),
    #[error("the round does not fit the engine: {0}")]
    Sizing(String),
    #[error("decoding audio: {0}")]
    Codec(String),
    #[error("synthesizing audio: {0}")]
    Voice(String),
    #[error("the engine thread panicked: {0}")]
    Panicked(String),
    #[error("the engine thread has stopped")]
    Stopped,
    #[error("the lane's grammar failed: {0}")]
    Grammar(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the request took longer than the server's limit of {0:?}")]
    TimedOut(std::time::Duration),
    /// Memory a round needed was refused (the ledger's cap or the driver); the round's lanes end, the server goes on.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
}

impl From<tensorfold_kernels::cuda::GpuError> for EngineError {
    /// A driver's refusal for want of memory is `OutOfMemory`; any other GPU failure is `Device`.
    fn from(e: tensorfold_kernels::cuda::GpuError) -> EngineError {
        match e.is_out_of_memory() {
            true => EngineError::OutOfMemory(format!("the GPU: {e}")),
            false => EngineError::Device(e.to_string()),
        }
    }
}

impl EngineError {
    /// The error's name in API error bodies and events.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::Device(_) => "engine_device_error",
            EngineError::Sizing(_) => "engine_sizing_error",
            EngineError::Codec(_) => "engine_codec_error",
            EngineError::Voice(_) => "engine_voice_error",
            EngineError::Panicked(_) => "engine_panicked",
            EngineError::Stopped => "engine_stopped",
            EngineError::Grammar(_) => "engine_grammar_error",
            EngineError::ShuttingDown => "server_shutting_down",
            EngineError::TimedOut(_) => "request_timeout",
            EngineError::OutOfMemory(_) => "out_of_memory",
        }
    }
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

/// Which logits a lane wants back from a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
    /// The last row's largest logit's index (the first on ties, as `ops::argmax` picks it).
    Argmax,
    /// Each row's largest logit's index, as `Argmax` gives the last row's.
    Picks,
    /// Each row's final hidden state after the model's last norm, in place of logits: `hidden_size` values a row.
    Hidden,
}

impl Logits {
    /// How many rows of logits a step of `tokens` tokens returns.
    pub fn rows(self, tokens: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last | Logits::Argmax => 1.min(tokens),
            Logits::All | Logits::Picks | Logits::Hidden => tokens,
        }
    }

    /// A step's computed rows of `vocab` values as the step asked for them: whole rows, each row's largest index,
    /// or hidden states.
    pub fn take(self, rows: &[f32], vocab: usize) -> LaneRows {
        match self {
            Logits::None => LaneRows::None,
            Logits::Last | Logits::All => LaneRows::Logits(rows.to_vec()),
            Logits::Argmax | Logits::Picks => {
                LaneRows::Picks(rows.chunks_exact(vocab).map(|r| argmax(r) as u32).collect())
            }
            Logits::Hidden => LaneRows::Hidden(rows.to_vec()),
        }
    }
}

/// One lane's rows from a forward pass, of the kind its step's `Logits` asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum LaneRows {
    /// `Logits::None`: nothing.
    None,
    /// `Last` or `All`: whole rows of logits, one a row, `vocab` values each.
    Logits(Vec<f32>),
    /// `Argmax` or `Picks`: each row's largest logit's index, the first on ties.
    Picks(Vec<u32>),
    /// A sampled last row cut to the tokens its draw may take, by an engine that `keeps_rows`: (id, logit) pairs.
    Kept(Vec<(u32, f32)>),
    /// `Hidden`: final hidden states after the model's last norm, `hidden_size` values a row.
    Hidden(Vec<f32>),
}

impl LaneRows {
    /// Whole rows' values, of logits or hidden states; `None` for the other kinds.
    pub fn values(&self) -> Option<&[f32]> {
        match self {
            LaneRows::Logits(v) | LaneRows::Hidden(v) => Some(v),
            _ => None,
        }
    }
}

/// One lane's share of a round: tokens at consecutive absolute positions, and the pages holding its KV.
pub struct LaneStep<'a> {
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub pages: &'a [u32],
    pub logits: Logits,
    /// How a sampled lane's last row is drawn, for an engine that `keeps_rows`.
    pub keep: Option<Keep<'a>>,
}

/// What a sampled row's draw needs before it can cut the row to the tokens it may take (`sampling::kept`).
#[derive(Clone, Copy, Debug)]
pub struct Keep<'a> {
    pub temperature: f32,
    pub repetition_penalty: f32,
    /// The lane's distinct tokens, which the penalty changes.
    pub history: &'a [u32],
}

/// A model family as the runtime drives it.
pub trait Engine: Send {
    /// The KV pool shape for pages of `page_tokens` positions.
    fn kv_layout(&self, page_tokens: usize) -> KvLayout;
    fn vocab_size(&self) -> usize;
    /// Runs every lane in one batched pass; returns each lane's rows, of the kind its step asked for.
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError>;
    /// Whether a lane with `keep` gets back its last row cut to `sampling::kept`'s tokens, penalty applied, as
    /// `LaneRows::Kept`, instead of the whole row.
    fn keeps_rows(&self) -> bool {
        false
    }
    /// Whether the engine hands back a `Hidden` lane's final hidden states, as embeddings need.
    fn embeds(&self) -> bool {
        true
    }
    /// Host bytes that rounds of `round_tokens` tokens over `lanes` lanes hold, as (weights, activations): none
    /// where a device's ledger holds them already.
    fn host_bytes(&self, _round_tokens: usize, _lanes: usize) -> (usize, usize) {
        (0, 0)
    }
    /// Whether the model has a draft head of its own (multi-token prediction), which `draft_head` runs.
    fn has_draft_head(&self) -> bool {
        false
    }
    /// The draft head over each lane's tokens: token j reads the model's final hidden state at position j - 1, which
    /// an earlier `forward` left in the lane's pages, and guesses token j + 1; the rows each step asks for.
    fn draft_head(&mut self, _pool: &mut KvPool, _lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        Err(EngineError::Sizing("the model has no draft head".into()))
    }
}

/// A boxed engine is driven as the engine it holds.
impl<T: Engine + ?Sized> Engine for Box<T> {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        (**self).kv_layout(page_tokens)
    }

    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        (**self).forward(pool, lanes)
    }

    fn keeps_rows(&self) -> bool {
        (**self).keeps_rows()
    }

    fn embeds(&self) -> bool {
        (**self).embeds()
    }

    fn has_draft_head(&self) -> bool {
        (**self).has_draft_head()
    }

    fn draft_head(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        (**self).draft_head(pool, lanes)
    }

    fn host_bytes(&self, round_tokens: usize, lanes: usize) -> (usize, usize) {
        (**self).host_bytes(round_tokens, lanes)
    }
}

/// An engine lent for a while is driven as itself.
impl<T: Engine + ?Sized> Engine for &mut T {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        (**self).kv_layout(page_tokens)
    }

    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        (**self).forward(pool, lanes)
    }

    fn keeps_rows(&self) -> bool {
        (**self).keeps_rows()
    }

    fn embeds(&self) -> bool {
        (**self).embeds()
    }

    fn has_draft_head(&self) -> bool {
        (**self).has_draft_head()
    }

    fn draft_head(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        (**self).draft_head(pool, lanes)
    }

    fn host_bytes(&self, round_tokens: usize, lanes: usize) -> (usize, usize) {
        (**self).host_bytes(round_tokens, lanes)
    }
}

/// Frames of codec codes to turn into PCM: the window with its context, and the frames to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecJob {
    /// Codes of every codebook for the window's frames, coarsest codebook first.
    pub codes: Vec<Vec<u32>>,
    /// Absolute index of the window's first frame in the request's audio.
    pub first_frame: usize,
    /// The frames whose samples are kept, relative to the window.
    pub keep: std::ops::Range<usize>,
}

/// A speech model's codec: decodes frames into mono PCM on the engine thread, in the rounds.
pub trait Codec: Send + Sync {
    fn sample_rate(&self) -> u32;
    /// Samples of `job.keep`; equal, bit for bit, to the same frames of a one-shot decode.
    fn decode(&self, job: &CodecJob) -> Result<Vec<f32>, EngineError>;
    /// Each window's `decode`, in order; a window's samples never depend on the others.
    fn decode_batch(&self, jobs: &[&CodecJob]) -> Vec<Result<Vec<f32>, EngineError>> {
        use rayon::prelude::*;
        jobs.par_iter().map(|job| self.decode(job)).collect()
    }
}

/// Turns a speech lane's tokens into codec jobs, where its tokens are sampled.
pub trait FrameSink: Send {
    /// Takes one generated token; returns a job when more audio can be decoded exactly.
    fn push(&mut self, id: u32) -> Option<CodecJob>;
    /// At the end of generation: the job for whatever audio is left.
    fn finish(&mut self) -> Option<CodecJob>;
}

/// Turns a lane's token ids into text as they arrive.
pub trait TextDecoder: Send {
    /// Text completed by this token (may be empty while a character is incomplete).
    fn push(&mut self, id: u32) -> String;
    /// Whatever is held back at the end.
    fn finish(&mut self) -> String;
}

/// What a voice lane speaks: sentence chunks as the voice's input ids, at a speed, with noise from a seed.
#[derive(Clone, Debug, PartialEq)]
pub struct VoiceInput {
    pub chunks: Vec<Vec<i64>>,
    pub speed: f32,
    pub seed: u64,
}

/// A speech model without tokens (the default voice), run on the engine thread; `voices::Voice` is a voice preset.
pub trait Synth: Send + Sync {
    /// A lane's state before its first step.
    fn start(&self, input: VoiceInput) -> Box<dyn VoiceState>;
}

/// One lane's synthesis state; the runtime moves it to the engine thread for each step and back.
pub trait VoiceState: Send {
    /// One round's work: prepare the next sentence or make the next window; `None` when the audio is complete.
    fn step(&mut self) -> Result<Option<Vec<f32>>, EngineError>;
}

/// Changes to a lane's logits before its draw, each a pure function of the lane's own tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogitRules {
    /// Added to the named tokens' logits (OpenAI's `logit_bias`), in id order.
    pub bias: Vec<(u32, f32)>,
    /// Subtracted once from the logit of every token generated so far (OpenAI's `presence_penalty`).
    pub presence: f32,
    /// Subtracted from a token's logit once per time it was generated (OpenAI's `frequency_penalty`).
    pub frequency: f32,
}

impl LogitRules {
    pub fn is_empty(&self) -> bool {
        self.bias.is_empty() && self.presence == 0.0 && self.frequency == 0.0
    }
}

/// A grammar that a lane's generated tokens must follow; its state is the tokens committed so far.
pub trait Constraint: Send {
    /// The tokens allowed next: bit `i % 32` of word `i / 32` for token `i`, over the vocabulary.
    fn allowed(&mut self) -> Result<Vec<u32>, String>;
    /// Takes the drawn token, which `allowed` allowed.
    fn commit(&mut self, id: u32) -> Result<(), String>;
    /// Takes back the last `n` committed tokens.
    fn rollback(&mut self, n: usize) -> Result<(), String>;
}

/// What a token lane's tokens become.
pub enum Output {
    Text(Box<dyn TextDecoder>),
    /// Codec frames, assembled where the tokens are sampled.
    Speech(Box<dyn FrameSink>),
}

/// A lane of tokens: a prompt, how to sample, when to stop, and what the tokens become.
pub struct TokenWork {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (EOS and end-of-turn).
    pub stop_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    /// Log-probabilities: `None` off, `Some(n)` the chosen token's and the top n.
    pub logprobs: Option<usize>,
    /// The prompt may resume from the prefix cache, and its pages be cached for later prompts.
    pub cache: bool,
    /// With `cache`, the reply's tokens join the prompt's pages in the cache when the lane ends, for a next turn.
    pub keep_reply: bool,
    /// Decoding may draft tokens from the lane's own text and verify them; the output is the same either way.
    pub draft: bool,
    /// Bias and penalties on the logits before each draw.
    pub rules: LogitRules,
    /// A grammar the generated tokens follow: disallowed tokens are masked before each draw.
    pub constraint: Option<Box<dyn Constraint>>,
    pub output: Output,
}

/// A lane that only prefills its prompt, asking each chunk for its hidden states, and ends without a draw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmbedWork {
    pub prompt: Vec<u32>,
    /// The prompt's pages may be cached for later prompts; an embedding never resumes from the cache, which
    /// would skip the rows its pooling needs.
    pub cache: bool,
}

/// The work of one request: a lane of tokens on a token model, a voice lane, or an embedding of a prompt.
pub enum Work {
    Tokens(TokenWork),
    Voice(VoiceInput),
    Embed(EmbedWork),
}

#[cfg(test)]
mod tests {
    use super::{LaneRows, Logits};

    #[test]
    fn test_logits_rows_per_step() {
        assert_eq!([Logits::None.rows(5), Logits::Last.rows(5), Logits::All.rows(5)], [0, 1, 5]);
        assert_eq!([Logits::Last.rows(0), Logits::All.rows(0)], [0, 0]);
        assert_eq!([Logits::Argmax.rows(5), Logits::Argmax.rows(0)], [1, 0]);
    }

    #[test]
    fn test_argmax_keeps_the_first_largest_index() {
        assert_eq!(Logits::Argmax.take(&[0.5, 2.0, -1.0, 2.0], 4), LaneRows::Picks(vec![1]));
        assert_eq!(Logits::Last.take(&[0.5, 2.0], 2), LaneRows::Logits(vec![0.5, 2.0]));
        assert_eq!(Logits::Argmax.take(&[], 4), LaneRows::Picks(Vec::new()));
        assert_eq!(Logits::Picks.take(&[0.5, 2.0, 3.0, 3.0, -1.0, -2.0], 2), LaneRows::Picks(vec![1, 0, 0]));
        assert_eq!(Logits::None.take(&[0.5], 1), LaneRows::None);
        assert_eq!(Logits::Picks.rows(5), 5);
    }

    #[test]
    fn test_hidden_returns_every_row_whole() {
        assert_eq!([Logits::Hidden.rows(5), Logits::Hidden.rows(0)], [5, 0]);
        assert_eq!(Logits::Hidden.take(&[0.5, 2.0, -1.0, 2.0], 2), LaneRows::Hidden(vec![0.5, 2.0, -1.0, 2.0]));
    }
}
