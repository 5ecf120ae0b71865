//! A GGUF file as a checkpoint: the configuration from its metadata, tensors under Hugging Face names.

use std::borrow::Cow;
use std::path::Path;

use rayon::prelude::*;
use tensorfold_kernels::quant::{dequantize, row_bytes};
use tensorfold_kernels::{GgmlType, Weight};

use crate::checkpoint::gguf::{GgufFile, Value};
use crate::checkpoint::gguf_names::{alias, gguf_name, ExpertName};
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::config::{HybridConfig, ModelConfig, MoeConfig};

/// Architectures whose GGUF layout this loader knows; Mixtral is `llama` with experts.
const ARCHITECTURES: [&str; 5] = ["llama", "qwen2", "qwen3", "qwen3moe", "qwen3next"];

/// A memory-mapped GGUF checkpoint whose tensors are found by Hugging Face name, else by GGUF name.
///
/// A GGUF Llama 3 keeps its RoPE scaling in the tensor `rope_freqs.weight`, so `rope_scaling` is `None`.
pub struct GgufCheckpoint {
    file: GgufFile,
    config: ModelConfig,
}

impl GgufCheckpoint {
    pub fn open(path: &Path) -> Result<GgufCheckpoint, LoadError> {
        Self::from_file(GgufFile::open(path)?)
    }

    pub fn from_file(file: GgufFile) -> Result<GgufCheckpoint, LoadError> {
        let config = model_config(&file)?;
        Ok(GgufCheckpoint { file, config })
    }

    /// The parsed file, for its metadata (the tokenizer lives there).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }
}

impl Checkpoint for GgufCheckpoint {
    fn path(&self) -> &Path {
        &self.file.path
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn contains(&self, name: &str) -> bool {
        let name = &*alias(name, &self.config.arch, self.config.num_layers);
        match ExpertName::parse(name) {
            Some(x) => self.file.tensor(&x.own_name()).is_some() || self.stacked(&x).is_some(),
            None => self.file.tensor(&gguf_name(name)).is_some(),
        }
    }

    /// Q4_0, Q4_1 and Q8_0 matrices stay quantized; every other tensor, and every 1-D one, is f32. An expert's
    /// matrix is its own tensor in older files, else its slice of the layer's stacked `ffn_*_exps`.
    fn weight(&self, name: &str) -> Result<Weight, LoadError> {
        let name = &*alias(name, &self.config.arch, self.config.num_layers);
        let path = &self.file.path;
        let expert = ExpertName::parse(name);
        let own = expert.as_ref().map(ExpertName::own_name).filter(|own| self.file.tensor(own).is_some());
        if let (Some(x), None) = (&expert, &own) {
            let stacked = x.stacked_name();
            let fault = |fault: String| LoadError::Tensor { path: path.clone(), name: stacked.clone(), fault };
            let info = self
                .file
                .tensor(&stacked)
                .ok_or_else(|| LoadError::MissingTensor { path: path.clone(), name: format!("{name} ({stacked})") })?;
            let (rows, cols, part) = self.stacked(x).ok_or_else(|| {
                fault(format!("dims {:?} ({:?}) have no expert {} of whole rows", info.dims, info.ty, x.expert))
            })?;
            // An expert's quantized blocks stay mapped: one never chosen is never read.
            if let Some(data) = self.file.tensor_shared(info, part.clone()).filter(|_| keeps_quantized(info.ty)) {
                return Ok(Weight::Quant { ty: info.ty, rows, cols, data });
            }
            let bytes = &self.file.tensor_bytes(info)[part];
            return matrix(info.ty, rows, cols, bytes, true).map_err(fault);
        }
        let gguf = own.map_or_else(|| gguf_name(name), Cow::Owned);
        let info = self.file.tensor(&gguf).ok_or_else(|| LoadError::MissingTensor {
            path: path.clone(),
            name: if gguf == name { name.into() } else { format!("{name} ({gguf})") },
        })?;
        let fault = |fault: String| LoadError::Tensor { path: path.clone(), name: gguf.to_string(), fault };
        let to_usize = |d: u64| usize::try_from(d).map_err(|_| fault(format!("dim {d} overflows")));
        let (rows, cols) = match info.dims[..] {
            [cols] => (1, to_usize(cols)?),
            [cols, rows] => (to_usize(rows)?, to_usize(cols)?),
            ref dims => return Err(fault(format!("dims {dims:?} are not 1-D or 2-D"))),
        };
        matrix(info.ty, rows, cols, self.file.tensor_bytes(info), info.dims.len() == 2).map_err(fault)
    }
}

impl GgufCheckpoint {
    /// An expert's rows, columns and byte range within its layer's stacked tensor, where it holds that expert whole.
    fn stacked(&self, x: &ExpertName) -> Option<(usize, usize, std::ops::Range<usize>)> {
        let info = self.file.tensor(&x.stacked_name())?;
        let [cols, rows, num_experts] = info.dims[..] else { return None };
        let (rows, cols) = (usize::try_from(rows).ok()?, usize::try_from(cols).ok()?);
        if x.expert as u64 >= num_experts {
            return None;
        }
        let expert_bytes = row_bytes(info.ty, cols)?.checked_mul(rows)?;
        let start = x.expert.checked_mul(expert_bytes)?;
        let end = start.checked_add(expert_bytes)?;
        (end <= self.file.tensor_bytes(info).len()).then_some((rows, cols, start..end))
    }
}

/// A matrix from its stored bytes: quantized kinds kept as they are where `may_stay_quantized`, else f32.
fn matrix(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8], may_stay_quantized: bool) -> Result<Weight, String> {
    let row_len = row_bytes(ty, cols).filter(|&n| n.checked_mul(rows) == Some(bytes.len()));
    let Some(row_len) = row_len else {
        return Err(format!("{} bytes do not hold {rows} rows of {cols} {ty:?}", bytes.len()));
    };
    if keeps_quantized(ty) && may_stay_quantized {
        return Ok(Weight::Quant { ty, rows, cols, data: bytes.to_vec().into() });
    }
    let mut data = vec![0.0; rows * cols];
    if row_len > 0 {
        data.par_chunks_mut(cols).zip(bytes.par_chunks(row_len)).for_each(|(out, row)| dequantize(ty, row, out));
    }
    Ok(Weight::F32 { rows, cols, data })
}

