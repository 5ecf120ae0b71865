//! NCCL communicators for tensor-parallel ranks in one process, and the all-gather they run on a GPU's stream.

use cudarc::nccl::{result, sys as nccl};

use super::{DevPtr, Gpu, GpuError};

fn fault(what: &str, e: result::NcclError) -> GpuError {
    GpuError::Collective(format!("NCCL {what}: {e:?}"))
}

/// One rank's NCCL communicator.
pub struct NcclComm {
    comm: nccl::ncclComm_t,
    rank: usize,
    ranks: usize,
}

// SAFETY: a communicator is used by one rank's thread at a time, which NCCL allows from any thread.
unsafe impl Send for NcclComm {}
// SAFETY: the rank's calls through a shared reference are made from that rank's thread alone.
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// One communicator per GPU of `ordinals`, made together; rank r runs on `ordinals[r]`.
    pub fn group(ordinals: &[usize]) -> Result<Vec<NcclComm>, GpuError> {
        // SAFETY: only opens the library.
        if !unsafe { nccl::is_culib_present() } {
            return Err(GpuError::Collective("no NCCL library (libnccl.so) was found".into()));
        }
        let devices: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has one slot per device in `devices`.
        unsafe { result::comm_init_all(comms.as_mut_ptr(), devices.len() as i32, devices.as_ptr()) }
            .map_err(|e| fault("init", e))?;
        let ranks = comms.len();
        Ok(comms.into_iter().enumerate().map(|(rank, comm)| NcclComm { comm, rank, ranks }).collect())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the communicator was made by `group` and is destroyed once.
        if let Err(e) = unsafe { result::comm_destroy(self.comm) } {
            tracing::warn!(error = ?e, "destroying an NCCL communicator failed");
        }
    }
}

impl Gpu {
    /// Queues an all-gather on this GPU's stream: rank r's `count` floats at `send` land at `recv + 4 r count` on
    /// every rank.
    pub fn all_gather(&self, comm: &NcclComm, send: DevPtr, recv: DevPtr, count: usize) -> Result<(), GpuError> {
        let stream = self.stream.cu_stream() as nccl::cudaStream_t;
        // SAFETY: callers pass `count` floats at `send` and `ranks * count` at `recv`, on this GPU.
        unsafe {
            result::all_gather(
                send as *const std::ffi::c_void,
                recv as *mut std::ffi::c_void,
                count,
                nccl::ncclDataType_t::ncclFloat32,
                comm.comm,
                stream,
            )
        }
        .map_err(|e| fault("all-gather", e))?;
        Ok(())
    }

    /// Queues a copy of `bytes` from `src` to `dst`, both on this GPU.
    pub fn copy_on_device(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), GpuError> {
        // SAFETY: callers pass two allocations of at least `bytes` bytes on this GPU.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())? };
        Ok(())
    }
}
