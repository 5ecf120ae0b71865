//! Speech requests for the runtime: the speakers a server holds (Drama checkpoints and voices) and their front ends.

use std::path::Path;
use std::sync::Arc;

use crate::boundary::{Output, TokenWork, VoiceInput};
use tensorfold_audio::snac::NUM_CODEBOOKS;
use tensorfold_audio::SnacDecoder;

use crate::llama::Llama;
use crate::speech::drama::stream::{DramaFrames, SnacCodec};
use crate::speech::drama::{orpheus_sampling, DramaError, DramaLayout, DramaModel, DramaParts, ORPHEUS_MAX_TOKENS};
use crate::speech::voices::{UnknownVoice, Voice, Voices};
use crate::text::tokenizer::Tokenizer;

/// Most characters of input text one speech request may carry.
pub const MAX_INPUT_CHARS: usize = 4096;

/// Everything of a loaded Drama checkpoint but its weights: what turns text into a speech lane.
pub struct SpeechFrontEnd {
    /// The registered runtime model that runs this checkpoint's lanes.
    pub model: String,
    /// The name `/v1/models` lists.
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
    /// Opens the Drama checkpoint in `dir`: its weights and codec for the runtime, and its front end, named for the directory.
    pub fn open(dir: &Path) -> Result<(Llama, SnacCodec, Self), DramaError> {
        let drama = DramaModel::open(dir)?;
        let name = dir.file_name().map_or_else(|| "drama".into(), |n| n.to_string_lossy().into_owned());
        Ok(SpeechFrontEnd::split(drama, name))
    }

    /// A loaded checkpoint as its weights, its codec and a front end whose lanes run on the model `name`.
    pub fn split(drama: DramaModel, name: String) -> (Llama, SnacCodec, Self) {
        let DramaModel { llama, tokenizer, layout, voices, codec } = drama;
        let context = llama.config().max_position;
        let (codec, front) = SpeechFrontEnd::from_parts(DramaParts { tokenizer, layout, voices, codec }, name, context);
        (llama, SnacCodec(Arc::new(codec)), front)
    }

    /// A front end for a checkpoint whose language model, of `context` positions, is loaded elsewhere; and its codec.
    pub fn from_parts(parts: DramaParts, name: String, context: usize) -> (SnacDecoder, Self) {
        let DramaParts { tokenizer, layout, voices, codec } = parts;
        let front = SpeechFrontEnd {
            model: name.clone(),
            name,
            tokenizer,
            layout,
            voices,
            sample_rate: codec.sample_rate(),
            codes_per_frame: codec.codes_per_frame(),
            context_frames: codec.context_frames(),
            context,
        };
        (codec, front)
    }

    pub fn voices(&self) -> &Voices {
        &self.voices
    }

    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// The lane for `text` in `voice`: the Orpheus prompt and sampling, and as many tokens as the context leaves.
    pub fn request(&self, voice: &Voice, text: &str, seed: u64) -> Result<TokenWork, DramaError> {
        let prompt = self.layout.build_prompt(&self.tokenizer, voice, text)?;
        if prompt.len() >= self.context {
            return Err(DramaError::PromptTooLong { prompt_tokens: prompt.len(), max_position: self.context });
        }
        let frames = DramaFrames::with_context(&self.layout, self.codes_per_frame, self.context_frames);
        Ok(TokenWork {
            max_tokens: ORPHEUS_MAX_TOKENS.min(self.context - prompt.len()),
            prompt,
            sampling: orpheus_sampling(seed),
            stop_ids: self.layout.stop_ids().to_vec(),
            stop_strings: Vec::new(),
            logprobs: None,
            cache: true,
            keep_reply: false,
            draft: false,
            rules: Default::default(),
            constraint: None,
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
    /// The registered runtime model that runs its lanes.
    pub model: String,
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
    /// The registered runtime model that runs the speaker's lanes.
    pub fn model(&self) -> &str {
        match self {
            Speaker::Drama(front) => &front.model,
            Speaker::Voice(v) => &v.model,
        }
    }

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

    /// The speaker named `model`, else the first.
    fn named_or_first(&self, model: &str) -> Option<&Speaker> {
        self.list.iter().find(|s| s.name() == model).or(self.list.first())
    }

    /// The speaker and voice of a request: a voice's own name finds it on any speaker; no voice, or one of OpenAI's
    /// names, resolves on the speaker `model` names, else on the first.
    pub fn pick(&self, voice: Option<&str>, model: &str) -> Result<(&Speaker, Voice), UnknownVoice> {
        let Some(chosen) = self.named_or_first(model) else {
            return Err(UnknownVoice { voice: voice.unwrap_or_default().into(), valid: Vec::new() });
        };
        if let Some(name) = voice {
            for speaker in &self.list {
                if let Ok(voice) = speaker.voices().check(Some(name)) {
                    return Ok((speaker, voice));
                }
            }
        }
        match chosen.voices().resolve(voice) {
            Ok(voice) => Ok((chosen, voice)),
            Err(unknown) => Err(UnknownVoice { voice: unknown.voice, valid: self.voice_names() }),
        }
    }

    /// Every speaker in order.
    pub fn iter(&self) -> impl Iterator<Item = &Speaker> {
        self.list.iter()
    }
}
