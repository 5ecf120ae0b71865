//! The CUDA driver table under the ledger: cuMemAlloc/cuMemFree for device memory, cuMemAllocHost/cuMemFreeHost for
//! pinned, and the virtual memory calls for lent device memory mapped beside the process's own.

use std::sync::Arc;

use std::os::fd::BorrowedFd;

use tensorfold_kernels::cuda::{Gpu, GpuError};

use crate::memory::ledger::{DevicePtr, DriverError, DriverTable, Mapping, MemoryKind};

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

    fn map_lent(&mut self, own_bytes: usize, lent: BorrowedFd, lent_bytes: usize) -> Result<Mapping, DriverError> {
        let vmm = self.gpu.vmm();
        let failed = |e: GpuError| DriverError::Failed { reason: e.to_string() };
        let grain = vmm.granularity().map_err(failed)?;
        if grain == 0 || !own_bytes.is_multiple_of(grain) || !lent_bytes.is_multiple_of(grain) {
            return Err(DriverError::Failed {
                reason: format!("{own_bytes} own and {lent_bytes} lent bytes are not whole {grain}-byte grains"),
            });
        }
        let mut parts = vec![vmm.import(lent, lent_bytes).map_err(failed)?];
        if own_bytes > 0 {
            let out_of_memory = |e: GpuError| match e.is_out_of_memory() {
                true => DriverError::OutOfMemory { bytes: own_bytes },
                false => failed(e),
            };
            parts.push(vmm.create(own_bytes).map_err(out_of_memory)?);
        }
        let mapped = vmm.map(parts).map_err(failed)?;
        Ok(Mapping { ptr: DevicePtr(mapped.ptr()), holder: Box::new(mapped) })
    }
}
