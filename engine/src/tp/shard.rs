//! One rank's share of a checkpoint: the same tensor names, each layer's heads and MLP rows split N ways.
//!
//! Column-parallel (split by output rows): q, k and v by heads, gate and up by intermediate rows, and their biases.
//! Row-parallel (split by input columns): o and down, whose outputs are partial sums the ranks add together; the o
//! bias goes to rank 0 alone, so the sum holds it once. Embeddings, norms and the output head are whole on every rank.

use std::path::Path;

use tensorfold_kernels::quant::row_bytes;
use tensorfold_kernels::{QuantBytes, Weight};

use crate::checkpoint::{Bf16Rows, Checkpoint};
use crate::error::LoadError;
use crate::llama::config::ModelConfig;
use crate::llama::walk::names;

/// How a tensor is cut for one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    Whole,
    /// Rows `[lo, hi)` of the stored matrix (a bias's elements).
    Rows(usize, usize),
    /// Columns `[lo, hi)` of every row.
    Cols(usize, usize),
    /// Not on this rank.
    Absent,
}

/// The checkpoint as rank `rank` of `ranks` sees it.
pub struct ShardedCheckpoint<'a> {
    inner: &'a dyn Checkpoint,
    config: ModelConfig,
    rank: usize,
    ranks: usize,
}

impl<'a> ShardedCheckpoint<'a> {
    /// Rank `rank` of `ranks`; fails naming the size that does not divide.
    pub fn new(inner: &'a dyn Checkpoint, rank: usize, ranks: usize) -> Result<ShardedCheckpoint<'a>, LoadError> {
        let c = inner.config();
        let fault = |what: &str, n: usize| {
            LoadError::format(inner.path(), format!("{what} ({n}) do not split over {ranks} tensor-parallel ranks"))
        };
        crate::model::refuse_moe(inner, "tensor parallelism")?;
        if ranks == 0 || rank >= ranks {
            return Err(LoadError::format(inner.path(), format!("rank {rank} of {ranks} tensor-parallel ranks")));
        }
        for (what, n) in
            [("query heads", c.num_heads), ("KV heads", c.num_kv_heads), ("intermediate rows", c.intermediate_size)]
        {
            if !n.is_multiple_of(ranks) {
                return Err(fault(what, n));
            }
        }
        let config = ModelConfig {
            num_heads: c.num_heads / ranks,
            num_kv_heads: c.num_kv_heads / ranks,
            intermediate_size: c.intermediate_size / ranks,
            ..c.clone()
        };
        Ok(ShardedCheckpoint { inner, config, rank, ranks })
    }

    fn cut(&self, name: &str) -> Cut {
        let c = self.inner.config();
        let (q, kv, f) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size);
        let part = |n: usize| (self.rank * n / self.ranks, (self.rank + 1) * n / self.ranks);
        let Some((_, tail)) = name.strip_prefix(names::LAYERS).and_then(|rest| rest.split_once('.')) else {
            return Cut::Whole;
        };
        match tail {
            names::Q | names::Q_BIAS => Cut::Rows(part(q).0, part(q).1),
            names::K | names::K_BIAS | names::V | names::V_BIAS => Cut::Rows(part(kv).0, part(kv).1),
            names::GATE | names::UP => Cut::Rows(part(f).0, part(f).1),
            names::O => Cut::Cols(part(q).0, part(q).1),
            names::DOWN => Cut::Cols(part(f).0, part(f).1),
            names::O_BIAS if self.rank > 0 => Cut::Absent,
            _ => Cut::Whole,
        }
    }
}

