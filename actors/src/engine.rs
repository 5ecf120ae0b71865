//! What the runtime needs from an engine: one batched forward pass over a round's lanes.

pub use tensorfold_kernels::attention::{KvLayout, KvPool};

/// Which logits a lane wants back from a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// One lane's share of a round: tokens at consecutive absolute positions, and the pages holding its KV.
pub struct LaneStep<'a> {
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub pages: &'a [u32],
    pub logits: Logits,
}

/// A model family as the runtime drives it.
pub trait Engine: Send {
    /// The KV pool shape for pages of `page_tokens` positions.
    fn kv_layout(&self, page_tokens: usize) -> KvLayout;
    fn vocab_size(&self) -> usize;
    /// Runs every lane in one batched pass; returns each lane's requested logits rows, concatenated.
    fn forward(&self, pool: &mut KvPool, lanes: &[LaneStep]) -> Vec<Vec<f32>>;
}
