//! What the runtime needs from an engine: one batched forward pass over a round's lanes.

pub use tensorfold_kernels::attention::{KvLayout, KvPool};
use tensorfold_kernels::ops::argmax;

/// Which logits a lane wants back from a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
    /// The last row's largest logit: one value, its index (the first on ties, as `ops::argmax` picks it), as f32.
    Argmax,
}

impl Logits {
    /// How many rows of logits a step of `tokens` tokens returns.
    pub fn rows(self, tokens: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last | Logits::Argmax => 1.min(tokens),
            Logits::All => tokens,
        }
    }

    /// A step's computed logits rows as the step asked for them: `Argmax` keeps the index of the largest only.
    pub fn take(self, rows: &[f32]) -> Vec<f32> {
        match self {
            Logits::Argmax if !rows.is_empty() => vec![argmax(rows) as f32],
            _ => rows.to_vec(),
        }
    }
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

/// Which of the runtime's models a lane runs on: its index in the list given to `Runtime::start`.
pub type ModelId = usize;

/// Frames of codec codes to turn into PCM: the window with its context, and the frames to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecJob {
    /// Codes of every codebook for the window's frames, coarsest codebook first.
    pub codes: Vec<Vec<u32>>,
    /// Absolute index of the window's first frame in the request's audio.
    pub first_frame: usize,
    /// The frames whose samples are kept, relative to the window.
    pub keep: std::ops::Range<usize>,
}

/// A speech model's codec: decodes frames into mono PCM on the engine thread, in the rounds.
pub trait Codec: Send + Sync {
    fn sample_rate(&self) -> u32;
    /// Samples of `job.keep`; equal, bit for bit, to the same frames of a one-shot decode.
    fn decode(&self, job: &CodecJob) -> Result<Vec<f32>, String>;
}

#[cfg(test)]
mod tests {
    use super::Logits;

    #[test]
    fn test_logits_rows_per_step() {
        assert_eq!([Logits::None.rows(5), Logits::Last.rows(5), Logits::All.rows(5)], [0, 1, 5]);
        assert_eq!([Logits::Last.rows(0), Logits::All.rows(0)], [0, 0]);
        assert_eq!([Logits::Argmax.rows(5), Logits::Argmax.rows(0)], [1, 0]);
    }

    #[test]
    fn test_argmax_keeps_the_first_largest_index() {
        assert_eq!(Logits::Argmax.take(&[0.5, 2.0, -1.0, 2.0]), vec![1.0]);
        assert_eq!(Logits::Last.take(&[0.5, 2.0]), vec![0.5, 2.0]);
        assert_eq!(Logits::Argmax.take(&[]), Vec::<f32>::new());
    }
}
