//! Hibari in the rounds: a lane prepares each sentence in one step, then decodes a window of frames per step.

use std::path::Path;
use std::sync::Arc;

use crate::boundary::{EngineError, Synth, VoiceInput, VoiceState};
use tensorfold_audio::hibari::{Frames, Vocoder, VocoderStream, SAMPLE_RATE};

use super::acoustic::{AcousticError, AcousticModel, DecodedFrames, DecoderRows, Prepared};
use super::g2p::{G2p, G2pError};
use crate::speech::speakers::VoiceText;
use crate::speech::voices::Voices;

/// The voices this model speaks with; the wheel ships one.
pub const HIBARI_VOICES: [&str; 1] = ["heart"];
/// Frames in a lane's first window of a sentence; each next window doubles, up to `MAX_WINDOW_FRAMES`.
const FIRST_WINDOW_FRAMES: usize = 20;
const MAX_WINDOW_FRAMES: usize = 160;

/// The seed of chunk `chunk`'s noise, so sentences of one request draw different noise.
fn chunk_seed(seed: u64, chunk: usize) -> u64 {
    seed ^ (chunk as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn frames(decoded: &DecodedFrames) -> Frames<'_> {
    let d = decoded;
    Frames { lh: &d.lh, theta: &d.theta, ln: &d.ln, lr: &d.lr, phi: &d.phi, f0: &d.f0 }
}

/// The voice's network and signal stage, shared by every lane.
pub struct HibariVoice {
    acoustic: AcousticModel,
    vocoder: Vocoder,
}

impl HibariVoice {
    pub fn open(dir: &Path) -> Result<Arc<HibariVoice>, AcousticError> {
        Ok(Arc::new(HibariVoice { acoustic: AcousticModel::open_dir(dir)?, vocoder: Vocoder::new() }))
    }

    pub fn voices() -> Voices {
        Voices::new(HIBARI_VOICES.iter().map(|v| v.to_string()).collect(), 0).expect("one voice")
    }

    /// The whole audio of `input` in one pass per sentence: what a lane's windows must add up to.
    pub fn synthesize(&self, input: &VoiceInput) -> Result<Vec<f32>, String> {
        let mut pcm = Vec::new();
        for (chunk, ids) in input.chunks.iter().enumerate() {
            let prepared = self.acoustic.prepare(ids, input.speed).map_err(|e| e.to_string())?;
            let decoded = self.acoustic.decode_frames(&prepared, 0..prepared.num_frames);
            let audio = self.vocoder.synthesize(&frames(&decoded), chunk_seed(input.seed, chunk));
            pcm.extend(audio.map_err(|e| e.to_string())?);
        }
        Ok(pcm)
    }
}

/// The voice as the runtime's engine thread holds it.
pub struct HibariModel(pub Arc<HibariVoice>);

impl Synth for HibariModel {
    fn start(&self, input: VoiceInput) -> Box<dyn VoiceState> {
        Box::new(Lane { voice: self.0.clone(), input, chunk: 0, sentence: None })
    }
}

/// The sentence being spoken: its prepared features, the frames decoded so far, the decoder rows kept for
/// the next window, and its signal stream.
struct Sentence {
    prepared: Prepared,
    decoded: usize,
    rows: DecoderRows,
    window: usize,
    stream: VocoderStream,
}

struct Lane {
    voice: Arc<HibariVoice>,
    input: VoiceInput,
    chunk: usize,
    sentence: Option<Sentence>,
}

impl VoiceState for Lane {
    fn step(&mut self) -> Result<Option<Vec<f32>>, EngineError> {
        self.next_window().map_err(EngineError::Voice)
    }
}

impl Lane {
    fn next_window(&mut self) -> Result<Option<Vec<f32>>, String> {
        let Some(sentence) = &mut self.sentence else {
            let Some(ids) = self.input.chunks.get(self.chunk) else { return Ok(None) };
            let prepared = self.voice.acoustic.prepare(ids, self.input.speed).map_err(|e| e.to_string())?;
            let stream = VocoderStream::new(chunk_seed(self.input.seed, self.chunk));
            self.sentence = Some(Sentence {
                prepared,
                decoded: 0,
                rows: DecoderRows::default(),
                window: FIRST_WINDOW_FRAMES,
                stream,
            });
            return Ok(Some(Vec::new()));
        };
        let end = (sentence.decoded + sentence.window).min(sentence.prepared.num_frames);
        let decoded = self.voice.acoustic.decode_next(&sentence.prepared, sentence.decoded..end, &mut sentence.rows);
        sentence.stream.push(&frames(&decoded)).map_err(|e| e.to_string())?;
        sentence.decoded = end;
        sentence.window = (sentence.window * 2).min(MAX_WINDOW_FRAMES);
        if end < sentence.prepared.num_frames {
            return sentence.stream.pull(&self.voice.vocoder).map(Some).map_err(|e| e.to_string());
        }
        let pcm = sentence.stream.finish(&self.voice.vocoder).map_err(|e| e.to_string())?;
        self.sentence = None;
        self.chunk += 1;
        Ok(Some(pcm))
    }
}

/// The voice's text front end: sentences to phoneme ids.
pub struct HibariText(pub G2p);

impl HibariText {
    pub fn open(dir: &Path) -> Result<HibariText, G2pError> {
        G2p::load(dir).map(HibariText)
    }
}

impl VoiceText for HibariText {
    fn input(&self, text: &str, speed: f32, seed: u64) -> Result<VoiceInput, String> {
        let chunks: Vec<Vec<i64>> =
            self.0.phonemize(text).iter().map(|p| self.0.ids(p)).filter(|ids| ids.len() > 2).collect();
        if chunks.is_empty() {
            return Err(format!("the input has nothing to speak: {text:?} makes no phonemes"));
        }
        Ok(VoiceInput { chunks, speed, seed })
    }
}

/// Hibari's sample rate.
pub const HIBARI_SAMPLE_RATE: u32 = SAMPLE_RATE;
