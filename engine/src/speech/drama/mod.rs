//! The Drama speech family: a Llama 3 whose vocabulary holds SNAC codes in the Orpheus TTS layout, and its codec.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tensorfold_audio::snac::{Codes, NUM_CODEBOOKS};
use tensorfold_audio::{CodecError, SnacDecoder};
use tensorfold_kernels::sampling::SamplingParams;

pub mod cuda;
pub mod stream;

use crate::boundary::FinishReason;
use crate::error::LoadError;
use crate::generate::Sequence;
use crate::llama::Llama;
use crate::speech::voices::{UnknownVoice, Voice, Voices};
use crate::text::tokenizer::{TokenizeError, Tokenizer};

/// The codec's directory inside a Drama checkpoint.
pub const CODEC_DIR: &str = "snac";
/// An optional file naming the checkpoint's voices; without it the Orpheus English voices apply.
pub const VOICES_FILE: &str = "drama.json";

/// Voices of the public Orpheus English finetune, best first by its authors' judgement.
pub const ORPHEUS_VOICES: [&str; 8] = ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"];
pub const ORPHEUS_DEFAULT_VOICE: &str = "tara";
/// OpenAI's voice names for the Orpheus voices: female to female and male to male, `alloy` to the default.
pub const ORPHEUS_ALIASES: [(&str, &str); 11] = [
    ("alloy", "tara"),
    ("ash", "leo"),
    ("ballad", "dan"),
    ("coral", "leah"),
    ("echo", "zac"),
    ("fable", "leo"),
    ("nova", "jess"),
    ("onyx", "dan"),
    ("sage", "mia"),
    ("shimmer", "zoe"),
    ("verse", "zac"),
];

pub const SLOTS_PER_FRAME: usize = 7;
/// The codebook each slot of a frame feeds, in the order Orpheus interleaves them.
pub const SLOT_CODEBOOK: [usize; SLOTS_PER_FRAME] = [0, 1, 2, 2, 1, 2, 2];
/// Codes per codebook; slot `s` of a frame owns the token range `[s * CODEBOOK_SIZE, (s + 1) * CODEBOOK_SIZE)`.
pub const CODEBOOK_SIZE: usize = 4096;
/// `<custom_token_0>` to `<custom_token_9>` are control tokens; codes start at `<custom_token_10>`.
const FIRST_CODE_TOKEN: usize = 10;
/// The SNAC codes per frame that `SLOT_CODEBOOK` fills.
const CODES_PER_FRAME: [usize; NUM_CODEBOOKS] = [1, 2, 4];

/// The reference engine's generation limit, in tokens.
pub const ORPHEUS_MAX_TOKENS: usize = 1200;

#[derive(Debug, thiserror::Error)]
pub enum DramaError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    #[error("{}: no codec: Drama keeps the SNAC codec in {}", dir.display(), dir.join(CODEC_DIR).display())]
    MissingCodec { dir: PathBuf },
    #[error("{}: not a Drama checkpoint: {fault}", dir.display())]
    NotDrama { dir: PathBuf, fault: String },
    #[error("the tokenizer has no {name}, which the Orpheus layout needs")]
    MissingToken { name: String },
    #[error("the tokenizer's {name} is id {found}, but the Orpheus layout puts it at {expected}")]
    ScatteredCodes { name: String, found: u32, expected: u32 },
    #[error("{}: {fault}", path.display())]
    Voices { path: PathBuf, fault: String },
    #[error(transparent)]
    UnknownVoice(#[from] UnknownVoice),
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    #[error(transparent)]
    Engine(#[from] crate::boundary::EngineError),
    #[error("bad sampling parameters: {0}")]
    Sampling(String),
    #[error(
        "a prompt of {prompt_tokens} tokens and {max_tokens} new tokens exceed the model's {max_position} positions"
    )]
    TooLong { prompt_tokens: usize, max_tokens: usize, max_position: usize },
    #[error("the text makes a prompt of {prompt_tokens} tokens, which leaves no room in the model's {max_position} positions")]
    PromptTooLong { prompt_tokens: usize, max_position: usize },
}

/// Sampling as the reference Orpheus engine does it: temperature 0.6, top-p 0.8, repetition penalty 1.3.
pub fn orpheus_sampling(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.6, top_p: 0.8, repetition_penalty: 1.3, seed, ..Default::default() }
}

