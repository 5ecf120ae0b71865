//! Speech requests for the runtime: the speakers a server holds (Drama checkpoints and voices) and their front ends.

use std::path::Path;
use std::sync::Arc;

use tensorfold_actors::engine::ModelId;
use tensorfold_actors::request_types::{Output, ValidRequest};
use tensorfold_actors::runtime::{ModelKind, ModelSpec};
use tensorfold_actors::voice::VoiceInput;
use tensorfold_audio::snac::NUM_CODEBOOKS;

use crate::drama::stream::{DramaFrames, SnacCodec};
use crate::drama::{orpheus_sampling, DramaError, DramaLayout, DramaModel, Voice, Voices, ORPHEUS_MAX_TOKENS};
use crate::tokenizer::Tokenizer;

/// Most characters of input text one speech request may carry.
pub const MAX_INPUT_CHARS: usize = 4096;

/// Everything of a loaded Drama checkpoint but its weights: what turns text into a speech lane.
pub struct SpeechFrontEnd {
    /// The runtime model that runs this checkpoint's lanes.
    pub model: ModelId,
    pub name: String,
    tokenizer: Tokenizer,
    layout: DramaLayout,
    voices: Voices,
    sample_rate: u32,
    codes_per_frame: [usize; NUM_CODEBOOKS],
    context_frames: usize,
    context: usize,
}

impl SpeechFrontEnd {
    /// Opens the Drama checkpoint in `dir`; the model spec goes to the runtime as model `model`.
    pub fn open(
        dir: &Path,
        model: ModelId,
        round_tokens: usize,
        parallel: usize,
    ) -> Result<(ModelSpec, Self), DramaError> {
        let drama = DramaModel::open(dir)?;
        let name = dir.file_name().map_or_else(|| "drama".into(), |n| n.to_string_lossy().into_owned());
        Ok(SpeechFrontEnd::split(drama, name, model, round_tokens, parallel))
    }

    pub fn split(
        drama: DramaModel,
        name: String,
        model: ModelId,
        round_tokens: usize,
        parallel: usize,
    ) -> (ModelSpec, Self) {
        let DramaModel { llama, tokenizer, layout, voices, codec } = drama;
        let context = llama.config().max_position;
        let front = SpeechFrontEnd {
            model,
            name,
            tokenizer,
            layout,
            voices,
            sample_rate: codec.sample_rate(),
            codes_per_frame: codec.codes_per_frame(),
            context_frames: codec.context_frames(),
            context,
        };
        let spec = ModelSpec {
            weight_bytes: llama.num_weight_bytes(),
            activation_bytes: llama.activation_bytes(round_tokens, parallel),
            kind: ModelKind::Tokens { engine: Box::new(llama), codec: Some(Box::new(SnacCodec(Arc::new(codec)))) },
            context,
        };
        (spec, front)
    }

    pub fn voices(&self) -> &Voices {
        &self.voices
    }

    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// The lane for `text` in `voice`: the Orpheus prompt and sampling, and as many tokens as the context leaves.
    pub fn request(&self, voice: &Voice, text: &str, seed: u64) -> Result<ValidRequest, DramaError> {
        let prompt = self.layout.build_prompt(&self.tokenizer, voice, text)?;
        if prompt.len() >= self.context {
            return Err(DramaError::PromptTooLong { prompt_tokens: prompt.len(), max_position: self.context });
        }
        let frames = DramaFrames::with_context(&self.layout, self.codes_per_frame, self.context_frames);
        Ok(ValidRequest {
            model: self.model,
            max_tokens: ORPHEUS_MAX_TOKENS.min(self.context - prompt.len()),
            prompt,
            sampling: orpheus_sampling(seed),
            stop_ids: self.layout.stop_ids().to_vec(),
            stop_strings: Vec::new(),
            logprobs: None,
            output: Output::Speech(Box::new(frames)),
        })
    }
}

/// A voice's text front end: text to the input of its voice lane.
pub trait VoiceText: Send + Sync {
    fn input(&self, text: &str, speed: f32, seed: u64) -> Result<VoiceInput, String>;
}

/// A voice model served through voice lanes.
pub struct VoiceSpeaker {
    pub model: ModelId,
    /// The name `/v1/models` lists.
    pub name: String,
    pub voices: Voices,
    pub text: Arc<dyn VoiceText>,
    pub sample_rate: u32,
}

pub enum Speaker {
    Drama(Arc<SpeechFrontEnd>),
    Voice(VoiceSpeaker),
}

impl Speaker {
    pub fn voices(&self) -> &Voices {
        match self {
            Speaker::Drama(front) => front.voices(),
            Speaker::Voice(v) => &v.voices,
        }
    }

    pub fn sample_rate(&self) -> u32 {
        match self {
            Speaker::Drama(front) => front.sample_rate(),
            Speaker::Voice(v) => v.sample_rate,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Speaker::Drama(front) => &front.name,
            Speaker::Voice(v) => &v.name,
        }
    }
}

/// Every speaker a server holds; a request's voice picks the speaker, and the first speaker's default voice is the default.
#[derive(Default)]
pub struct Speakers {
    list: Vec<Speaker>,
}

impl Speakers {
    pub fn push(&mut self, speaker: Speaker) {
        self.list.push(speaker);
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Each speaker's model name, in order.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.list.iter().map(|s| s.name().to_string())
    }

    pub fn voice_names(&self) -> Vec<String> {
        self.list.iter().flat_map(|s| s.voices().names().iter().cloned()).collect()
    }

    /// The speaker that knows `voice` (or the default voice), with the checked voice.
    pub fn pick(&self, voice: Option<&str>) -> Result<(&Speaker, Voice), DramaError> {
        let Some(first) = self.list.first() else {
            return Err(DramaError::UnknownVoice { voice: voice.unwrap_or_default().into(), valid: Vec::new() });
        };
        let Some(name) = voice else { return Ok((first, first.voices().default_voice())) };
        for speaker in &self.list {
            if let Ok(voice) = speaker.voices().check(Some(name)) {
                return Ok((speaker, voice));
            }
        }
        Err(DramaError::UnknownVoice { voice: name.into(), valid: self.voice_names() })
    }
}
