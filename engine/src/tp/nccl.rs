//! GPU ranks joined by NCCL, one GPU each: every rank's partials all-gathered, then added in rank order on each rank
//! by the same kernel as the one-stream group, in place of NCCL's all-reduce, whose order depends on message size.

use std::sync::Arc;

use tensorfold_kernels::cuda::{DevPtr, Gpu, NcclComm};

use super::collective::CollectiveError;
use super::stream::DeviceCollective;
use crate::memory::{Alloc, Held, MemoryError, MemoryKind};

/// A rank of an NCCL group: its GPU, its communicator, and room for every rank's partials.
pub struct NcclRank {
    gpu: Arc<Gpu>,
    comm: NcclComm,
    gather: DevPtr,
    max_len: usize,
    _held: Held,
}

/// One rank per GPU of `gpus` (ordinal and opened GPU), each with room to gather `max_len` floats from every rank,
/// taken through `alloc`; the caller keeps NVLink multicast off (`NCCL_NVLS_ENABLE=0`).
pub fn nccl_group(gpus: &[(usize, Arc<Gpu>)], max_len: usize, alloc: &mut Alloc) -> Result<Vec<NcclRank>, String> {
    let ordinals: Vec<usize> = gpus.iter().map(|(o, _)| *o).collect();
    let comms = NcclComm::group(&ordinals).map_err(|e| e.to_string())?;
    let bytes = 4 * max_len * gpus.len();
    let mut ranks = Vec::with_capacity(gpus.len());
    for ((_, gpu), comm) in gpus.iter().zip(comms) {
        let held = alloc(MemoryKind::Activations, bytes).map_err(|MemoryError(e)| e)?;
        let gather = held.ptr().0;
        ranks.push(NcclRank { gpu: gpu.clone(), comm, gather, max_len, _held: held });
    }
    Ok(ranks)
}

impl DeviceCollective for NcclRank {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn ranks(&self) -> usize {
        self.comm.ranks()
    }

    fn all_reduce_sum(&self, values: DevPtr, len: usize) -> Result<(), CollectiveError> {
        let fault = |why: String| CollectiveError { rank: self.rank(), why };
        if len > self.max_len {
            return Err(fault(format!("{len} values where the group has room for {}", self.max_len)));
        }
        let parts: Vec<DevPtr> = (0..self.ranks()).map(|r| self.gather + (4 * r * len) as u64).collect();
        let g = &self.gpu;
        g.all_gather(&self.comm, values, self.gather, len).map_err(|e| fault(e.to_string()))?;
        g.sum_ranks(&parts, len).map_err(|e| fault(e.to_string()))?;
        g.copy_on_device(values, parts[0], 4 * len).map_err(|e| fault(e.to_string()))
    }
}