/// Whether a matrix of this type stays in its blocks for the quantized kernels.
fn keeps_quantized(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Reads the metadata keys of one architecture, failing with the key's name.
struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Meta<'_> {
    fn fault(&self, fault: String) -> LoadError {
        LoadError::format(&self.file.path, fault)
    }

    fn get(&self, suffix: &str) -> (String, Option<&Value>) {
        let key = format!("{}.{suffix}", self.arch);
        let value = self.file.get(&key);
        (key, value)
    }

    fn usize_or(&self, suffix: &str, default: Option<usize>) -> Result<usize, LoadError> {
        match self.get(suffix) {
            (key, None) => default.ok_or_else(|| self.fault(format!("missing metadata key {key}"))),
            (key, Some(v)) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.fault(format!("{key} is {v:?}, expected a non-negative integer"))),
        }
    }

    fn usize(&self, suffix: &str) -> Result<usize, LoadError> {
        self.usize_or(suffix, None)
    }

    fn f32_or(&self, suffix: &str, default: Option<f32>) -> Result<f32, LoadError> {
        match self.get(suffix) {
            (key, None) => default.ok_or_else(|| self.fault(format!("missing metadata key {key}"))),
            (key, Some(v)) => v
                .as_f64()
                .map(|x| x as f32)
                .filter(|x| x.is_finite())
                .ok_or_else(|| self.fault(format!("{key} is {v:?}, expected a finite number"))),
        }
    }
}

