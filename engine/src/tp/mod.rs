//! Tensor parallelism: a model's layers split over ranks that run every round together and add their partial
//! sums after the attention output and the MLP down projection.
//!
//! Each rank holds its share of the heads and MLP rows (`shard`), its share of the KV heads, and the whole
//! residual stream. The two sums per layer go through `Collective::all_reduce_sum`, whose order is fixed (rank 0,
//! then 1, ...) and never chosen by message size, so for a fixed rank count a row's result never depends on the
//! batch. Between rank counts the results differ in the last bits: N ranks add N partial sums of a projection
//! where one rank adds its terms in one run.

pub mod collective;
pub mod shard;

use crate::boundary::{Engine, EngineError, KvLayout, KvPool, LaneStep};
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::Llama;
use collective::host_group;
use shard::ShardedCheckpoint;

/// One rank: its engine, the compute threads it runs on, and (past rank 0) its own KV pool.
struct Rank {
    engine: Box<dyn Engine>,
    threads: rayon::ThreadPool,
    pool: Option<KvPool>,
}

/// Ranks driven as one engine: each round runs on every rank at once; rank 0's rows are the answer (every rank
/// computes the same). Rank 0 keeps its KV in the runtime's pool; the others in pools of the same pages.
pub struct TensorParallel {
    ranks: Vec<Rank>,
}

impl TensorParallel {
    /// `ranks` CPU ranks of the checkpoint, joined by a host group, sharing `threads` compute threads.
    pub fn load_cpu(ckpt: &dyn Checkpoint, ranks: usize, threads: usize) -> Result<TensorParallel, LoadError> {
        let mut out = Vec::with_capacity(ranks);
        for (rank, member) in host_group(ranks).into_iter().enumerate() {
            let mut llama = Llama::load(&ShardedCheckpoint::new(ckpt, rank, ranks)?)?;
            llama.join(Box::new(member));
            let threads = rayon::ThreadPoolBuilder::new()
                .num_threads((threads / ranks).max(1))
                .thread_name(move |i| format!("tp{rank}-{i}"))
                .build()
                .map_err(|e| LoadError::format(ckpt.path(), e.to_string()))?;
            out.push(Rank { engine: Box::new(llama), threads, pool: None });
        }
        Ok(TensorParallel { ranks: out })
    }

    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }
}

impl Engine for TensorParallel {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        self.ranks[0].engine.kv_layout(page_tokens)
    }

    fn vocab_size(&self) -> usize {
        self.ranks[0].engine.vocab_size()
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<Vec<f32>>, EngineError> {
        let (layout, pages) = (pool.layout(), pool.num_pages());
        for rank in &mut self.ranks[1..] {
            if rank.pool.as_ref().is_none_or(|p| p.layout() != layout || p.num_pages() != pages) {
                rank.pool = Some(KvPool::new(layout, pages));
            }
        }
        let (first, rest) = self.ranks.split_first_mut().expect("at least one rank");
        std::thread::scope(|s| {
            let others: Vec<_> = rest
                .iter_mut()
                .map(|r| {
                    let Rank { engine, threads, pool } = r;
                    let pool = pool.as_mut().expect("made above");
                    s.spawn(move || threads.install(|| engine.forward(pool, lanes)))
                })
                .collect();
            let out = first.threads.install(|| first.engine.forward(pool, lanes));
            for other in others {
                let done = other.join().map_err(|_| EngineError::Panicked("a tensor-parallel rank".into()))?;
                done?;
            }
            out
        })
    }

    fn embeds(&self) -> bool {
        self.ranks[0].engine.embeds()
    }
}
