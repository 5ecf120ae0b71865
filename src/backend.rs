//! Where models run: the CPU, or one GPU whose device actor's ledger holds every allocation. The backend loads a
//! checkpoint, makes KV pools and codecs where its models run, and says what memory the runtime must still count.

use std::path::Path;
use std::sync::Arc;

use actix::Addr;
use anyhow::Result;
use tensorfold_actors::coordinator::Drafting;
use tensorfold_actors::memory::device::DeviceActor;
use tensorfold_audio::SnacDecoder;
use tensorfold_engine::boundary::{Codec, Engine, KvPool};
use tensorfold_engine::error::LoadError;
use tensorfold_engine::fetch::Fetcher;
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::config::ModelConfig;
use tensorfold_engine::llama::cuda::{CudaOptions, Sizing};
use tensorfold_engine::speech::drama::stream::SnacCodec;
use tensorfold_engine::text::tokenizer::Tokenizer;

use crate::cuda_setup::{CudaDevice, Device};

/// The backend every model of one server runs on.
pub enum Backend {
    /// The CPU kernels; models and pools live in host memory.
    Cpu,
    /// One GPU; weights, buffers and pools are allocated through its device actor's ledger.
    Cuda(CudaDevice),
}

/// A text model loaded on its backend.
pub struct TextModel {
    pub name: String,
    pub tokenizer: Tokenizer,
    pub config: ModelConfig,
    pub engine: Box<dyn Engine>,
    /// Bytes of its weights, wherever they are.
    pub weight_bytes: usize,
}

impl Backend {
    /// The backend for `device`: opening a GPU starts its device actor, with a cap of `memory_limit` bytes.
    pub fn open(device: Device, memory_limit: Option<usize>, options: CudaOptions, fetcher: &Fetcher) -> Result<Self> {
        Ok(match device {
            Device::Cpu => Backend::Cpu,
            Device::Cuda => Backend::Cuda(CudaDevice::open(memory_limit, options, fetcher)?),
        })
    }

    /// Loads the checkpoint at `path`; on a GPU with buffers for rounds of `sizing`.
    pub fn load(
        &self,
        path: &Path,
        sizing: Sizing,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<TextModel, LoadError> {
        Ok(match self {
            Backend::Cpu => {
                let m = tensorfold_engine::model::load(path, progress)?;
                let (config, weight_bytes) = (m.llama.config().clone(), m.llama.num_weight_bytes());
                TextModel { name: m.name, tokenizer: m.tokenizer, config, engine: Box::new(m.llama), weight_bytes }
            }
            Backend::Cuda(dev) => {
                let m = dev.load(path, sizing, progress)?;
                let (config, weight_bytes) = (m.llama.config().clone(), m.llama.num_weight_bytes());
                tracing::info!(activation_bytes = m.llama.activation_bytes(), "GPU buffers");
                TextModel { name: m.name, tokenizer: m.tokenizer, config, engine: Box::new(m.llama), weight_bytes }
            }
        })
    }

    /// A KV pool of `num_pages` pages of `PAGE_TOKENS` positions for `engine`, where the backend keeps KV.
    pub fn kv_pool(&self, engine: &dyn Engine, num_pages: usize) -> Result<KvPool> {
        Ok(match self {
            Backend::Cpu => KvPool::new(engine.kv_layout(PAGE_TOKENS), num_pages),
            Backend::Cuda(dev) => dev.kv_pool(engine, PAGE_TOKENS, num_pages)?,
        })
    }

    /// A Drama checkpoint's codec, run where the backend runs.
    pub fn codec(&self, decoder: SnacDecoder) -> Result<Box<dyn Codec>, LoadError> {
        Ok(match self {
            Backend::Cpu => Box::new(SnacCodec(Arc::new(decoder))),
            Backend::Cuda(dev) => Box::new(dev.load_codec(&decoder)?),
        })
    }

    /// Positions a lane of a model with `max_position` may hold: a GPU model's buffers hold `sizing.context`.
    pub fn positions(&self, max_position: usize, sizing: Sizing) -> usize {
        match self {
            Backend::Cpu => max_position,
            Backend::Cuda(_) => max_position.min(sizing.context),
        }
    }

    /// The bytes the runtime's KV plan may use: a GPU's ledger cap, else what was asked.
    pub fn memory_limit(&self, asked: Option<usize>) -> Option<usize> {
        match self {
            Backend::Cpu => asked,
            Backend::Cuda(dev) => Some(dev.cap),
        }
    }

    /// Prompt-lookup drafts of `tokens` (by default 12 on a GPU, where a round's width is nearly free, 3 on the CPU).
    pub fn drafting(&self, tokens: Option<usize>) -> Drafting {
        match self {
            Backend::Cpu => Drafting::on_cpu(tokens.unwrap_or(3)),
            Backend::Cuda(_) => Drafting::on_gpu(tokens.unwrap_or(12)),
        }
    }

    /// The device actor the runtime allocates through, on a GPU.
    pub fn device_actor(&self) -> Option<Addr<DeviceActor>> {
        match self {
            Backend::Cpu => None,
            Backend::Cuda(dev) => Some(dev.device.clone()),
        }
    }
}
