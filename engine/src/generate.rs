//! One sequence driven through the engine's batched forward: chunked prefill, then decode.

use crate::boundary::{Engine, EngineError, FinishReason, KvPool, LaneRows, LaneStep, Logits};

use tensorfold_kernels::sampling::{sample, SamplingParams};

/// Positions per KV page.
pub const PAGE_TOKENS: usize = 16;

/// A single lane with a KV pool of its own, for the CLI and for tests.
pub struct Sequence<E: Engine> {
    engine: E,
    pool: KvPool,
    pages: Vec<u32>,
    tokens: Vec<u32>,
    /// Tokens whose KV is in the pool.
    num_cached: usize,
}

impl<E: Engine> Sequence<E> {
    /// A sequence with room for `capacity` positions.
    pub fn new(engine: E, capacity: usize) -> Sequence<E> {
        let num_pages = capacity.div_ceil(PAGE_TOKENS).max(1);
        let pool = KvPool::new(engine.kv_layout(PAGE_TOKENS), num_pages);
        Sequence { engine, pool, pages: (0..num_pages as u32).collect(), tokens: Vec::new(), num_cached: 0 }
    }

    /// A sequence over a given pool, such as one on a GPU; it uses every page.
    pub fn with_pool(engine: E, pool: KvPool) -> Sequence<E> {
        let pages = (0..pool.num_pages() as u32).collect();
        Sequence { engine, pool, pages, tokens: Vec::new(), num_cached: 0 }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn capacity(&self) -> usize {
        self.pages.len() * PAGE_TOKENS
    }

    /// Appends tokens and runs them in chunks of `chunk`; returns the whole rows `want` asks for (`Last`, `All` or
    /// `Hidden`: a pick has no values to return).
    pub fn extend(&mut self, new: &[u32], chunk: usize, want: Logits) -> Result<Vec<f32>, EngineError> {
        assert!(self.tokens.len() + new.len() <= self.capacity(), "sequence is full");
        self.tokens.extend_from_slice(new);
        let mut out = Vec::new();
        while self.num_cached < self.tokens.len() {
            let end = (self.num_cached + chunk.max(1)).min(self.tokens.len());
            let last = end == self.tokens.len();
            let logits = match want {
                Logits::All | Logits::Picks => want,
                Logits::Last | Logits::Argmax if last => want,
                _ => Logits::None,
            };
            let step = LaneStep {
                tokens: &self.tokens[self.num_cached..end],
                start_pos: self.num_cached,
                pages: &self.pages,
                logits,
                keep: None,
            };
            match self.engine.forward(&mut self.pool, &[step])?.remove(0) {
                LaneRows::None => {}
                rows => {
                    out.extend(rows.values().ok_or_else(|| EngineError::Sizing(format!("{want:?} has no values")))?)
                }
            }
            self.num_cached = end;
        }
        Ok(out)
    }

    /// Generates up to `max_tokens`, calling `on_token` with each; `on_token` returns false to stop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        params: &SamplingParams,
        stop_ids: &[u32],
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<FinishReason, EngineError> {
        let mut logits = self.extend(prompt, 256, Logits::Last)?;
        for _ in 0..max_tokens {
            let tok = sample(&logits, params, &self.tokens, self.tokens.len() as u64);
            if stop_ids.contains(&tok) || !on_token(tok) {
                return Ok(FinishReason::Stop);
            }
            if self.tokens.len() + 1 > self.capacity() {
                return Ok(FinishReason::Length);
            }
            logits = self.extend(&[tok], 1, Logits::Last)?;
        }
        Ok(FinishReason::Length)
    }
}
