//! `tensorfold speak`: one speech request through the runtime's rounds, written to a WAV file.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tensorfold_actors::coordinator::Schedule;
use tensorfold_actors::engine::ModelId;
use tensorfold_actors::request_types::Event;
use tensorfold_actors::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use tensorfold_audio::pcm::to_i16;
use tokio::sync::mpsc::Receiver;

use crate::generate::PAGE_TOKENS;
use crate::hibari::voice::{HibariModel, HIBARI_SAMPLE_RATE};
use crate::hibari::{HibariText, HibariVoice};
use crate::speech::{Speaker, SpeechFrontEnd, VoiceSpeaker, MAX_INPUT_CHARS};

/// The default voice as a runtime model and its speaker, fetching its files on first use.
pub fn hibari_speaker(model: ModelId) -> Result<(ModelSpec, Speaker)> {
    let dir = crate::fetch::hibari_dir().context("fetching the default voice")?;
    let voice = HibariVoice::open(&dir).with_context(|| format!("loading the default voice from {}", dir.display()))?;
    let text =
        HibariText::open(&dir).with_context(|| format!("loading the voice's text front end from {}", dir.display()))?;
    let spec = ModelSpec {
        kind: ModelKind::Voice(Box::new(HibariModel(voice))),
        context: 0,
        weight_bytes: 0,
        activation_bytes: 0,
    };
    let speaker = VoiceSpeaker {
        model,
        name: "hibari".into(),
        voices: HibariVoice::voices(),
        text: Arc::new(text),
        sample_rate: HIBARI_SAMPLE_RATE,
    };
    Ok((spec, Speaker::Voice(speaker)))
}

pub struct SpeakArgs {
    /// A Drama checkpoint; `None` speaks with the default voice.
    pub speech_model: Option<PathBuf>,
    pub text: String,
    pub voice: Option<String>,
    pub speed: f32,
    pub seed: u64,
    pub output: PathBuf,
}

pub fn speak(args: SpeakArgs) -> Result<()> {
    let chars = args.text.chars().count();
    if args.text.trim().is_empty() {
        bail!("--text is empty or only whitespace");
    }
    if chars > MAX_INPUT_CHARS {
        bail!("--text must hold at most {MAX_INPUT_CHARS} characters, not {chars}");
    }
    if !(0.25..=4.0).contains(&args.speed) {
        bail!("--speed must be between 0.25 and 4.0, not {}", args.speed);
    }
    let schedule = Schedule { round_tokens: 512, parallel: 1, max_waiting: 1 };
    let (spec, speaker) = match &args.speech_model {
        Some(dir) => {
            let (spec, front) = SpeechFrontEnd::open(dir, 0, 512, 1)
                .with_context(|| format!("loading the speech model {}", dir.display()))?;
            (spec, Speaker::Drama(Arc::new(front)))
        }
        None => hibari_speaker(0)?,
    };
    let voice = speaker.voices().check(args.voice.as_deref())?;
    let sample_rate = speaker.sample_rate();
    let wav_spec =
        hound::WavSpec { channels: 1, sample_rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut wav = hound::WavWriter::create(&args.output, wav_spec)
        .with_context(|| format!("creating {}", args.output.display()))?;
    // Speech from the CLI is one lane of the same rounds the server runs.
    let num_samples = actix_web::rt::System::new().block_on(async move {
        let events = match &speaker {
            Speaker::Drama(front) => {
                if args.speed != 1.0 {
                    bail!("--speed {} is not supported: voice {} speaks at speed 1.0 only", args.speed, voice.name());
                }
                let request = front.request(&voice, &args.text, args.seed)?;
                let pages = (request.prompt.len() + request.max_tokens).div_ceil(PAGE_TOKENS);
                let cfg =
                    RuntimeConfig { page_tokens: PAGE_TOKENS, kv_pages: Some(pages), memory_limit: None, schedule };
                let runtime = Runtime::start(vec![spec], cfg).await?;
                runtime.submit(request).await?
            }
            Speaker::Voice(v) => {
                let input = v.text.input(&args.text, args.speed, args.seed).map_err(anyhow::Error::msg)?;
                let cfg = RuntimeConfig { page_tokens: PAGE_TOKENS, kv_pages: Some(0), memory_limit: None, schedule };
                let runtime = Runtime::start(vec![spec], cfg).await?;
                runtime.submit_voice(v.model, input).await?
            }
        };
        write_all(events, &mut wav).await?;
        let n = wav.len() as usize;
        wav.finalize()?;
        Ok(n)
    })?;
    let seconds = num_samples as f64 / sample_rate as f64;
    eprintln!("wrote {} ({seconds:.2} s of audio)", args.output.display());
    Ok(())
}

async fn write_all(
    mut events: Receiver<Event>,
    wav: &mut hound::WavWriter<std::io::BufWriter<std::fs::File>>,
) -> Result<()> {
    while let Some(event) = events.recv().await {
        match event {
            Event::Audio { pcm } => pcm.iter().try_for_each(|s| wav.write_sample(to_i16(*s)))?,
            Event::Done { .. } => return Ok(()),
            Event::Error { message } => bail!("speaking failed: {message}"),
            Event::Token { .. } => {}
        }
    }
    bail!("the speech request ended early")
}
