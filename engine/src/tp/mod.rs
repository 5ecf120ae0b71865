//! Tensor parallelism: a model's layers split over ranks that run every round together and add their partial
//! sums after the attention output and the MLP down projection.
//!
//! Each rank holds its share of the heads and MLP rows (`shard`), its share of the KV heads, and the whole
//! residual stream. The two sums per layer go through `Collective::all_reduce_sum`, whose order is fixed (rank 0,
//! then 1, ...) and never chosen by message size, so for a fixed rank count a row's result never depends on the
//! batch. Between rank counts the results differ in the last bits: N ranks add N partial sums of a projection
//! where one rank adds its terms in one run.

pub mod collective;
pub mod nccl;
pub mod shard;
pub mod stream;

use std::sync::Arc;

use tensorfold_kernels::cuda::Gpu;

use crate::boundary::{Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep};
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::cuda::{CudaLlama, CudaOptions, Sizing};
use crate::llama::Llama;
use crate::memory::{Alloc, MemoryError, MemoryKind, OwnedAlloc};
use collective::{host_group, Rendezvous};
use nccl::nccl_group;
use shard::ShardedCheckpoint;
use stream::{stream_group, DeviceCollective};

/// One rank: its engine, the compute threads it runs on (CPU ranks), and (past rank 0) its own KV pool.
struct Rank {
    engine: Box<dyn Engine>,
    threads: Option<rayon::ThreadPool>,
    pool: Option<KvPool>,
}

/// Where the ranks past 0 keep their KV pools.
enum RankPools {
    Host,
    /// On the GPU, from memory this grants (the runtime's ledger).
    Device(OwnedAlloc),
}

impl RankPools {
    fn make(&mut self, layout: KvLayout, pages: usize) -> Result<KvPool, EngineError> {
        match self {
            RankPools::Host => Ok(KvPool::new(layout, pages)),
            RankPools::Device(alloc) => {
                let bytes = layout.buffer_bytes(pages);
                let oom = |e: MemoryError| EngineError::OutOfMemory(format!("a tensor-parallel rank's KV pool: {e}"));
                let keys = alloc(MemoryKind::KvCache, bytes).map_err(oom)?;
                let values = alloc(MemoryKind::KvCache, bytes).map_err(oom)?;
                let ptrs = [keys.ptr().0, values.ptr().0];
                Ok(KvPool::on_device(layout, pages, Box::new((keys, values)), ptrs))
            }
        }
    }
}

/// Ranks driven as one engine: each round runs on every rank at once; rank 0's rows are the answer (every rank
/// computes the same). Rank 0 keeps its KV in the runtime's pool; the others in pools of the same pages.
pub struct TensorParallel {
    ranks: Vec<Rank>,
    pools: RankPools,
    /// Where the ranks meet: broken when one fails in a round, so the others do not wait for it.
    meet: Arc<Rendezvous>,
}

impl TensorParallel {
    /// `ranks` CPU ranks of the checkpoint, joined by a host group, sharing `threads` compute threads.
    pub fn load_cpu(ckpt: &dyn Checkpoint, ranks: usize, threads: usize) -> Result<TensorParallel, LoadError> {
        let (mut out, group) = (Vec::with_capacity(ranks), host_group(ranks));
        let meet = group[0].rendezvous();
        for (rank, member) in group.into_iter().enumerate() {
            let mut llama = Llama::load(&ShardedCheckpoint::new(ckpt, rank, ranks)?)?;
            llama.join(Box::new(member));
            let threads = rayon::ThreadPoolBuilder::new()
                .num_threads((threads / ranks).max(1))
                .thread_name(move |i| format!("tp{rank}-{i}"))
                .build()
                .map_err(|e| LoadError::format(ckpt.path(), e.to_string()))?;
            out.push(Rank { engine: Box::new(llama), threads: Some(threads), pool: None });
        }
        Ok(TensorParallel { ranks: out, pools: RankPools::Host, meet })
    }

