//! The CUDA driver table under the ledger: cuMemAlloc/cuMemFree for device memory, cuMemAllocHost/cuMemFreeHost for pinned.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tensorfold_kernels::cuda::Gpu;

use crate::ledger::{DevicePtr, DriverError, DriverTable, MemoryKind};

/// How often the ledger reached the driver, for tests that show a refusal never does.
#[derive(Debug, Default)]
pub struct DriverCalls {
    pub allocs: AtomicUsize,
    pub frees: AtomicUsize,
    pub failures: AtomicUsize,
}

pub struct CudaDriver {
    gpu: Arc<Gpu>,
    calls: Arc<DriverCalls>,
}

impl CudaDriver {
    pub fn new(gpu: Arc<Gpu>) -> (CudaDriver, Arc<DriverCalls>) {
        let calls = Arc::new(DriverCalls::default());
        (CudaDriver { gpu, calls: calls.clone() }, calls)
    }
}

impl DriverTable for CudaDriver {
    fn alloc(&mut self, kind: MemoryKind, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.calls.allocs.fetch_add(1, Ordering::SeqCst);
        self.gpu.malloc(bytes, kind == MemoryKind::PinnedHost).map(DevicePtr).map_err(|(oom, reason)| {
            self.calls.failures.fetch_add(1, Ordering::SeqCst);
            match oom {
                true => DriverError::OutOfMemory { bytes },
                false => DriverError::Failed { reason },
            }
        })
    }

    fn free(&mut self, kind: MemoryKind, ptr: DevicePtr, _bytes: usize) {
        self.calls.frees.fetch_add(1, Ordering::SeqCst);
        self.gpu.free(ptr.0, kind == MemoryKind::PinnedHost);
    }

    fn is_host_addressable(&self, kind: MemoryKind) -> bool {
        kind == MemoryKind::PinnedHost
    }
}