fn custom_token(n: usize) -> String {
    format!("<custom_token_{n}>")
}

/// Token ids of the Orpheus layout, found by name so any vocabulary size serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DramaLayout {
    pub bos: u32,
    /// `<|eot_id|>`, which the Orpheus code calls end-of-text.
    pub end_of_text: u32,
    pub start_of_human: u32,
    pub end_of_human: u32,
    pub start_of_ai: u32,
    pub start_of_speech: u32,
    pub end_of_speech: u32,
    pub end_of_ai: u32,
    /// Id of `<custom_token_10>`: code 0 of slot 0.
    pub first_code: u32,
    stop_ids: Vec<u32>,
}

impl DramaLayout {
    /// Finds the layout's tokens and checks that all `SLOTS_PER_FRAME * CODEBOOK_SIZE` code tokens are consecutive.
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Self, DramaError> {
        let id = |name: &str| tok.token_id(name).ok_or_else(|| DramaError::MissingToken { name: name.into() });
        let bos = match tok.token_id("<|begin_of_text|>").or(tok.bos_id()) {
            Some(bos) => bos,
            None => return Err(DramaError::MissingToken { name: "<|begin_of_text|> (or a declared BOS)".into() }),
        };
        let first_code = id(&custom_token(FIRST_CODE_TOKEN))?;
        for n in 1..SLOTS_PER_FRAME * CODEBOOK_SIZE {
            let name = custom_token(FIRST_CODE_TOKEN + n);
            let expected = first_code.checked_add(n as u32).ok_or(DramaError::MissingToken { name: name.clone() })?;
            let found = id(&name)?;
            if found != expected {
                return Err(DramaError::ScatteredCodes { name, found, expected });
            }
        }
        let end_of_speech = id(&custom_token(2))?;
        let end_of_ai = id(&custom_token(6))?;
        let mut stop_ids = vec![end_of_speech, end_of_ai];
        stop_ids.extend(tok.eos_ids().iter().filter(|t| ![end_of_speech, end_of_ai].contains(t)));
        Ok(DramaLayout {
            bos,
            end_of_text: id("<|eot_id|>")?,
            start_of_speech: id(&custom_token(1))?,
            end_of_speech,
            start_of_human: id(&custom_token(3))?,
            end_of_human: id(&custom_token(4))?,
            start_of_ai: id(&custom_token(5))?,
            end_of_ai,
            first_code,
            stop_ids,
        })
    }

    /// Start-of-human, BOS, `"{voice}: {text}"`, end-of-text, end-of-human, start-of-AI, start-of-speech.
    pub fn build_prompt(&self, tok: &Tokenizer, voice: &Voice, text: &str) -> Result<Vec<u32>, DramaError> {
        let words = tok.encode(&format!("{}: {text}", voice.name()), false)?;
        let mut ids = Vec::with_capacity(words.len() + 6);
        ids.extend([self.start_of_human, self.bos]);
        ids.extend(words);
        ids.extend([self.end_of_text, self.end_of_human, self.start_of_ai, self.start_of_speech]);
        Ok(ids)
    }

    pub fn is_end_of_speech(&self, id: u32) -> bool {
        id == self.end_of_speech
    }

    /// Tokens that end generation: end-of-speech first, then end-of-AI and the tokenizer's end-of-text tokens.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether `id` is one of the `SLOTS_PER_FRAME * CODEBOOK_SIZE` code tokens.
    pub fn is_code(&self, id: u32) -> bool {
        code_offset(self.first_code, id).is_some()
    }
}

/// A code token's `slot * CODEBOOK_SIZE + code`; `None` for every other token.
fn code_offset(first_code: u32, id: u32) -> Option<usize> {
    let offset = id.checked_sub(first_code)? as usize;
    (offset < SLOTS_PER_FRAME * CODEBOOK_SIZE).then_some(offset)
}

