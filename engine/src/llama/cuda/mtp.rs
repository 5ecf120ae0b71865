//! Qwen3-Next's MTP draft head on the GPU. The main pass leaves every position's final hidden state (normed, f32)
//! in its page; the head's row for token j runs at position j - 1 from token j's embedding and position j - 1's
//! hidden state, through `fc`, one gated attention layer with the model's experts (its keys in token j's own slot,
//! after the attention layers' in the pool) and its own norm, then the model's output head: the CPU's head
//! (`llama/mtp.rs`) step for step, with the GPU's kernels. The model's bits never read the head's.

use tensorfold_kernels::cuda::DevPtr;

use super::layer::{self, GpuLayer};
use super::upload::Uploader;
use super::{refuse_hidden, CudaLlama};
use crate::boundary::{EngineError, KvPool, LaneRows, LaneStep};
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::config::ModelConfig;
use crate::llama::mtp::on_head_rows;
use crate::llama::walk::{names, LayerKind};
use crate::llama::Loader;

/// The head's own tensors; its decoder layer follows the main layers in `Net::layers`.
pub(super) struct MtpWeights {
    /// hidden x (embedding ++ hidden state), packed for the GEMM.
    pub fc: DevPtr,
    pub norm_embed: DevPtr,
    pub norm_hidden: DevPtr,
    pub norm: DevPtr,
}

/// The head's layer and tensors, where the checkpoint has a head.
pub(super) fn upload(
    up: &mut Uploader,
    ckpt: &dyn Checkpoint,
    ld: &Loader,
    c: &ModelConfig,
) -> Result<Option<(GpuLayer, MtpWeights)>, LoadError> {
    if c.hybrid.as_ref().is_none_or(|h| h.mtp_layers == 0) {
        return Ok(None);
    }
    let h = c.hidden_size;
    let kind = LayerKind { prefix: names::MTP_LAYERS, linear: false, moe: c.moe.is_some() };
    let layer = layer::upload(up, ckpt, ld, ld.layer_tensors_at(kind, 0, c)?, c)?;
    let mut centred = |name: &str| -> Result<DevPtr, LoadError> { up.vector(&c.centre_norm(ld.vector(name, h)?)) };
    let (norm_embed, norm_hidden, norm) =
        (centred(names::MTP_NORM_EMBED)?, centred(names::MTP_NORM_HIDDEN)?, centred(names::MTP_NORM)?);
    let fc = up.matrices(&[super::pack::read(ckpt, ld, names::MTP_FC, h, 2 * h)?])?;
    Ok(Some((layer, MtpWeights { fc, norm_embed, norm_hidden, norm })))
}

impl CudaLlama {
    /// The draft head over each lane's tokens (token j at position j - 1; a token at 0 has no row), as the CPU's
    /// `run_draft_head`: each lane gets the rows its step asks for.
    pub(super) fn run_head(&mut self, pool: &KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        if self.net.mtp.is_none() {
            return Err(EngineError::Sizing("the model has no draft head".into()));
        }
        refuse_hidden(lanes)?;
        let vocab = self.net.cfg.vocab_size;
        on_head_rows(lanes, vocab, |shifted| self.head_round(pool, shifted))
    }

    fn head_round(&mut self, pool: &KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        let (cache, f) = self.upload_round(pool, lanes, true)?;
        self.net.queue_head(&cache, &f).map_err(EngineError::from)?;
        self.bring_back(f.logit_rows, lanes)
    }
}
