//! A multi-token-prediction (MTP) draft head on the CPU (Qwen3-Next's `mtp.*`): from the final hidden state of
//! position i and the token of position i + 1 it guesses the token of position i + 2.
//!
//! Row j of a head step takes token j, reads the hidden state the main model left in position j - 1's page slot,
//! and runs at position j - 1: the embedding and the hidden state each RMS-normed, joined embedding first, projected
//! by `fc`, one decoder layer (its keys and values after the attention layers' in the pool, in token j's own slot,
//! so a slot's contents follow from the tokens up to it, as a shared prefix page's must), the head's norm,
//! then the model's output head. A lane that asks for its last pick (`Logits::Argmax`) must end at its newest
//! token, which the main model has not run yet: the head leaves its last row's output in that token's slot, so it
//! can run again on its own guess, and the main model writes the slot again when it verifies the position. Drafts
//! only change how fast a lane goes: the main model's bits never read the head's.

use tensorfold_kernels::matmul::matmul_with;
use tensorfold_kernels::ops;
use tensorfold_kernels::Weight;

use crate::boundary::{EngineError, KvPool, LaneRows, LaneStep, Logits};
use crate::llama::cpu::{wanted_rows, Llama};
use crate::llama::forward::{layer, LlamaSteps};

/// The head's own tensors; its decoder layer sits after the main layers.
pub(crate) struct MtpHead {
    /// hidden x (embedding ++ hidden state).
    pub fc: Weight,
    pub norm_embed: Vec<f32>,
    pub norm_hidden: Vec<f32>,
    pub norm: Vec<f32>,
}

/// Runs `run` over the head's rows of `lanes` (token j at position j - 1; a lane whose only token is at position 0
/// has none), unless no lane has any, and gives each lane its rows: none for a lane without.
pub(crate) fn on_head_rows<E>(
    lanes: &[LaneStep],
    vocab: usize,
    run: impl FnOnce(&[LaneStep]) -> Result<Vec<LaneRows>, E>,
) -> Result<Vec<LaneRows>, E> {
    let rowless = |l: &LaneStep| l.tokens.len() <= usize::from(l.start_pos == 0);
    let shifted: Vec<LaneStep> = lanes
        .iter()
        .filter(|l| !rowless(l))
        .map(|l| {
            let skip = usize::from(l.start_pos == 0);
            let start_pos = (l.start_pos + skip).saturating_sub(1);
            LaneStep { tokens: &l.tokens[skip..], start_pos, pages: l.pages, logits: l.logits, keep: None }
        })
        .collect();
    let mut rows = match shifted.is_empty() {
        true => Vec::new(),
        false => run(&shifted)?,
    }
    .into_iter();
    Ok(lanes
        .iter()
        .map(|l| match rowless(l) {
            true => l.logits.take(&[], vocab),
            false => rows.next().expect("a row set for each lane with rows"),
        })
        .collect())
}

impl Llama {
    /// Whether the model has a draft head.
    pub fn has_draft_head(&self) -> bool {
        self.mtp.is_some()
    }

    /// Where position `pos`'s hidden state sits in its page's state.
    fn hidden_at(&self, pos: usize, page_tokens: usize) -> usize {
        let c = self.config();
        let h = c.hybrid.as_ref().expect("a draft head is a hybrid's");
        h.num_linear() * h.page_state_per_layer(page_tokens) + (pos % page_tokens) * c.hidden_size
    }

    /// Stores position `pos`'s final hidden state for the draft head.
    pub(super) fn write_hidden(&self, pool: &mut KvPool, pages: &[u32], pos: usize, row: &[f32]) {
        let p = pool.layout().page_tokens;
        let at = self.hidden_at(pos, p);
        pool.state_mut(pages[pos / p])[at..at + row.len()].copy_from_slice(row);
    }

    /// The draft head over each lane's tokens (token j at position j - 1; a token at 0 has no row); each lane gets
    /// the rows its step asks for. A lane asking `Argmax` needs a page for the position after its last token. Panics
    /// where the model has no head: ask `has_draft_head` first.
    pub fn run_draft_head(&self, pool: &mut KvPool, lanes: &[LaneStep]) -> Vec<LaneRows> {
        rayon::scope(|_| self.draft_on_pool(pool, lanes))
    }

    /// `run_draft_head`, or an error naming the want of a head.
    pub(super) fn try_draft_head(&self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        match self.has_draft_head() {
            true => Ok(self.run_draft_head(pool, lanes)),
            false => Err(EngineError::Sizing("the model has no draft head".into())),
        }
    }

    fn draft_on_pool(&self, pool: &mut KvPool, lanes: &[LaneStep]) -> Vec<LaneRows> {
        let head = self.mtp.as_ref().expect("the model has a draft head");
        let Ok(rows) = on_head_rows(lanes, self.config().vocab_size, |shifted| {
            Ok::<_, std::convert::Infallible>(self.head_rows(head, pool, shifted))
        });
        rows
    }

    fn head_rows(&self, head: &MtpHead, pool: &mut KvPool, lanes: &[LaneStep]) -> Vec<LaneRows> {
        let c = self.config();
        let (h, li, p) = (c.hidden_size, c.num_layers, pool.layout().page_tokens);
        let hidden: Vec<f32> = lanes
            .iter()
            .flat_map(|l| (0..l.tokens.len()).map(move |i| (l.start_pos + i, l.pages)))
            .flat_map(|(pos, pages)| {
                let at = self.hidden_at(pos, p);
                pool.state(pages[pos / p])[at..at + h].to_vec()
            })
            .collect();
        let mut pass = self.pass(pool, lanes);
        let Ok(()) = pass.embed();
        let rows = pass.queries.len();
        let (mut joined, mut a, mut b) = (vec![0f32; rows * 2 * h], vec![0f32; rows * h], vec![0f32; rows * h]);
        ops::rms_norm(&pass.x, &head.norm_embed, c.rms_eps, &mut a);
        ops::rms_norm(&hidden, &head.norm_hidden, c.rms_eps, &mut b);
        for ((j, a), b) in joined.chunks_exact_mut(2 * h).zip(a.chunks_exact(h)).zip(b.chunks_exact(h)) {
            j[..h].copy_from_slice(a);
            j[h..].copy_from_slice(b);
        }
        matmul_with(&joined, rows, &head.fc, &mut pass.x, self.activations());
        let Ok(()) = layer(&mut pass, li);
        let mut normed = vec![0f32; pass.x.len()];
        ops::rms_norm(&pass.x, &head.norm, c.rms_eps, &mut normed);
        // Only the rows the lanes ask for go through the output head.
        let (vocab, wanted) = (c.vocab_size, wanted_rows(lanes));
        for (l, r) in lanes.iter().zip(&wanted).filter(|(l, _)| l.logits == Logits::Argmax) {
            // The guess's own state, for the head's next step on its guess.
            let next = l.start_pos + l.tokens.len();
            self.write_hidden(pass.pool, l.pages, next, &normed[r.start * h..r.end * h]);
        }
        let picked: Vec<f32> = wanted.iter().flat_map(|r| normed[r.start * h..r.end * h].iter().copied()).collect();
        let num = picked.len() / h;
        let mut logits = vec![0f32; num * vocab];
        matmul_with(&picked, num, self.head_weight(), &mut logits, self.activations());
        let mut from = 0;
        let mut out = Vec::with_capacity(lanes.len());
        for (l, r) in lanes.iter().zip(&wanted) {
            let k = r.end - r.start;
            out.push(l.logits.take(&logits[from * vocab..(from + k) * vocab], vocab));
            from += k;
        }
        out
    }
}