    /// `ranks` GPU ranks of the checkpoint on one GPU, their kernels on its one stream, weights and round buffers
    /// from `alloc`; the KV pools of ranks past 0 from `kv`.
    pub fn load_cuda(
        ckpt: &dyn Checkpoint,
        gpu: Arc<Gpu>,
        ranks: usize,
        sizing: Sizing,
        options: CudaOptions,
        alloc: &mut Alloc,
        kv: OwnedAlloc,
    ) -> Result<TensorParallel, LoadError> {
        let group = stream_group(gpu.clone(), ranks);
        let meet = group[0].rendezvous();
        let members = group.into_iter().map(|m| (gpu.clone(), Box::new(m) as Box<dyn DeviceCollective>)).collect();
        Self::load_gpu_ranks(ckpt, members, meet, sizing, options, alloc, kv)
    }

    /// One GPU rank of the checkpoint per GPU of `gpus` (ordinal and opened GPU), joined by NCCL; memory as in
    /// `load_cuda`.
    pub fn load_nccl(
        ckpt: &dyn Checkpoint,
        gpus: &[(usize, Arc<Gpu>)],
        sizing: Sizing,
        options: CudaOptions,
        alloc: &mut Alloc,
        kv: OwnedAlloc,
    ) -> Result<TensorParallel, LoadError> {
        let max_len = sizing.max_tokens * ckpt.config().hidden_size;
        let group = nccl_group(gpus, max_len, alloc).map_err(LoadError::Device)?;
        let members = gpus.iter().zip(group).map(|((_, g), m)| (g.clone(), Box::new(m) as Box<dyn DeviceCollective>));
        let meet = Rendezvous::new(gpus.len());
        Self::load_gpu_ranks(ckpt, members.collect(), meet, sizing, options, alloc, kv)
    }

    fn load_gpu_ranks(
        ckpt: &dyn Checkpoint,
        members: Vec<(Arc<Gpu>, Box<dyn DeviceCollective>)>,
        meet: Arc<Rendezvous>,
        sizing: Sizing,
        options: CudaOptions,
        alloc: &mut Alloc,
        kv: OwnedAlloc,
    ) -> Result<TensorParallel, LoadError> {
        let ranks = members.len();
        let mut out = Vec::with_capacity(ranks);
        for (rank, (gpu, member)) in members.into_iter().enumerate() {
            let shard = ShardedCheckpoint::new(ckpt, rank, ranks)?;
            let mut llama = CudaLlama::load(&shard, gpu, sizing, options, alloc, &mut |_, _| {})?;
            llama.join(member);
            out.push(Rank { engine: Box::new(llama), threads: None, pool: None });
        }
        Ok(TensorParallel { ranks: out, pools: RankPools::Device(kv), meet })
    }

    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }
}

impl Engine for TensorParallel {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        self.ranks[0].engine.kv_layout(page_tokens)
    }

    fn host_bytes(&self, round_tokens: usize, lanes: usize) -> (usize, usize) {
        let each = self.ranks.iter().map(|r| r.engine.host_bytes(round_tokens, lanes));
        each.fold((0, 0), |(w, a), (rw, ra)| (w + rw, a + ra))
    }

    fn vocab_size(&self) -> usize {
        self.ranks[0].engine.vocab_size()
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        let (layout, pages) = (pool.layout(), pool.num_pages());
        for rank in &mut self.ranks[1..] {
            if rank.pool.as_ref().is_none_or(|p| p.layout() != layout || p.num_pages() != pages) {
                // The old pool goes back to the ledger before the new one is taken.
                rank.pool = None;
                rank.pool = Some(self.pools.make(layout, pages)?);
            }
        }
        let (first, rest) = self.ranks.split_first_mut().expect("at least one rank");
        let meet = &*self.meet;
        let results = std::thread::scope(|s| {
            let others: Vec<_> = rest
                .iter_mut()
                .map(|r| {
                    let Rank { engine, threads, pool } = r;
                    let pool = pool.as_mut().expect("made above");
                    s.spawn(move || run_rank(engine.as_mut(), threads.as_ref(), pool, lanes, meet))
                })
                .collect();
            let mut results = vec![run_rank(first.engine.as_mut(), first.threads.as_ref(), pool, lanes, meet)];
            results.extend(others.into_iter().map(|o| o.join().expect("a rank's panic is caught in run_rank")));
            results
        });
        self.meet.reset();
        // The rank that broke the group first has the cause; the others' errors only say it broke.
        let cause = results.iter().position(|(_, first_to_fail)| *first_to_fail);
        let mut results = results.into_iter().map(|(out, _)| out);
        match cause {
            Some(rank) => Err(results.nth(rank).and_then(Result::err).expect("the failed rank's error")),
            None => results.next().expect("rank 0"),
        }
    }

    fn embeds(&self) -> bool {
        self.ranks[0].engine.embeds()
    }
}

