//! Seeded random checkpoints on the GPU, and the GPU itself, for the CUDA test binaries.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};
use tensorfold::cuda_setup::CudaDevice;
use tensorfold_engine::boundary::{Engine, KvPool, LaneStep, Logits};
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::cuda::{CudaLlama, CudaOptions, Sizing};

use super::Rng;

/// The seeded checkpoints' vocabulary.
pub const VOCAB: usize = 1000;

/// The GPU, or `None` after printing why the test is skipped.
pub fn gpu() -> Option<CudaDevice> {
    let fetcher = tensorfold::settings::process_fetcher().expect("a cache directory");
    match CudaDevice::open(None, CudaOptions::default(), &fetcher) {
        Ok(dev) => Some(dev),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

pub fn config(arch: &str) -> Value {
    let mut c = json!({
        "model_type": arch, "vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 2048,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": false
    });
    if arch == "llama" {
        // One query head per KV head, of the largest size the kernels take.
        c["num_attention_heads"] = json!(2);
        c["num_key_value_heads"] = json!(2);
        c["head_dim"] = json!(128);
        c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
    }
    c
}

/// A seeded random checkpoint in bf16; Qwen2 gets q/k/v biases and Qwen3 per-head q/k norms.
pub fn checkpoint(arch: &str, seed: u64) -> tempfile::TempDir {
    let c = config(arch);
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let (h, f, d) = (n("hidden_size"), n("intermediate_size"), n("head_dim"));
    let (q, kv) = (n("num_attention_heads") * d, n("num_key_value_heads") * d);
    let mut shapes: Vec<(String, Vec<usize>, f32, f32)> = vec![
        ("model.embed_tokens.weight".into(), vec![VOCAB, h], 0.0, 1.0),
        ("model.norm.weight".into(), vec![h], 1.0, 0.1),
        ("lm_head.weight".into(), vec![VOCAB, h], 0.0, 0.2),
    ];
    for l in 0..n("num_hidden_layers") {
        let p = format!("model.layers.{l}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("mlp.gate_proj.weight", vec![f, h]),
            ("mlp.up_proj.weight", vec![f, h]),
            ("mlp.down_proj.weight", vec![h, f]),
        ] {
            shapes.push((format!("{p}.{name}"), shape, 0.0, 0.08));
        }
        shapes.push((format!("{p}.input_layernorm.weight"), vec![h], 1.0, 0.1));
        shapes.push((format!("{p}.post_attention_layernorm.weight"), vec![h], 1.0, 0.1));
        if arch == "qwen2" {
            for (name, len) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                shapes.push((format!("{p}.self_attn.{name}.bias"), vec![len], 0.0, 0.1));
            }
        }
        if arch == "qwen3" {
            shapes.push((format!("{p}.self_attn.q_norm.weight"), vec![d], 1.0, 0.1));
            shapes.push((format!("{p}.self_attn.k_norm.weight"), vec![d], 1.0, 0.1));
        }
    }
    let mut rng = Rng(seed);
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .map(|(name, shape, mean, std)| {
            let len: usize = shape.iter().product();
            let bytes =
                (0..len).flat_map(|_| half::bf16::from_f32(mean + std * normal(&mut rng)).to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| (name.as_str(), TensorView::new(Dtype::BF16, shape.clone(), bytes).unwrap()));
    safetensors::serialize_to_file(views, &None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

/// A standard normal draw (Box-Muller).
pub fn normal(rng: &mut Rng) -> f32 {
    let u = ((rng.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let v = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
}

pub fn load(dev: &CudaDevice, dir: &Path, sizing: Sizing) -> CudaLlama {
    let ckpt = HfCheckpoint::open(dir).unwrap();
    let mut alloc = dev.alloc();
    CudaLlama::load(&ckpt, dev.gpu.clone(), sizing, CudaOptions::default(), &mut alloc, &mut |_, _| {}).unwrap()
}

/// Sets the model's switches for the rounds that follow.
pub fn switch(model: &mut CudaLlama, set: impl FnOnce(&mut CudaOptions)) {
    let mut options = model.options();
    set(&mut options);
    model.set_options(options);
}

pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub fn tokens(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.below(VOCAB as u64) as u32).collect()
}

/// The last row's logits after `prompt` goes into `pool` `chunk` tokens a round, from page 0.
pub fn prefill(engine: &mut dyn Engine, pool: &mut KvPool, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let pages: Vec<u32> = (0..prompt.len().div_ceil(PAGE_TOKENS) as u32).collect();
    let mut last = Vec::new();
    for (i, part) in prompt.chunks(chunk).enumerate() {
        let start_pos = i * chunk;
        let logits = if start_pos + part.len() == prompt.len() { Logits::Last } else { Logits::None };
        let lane = LaneStep { tokens: part, start_pos, pages: &pages, logits, keep: None };
        last = engine.forward(pool, &[lane]).unwrap().remove(0).values().unwrap_or_default().to_vec();
    }
    last
}

/// The largest difference between two rows, against the row's largest magnitude.
pub fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}
