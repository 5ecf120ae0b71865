//! The wiring: models and speakers built from settings, registered by name with the runtime.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use actix::Addr;
use anyhow::{bail, Context, Result};
use tensorfold_actors::memory::device::DeviceActor;
use tensorfold_actors::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use tensorfold_engine::boundary::{Codec, Engine, KvPool};
use tensorfold_engine::fetch::Fetcher;
use tensorfold_engine::generate::{Sequence, PAGE_TOKENS};
use tensorfold_engine::llama::config::ModelConfig;
use tensorfold_engine::llama::cuda::Sizing;
use tensorfold_engine::llama::Llama;
use tensorfold_engine::speech::drama::stream::SnacCodec;
use tensorfold_engine::speech::drama::DramaParts;
use tensorfold_engine::speech::hibari::voice::{HibariModel, HIBARI_SAMPLE_RATE};
use tensorfold_engine::speech::hibari::{HibariText, HibariVoice};
use tensorfold_engine::speech::speakers::{Speaker, SpeechFrontEnd, VoiceSpeaker};
use tensorfold_engine::text::tokenizer::Tokenizer;
use tensorfold_lend::Lent;

use crate::backend::{Backend, TextModel};
use crate::settings::{Key, Settings};

/// The registered name of the default voice.
pub const HIBARI: &str = "hibari";

/// The text model and the backend it runs on.
pub struct Loaded {
    pub backend: Backend,
    pub model: TextModel,
}

impl Loaded {
    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }

    pub fn name(&self) -> &str {
        &self.model.name
    }

    /// The runtime's model, registered under the model's name, its tokenizer, and the device actor a GPU model's
    /// memory is held by.
    pub fn into_spec(
        self,
        context: usize,
        round_tokens: usize,
        parallel: usize,
    ) -> (ModelSpec, Tokenizer, Option<Addr<DeviceActor>>) {
        let TextModel { name, tokenizer, engine, .. } = self.model;
        let spec = tokens_spec(name, engine, None, context, round_tokens, parallel);
        (spec, tokenizer, self.backend.device_actor())
    }
}

/// A runtime model of tokens named `name`, with `codec` for speech, counting the host bytes its engine holds for
/// rounds of `round_tokens` over `parallel` lanes.
fn tokens_spec(
    name: String,
    engine: Box<dyn Engine>,
    codec: Option<Box<dyn Codec>>,
    context: usize,
    round_tokens: usize,
    parallel: usize,
) -> ModelSpec {
    let (weight_bytes, activation_bytes) = engine.host_bytes(round_tokens, parallel);
    ModelSpec { name, weight_bytes, activation_bytes, context, kind: ModelKind::Tokens { engine, codec } }
}

/// The draft model at `path`, loaded where `target` runs, as a runtime model that drafts for it.
pub fn draft_spec(
    target: &Loaded,
    path: &Path,
    sizing: Sizing,
    context: usize,
    round_tokens: usize,
) -> Result<ModelSpec> {
    let mut quiet = |_: usize, _: usize| {};
    let loading = || format!("--draft-model: loading {}", path.display());
    let engine = target.backend.load(path, sizing, &mut quiet).with_context(loading)?.engine;
    let (weight_bytes, activation_bytes) = engine.host_bytes(round_tokens, sizing.max_lanes);
    tracing::info!(path = %path.display(), weight_bytes, "draft model loaded");
    let kind = ModelKind::Draft { engine, target: target.name().to_string() };
    Ok(ModelSpec { name: format!("{} (draft)", target.name()), kind, context, weight_bytes, activation_bytes })
}

/// Starts the runtime on the GPU's device actor when there is one.
pub async fn start_runtime(
    device: Option<Addr<DeviceActor>>,
    models: Vec<ModelSpec>,
    cfg: RuntimeConfig,
    lent: Option<Lent>,
) -> Result<Runtime> {
    Ok(match device {
        Some(d) => Runtime::start_on_lent(d, models, cfg, lent).await?,
        None => Runtime::start_lent(models, cfg, lent).await?,
    })
}

/// `--model`, or the default model, fetched on first use.
pub fn model_path(settings: &Settings, fetcher: &Fetcher) -> Result<PathBuf> {
    match settings.path(Key::Model) {
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(fetcher.default_model_path()?),
    }
}

pub fn same_path(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// Loads the text model on `--device`; a GPU model gets buffers for rounds of `sizing` under `memory_limit`.
pub fn load(settings: &Settings, sizing: Sizing, memory_limit: Option<usize>) -> Result<Loaded> {
    if let Some(n) = settings.size(Key::Threads) {
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global().context("starting the compute threads")?;
    }
    let fetcher = settings.fetcher()?;
    let path = model_path(settings, &fetcher)?;
    let started = Instant::now();
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        let style = indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers");
        bar.set_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
        bar.set_message(path.display().to_string());
        bar
    });
    let mut progress = |done: usize, total: usize| match &bar {
        Some(b) => {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
        None if done == total => tracing::info!(path = %path.display(), layers = total, "model loaded"),
        None => {}
    };
    let device = settings.device();
    let backend = Backend::open(device, memory_limit, settings.cuda_options(), &fetcher)?;
    let model = backend.load(&path, sizing, &mut progress)?;
    let weight_bytes = model.weight_bytes;
    let model = Loaded { backend, model };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let cfg = model.config();
    tracing::info!(
        arch = %cfg.arch,
        layers = cfg.num_layers,
        ?device,
        weight_bytes,
        threads = rayon::current_num_threads(),
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "ready"
    );
    Ok(model)
}