/// Rows `[lo, hi)` of `w`; a 1-D tensor (one row) is cut by its elements.
fn rows(w: Weight, lo: usize, hi: usize) -> Result<Weight, String> {
    if w.rows() == 1 && hi > 1 {
        return cols(w, lo, hi);
    }
    match w {
        Weight::F32 { cols, data, .. } => {
            Ok(Weight::F32 { rows: hi - lo, cols, data: data[lo * cols..hi * cols].to_vec() })
        }
        Weight::Quant { ty, cols, data, .. } => {
            let rb = row_bytes(ty, cols).ok_or("a row that is not whole blocks")?;
            Ok(Weight::Quant { ty, rows: hi - lo, cols, data: data[lo * rb..hi * rb].to_vec().into() })
        }
    }
}

/// Columns `[lo, hi)` of every row of an f32 matrix.
fn cut_f32(rows: usize, cols: usize, data: &[f32], lo: usize, hi: usize) -> Result<Weight, String> {
    let data = data.chunks_exact(cols).flat_map(|r| r[lo..hi].iter().copied()).collect();
    Ok(Weight::F32 { rows, cols: hi - lo, data })
}

/// Columns `[lo, hi)` of every row of `w`; quantized rows are cut on block edges only.
fn cols(w: Weight, lo: usize, hi: usize) -> Result<Weight, String> {
    match w {
        Weight::F32 { rows, cols, data } => cut_f32(rows, cols, &data, lo, hi),
        Weight::Quant { ty, rows, cols, data } => {
            let (len, bytes) = (ty.block_len(), ty.block_bytes());
            let cut = !lo.is_multiple_of(len) || !hi.is_multiple_of(len);
            if cut && len > 32 {
                // A K-quant's 256-element blocks may straddle a rank's edge: that rank cuts their f32 values.
                let data = Weight::Quant { ty, rows, cols, data }.to_f32();
                return cut_f32(rows, cols, &data, lo, hi);
            }
            if cut {
                return Err(format!("columns {lo}..{hi} cut {ty:?} blocks of {len}"));
            }
            let rb = row_bytes(ty, cols).ok_or("a row that is not whole blocks")?;
            let data = data.chunks_exact(rb).flat_map(|r| r[lo / len * bytes..hi / len * bytes].iter().copied());
            Ok(Weight::Quant { ty, rows, cols: hi - lo, data: QuantBytes::Owned(data.collect()) })
        }
    }
}

impl Checkpoint for ShardedCheckpoint<'_> {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn contains(&self, name: &str) -> bool {
        self.cut(name) != Cut::Absent && self.inner.contains(name)
    }

    fn weight(&self, name: &str) -> Result<Weight, LoadError> {
        let cut = self.cut(name);
        let fault = |why: String| LoadError::format(self.inner.path(), format!("{name}: {why}"));
        match cut {
            Cut::Whole => self.inner.weight(name),
            Cut::Absent => Err(fault(format!("not on tensor-parallel rank {}", self.rank))),
            Cut::Rows(lo, hi) => rows(self.inner.weight(name)?, lo, hi).map_err(fault),
            Cut::Cols(lo, hi) => cols(self.inner.weight(name)?, lo, hi).map_err(fault),
        }
    }

    fn bf16_rows(&self, name: &str) -> Option<Bf16Rows<'_>> {
        let whole = self.inner.bf16_rows(name)?;
        match self.cut(name) {
            Cut::Whole => Some(whole),
            Cut::Rows(lo, hi) if whole.rows > 1 => {
                let bytes = &whole.bytes[lo * whole.cols * 2..hi * whole.cols * 2];
                Some(Bf16Rows { rows: hi - lo, cols: whole.cols, bytes })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorfold_kernels::quant::GgmlType;

    fn q6k(rows: usize, cols: usize) -> Weight {
        let mut data: Vec<u8> = (0..rows * cols / 256 * 210).map(|i| (i * 37 % 251) as u8).collect();
        data.chunks_exact_mut(210).for_each(|b| b[208..210].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes()));
        Weight::Quant { ty: GgmlType::Q6K, rows, cols, data: data.into() }
    }

    #[test]
    fn test_a_k_quant_cut_inside_its_blocks_keeps_the_f32_values_of_those_columns() {
        let w = q6k(3, 512);
        let dense = w.to_f32();
        let part = cols(w, 128, 384).unwrap();
        let want: Vec<f32> = dense.chunks_exact(512).flat_map(|r| r[128..384].to_vec()).collect();
        assert!(matches!(part, Weight::F32 { rows: 3, cols: 256, ref data } if *data == want));
    }

    #[test]
    fn test_a_k_quant_cut_on_its_block_edges_stays_quantized() {
        let w = q6k(2, 512);
        let part = cols(w.clone(), 256, 512).unwrap();
        let want: Vec<f32> = w.to_f32().chunks_exact(512).flat_map(|r| r[256..].to_vec()).collect();
        assert!(matches!(part, Weight::Quant { ty: GgmlType::Q6K, rows: 2, cols: 256, .. }));
        assert_eq!(part.to_f32(), want);
    }
}