/// One rank's share of a round; a rank that fails or panics breaks the group, so the others stop waiting for it.
/// Also says whether this rank broke it first.
fn run_rank(
    engine: &mut dyn Engine,
    threads: Option<&rayon::ThreadPool>,
    pool: &mut KvPool,
    lanes: &[LaneStep],
    meet: &Rendezvous,
) -> (Result<Vec<LaneRows>, EngineError>, bool) {
    let run = || match threads {
        Some(threads) => threads.install(|| engine.forward(pool, lanes)),
        None => engine.forward(pool, lanes),
    };
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run))
        .unwrap_or_else(|_| Err(EngineError::Panicked("a tensor-parallel rank".into())));
    let first_to_fail = out.is_err() && meet.break_all();
    (out, first_to_fail)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::collective::{Collective, HostRank};
    use super::*;

    /// A rank that adds 1.0 with its group, or fails before the sum while `fails` is set.
    struct Adds {
        member: HostRank,
        fails: Arc<AtomicBool>,
    }

    impl Engine for Adds {
        fn kv_layout(&self, page_tokens: usize) -> KvLayout {
            KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 1, page_tokens, elem_bytes: 4, state_elems: 0 }
        }

        fn vocab_size(&self) -> usize {
            1
        }

        fn forward(&mut self, _: &mut KvPool, _: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
            if self.fails.load(Ordering::Relaxed) {
                return Err(EngineError::Sizing(format!("rank {} fails", self.member.rank())));
            }
            let mut v = [1.0];
            self.member.all_reduce_sum(&mut v).map_err(|e| EngineError::Device(e.to_string()))?;
            Ok(vec![LaneRows::Logits(v.to_vec())])
        }

        fn host_bytes(&self, round_tokens: usize, lanes: usize) -> (usize, usize) {
            (1000 * (self.member.rank() + 1), round_tokens * lanes)
        }
    }

    #[test]
    fn test_a_host_group_reports_the_bytes_of_every_rank() {
        let members = host_group(3);
        let meet = members[0].rendezvous();
        let rank =
            |member| Rank { engine: Box::new(Adds { member, fails: Arc::default() }), threads: None, pool: None };
        let tp = TensorParallel { ranks: members.into_iter().map(rank).collect(), pools: RankPools::Host, meet };
        assert_eq!(tp.host_bytes(4, 2), (6000, 24));
    }

    #[test]
    fn test_a_rank_that_fails_before_the_sum_ends_the_round_with_its_error_and_the_group_serves_again() {
        for failing in 0..3 {
            let members = host_group(3);
            let meet = members[0].rendezvous();
            let fails = Arc::new(AtomicBool::new(true));
            let ranks = members
                .into_iter()
                .enumerate()
                .map(|(r, member)| {
                    let fails = if r == failing { fails.clone() } else { Arc::new(AtomicBool::new(false)) };
                    Rank { engine: Box::new(Adds { member, fails }), threads: None, pool: None }
                })
                .collect();
            let mut tp = TensorParallel { ranks, pools: RankPools::Host, meet };
            let mut pool = KvPool::new(tp.kv_layout(16), 1);
            let err = tp.forward(&mut pool, &[]).unwrap_err();
            assert_eq!(err.to_string(), EngineError::Sizing(format!("rank {failing} fails")).to_string());
            fails.store(false, Ordering::Relaxed);
            assert_eq!(
                tp.forward(&mut pool, &[]).unwrap(),
                vec![LaneRows::Logits(vec![3.0])],
                "rank {failing} failed once"
            );
        }
    }
}