/// Builds the model configuration from the file's metadata and which tensors it holds.
fn model_config(file: &GgufFile) -> Result<ModelConfig, LoadError> {
    let fault = |fault: String| LoadError::format(&file.path, fault);
    let arch = file
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| fault("missing metadata key general.architecture".into()))?;
    if !ARCHITECTURES.contains(&arch) {
        return Err(fault(format!("unsupported architecture {arch:?} (supported: {})", ARCHITECTURES.join(", "))));
    }
    let meta = Meta { file, arch };
    if let (key, Some(v)) = meta.get("rope.scaling.type") {
        if v.as_str() != Some("none") {
            return Err(fault(format!("{key} is {v:?}; only unscaled RoPE or a rope_freqs tensor is supported")));
        }
    }
    let hidden_size = meta.usize("embedding_length")?;
    let num_heads = meta.usize("attention.head_count")?;
    let num_kv_heads = meta.usize_or("attention.head_count_kv", Some(num_heads))?;
    if hidden_size == 0 || num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(fault(format!(
            "{num_heads} heads, {num_kv_heads} kv heads and width {hidden_size} do not make a model"
        )));
    }
    let head_dim = meta.usize_or("attention.key_length", Some(hidden_size / num_heads))?;
    let embedding_rows = file.tensor("token_embd.weight").and_then(|t| match t.dims[..] {
        [_, rows] => usize::try_from(rows).ok(),
        _ => None,
    });
    let num_tokens = file.get("tokenizer.ggml.tokens").and_then(Value::as_array).map(<[Value]>::len);
    let vocab_size = embedding_rows.or(num_tokens).ok_or_else(|| {
        fault("no token_embd.weight matrix and no tokenizer.ggml.tokens to size the vocabulary".into())
    })?;
    let intermediate_size = meta.usize("feed_forward_length")?;
    // A Qwen3-Next file counts its MTP head's blocks after the model's.
    let nextn = if arch == "qwen3next" { meta.usize_or("nextn_predict_layers", Some(0))? } else { 0 };
    let num_layers = match meta.usize("block_count")?.checked_sub(nextn) {
        Some(n) if n > 0 => n,
        _ => return Err(fault(format!("block_count leaves no layer beside {nextn} nextn_predict_layers"))),
    };
    Ok(ModelConfig {
        arch: arch.to_string(),
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_eps: meta.f32_or("attention.layer_norm_rms_epsilon", None)?,
        rope_theta: meta.f32_or("rope.freq_base", Some(10_000.0))?,
        rope_scaling: None,
        // llama.cpp's converter permutes Llama q/k rows for adjacent-pair RoPE; Qwen keeps the halves.
        rope_interleaved: arch == "llama",
        max_position: meta.usize("context_length")?,
        tie_embeddings: file.tensor("output.weight").is_none(),
        attn_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        qk_norm: arch == "qwen3next" || file.tensor("blk.0.attn_q_norm.weight").is_some(),
        moe: moe_config(&meta, intermediate_size, num_layers)?,
        hybrid: if arch == "qwen3next" { Some(hybrid_config(&meta, num_layers, head_dim, nextn)?) } else { None },
    })
}

/// The experts where the file has an expert count (Mixtral under `llama`, Qwen3-MoE); a layer without a router
/// (`ffn_gate_inp`) keeps its dense MLP.
fn moe_config(meta: &Meta, intermediate_size: usize, num_layers: usize) -> Result<Option<MoeConfig>, LoadError> {
    let num_experts = meta.usize_or("expert_count", Some(0))?;
    if num_experts == 0 {
        return Ok(None);
    }
    let num_experts_per_tok = meta.usize("expert_used_count")?;
    if num_experts_per_tok == 0 || num_experts_per_tok > num_experts {
        let (key, _) = meta.get("expert_used_count");
        return Err(meta.fault(format!("{key} {num_experts_per_tok} is not between 1 and {num_experts}")));
    }
    // Qwen3-MoE names its experts' width apart from the dense MLP's; Mixtral's experts are the MLP's width.
    let expert_intermediate_size = meta.usize_or("expert_feed_forward_length", Some(intermediate_size))?;
    // llama.cpp renormalizes the chosen weights of both unless the file says otherwise.
    let norm_topk_prob = match meta.get("expert_weights_norm") {
        (_, Some(v)) => v.as_bool().ok_or_else(|| meta.fault(format!("expert_weights_norm is {v:?}")))?,
        (_, None) => true,
    };
    let has_router = |li: usize| meta.file.tensor(&format!("blk.{li}.ffn_gate_inp.weight")).is_some();
    Ok(Some(MoeConfig {
        num_experts,
        num_experts_per_tok,
        expert_intermediate_size,
        norm_topk_prob,
        dense_layers: (0..num_layers).filter(|&li| !has_router(li)).collect(),
        sparse_step: 1,
        shared_expert_size: Some(meta.usize_or("expert_shared_feed_forward_length", Some(0))?).filter(|&n| n > 0),
    }))
}