/// The Orpheus English voices, `tara` first as their default, with OpenAI's names.
pub fn orpheus_voices() -> Voices {
    let names = ORPHEUS_VOICES.iter().map(|v| v.to_string()).collect();
    let default = ORPHEUS_VOICES.iter().position(|v| *v == ORPHEUS_DEFAULT_VOICE).unwrap_or(0);
    let voices = Voices::new(names, default).expect("the Orpheus voices are not empty");
    voices.with_aliases(&ORPHEUS_ALIASES).expect("the alias table names every OpenAI voice and only Orpheus voices")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VoicesFile {
    voices: Vec<String>,
    default_voice: Option<String>,
}

/// `dir/drama.json` (`{"voices": [...], "default_voice": "..."}`), or the Orpheus voices without one.
pub fn voices_from_dir(dir: &Path) -> Result<Voices, DramaError> {
    let path = dir.join(VOICES_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(orpheus_voices()),
        Err(e) => return Err(DramaError::Voices { path, fault: e.to_string() }),
    };
    let bad = |fault: String| DramaError::Voices { path: path.clone(), fault };
    let file: VoicesFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let mut seen = HashSet::new();
    if let Some(v) = file.voices.iter().find(|v| v.trim().is_empty() || !seen.insert(v.as_str())) {
        return Err(bad(format!("voice {v:?} is empty or listed twice")));
    }
    let default = match &file.default_voice {
        None if file.voices.is_empty() => return Err(bad("no voices listed".into())),
        None => 0,
        Some(d) => {
            file.voices.iter().position(|v| v == d).ok_or_else(|| bad(format!("default voice {d:?} is not listed")))?
        }
    };
    Voices::new(file.voices, default).ok_or_else(|| bad("no voices listed".into()))
}

/// One frame of SNAC codes: one of codebook 0, two of codebook 1 and four of codebook 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub c0: [u32; 1],
    pub c1: [u32; 2],
    pub c2: [u32; 4],
}

impl Frame {
    fn from_slots(slots: &[u32; SLOTS_PER_FRAME]) -> Frame {
        let [s0, s1, s2, s3, s4, s5, s6] = *slots;
        Frame { c0: [s0], c1: [s1, s4], c2: [s2, s3, s5, s6] }
    }
}

/// What one generated token did to the frame being assembled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assembled {
    /// Not a code token, or a code of a slot already passed: ignored, as the reference decoder ignores it.
    Skipped,
    /// Filled the next slot of an unfinished frame.
    Pending,
    Frame(Frame),
    /// Finished a frame in which some slot holds a code from a later slot's range, so it cannot be decoded.
    Dropped,
}

/// Turns generated tokens into frames, one token at a time, with the reference decoder's positions.
#[derive(Clone, Debug)]
pub struct FrameAssembler {
    first_code: u32,
    slots: [u32; SLOTS_PER_FRAME],
    num_filled: usize,
    misplaced: bool,
}

impl FrameAssembler {
    pub fn new(layout: &DramaLayout) -> Self {
        FrameAssembler { first_code: layout.first_code, slots: [0; SLOTS_PER_FRAME], num_filled: 0, misplaced: false }
    }

    /// Slots filled of the frame under way; they are lost if generation ends here.
    pub fn num_pending(&self) -> usize {
        self.num_filled
    }

    pub fn push(&mut self, id: u32) -> Assembled {
        let Some(offset) = code_offset(self.first_code, id) else {
            return Assembled::Skipped;
        };
        // The reference subtracts the slot's offset and keeps any result that is not negative.
        let Some(code) = offset.checked_sub(self.num_filled * CODEBOOK_SIZE) else {
            return Assembled::Skipped;
        };
        self.misplaced |= code >= CODEBOOK_SIZE;
        self.slots[self.num_filled] = code as u32;
        self.num_filled += 1;
        if self.num_filled < SLOTS_PER_FRAME {
            return Assembled::Pending;
        }
        self.num_filled = 0;
        match std::mem::take(&mut self.misplaced) {
            true => Assembled::Dropped,
            false => Assembled::Frame(Frame::from_slots(&self.slots)),
        }
    }
}

/// Frames' codes gathered per codebook, the form the codec decodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameCodes {
    codebooks: [Vec<u32>; NUM_CODEBOOKS],
}

impl FrameCodes {
    pub fn push(&mut self, frame: &Frame) {
        self.codebooks[0].extend(frame.c0);
        self.codebooks[1].extend(frame.c1);
        self.codebooks[2].extend(frame.c2);
    }

    pub fn num_frames(&self) -> usize {
        self.codebooks[0].len()
    }

    pub fn codebook(&self, i: usize) -> &[u32] {
        &self.codebooks[i]
    }

    pub fn codes(&self) -> Codes<'_> {
        std::array::from_fn(|i| self.codebooks[i].as_slice())
    }
}