/// One lane driven straight through the engine, with room for `capacity` positions on the model's device.
pub fn sequence(model: &mut Loaded, capacity: usize) -> Result<Sequence<Box<dyn Engine + '_>>> {
    let (engine, pool) = engine_and_pool(model, capacity.div_ceil(PAGE_TOKENS).max(1))?;
    Ok(Sequence::with_pool(engine, pool))
}

/// The model's engine and a KV pool of `num_pages` pages of `PAGE_TOKENS` where the model runs.
pub fn engine_and_pool(loaded: &mut Loaded, num_pages: usize) -> Result<(Box<dyn Engine + '_>, KvPool)> {
    let pool = loaded.backend.kv_pool(&*loaded.model.engine, num_pages)?;
    Ok((Box::new(&mut *loaded.model.engine), pool))
}

/// The default voice as a runtime model and its speaker, fetching its files on first use.
pub fn hibari_speaker(fetcher: &Fetcher) -> Result<(ModelSpec, Speaker)> {
    let dir = fetcher.hibari_dir().context("fetching the default voice")?;
    let voice = HibariVoice::open(&dir).with_context(|| format!("loading the default voice from {}", dir.display()))?;
    let text =
        HibariText::open(&dir).with_context(|| format!("loading the voice's text front end from {}", dir.display()))?;
    let spec = ModelSpec {
        name: HIBARI.into(),
        kind: ModelKind::Voice(Box::new(HibariModel(voice))),
        context: 0,
        weight_bytes: 0,
        activation_bytes: 0,
    };
    let speaker = VoiceSpeaker {
        model: HIBARI.into(),
        name: HIBARI.into(),
        voices: HibariVoice::voices(),
        text: Arc::new(text),
        sample_rate: HIBARI_SAMPLE_RATE,
    };
    Ok((spec, Speaker::Voice(speaker)))
}

/// A Drama checkpoint on the CPU as a runtime model named `name`: its weights with its codec, sized for rounds of
/// `round_tokens` over `parallel` lanes.
pub fn drama_spec(name: String, llama: Llama, codec: SnacCodec, round_tokens: usize, parallel: usize) -> ModelSpec {
    let context = llama.config().max_position;
    tokens_spec(name, Box::new(llama), Some(Box::new(codec)), context, round_tokens, parallel)
}

/// Where a Drama checkpoint's lanes run.
pub enum DramaLanes {
    /// Its own language model, with its codec.
    Own(ModelSpec),
    /// The text model, the same checkpoint, with this codec attached: text and speech lanes share every forward pass.
    Shared(Box<dyn Codec>),
}

/// A Drama checkpoint served where `target` runs (`same`: `target` is this checkpoint): its front end, and where its
/// lanes run, the codec on the GPU with a GPU text model.
pub fn drama(
    target: &Loaded,
    dir: &Path,
    same: bool,
    sizing: Sizing,
    round_tokens: usize,
    parallel: usize,
) -> Result<(SpeechFrontEnd, DramaLanes)> {
    let loading = || format!("loading the speech model {}", dir.display());
    let parts = DramaParts::open(dir).with_context(loading)?;
    let name = dir.file_name().map_or_else(|| "drama".into(), |n| n.to_string_lossy().into_owned());
    let mut quiet = |_: usize, _: usize| {};
    let backend = &target.backend;
    let model = match same {
        true => None,
        false => Some(backend.load(dir, sizing, &mut quiet).with_context(loading)?),
    };
    let max_position = model.as_ref().map_or(target.config().max_position, |m| m.config.max_position);
    let context = backend.positions(max_position, sizing);
    let (decoder, front) = SpeechFrontEnd::from_parts(parts, name.clone(), context);
    let codec = backend.codec(decoder).with_context(loading)?;
    let lanes = match model {
        Some(m) => DramaLanes::Own(tokens_spec(name, m.engine, Some(codec), context, round_tokens, parallel)),
        None => DramaLanes::Shared(codec),
    };
    Ok((front, lanes))
}

/// Refuses a `--context` the model cannot hold; unset, the model's own, at most 4096.
pub fn context(settings: &Settings, model_context: usize) -> Result<usize> {
    let context = settings.size(Key::Context).unwrap_or(model_context.min(4096));
    if context > model_context {
        bail!("--context: {context} is more than the model's context of {model_context}");
    }
    Ok(context)
}
