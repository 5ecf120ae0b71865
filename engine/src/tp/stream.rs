//! The GPU ranks' collective call, and a group of ranks that share one GPU's stream, which implements it on a
//! single GPU: the test backend of the device collective, and the rank arithmetic a multi-GPU group must match.

use std::sync::{Arc, Mutex};

use tensorfold_kernels::cuda::{DevPtr, Gpu, MAX_RANKS};

use super::collective::{CollectiveError, Rendezvous};

/// One GPU rank's side of its group's calls; every rank of the group makes the same calls in the same order.
pub trait DeviceCollective: Send + Sync {
    fn rank(&self) -> usize;
    fn ranks(&self) -> usize;
    /// Every rank's `len` floats at `values` become the sum of all ranks' values, added in rank order element by
    /// element (the order of `Collective::all_reduce_sum`); queued on the rank's stream, in order with its kernels.
    fn all_reduce_sum(&self, values: DevPtr, len: usize) -> Result<(), CollectiveError>;
}

struct Shared {
    gpu: Arc<Gpu>,
    slots: Mutex<Vec<(DevPtr, usize)>>,
    meet: Arc<Rendezvous>,
}

/// A rank of a group whose ranks all queue their kernels on one GPU's stream, each from its own thread.
pub struct StreamRank {
    rank: usize,
    ranks: usize,
    shared: Arc<Shared>,
}

/// `ranks` members of one group on `gpu`, rank 0 first; each must be driven from its own thread.
pub fn stream_group(gpu: Arc<Gpu>, ranks: usize) -> Vec<StreamRank> {
    let shared = Arc::new(Shared { gpu, slots: Mutex::new(vec![(0, 0); ranks]), meet: Rendezvous::new(ranks) });
    (0..ranks).map(|rank| StreamRank { rank, ranks, shared: shared.clone() }).collect()
}

impl StreamRank {
    /// Where the group's ranks wait, for the driver to break when a rank fails.
    pub fn rendezvous(&self) -> Arc<Rendezvous> {
        self.shared.meet.clone()
    }
}

impl DeviceCollective for StreamRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_reduce_sum(&self, values: DevPtr, len: usize) -> Result<(), CollectiveError> {
        let fault = |why: String| CollectiveError { rank: self.rank, why };
        if self.ranks > MAX_RANKS {
            return Err(fault(format!("{} ranks on one stream: at most {MAX_RANKS}", self.ranks)));
        }
        self.shared.slots.lock().map_err(|_| fault("a rank panicked".into()))?[self.rank] = (values, len);
        // The stream runs launches in queued order: every partial is queued before the sum, the sum before any reader.
        self.shared.meet.wait(self.rank)?;
        let queued = {
            let slots = self.shared.slots.lock().map_err(|_| fault("a rank panicked".into()))?;
            match (slots.iter().position(|&(_, n)| n != len), self.rank) {
                (Some(other), _) => Err(fault(format!("{len} values where rank {other} gave {}", slots[other].1))),
                (None, 0) => {
                    let parts: Vec<DevPtr> = slots.iter().map(|&(p, _)| p).collect();
                    self.shared.gpu.sum_ranks(&parts, len).map_err(|e| fault(e.to_string()))
                }
                (None, _) => Ok(()),
            }
        };
        // Every slot is read before any rank writes its next one.
        self.shared.meet.wait(self.rank)?;
        queued
    }
}
