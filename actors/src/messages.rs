//! The messages between actors about lanes: what the coordinator tells a request actor of its lane, and what a
//! request actor tells the coordinator when it ends.

use actix::prelude::*;
use tensorfold_engine::boundary::EngineError;

use crate::request_types::{FinishReason, TokenLogprob};

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
