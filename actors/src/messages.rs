//! Every message between actors about lanes: the requests the coordinator queues, what it tells a request actor
//! of its lane, what a request actor tells it when it ends, and the close that ends them all.

use std::sync::Arc;

use actix::prelude::*;
use tensorfold_engine::boundary::{Constraint, EngineError, FrameSink, LogitRules, VoiceInput};
use tensorfold_kernels::sampling::SamplingParams;

use crate::request_types::{FinishReason, SubmitError, TokenLogprob};
use crate::round::ModelId;

/// A token request waiting for a lane.
#[derive(Message)]
#[rtype(result = "Result<(), SubmitError>")]
pub struct Enqueue {
    pub lane_id: u64,
    pub model: ModelId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_ids: Vec<u32>,
    pub logprobs: Option<usize>,
    /// Whether the prompt may resume from the prefix cache and its pages be cached.
    pub cache: bool,
    /// Whether, with `cache`, the reply's tokens are cached with the prompt when the lane ends.
    pub keep_reply: bool,
    /// Whether the lane may draft tokens and verify them.
    pub draft: bool,
    pub rules: Arc<LogitRules>,
    /// The lane's grammar; it moves to the engine thread for each round the lane draws in, and back.
    pub constraint: Option<Box<dyn Constraint>>,
    /// A speech lane's frame assembly, which turns its tokens into codec windows as they are drawn.
    pub frames: Option<Box<dyn FrameSink>>,
    pub to: Recipient<LaneToken>,
    pub pcm: Recipient<LanePcm>,
    pub failed: Recipient<LaneFailed>,
}

/// A voice request waiting for a lane.
#[derive(Message)]
#[rtype(result = "Result<(), SubmitError>")]
pub struct EnqueueVoice {
    pub lane_id: u64,
    pub model: ModelId,
    pub input: VoiceInput,
    pub to: Recipient<VoiceAudio>,
}

/// An embedding request waiting for a lane.
#[derive(Message)]
#[rtype(result = "Result<(), SubmitError>")]
pub struct EnqueueEmbed {
    pub lane_id: u64,
    pub model: ModelId,
    pub prompt: Vec<u32>,
    /// Whether the prompt's pages are cached for later prompts once computed.
    pub cache: bool,
    pub to: Recipient<LaneEmbedding>,
}

/// Shutdown: refuses every later request, and ends every queued and running one with `EngineError::ShuttingDown`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Close;

/// A token of the request's lane; `finish` is set on its lane's last token.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaneToken {
    pub id: u32,
    pub logprob: Option<TokenLogprob>,
    /// The token ended generation (EOS or end of turn) and carries no text.
    pub is_stop_token: bool,
    pub finish: Option<FinishReason>,
    /// Codec windows a speech lane has queued so far, this token's included.
    pub num_windows: usize,
    /// Prompt positions whose KV the lane found in the prefix cache.
    pub cached_tokens: usize,
}

/// The PCM of one decoded window of a speech lane, in order, or why decoding failed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LanePcm(pub Result<Vec<f32>, EngineError>);

/// The request's lane failed; the last message it gets.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaneFailed {
    pub error: EngineError,
}

/// An embedding lane's vector, or why its lane failed; the only message its request gets.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaneEmbedding(pub Result<Vec<f32>, EngineError>);

/// A window of a voice lane's audio; `finished` on its last message.
#[derive(Message)]
#[rtype(result = "()")]
pub struct VoiceAudio {
    pub pcm: Result<Vec<f32>, EngineError>,
    pub finished: bool,
}

/// The request is gone (finished, failed or its client left): drop its lane and lease now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release {
    pub lane_id: u64,
}