/// The result of one synthesis: the generated tokens, the frames they formed and the PCM.
#[derive(Clone, Debug)]
pub struct Synthesis {
    /// Generated tokens, without the stop token.
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub frames: FrameCodes,
    pub num_dropped_frames: usize,
    /// Mono samples at the codec's rate.
    pub pcm: Vec<f32>,
}

/// A Drama checkpoint's parts beside its language model: tokenizer and layout, voices, codec.
pub struct DramaParts {
    pub tokenizer: Tokenizer,
    pub layout: DramaLayout,
    pub voices: Voices,
    pub codec: SnacDecoder,
}

impl DramaParts {
    /// Reads `dir` (a Hugging Face Llama directory) but its weights, and its codec in `dir/snac`.
    pub fn open(dir: &Path) -> Result<Self, DramaError> {
        if !dir.is_dir() {
            return Err(DramaError::NotDrama { dir: dir.into(), fault: "not a directory".into() });
        }
        if !dir.join(CODEC_DIR).is_dir() {
            return Err(DramaError::MissingCodec { dir: dir.into() });
        }
        let codec = SnacDecoder::open(dir.join(CODEC_DIR))?;
        if codec.config().codebook_size != CODEBOOK_SIZE || codec.codes_per_frame() != CODES_PER_FRAME {
            let (size, per_frame) = (codec.config().codebook_size, codec.codes_per_frame());
            let want = format!("{CODEBOOK_SIZE} in {CODES_PER_FRAME:?}");
            let fault = format!("codec codebooks of {size} codes in frames of {per_frame:?}, not {want}");
            return Err(DramaError::NotDrama { dir: dir.into(), fault });
        }
        let voices = voices_from_dir(dir)?;
        let tokenizer = Tokenizer::from_hf_dir(dir)?;
        let layout = DramaLayout::from_tokenizer(&tokenizer)?;
        Ok(DramaParts { tokenizer, layout, voices, codec })
    }
}

/// A Drama checkpoint ready to speak: the language model, its tokenizer and layout, voices and codec.
pub struct DramaModel {
    pub llama: Llama,
    pub tokenizer: Tokenizer,
    pub layout: DramaLayout,
    pub voices: Voices,
    pub codec: SnacDecoder,
}

impl DramaModel {
    /// Loads `dir` (a Hugging Face Llama directory) and its codec in `dir/snac`.
    pub fn open(dir: &Path) -> Result<Self, DramaError> {
        let DramaParts { tokenizer, layout, voices, codec } = DramaParts::open(dir)?;
        let llama = crate::model::load(dir, &mut |_, _| {})?.llama;
        Ok(DramaModel { llama, tokenizer, layout, voices, codec })
    }

    pub fn sample_rate(&self) -> u32 {
        self.codec.sample_rate()
    }

    /// Speaks `text` in one lane: generates up to `max_tokens` tokens, assembles frames, decodes them without noise.
    pub fn synthesize(
        &self,
        voice: &str,
        text: &str,
        sampling: &SamplingParams,
        max_tokens: usize,
    ) -> Result<Synthesis, DramaError> {
        let voice = self.voices.check(Some(voice))?;
        sampling.validate().map_err(DramaError::Sampling)?;
        let prompt = self.layout.build_prompt(&self.tokenizer, &voice, text)?;
        let max_position = self.llama.config().max_position;
        if prompt.len().saturating_add(max_tokens) > max_position {
            return Err(DramaError::TooLong { prompt_tokens: prompt.len(), max_tokens, max_position });
        }
        let mut sequence = Sequence::new(&self.llama, prompt.len() + max_tokens);
        let mut assembler = FrameAssembler::new(&self.layout);
        let (mut tokens, mut frames, mut num_dropped_frames) = (Vec::new(), FrameCodes::default(), 0);
        let finish = sequence.generate(&prompt, max_tokens, sampling, self.layout.stop_ids(), |token| {
            tokens.push(token);
            match assembler.push(token) {
                Assembled::Frame(frame) => frames.push(&frame),
                Assembled::Dropped => num_dropped_frames += 1,
                Assembled::Skipped | Assembled::Pending => {}
            }
            true
        })?;
        let pcm = match frames.num_frames() {
            0 => Vec::new(),
            _ => self.codec.decode(frames.codes(), None)?,
        };
        Ok(Synthesis { tokens, finish, frames, num_dropped_frames, pcm })
    }
}

#[cfg(test)]
mod tests;
