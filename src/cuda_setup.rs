//! `--device cuda`: opens the GPU, starts the device actor over its ledger, and loads a model through it.

use std::path::Path;
use std::sync::Arc;

use actix::Addr;
use tensorfold_actors::cuda_driver::{CudaDriver, DriverCalls};
use tensorfold_actors::device::{allocate_blocking, spawn_device, DeviceActor};
use tensorfold_actors::engine::{Engine, KvPool};
use tensorfold_actors::ledger::{Ledger, LedgerError, MemoryKind};
use tensorfold_kernels::cuda::Gpu;

use crate::cuda_llama::Sizing;
use crate::error::LoadError;
use crate::model::CudaModel;

/// Which backend runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
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
    pub calls: Arc<DriverCalls>,
    /// The ledger's cap in bytes.
    pub cap: usize,
}

impl CudaDevice {
    /// Opens GPU 0 with a cap of `memory_limit` bytes, by default 90% of its memory.
    pub fn open(memory_limit: Option<usize>) -> Result<CudaDevice, LoadError> {
        let cache = crate::fetch::cache_dir().ok().map(|d| d.join("kernels"));
        let gpu = Gpu::open(0, cache.as_deref()).map_err(|e| LoadError::Device(e.to_string()))?;
        let total = gpu.total_memory().map_err(|e| LoadError::Device(e.to_string()))?;
        let cap = memory_limit.unwrap_or(total / 10 * 9);
        let (driver, calls) = CudaDriver::new(gpu.clone());
        let device =
            spawn_device(Ledger::new(Some(cap), Box::new(driver))).map_err(|e| LoadError::Device(e.to_string()))?;
        tracing::info!(gpu = gpu.name(), memory_bytes = total, cap_bytes = cap, "GPU ready");
        Ok(CudaDevice { gpu, device, calls, cap })
    }

    /// Allocates through the ledger from outside the actor system.
    pub fn allocate(
        &self,
        kind: MemoryKind,
        bytes: usize,
    ) -> Result<tensorfold_actors::device::Allocation, LedgerError> {
        allocate_blocking(&self.device, kind, bytes)
    }

    /// Loads a checkpoint onto the GPU with buffers for rounds of `sizing`.
    pub fn load(
        &self,
        path: &Path,
        sizing: Sizing,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<CudaModel, LoadError> {
        let mut alloc = |kind, bytes| self.allocate(kind, bytes);
        crate::model::load_cuda(path, self.gpu.clone(), sizing, &mut alloc, progress)
    }

    /// A KV pool of `num_pages` pages on the GPU, for driving an engine directly (tools and tests).
    pub fn kv_pool(&self, engine: &dyn Engine, page_tokens: usize, num_pages: usize) -> Result<KvPool, LedgerError> {
        let layout = engine.kv_layout(page_tokens);
        let bytes = num_pages * layout.page_floats() * 4;
        let keys = self.allocate(MemoryKind::KvCache, bytes)?;
        let values = self.allocate(MemoryKind::KvCache, bytes)?;
        let ptrs = [keys.ptr().0, values.ptr().0];
        Ok(KvPool::on_device(layout, num_pages, Box::new(keys), Box::new(values), ptrs))
    }
}