/// Qwen3-Next's linear layers from llama.cpp's keys: every `full_attention_interval`-th layer is full attention.
fn hybrid_config(meta: &Meta, num_layers: usize, head_dim: usize, nextn: usize) -> Result<HybridConfig, LoadError> {
    let positive = |suffix: &str, default: Option<usize>| match meta.usize_or(suffix, default)? {
        0 => Err(meta.fault(format!("{}.{suffix} must be positive", meta.arch))),
        n => Ok(n),
    };
    let interval = positive("full_attention_interval", Some(4))?;
    let (num_k_heads, num_v_heads) = (positive("ssm.group_count", None)?, positive("ssm.time_step_rank", None)?);
    let inner = positive("ssm.inner_size", None)?;
    let rotary_dim = positive("rope.dimension_count", Some(head_dim / 4))?;
    if num_v_heads % num_k_heads != 0 || inner % num_v_heads != 0 || rotary_dim > head_dim || rotary_dim % 2 == 1 {
        let what = format!("{num_k_heads} key heads, {num_v_heads} value heads of {inner}, rotary {rotary_dim}");
        return Err(meta.fault(format!("{}: {what} do not make Gated DeltaNet layers", meta.arch)));
    }
    let head = meta.file.tensor(&format!("blk.{num_layers}.nextn.eh_proj.weight")).is_some();
    Ok(HybridConfig {
        linear: (0..num_layers).map(|i| !(i + 1).is_multiple_of(interval)).collect(),
        num_k_heads,
        num_v_heads,
        k_head_dim: positive("ssm.state_size", None)?,
        v_head_dim: inner / num_v_heads,
        conv_kernel: positive("ssm.conv_kernel", None)?,
        rotary_dim,
        mtp_layers: if head { nextn.min(1) } else { 0 },
        centred_norms: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::gguf::write::{f32_bytes, GgufWriter};
    use tensorfold_kernels::QuantBytes;

    /// Blocks of seeded bytes with every f16 scale field set to a finite value.
    fn blocks(ty: GgmlType, num_blocks: usize, scale_offsets: &[usize]) -> Vec<u8> {
        let mut state = 0x1234_5678u32;
        let mut bytes: Vec<u8> = (0..num_blocks * ty.block_bytes())
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect();
        for block in bytes.chunks_mut(ty.block_bytes()) {
            for &at in scale_offsets {
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.03).to_le_bytes());
            }
        }
        bytes
    }

    fn tiny_qwen2() -> GgufWriter {
        let u32v = Value::U32;
        GgufWriter::new()
            .kv("general.architecture", Value::String("qwen2".into()))
            .kv("qwen2.block_count", u32v(1))
            .kv("qwen2.embedding_length", u32v(256))
            .kv("qwen2.feed_forward_length", u32v(512))
            .kv("qwen2.attention.head_count", u32v(4))
            .kv("qwen2.attention.head_count_kv", u32v(2))
            .kv("qwen2.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
            .kv("qwen2.context_length", u32v(4096))
            .tensor("token_embd.weight", &[256, 8], GgmlType::Q8_0, blocks(GgmlType::Q8_0, 64, &[0]))
            .tensor("blk.0.attn_norm.weight", &[256], GgmlType::F16, [0x00, 0x3c].repeat(256))
            .tensor("blk.0.attn_q.weight", &[256, 4], GgmlType::Q4K, blocks(GgmlType::Q4K, 4, &[0, 2]))
            .tensor("blk.0.attn_q.bias", &[256], GgmlType::F32, f32_bytes(&[0.5; 256]))
            .tensor("blk.0.attn_k.weight", &[256, 2], GgmlType::Q4_1, blocks(GgmlType::Q4_1, 16, &[0, 2]))
            .tensor("output_norm.weight", &[256], GgmlType::BF16, [0x80, 0x3f].repeat(256))
    }

    fn open(writer: &GgufWriter) -> (tempfile::TempDir, Result<GgufCheckpoint, LoadError>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        std::fs::write(&path, writer.write().bytes).unwrap();
        let ckpt = GgufCheckpoint::open(&path);
        (dir, ckpt)
    }

    #[test]
    fn test_config_from_qwen2_metadata() {
        let (_dir, ckpt) = open(&tiny_qwen2());
        let config = ckpt.unwrap().config().clone();
        let expected = ModelConfig {
            arch: "qwen2".into(),
            vocab_size: 8,
            hidden_size: 256,
            intermediate_size: 512,
            num_layers: 1,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 64,
            rms_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_scaling: None,
            rope_interleaved: false,
            max_position: 4096,
            tie_embeddings: true,
            attn_bias: true,
            qk_norm: false,
            moe: None,
            hybrid: None,
        };
        assert_eq!(config, expected);
    }

    #[test]
    fn test_weights_by_hugging_face_name() {
        let (_dir, ckpt) = open(&tiny_qwen2());
        let ckpt = ckpt.unwrap();
        let bytes_of = |name: &str| ckpt.file().tensor_bytes(ckpt.file().tensor(name).unwrap()).to_vec();

        let embed = ckpt.weight("model.embed_tokens.weight").unwrap();
        assert!(matches!(&embed, Weight::Quant { ty: GgmlType::Q8_0, rows: 8, cols: 256, data }
            if *data == bytes_of("token_embd.weight")));
        let k = ckpt.weight("model.layers.0.self_attn.k_proj.weight").unwrap();
        assert!(matches!(k, Weight::Quant { ty: GgmlType::Q4_1, rows: 2, cols: 256, .. }));

        let q = ckpt.weight("model.layers.0.self_attn.q_proj.weight").unwrap();
        assert!(matches!(&q, Weight::Quant { ty: GgmlType::Q4K, rows: 4, cols: 256, data }
            if *data == bytes_of("blk.0.attn_q.weight")));
        let mut expected = vec![0.0; 4 * 256];
        dequantize(GgmlType::Q4K, &bytes_of("blk.0.attn_q.weight"), &mut expected);
        assert_eq!(q.to_f32(), expected);

        let norm = ckpt.weight("model.layers.0.input_layernorm.weight").unwrap();
        assert!(matches!(norm, Weight::F32 { rows: 1, cols: 256, ref data } if data.iter().all(|&x| x == 1.0)));
        let bias = ckpt.weight("model.layers.0.self_attn.q_proj.bias").unwrap();
        assert!(matches!(bias, Weight::F32 { rows: 1, cols: 256, ref data } if data[0] == 0.5));
        let out_norm = ckpt.weight("model.norm.weight").unwrap();
        assert!(matches!(out_norm, Weight::F32 { ref data, .. } if data[255] == 1.0));

        assert!(ckpt.contains("model.layers.0.self_attn.q_proj.bias"));
        assert!(!ckpt.contains("lm_head.weight"));
        let err = ckpt.weight("lm_head.weight").unwrap_err().to_string();
        assert!(err.contains("missing tensor lm_head.weight (output.weight)"), "{err}");
    }

    #[test]
    fn test_llama_with_output_and_rope_freqs() {
        let writer = GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("llama.block_count", Value::U32(2))
            .kv("llama.embedding_length", Value::U32(64))
            .kv("llama.feed_forward_length", Value::U32(128))
            .kv("llama.attention.head_count", Value::U32(2))
            .kv("llama.attention.key_length", Value::U32(16))
            .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
            .kv("llama.rope.freq_base", Value::F32(500_000.0))
            .kv("llama.context_length", Value::U64(131_072))
            .kv("tokenizer.ggml.tokens", Value::Array(vec![Value::String("a".into()); 5]))
            .tensor("output.weight", &[64, 5], GgmlType::F32, f32_bytes(&[0.25; 320]))
            .tensor("blk.0.attn_q_norm.weight", &[16], GgmlType::F32, f32_bytes(&[1.0; 16]))
            .tensor("rope_freqs.weight", &[8], GgmlType::F32, f32_bytes(&[1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0]));
        let (_dir, ckpt) = open(&writer);
        let ckpt = ckpt.unwrap();
        let c = ckpt.config();
        assert_eq!((c.num_kv_heads, c.head_dim, c.vocab_size), (2, 16, 5));
        assert_eq!((c.rope_theta, c.max_position), (500_000.0, 131_072));
        assert!(c.rope_interleaved && !c.tie_embeddings && c.qk_norm && !c.attn_bias);
        let freqs = ckpt.weight("rope_freqs.weight").unwrap();
        assert!(matches!(freqs, Weight::F32 { rows: 1, cols: 8, ref data } if data[2] == 4.0));
        let lm_head = ckpt.weight("lm_head.weight").unwrap();
        assert!(matches!(lm_head, Weight::F32 { rows: 5, cols: 64, .. }));
    }

    #[test]
    fn test_config_errors_name_the_fault() {
        let unsupported = GgufWriter::new().kv("general.architecture", Value::String("gpt2".into()));
        let err = open(&unsupported).1.err().unwrap().to_string();
        assert!(err.contains("unsupported architecture \"gpt2\""), "{err}");

        let mut missing = tiny_qwen2();
        missing.kvs.retain(|(k, _)| k != "qwen2.block_count");
        let err = open(&missing).1.err().unwrap().to_string();
        assert!(err.contains("missing metadata key qwen2.block_count"), "{err}");

        let scaled = tiny_qwen2().kv("qwen2.rope.scaling.type", Value::String("yarn".into()));
        let err = open(&scaled).1.err().unwrap().to_string();
        assert!(err.contains("qwen2.rope.scaling.type"), "{err}");

        let mut bad_heads = tiny_qwen2();
        for (key, value) in &mut bad_heads.kvs {
            if key == "qwen2.attention.head_count" {
                *value = Value::U32(0);
            }
        }
        let err = open(&bad_heads).1.err().unwrap().to_string();
        assert!(err.contains("0 heads"), "{err}");

        let experts = tiny_qwen2().kv("qwen2.expert_count", Value::U32(8)).kv("qwen2.expert_used_count", Value::U32(9));
        let err = open(&experts).1.err().unwrap().to_string();
        assert!(err.contains("qwen2.expert_used_count 9 is not between 1 and 8"), "{err}");
        let err = open(&tiny_qwen2().kv("qwen2.expert_count", Value::U32(8))).1.err().unwrap().to_string();
        assert!(err.contains("missing metadata key qwen2.expert_used_count"), "{err}");
        assert!(open(&tiny_qwen2().kv("qwen2.expert_count", Value::U32(0))).1.unwrap().config().moe.is_none());
    }

    /// Qwen3-MoE metadata over two layers, the second without a router; 4 experts 32 wide over width 64.
    fn tiny_qwen3moe() -> GgufWriter {
        let u32v = Value::U32;
        let down: Vec<f32> = (0..4 * 64 * 32).map(|i| i as f32).collect();
        GgufWriter::new()
            .kv("general.architecture", Value::String("qwen3moe".into()))
            .kv("qwen3moe.block_count", u32v(2))
            .kv("qwen3moe.embedding_length", u32v(64))
            .kv("qwen3moe.feed_forward_length", u32v(96))
            .kv("qwen3moe.expert_feed_forward_length", u32v(32))
            .kv("qwen3moe.expert_count", u32v(4))
            .kv("qwen3moe.expert_used_count", u32v(2))
            .kv("qwen3moe.attention.head_count", u32v(4))
            .kv("qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
            .kv("qwen3moe.context_length", u32v(256))
            .tensor("token_embd.weight", &[64, 8], GgmlType::F32, f32_bytes(&[0.5; 512]))
            .tensor("blk.0.ffn_gate_inp.weight", &[64, 4], GgmlType::F32, f32_bytes(&[0.25; 256]))
            .tensor("blk.0.ffn_gate_exps.weight", &[64, 32, 4], GgmlType::Q8_0, blocks(GgmlType::Q8_0, 256, &[0]))
            .tensor("blk.0.ffn_down_exps.weight", &[32, 64, 4], GgmlType::F32, f32_bytes(&down))
    }

    #[test]
    fn test_moe_metadata_gives_the_experts_and_the_dense_layers() {
        let (_dir, ckpt) = open(&tiny_qwen3moe());
        let ckpt = ckpt.unwrap();
        let c = ckpt.config();
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.expert_intermediate_size), (4, 2, 32));
        assert!(moe.norm_topk_prob && c.is_moe_layer(0) && !c.is_moe_layer(1) && !c.rope_interleaved);
        assert_eq!(c.intermediate_size, 96);
        let no_norm = tiny_qwen3moe().kv("qwen3moe.expert_weights_norm", Value::Bool(false));
        assert!(!open(&no_norm).1.unwrap().config().moe.as_ref().unwrap().norm_topk_prob);
    }

    #[test]
    fn test_an_expert_is_its_slice_of_the_stacked_tensor() {
        let writer = tiny_qwen3moe();
        let (_dir, ckpt) = open(&writer);
        let ckpt = ckpt.unwrap();
        let expert = |e: usize, proj: &str| format!("model.layers.0.mlp.experts.{e}.{proj}.weight");
        let gate_bytes = &writer.tensors.iter().find(|t| t.name == "blk.0.ffn_gate_exps.weight").unwrap().data;
        let gate = ckpt.weight(&expert(2, "gate_proj")).unwrap();
        let want = gate_bytes[2 * 32 * 68..3 * 32 * 68].to_vec();
        let shared = |data: &QuantBytes| matches!(data, QuantBytes::Shared { .. }) && *data == want;
        assert!(matches!(gate, Weight::Quant { ty: GgmlType::Q8_0, rows: 32, cols: 64, ref data } if shared(data)));
        let down = ckpt.weight(&expert(3, "down_proj")).unwrap();
        let want: Vec<f32> = (3 * 64 * 32..4 * 64 * 32).map(|i| i as f32).collect();
        assert!(matches!(down, Weight::F32 { rows: 64, cols: 32, ref data } if *data == want));
        assert!(ckpt.contains(&expert(3, "gate_proj")) && !ckpt.contains(&expert(4, "gate_proj")));
        assert!(!ckpt.contains(&expert(0, "up_proj")) && ckpt.contains("model.layers.0.mlp.gate.weight"));
        let err = ckpt.weight(&expert(0, "up_proj")).unwrap_err().to_string();
        assert!(err.contains("blk.0.ffn_up_exps.weight"), "{err}");
        let err = ckpt.weight(&expert(4, "gate_proj")).unwrap_err().to_string();
        assert!(err.contains("no expert 4"), "{err}");
        // Older Mixtral files keep each expert's matrix on its own.
        let own = tiny_qwen3moe().tensor("blk.0.ffn_up.1.weight", &[64, 32], GgmlType::F32, f32_bytes(&[2.0; 2048]));
        let (_dir, ckpt) = open(&own);
        let up = ckpt.unwrap().weight(&expert(1, "up_proj")).unwrap();
        assert!(matches!(up, Weight::F32 { rows: 32, cols: 64, ref data } if data[5] == 2.0));
    }

    #[test]
    fn test_hugging_face_names_map_to_gguf() {
        let cases = [
            ("model.layers.12.self_attn.o_proj.weight", "blk.12.attn_output.weight"),
            ("model.layers.3.self_attn.v_proj.bias", "blk.3.attn_v.bias"),
            ("model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
            ("model.layers.7.post_attention_layernorm.weight", "blk.7.ffn_norm.weight"),
            ("model.layers.1.mlp.gate_proj.weight", "blk.1.ffn_gate.weight"),
            ("model.layers.1.mlp.up_proj.weight", "blk.1.ffn_up.weight"),
            ("model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"),
            ("rope_freqs.weight", "rope_freqs.weight"),
            ("model.layers.x.mlp.up_proj.weight", "model.layers.x.mlp.up_proj.weight"),
            ("model.layers.1.mlp.up_proj.scale", "model.layers.1.mlp.up_proj.scale"),
        ];
        for (hf, gguf) in cases {
            assert_eq!(gguf_name(hf), gguf, "{hf}");
        }
    }
}
