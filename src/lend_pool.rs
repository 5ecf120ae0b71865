//! Device memory for `tensorfold lend --device cuda`: each loan is fresh memory from `cuMemCreate` on one GPU,
//! cleared, and handed to the client as a POSIX descriptor it imports into its own context.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use tensorfold_kernels::cuda::cudarc::driver::{result, CudaContext};
use tensorfold_kernels::cuda::{GpuError, Mapped, Vmm};
use tensorfold_lend::pool::{Loan, Pool, PoolError, Slices};
use tensorfold_lend::SLICE_BYTES;

/// Why the device pool could not open.
#[derive(Debug, thiserror::Error)]
pub enum DevicePoolError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(
        "GPU {ordinal} maps memory in pieces of {granularity} bytes, which do not divide a slice of {slice} bytes"
    )]
    Granularity { ordinal: usize, granularity: usize, slice: u64 },
}

/// Whole slices of one GPU's memory; a loan's memory exists from its grant until it is taken back.
pub struct DevicePool {
    vmm: Vmm,
    ctx: Arc<CudaContext>,
    ordinal: usize,
    slices: Slices,
    /// Each loan's memory, mapped here only to clear it, by the number of the descriptor its loan holds.
    held: HashMap<RawFd, Mapped>,
}

impl DevicePool {
    /// A pool of `num_slices` slices on GPU `ordinal`; no memory is made until a loan asks for it.
    pub fn open(ordinal: usize, num_slices: usize) -> Result<DevicePool, DevicePoolError> {
        let vmm = Vmm::open(ordinal)?;
        let granularity = vmm.granularity()?;
        if granularity == 0 || !SLICE_BYTES.is_multiple_of(granularity as u64) {
            return Err(DevicePoolError::Granularity { ordinal, granularity, slice: SLICE_BYTES });
        }
        // The driver is present (Vmm::open checked), so this is the same primary context.
        let ctx = CudaContext::new(ordinal).map_err(GpuError::from)?;
        Ok(DevicePool { vmm, ctx, ordinal, slices: Slices::new(num_slices), held: HashMap::new() })
    }

    /// Fresh memory of `bytes`, cleared, and the descriptor that shares it.
    fn make(&self, bytes: usize) -> Result<(Mapped, std::os::fd::OwnedFd), GpuError> {
        let physical = self.vmm.create(bytes)?;
        let memory = physical.share()?;
        let mapped = self.vmm.map(vec![physical])?;
        self.ctx.bind_to_thread()?;
        // SAFETY: the range is mapped, readable and writable by this context, and `bytes` long.
        unsafe { result::memset_d8_sync(mapped.ptr(), 0, bytes) }?;
        // The clear must be done before the client can write, and a memset may return before it is.
        self.ctx.synchronize()?;
        Ok((mapped, memory))
    }
}

impl Pool for DevicePool {
    fn describe(&self) -> String {
        format!("GPU {} memory (cuMemCreate), {} slices of {} MiB", self.ordinal, self.slices.total, SLICE_BYTES >> 20)
    }

    fn slices(&self) -> Slices {
        self.slices
    }

    fn lend(&mut self, num_slices: usize) -> Result<Loan, PoolError> {
        let mut slices = self.slices;
        slices.lend(num_slices)?;
        let bytes = usize::try_from(num_slices as u64 * SLICE_BYTES)
            .map_err(|_| PoolError::Backing(format!("{num_slices} slices do not fit in an address")))?;
        // A GPU short of memory refuses here, in cuMemCreate, and the daemon answers with a refusal.
        let (mapped, memory) = self.make(bytes).map_err(|e| PoolError::Backing(e.to_string()))?;
        self.held.insert(memory.as_raw_fd(), mapped);
        self.slices = slices;
        Ok(Loan { memory, num_slices })
    }

    fn take_back(&mut self, loan: Loan) {
        // Dropping the mapping releases this process's hold; the memory goes once the client lets go too.
        self.held.remove(&loan.memory.as_raw_fd());
        self.slices.take_back(loan.num_slices);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPU 0's pool of `num_slices`, or `None` after saying why the test is skipped.
    fn pool(num_slices: usize) -> Option<DevicePool> {
        match DevicePool::open(0, num_slices) {
            Ok(pool) => Some(pool),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    #[test]
    fn test_a_device_pool_lends_whole_slices_and_takes_them_back() {
        let Some(mut pool) = pool(3) else { return };
        let loan = pool.lend(2).unwrap();
        assert_eq!((loan.bytes(), pool.num_free(), pool.held.len()), (2 * SLICE_BYTES, 1, 1));
        assert!(matches!(pool.lend(2), Err(PoolError::NoRoom { asked: 2, free: 1 })));
        assert!(matches!(pool.lend(0), Err(PoolError::NoRoom { .. })));
        let imported = pool.vmm.import(std::os::fd::AsFd::as_fd(&loan.memory), loan.bytes() as usize).unwrap();
        drop(imported);
        pool.take_back(loan);
        assert_eq!((pool.num_free(), pool.held.len()), (3, 0));
    }

    #[test]
    fn test_a_device_pool_refuses_more_than_the_gpu_has() {
        // A pool counts slices, not the GPU's memory; cuMemCreate is what refuses.
        let Some(mut pool) = pool(1 << 20) else { return };
        let total = pool.ctx.total_mem().unwrap();
        let num_slices = (total as u64 / SLICE_BYTES) as usize + 1;
        let refused = pool.lend(num_slices);
        assert!(matches!(refused, Err(PoolError::Backing(_))), "{refused:?}");
        assert_eq!(pool.num_free(), 1 << 20);
        let loan = pool.lend(1).unwrap();
        pool.take_back(loan);
    }
}