#[cfg(test)]
mod moe_tests {
    use super::*;
    use crate::llama::config::MoeConfig;

    /// A checkpoint that has only a config.
    struct ConfigOnly(ModelConfig);

    impl Checkpoint for ConfigOnly {
        fn path(&self) -> &Path {
            Path::new("moe-dir")
        }
        fn config(&self) -> &ModelConfig {
            &self.0
        }
        fn contains(&self, _: &str) -> bool {
            false
        }
        fn weight(&self, name: &str) -> Result<Weight, LoadError> {
            Err(LoadError::MissingTensor { path: self.path().into(), name: name.into() })
        }
    }

    fn qwen3_moe() -> ModelConfig {
        let moe = MoeConfig {
            num_experts: 4,
            num_experts_per_tok: 2,
            expert_intermediate_size: 8,
            norm_topk_prob: true,
            dense_layers: vec![],
            sparse_step: 1,
            shared_expert_size: None,
        };
        ModelConfig {
            arch: "qwen3_moe".into(),
            vocab_size: 8,
            hidden_size: 8,
            intermediate_size: 8,
            num_layers: 1,
            num_heads: 2,
            num_kv_heads: 2,
            head_dim: 4,
            rms_eps: 1e-6,
            rope_theta: 1e6,
            rope_scaling: None,
            rope_interleaved: false,
            max_position: 64,
            tie_embeddings: false,
            attn_bias: false,
            qk_norm: true,
            moe: Some(moe),
            hybrid: None,
        }
    }

    #[test]
    fn test_engines_without_experts_refuse_a_moe_model_by_name() {
        let ckpt = ConfigOnly(qwen3_moe());
        let err = ShardedCheckpoint::new(&ckpt, 0, 2).err().expect("sharding a MoE model should fail").to_string();
        assert!(err.contains("moe-dir") && err.contains("qwen3_moe") && err.contains("tensor parallelism"), "{err}");
        let err = crate::model::refuse_moe(&ckpt, "the CUDA engine").unwrap_err().to_string();
        assert!(err.contains("qwen3_moe is a mixture-of-experts model") && err.contains("CUDA"), "{err}");
        let dense = ConfigOnly(ModelConfig { moe: None, ..qwen3_moe() });
        assert!(ShardedCheckpoint::new(&dense, 0, 2).is_ok() && crate::model::refuse_moe(&dense, "x").is_ok());
        let linear = vec![true];
        let hybrid = crate::llama::config::HybridConfig {
            linear,
            num_k_heads: 1,
            num_v_heads: 1,
            k_head_dim: 4,
            v_head_dim: 4,
            conv_kernel: 4,
            rotary_dim: 2,
            mtp_layers: 0,
            centred_norms: true,
        };
        let ckpt = ConfigOnly(ModelConfig { arch: "qwen3_next".into(), hybrid: Some(hybrid), ..qwen3_moe() });
        let err = ShardedCheckpoint::new(&ckpt, 0, 2).err().expect("sharding a hybrid should fail").to_string();
        assert!(err.contains("qwen3_next is a hybrid linear-attention model") && err.contains("tensor"), "{err}");
    }
}
