//! `--device cuda`: opens the GPU, starts the device actor over its ledger, and loads a model through it.

use std::path::Path;
use std::sync::Arc;

use actix::Addr;
use tensorfold_actors::memory::cuda_driver::CudaDriver;
use tensorfold_actors::memory::device::{allocate_blocking, spawn_device, Allocation, DeviceActor};
use tensorfold_actors::memory::ledger::{Ledger, LedgerError, MemoryKind};
use tensorfold_audio::SnacDecoder;
use tensorfold_engine::boundary::{Engine, KvPool};
use tensorfold_engine::error::LoadError;
use tensorfold_engine::fetch::Fetcher;
use tensorfold_engine::llama::cuda::{CudaOptions, Sizing};
use tensorfold_engine::memory::{Held, MemoryError};
use tensorfold_engine::model::CudaModel;
use tensorfold_engine::speech::drama::cuda::CudaSnac;
use tensorfold_kernels::cuda::Gpu;

/// Which backend runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU kernels (the default).
    #[default]
    Cpu,
    /// The first NVIDIA GPU, through the CUDA driver.
    Cuda,
}

/// The GPU and the device actor whose ledger every GPU allocation goes through.
pub struct CudaDevice {
    pub gpu: Arc<Gpu>,
    pub device: Addr<DeviceActor>,
    /// The ledger's cap in bytes.
    pub cap: usize,
    pub options: CudaOptions,
}

impl CudaDevice {
    /// Opens GPU 0 with a cap of `memory_limit` bytes, by default 90% of its memory.
    pub fn open(memory_limit: Option<usize>, options: CudaOptions, fetcher: &Fetcher) -> Result<CudaDevice, LoadError> {
        let cache = fetcher.kernel_cache();
        let gpu = Gpu::open(0, Some(&cache), options.kernels).map_err(|e| LoadError::Device(e.to_string()))?;
        let total = gpu.total_memory().map_err(|e| LoadError::Device(e.to_string()))?;
        let cap = memory_limit.unwrap_or(total / 10 * 9);
        let driver = CudaDriver::new(gpu.clone());
        let device =
            spawn_device(Ledger::new(Some(cap), Box::new(driver))).map_err(|e| LoadError::Device(e.to_string()))?;
        tracing::info!(gpu = gpu.name(), memory_bytes = total, cap_bytes = cap, "GPU ready");
        Ok(CudaDevice { gpu, device, cap, options })
    }

    /// The engine's `Alloc` over the ledger, for loading onto the GPU.
    pub fn alloc(&self) -> impl FnMut(MemoryKind, usize) -> Result<Held, MemoryError> + '_ {
        |kind, bytes| self.allocate(kind, bytes).map(|a| Box::new(a) as Held).map_err(|e| MemoryError(e.to_string()))
    }

    /// Allocates through the ledger from outside the actor system.
    pub fn allocate(&self, kind: MemoryKind, bytes: usize) -> Result<Allocation, LedgerError> {
        allocate_blocking(&self.device, kind, bytes)
    }

    /// Loads a checkpoint onto the GPU with buffers for rounds of `sizing`.
    pub fn load(
        &self,
        path: &Path,
        sizing: Sizing,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<CudaModel, LoadError> {
        let mut alloc = self.alloc();
        tensorfold_engine::model::load_cuda(path, self.gpu.clone(), sizing, self.options, &mut alloc, progress)
    }

    /// The SNAC codec's weights and buffers on the GPU, through the ledger.
    pub fn load_codec(&self, codec: &SnacDecoder) -> Result<CudaSnac, LoadError> {
        let mut alloc = self.alloc();
        CudaSnac::load(codec, self.gpu.clone(), &mut alloc)
    }

    /// A KV pool of `num_pages` pages on the GPU, for driving an engine directly (tools and tests).
    pub fn kv_pool(&self, engine: &dyn Engine, page_tokens: usize, num_pages: usize) -> Result<KvPool, LedgerError> {
        let layout = engine.kv_layout(page_tokens);
        let bytes = layout.buffer_bytes(num_pages);
        let keys = self.allocate(MemoryKind::KvCache, bytes)?;
        let values = self.allocate(MemoryKind::KvCache, bytes)?;
        let ptrs = [keys.ptr().0, values.ptr().0];
        let pool = KvPool::on_device(layout, num_pages, Box::new((keys, values)), ptrs);
        match layout.state_bytes(num_pages) {
            0 => Ok(pool),
            bytes => {
                let states = self.allocate(MemoryKind::KvCache, bytes)?;
                let ptr = states.ptr().0;
                Ok(pool.with_device_states(ptr, Box::new(states)))
            }
        }
    }
}
