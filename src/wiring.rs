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
use tensorfold_engine::model::{CudaModel, LoadedModel};
use tensorfold_engine::speech::drama::stream::SnacCodec;
use tensorfold_engine::speech::drama::DramaParts;
use tensorfold_engine::speech::hibari::voice::{HibariModel, HIBARI_SAMPLE_RATE};
use tensorfold_engine::speech::hibari::{HibariText, HibariVoice};
use tensorfold_engine::speech::speakers::{Speaker, SpeechFrontEnd, VoiceSpeaker};
use tensorfold_engine::text::tokenizer::Tokenizer;
use tensorfold_lend::Lent;

use crate::cuda_setup::{CudaDevice, Device};
use crate::settings::{Key, Settings};

/// The registered name of the default voice.
pub const HIBARI: &str = "hibari";

/// A model loaded on its backend.
// One is built per loaded model and moved a few times, so the larger variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Loaded {
    Cpu(LoadedModel),
    Cuda(CudaDevice, CudaModel),
}

impl Loaded {
    pub fn config(&self) -> &ModelConfig {
        match self {
            Loaded::Cpu(m) => m.llama.config(),
            Loaded::Cuda(_, m) => m.llama.config(),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        match self {
            Loaded::Cpu(m) => &m.tokenizer,
            Loaded::Cuda(_, m) => &m.tokenizer,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Loaded::Cpu(m) => &m.name,
            Loaded::Cuda(_, m) => &m.name,
        }
    }

    /// The runtime's model, registered under the model's name, its tokenizer, and the device actor a GPU model's
    /// memory is held by.
    pub fn into_spec(
        self,
        context: usize,
        round_tokens: usize,
        parallel: usize,
    ) -> (ModelSpec, Tokenizer, Option<Addr<DeviceActor>>) {
        match self {
            Loaded::Cpu(LoadedModel { name, llama, tokenizer }) => {
                let spec = ModelSpec {
                    name,
                    weight_bytes: llama.num_weight_bytes(),
                    activation_bytes: llama.activation_bytes(round_tokens, parallel),
                    kind: ModelKind::Tokens { engine: Box::new(llama), codec: None },
                    context,
                };
                (spec, tokenizer, None)
            }
            Loaded::Cuda(dev, CudaModel { name, llama, tokenizer }) => {
                // Weights and activations are already held in the GPU ledger.
                let kind = ModelKind::Tokens { engine: Box::new(llama), codec: None };
                (ModelSpec { name, weight_bytes: 0, activation_bytes: 0, kind, context }, tokenizer, Some(dev.device))
            }
        }
    }
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
    let (engine, weight_bytes, activation_bytes): (Box<dyn Engine>, usize, usize) = match target {
        Loaded::Cpu(_) => {
            let m = tensorfold_engine::model::load(path, &mut quiet).with_context(loading)?;
            let (weights, activations) =
                (m.llama.num_weight_bytes(), m.llama.activation_bytes(round_tokens, sizing.max_lanes));
            (Box::new(m.llama), weights, activations)
        }
        // The device's ledger holds a GPU model's weights and buffers already.
        Loaded::Cuda(dev, _) => (Box::new(dev.load(path, sizing, &mut quiet).with_context(loading)?.llama), 0, 0),
    };
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
    let (model, weight_bytes) = match device {
        Device::Cpu => {
            let m = tensorfold_engine::model::load(&path, &mut progress)?;
            let bytes = m.llama.num_weight_bytes();
            (Loaded::Cpu(m), bytes)
        }
        Device::Cuda => {
            let dev = CudaDevice::open(memory_limit, settings.cuda_options(), &fetcher)?;
            let m = dev.load(&path, sizing, &mut progress)?;
            let bytes = m.llama.num_weight_bytes();
            tracing::info!(activation_bytes = m.llama.activation_bytes(), "GPU buffers");
            (Loaded::Cuda(dev, m), bytes)
        }
    };
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
pub fn engine_and_pool(model: &mut Loaded, num_pages: usize) -> Result<(Box<dyn Engine + '_>, KvPool)> {
    Ok(match model {
        Loaded::Cpu(m) => {
            let pool = KvPool::new(m.llama.kv_layout(PAGE_TOKENS), num_pages);
            (Box::new(&m.llama), pool)
        }
        Loaded::Cuda(dev, m) => {
            let pool = dev.kv_pool(&m.llama, PAGE_TOKENS, num_pages)?;
            (Box::new(&mut m.llama), pool)
        }
    })
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

/// A Drama checkpoint as a runtime model named `name`: its weights with its codec, sized for rounds of `round_tokens`.
pub fn drama_spec(name: String, llama: Llama, codec: SnacCodec, round_tokens: usize, parallel: usize) -> ModelSpec {
    ModelSpec {
        name,
        weight_bytes: llama.num_weight_bytes(),
        activation_bytes: llama.activation_bytes(round_tokens, parallel),
        context: llama.config().max_position,
        kind: ModelKind::Tokens { engine: Box::new(llama), codec: Some(Box::new(codec)) },
    }
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
    Ok(match target {
        Loaded::Cpu(_) if same => {
            let (codec, front) = SpeechFrontEnd::from_parts(parts, name, target.config().max_position);
            (front, DramaLanes::Shared(Box::new(SnacCodec(Arc::new(codec)))))
        }
        Loaded::Cpu(_) => {
            let llama = tensorfold_engine::model::load(dir, &mut quiet).with_context(loading)?.llama;
            let (codec, front) = SpeechFrontEnd::from_parts(parts, name.clone(), llama.config().max_position);
            (front, DramaLanes::Own(drama_spec(name, llama, SnacCodec(Arc::new(codec)), round_tokens, parallel)))
        }
        Loaded::Cuda(dev, _) => {
            let codec = Box::new(dev.load_codec(&parts.codec).with_context(loading)?);
            let model = match same {
                true => None,
                false => Some(dev.load(dir, sizing, &mut quiet).with_context(loading)?),
            };
            let positions = model.as_ref().map_or(target.config().max_position, |m| m.llama.config().max_position);
            let context = positions.min(sizing.context);
            let (_, front) = SpeechFrontEnd::from_parts(parts, name.clone(), context);
            let lanes = match model {
                // The device's ledger holds a GPU model's weights and buffers already.
                Some(m) => DramaLanes::Own(ModelSpec {
                    name,
                    weight_bytes: 0,
                    activation_bytes: 0,
                    context,
                    kind: ModelKind::Tokens { engine: Box::new(m.llama), codec: Some(codec) },
                }),
                None => DramaLanes::Shared(codec),
            };
            (front, lanes)
        }
    })
}

/// Refuses a `--context` the model cannot hold; unset, the model's own, at most 4096.
pub fn context(settings: &Settings, model_context: usize) -> Result<usize> {
    let context = settings.size(Key::Context).unwrap_or(model_context.min(4096));
    if context > model_context {
        bail!("--context: {context} is more than the model's context of {model_context}");
    }
    Ok(context)
}
