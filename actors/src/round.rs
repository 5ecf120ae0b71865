//! One round as plain data: the plan the coordinator builds and the output the engine returns.

use std::sync::Arc;

use tensorfold_engine::boundary::{CodecJob, Constraint, EngineError, LogitRules, VoiceInput, VoiceState};
use tensorfold_kernels::sampling::SamplingParams;

use crate::request_types::TokenLogprob;

/// A registered model's place in the runtime, given at start-up; requests name models, lanes carry this.
pub type ModelId = usize;

/// How to pick a lane's next token once its logits are computed.
#[derive(Clone, Debug)]
pub struct SampleSpec {
    pub params: SamplingParams,
    /// The lane's tokens so far, sent only when a penalty needs them.
    pub history: Vec<u32>,
    /// Where the lane's generated tokens start in `history`.
    pub prompt_len: usize,
    /// Bias and penalties on the row before the draw.
    pub rules: Arc<LogitRules>,
    /// The lane's grammar, in the round's `grammars`, masks its rows.
    pub masked: bool,
    /// Absolute position of the token being drawn: the draw depends on (seed, position) alone.
    pub position: u64,
    pub logprobs: Option<usize>,
    /// Tokens drafted after the step's last: the step carries them, and each row's draw is kept while it equals
    /// the next drafted token.
    pub draft: Vec<u32>,
}

/// One lane's share: a prompt chunk or one decode token, at consecutive absolute positions.
#[derive(Clone, Debug)]
pub struct PlannedLane {
    pub lane_id: u64,
    pub model: ModelId,
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    pub pages: Vec<u32>,
    /// `Some` when this step ends the lane's known tokens, so a new token is drawn.
    pub sample: Option<SampleSpec>,
    /// An embedding lane's prompt chunk: the step returns every row's final hidden state, and nothing is drawn.
    pub embed: bool,
}

/// A lane's turn on its draft model, before the round's forward pass: the draft model's KV takes `tokens` from
/// `start_pos`, then it draws `most` tokens greedily, one step each, which the lane's step verifies.
#[derive(Clone, Debug)]
pub struct PlannedDraft {
    pub lane_id: u64,
    pub model: ModelId,
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    /// The lane's pages in the draft model's pool.
    pub pages: Vec<u32>,
    /// 0 only catches the draft model's KV up.
    pub most: usize,
    /// The draft is the target model's own head (`Engine::draft_head`), over the lane's own pages.
    pub own_head: bool,
}

#[derive(Debug, Default)]
pub struct RoundPlan {
    pub lanes: Vec<PlannedLane>,
    /// Draft model steps, run before the lanes whose drafts they make.
    pub drafts: Vec<PlannedDraft>,
    /// One step of each voice lane.
    pub voices: Vec<PlannedVoice>,
    /// Codec windows of speech lanes, decoded after the forward pass, in the round after their last frame was drawn.
    pub codec: Vec<PlannedCodec>,
    /// Grammars of the lanes that draw this round, back in the output with the drawn tokens committed.
    pub grammars: Vec<LaneGrammar>,
}

/// A speech request's codec window, decoded by its model's codec.
#[derive(Clone, Debug)]
pub struct PlannedCodec {
    pub lane_id: u64,
    pub model: ModelId,
    pub job: CodecJob,
}

impl RoundPlan {
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty() && self.codec.is_empty() && self.voices.is_empty() && self.drafts.is_empty()
    }
}

/// A token drawn for a lane in a round.
#[derive(Clone, Debug)]
pub struct Sampled {
    pub lane_id: u64,
    pub id: u32,
    pub logprob: Option<TokenLogprob>,
}

#[derive(Default)]
pub struct RoundOutput {
    pub sampled: Vec<Sampled>,
    /// How many tokens each lane's draft model drafted for it this round.
    pub drafts: Vec<(u64, usize)>,
    /// Lanes whose draft model's or head's pass failed this round: it took none of their tokens.
    pub draft_failed: Vec<u64>,
    /// PCM of each planned codec window, in plan order, or why it failed.
    pub audio: Vec<(u64, Result<Vec<f32>, EngineError>)>,
    pub voices: Vec<VoiceOutput>,
    /// Token lanes whose forward pass failed this round; they end with the error.
    pub failed: Vec<(u64, EngineError)>,
    /// Each embedding lane's hidden rows of this round, `hidden_size` values a row, in position order.
    pub hidden: Vec<(u64, Vec<f32>)>,
    /// Grammars of the lanes that drew this round, their drawn tokens committed.
    pub grammars: Vec<LaneGrammar>,
}

/// A lane's grammar, moved to the engine thread for a round and back.
pub struct LaneGrammar {
    pub lane_id: u64,
    pub grammar: Box<dyn Constraint>,
}

impl std::fmt::Debug for LaneGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneGrammar").field("lane_id", &self.lane_id).finish_non_exhaustive()
    }
}

/// What a voice lane does in a round.
pub enum VoiceWork {
    Start(VoiceInput),
    Step(Box<dyn VoiceState>),
}

impl std::fmt::Debug for VoiceWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VoiceWork::Start(input) => f.debug_tuple("Start").field(input).finish(),
            VoiceWork::Step(_) => f.write_str("Step"),
        }
    }
}

/// A voice lane's step in a round plan.
#[derive(Debug)]
pub struct PlannedVoice {
    pub lane_id: u64,
    pub model: ModelId,
    pub work: VoiceWork,
}

/// What a step made, and the state to keep for the next one.
pub struct VoiceOutput {
    pub lane_id: u64,
    pub state: Option<Box<dyn VoiceState>>,
    pub result: Result<Option<Vec<f32>>, EngineError>,
}
