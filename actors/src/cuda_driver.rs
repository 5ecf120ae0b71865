//! The CUDA driver table under the ledger: cuMemAlloc/cuMemFree for device memory, cuMemAllocHost/cuMemFreeHost for pinned.

use std::sync::Arc;

use tensorfold_kernels::cuda::Gpu;

use crate::ledger::{DevicePtr, DriverError, DriverTable, MemoryKind};

pub struct CudaDriver {
    gpu: Arc<Gpu>,
}

impl CudaDriver {
    pub fn new(gpu: Arc<Gpu>) -> CudaDriver {
        CudaDriver { gpu }
    }
}

impl DriverTable for CudaDriver {
    fn alloc(&mut self, kind: MemoryKind, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.gpu.malloc(bytes, kind == MemoryKind::PinnedHost).map(DevicePtr).map_err(|(oom, reason)| match oom {
            true => DriverError::OutOfMemory { bytes },
            false => DriverError::Failed { reason },
        })
    }

    fn free(&mut self, kind: MemoryKind, ptr: DevicePtr, _bytes: usize) {
        self.gpu.free(ptr.0, kind == MemoryKind::PinnedHost);
    }

    fn is_host_addressable(&self, kind: MemoryKind) -> bool {
        kind == MemoryKind::PinnedHost
    }
}
