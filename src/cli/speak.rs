//! `tensorfold speak`: one speech request through the runtime's rounds, written to a WAV file.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use tensorfold_actors::coordinator::{Drafting, Schedule};
use tensorfold_actors::request_types::{Event, ValidRequest, Work};
use tensorfold_actors::runtime::{Runtime, RuntimeConfig};
use tensorfold_audio::pcm::to_i16;
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::speech::speakers::{Speaker, SpeechFrontEnd, MAX_INPUT_CHARS};
use tokio::sync::mpsc::Receiver;

use crate::settings::cli::SPEECH;
use crate::settings::{Key, Settings, TableArgs};
use crate::wiring::{drama_spec, hibari_speaker};

#[derive(Args)]
pub struct SpeakArgs {
    // The table's `--speech-model`: a Drama checkpoint to speak with; unset, the default voice.
    #[command(flatten)]
    pub table: TableArgs<SPEECH>,
    /// The text to speak.
    #[arg(long)]
    pub text: String,
    /// The voice; default: the checkpoint's default voice.
    #[arg(long)]
    pub voice: Option<String>,
    /// Random seed; the same seed gives the same audio.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Speaking rate, 0.25 to 4.0 (the default voice only; Drama speaks at 1.0).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f32,
    /// Where to write the 16-bit mono WAV file.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

pub fn speak(args: SpeakArgs, settings: &Settings) -> Result<()> {
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
    let schedule = Schedule { round_tokens: 512, parallel: 1, max_waiting: 1, drafting: Drafting::OFF };
    let (spec, speaker) = match settings.path(Key::SpeechModel) {
        Some(dir) => {
            let (llama, codec, front) =
                SpeechFrontEnd::open(dir).with_context(|| format!("loading the speech model {}", dir.display()))?;
            (drama_spec(front.model.clone(), llama, codec, 512, 1), Speaker::Drama(Arc::new(front)))
        }
        None => hibari_speaker(&settings.fetcher()?)?,
    };
    let voice = speaker.voices().resolve(args.voice.as_deref())?;
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
                let work = front.request(&voice, &args.text, args.seed)?;
                let pages = (work.prompt.len() + work.max_tokens).div_ceil(PAGE_TOKENS);
                let cfg = RuntimeConfig {
                    page_tokens: PAGE_TOKENS,
                    kv_pages: Some(pages),
                    memory_limit: None,
                    schedule,
                    prefix_cache_tokens: 0,
                };
                let runtime = Runtime::start(vec![spec], cfg).await?;
                runtime.submit(ValidRequest { model: front.model.clone(), work: Work::Tokens(work) }).await?
            }
            Speaker::Voice(v) => {
                let input = v.text.input(&args.text, args.speed, args.seed).map_err(anyhow::Error::msg)?;
                let cfg = RuntimeConfig {
                    page_tokens: PAGE_TOKENS,
                    kv_pages: Some(0),
                    memory_limit: None,
                    schedule,
                    prefix_cache_tokens: 0,
                };
                let runtime = Runtime::start(vec![spec], cfg).await?;
                runtime.submit(ValidRequest { model: v.model.clone(), work: Work::Voice(input) }).await?
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
            Event::Error(e) => bail!("speaking failed: {e}"),
            Event::Token { .. } | Event::Embedding { .. } => {}
        }
    }
    bail!("the speech request ended early")
}
