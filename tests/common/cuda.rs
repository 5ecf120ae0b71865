//! Seeded random checkpoints on the GPU, and the GPU itself, for the CUDA test binaries.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};
use tensorfold::cuda_setup::CudaDevice;
use tensorfold_engine::boundary::{Engine, KvPool, LaneStep, Logits};
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::checkpoint::Checkpoint;
use tensorfold_engine::generate::{Sequence, PAGE_TOKENS};
use tensorfold_engine::llama::cuda::{CudaLlama, CudaOptions, Sizing};
use tensorfold_engine::llama::Llama;

use super::Rng;

/// The seeded checkpoints' vocabulary.
pub const VOCAB: usize = 1000;

/// The GPU, or `None` after printing why the test is skipped.
pub fn gpu() -> Option<CudaDevice> {
    // The process's TF_CUDA_* settings pick the kernels (TF_CUDA_MOE_SPLIT=1, say), which must keep every bit.
    let settings = tensorfold::settings::Settings::from_process(&[]).expect("the process's settings");
    let fetcher = settings.fetcher().expect("a cache directory");
    match CudaDevice::open(None, settings.cuda_options(), &fetcher) {
        Ok(dev) => {
            // The runtime's warnings (a failed draft pass, say) on stderr, as the server logs them; RUST_LOG sets more.
            let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
            let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_default();
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
            Some(dev)
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// The config of `arch`: a model type, `qwen3_next_h256` (Qwen3-Next with the 80B shape's head size of 256) or
/// `qwen3_next_mtp` (Qwen3-Next with its MTP draft head).
pub fn config(arch: &str) -> Value {
    config_of(arch, VOCAB)
}

/// `config(arch)` with a vocabulary of `vocab` ids.
fn config_of(arch: &str, vocab: usize) -> Value {
    let (model_type, head_dim) = match arch {
        "qwen3_next_h256" => ("qwen3_next", 256),
        "qwen3_next_mtp" => ("qwen3_next", 64),
        _ => (arch, 64),
    };
    let mtp_layers = usize::from(arch == "qwen3_next_mtp");
    let arch = model_type;
    let mut c = json!({
        "model_type": arch, "vocab_size": vocab, "hidden_size": 256, "intermediate_size": 2048,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": false
    });
    if arch == "qwen3_moe" {
        // 16 experts of 128, 4 a row; the second layer keeps the dense MLP.
        c["num_experts"] = json!(16);
        c["num_experts_per_tok"] = json!(4);
        c["moe_intermediate_size"] = json!(128);
        c["norm_topk_prob"] = json!(true);
        c["mlp_only_layers"] = json!([1]);
    }
    if arch == "qwen3_next" {
        // Three Gated DeltaNet layers and one gated attention layer; 16 experts of 128 beside a shared expert, the
        // second layer dense; every size one the CUDA kernels take.
        c["intermediate_size"] = json!(512);
        c["num_hidden_layers"] = json!(4);
        c["layer_types"] = json!(["linear_attention", "linear_attention", "full_attention", "linear_attention"]);
        c["linear_num_key_heads"] = json!(4);
        c["linear_num_value_heads"] = json!(16);
        c["linear_key_head_dim"] = json!(32);
        c["linear_value_head_dim"] = json!(32);
        c["linear_conv_kernel_dim"] = json!(4);
        c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25});
        c["num_experts"] = json!(16);
        c["num_experts_per_tok"] = json!(4);
        c["moe_intermediate_size"] = json!(128);
        c["shared_expert_intermediate_size"] = json!(128);
        c["norm_topk_prob"] = json!(true);
        c["decoder_sparse_step"] = json!(1);
        c["mlp_only_layers"] = json!([1]);
        c["num_nextn_predict_layers"] = json!(mtp_layers);
    }
    if arch == "mixtral" {
        c["num_local_experts"] = json!(8);
        c["num_experts_per_tok"] = json!(2);
        c["intermediate_size"] = json!(512);
    }
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

/// A seeded random checkpoint in bf16; Qwen2 gets q/k/v biases, Qwen3 per-head q/k norms, Qwen3-MoE and Mixtral
/// experts.
pub fn checkpoint(arch: &str, seed: u64) -> tempfile::TempDir {
    checkpoint_of(arch, seed, VOCAB)
}

/// `checkpoint(arch, seed)` with a vocabulary of `vocab` ids.
pub fn checkpoint_of(arch: &str, seed: u64, vocab: usize) -> tempfile::TempDir {
    let c = config_of(arch, vocab);
    let arch = c["model_type"].as_str().unwrap();
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let (h, d) = (n("hidden_size"), n("head_dim"));
    let (q, kv) = (n("num_attention_heads") * d, n("num_key_value_heads") * d);
    // Qwen3-Next's norms scale by one plus their stored weight.
    let one = if arch == "qwen3_next" { 0.0 } else { 1.0 };
    let mut shapes: Vec<(String, Vec<usize>, f32, f32)> = vec![
        ("model.embed_tokens.weight".into(), vec![vocab, h], 0.0, 1.0),
        ("model.norm.weight".into(), vec![h], one, 0.1),
        ("lm_head.weight".into(), vec![vocab, h], 0.0, 0.2),
    ];
    if c["num_nextn_predict_layers"].as_u64().unwrap_or(0) > 0 {
        shapes.extend(mtp_shapes(&c));
    }
    for l in 0..n("num_hidden_layers") {
        let p = format!("model.layers.{l}");
        if arch == "qwen3_next" {
            shapes.extend(next_mixer_shapes(&c, l, &p));
        } else {
            for (name, shape) in [
                ("self_attn.q_proj.weight", vec![q, h]),
                ("self_attn.k_proj.weight", vec![kv, h]),
                ("self_attn.v_proj.weight", vec![kv, h]),
                ("self_attn.o_proj.weight", vec![h, q]),
            ] {
                shapes.push((format!("{p}.{name}"), shape, 0.0, 0.08));
            }
        }
        shapes.extend(mlp_shapes(&c, arch, l, &p));
        shapes.push((format!("{p}.input_layernorm.weight"), vec![h], one, 0.1));
        shapes.push((format!("{p}.post_attention_layernorm.weight"), vec![h], one, 0.1));
        if arch == "qwen2" {
            for (name, len) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                shapes.push((format!("{p}.self_attn.{name}.bias"), vec![len], 0.0, 0.1));
            }
        }
        if arch == "qwen3" || arch == "qwen3_moe" {
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

/// Layer `l`'s MLP tensors: the dense gated MLP, or a router and its experts (Qwen3-MoE's or Mixtral's names).
fn mlp_shapes(c: &Value, arch: &str, l: usize, p: &str) -> Vec<(String, Vec<usize>, f32, f32)> {
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let h = n("hidden_size");
    let dense = c["mlp_only_layers"].as_array().is_some_and(|d| d.iter().any(|v| v.as_u64() == Some(l as u64)));
    let (names, experts, f) = match arch {
        "qwen3_moe" | "qwen3_next" if !dense => {
            (["mlp.gate", "mlp.experts.", "gate_proj", "up_proj", "down_proj"], 16, n("moe_intermediate_size"))
        }
        "mixtral" => {
            (["block_sparse_moe.gate", "block_sparse_moe.experts.", "w1", "w3", "w2"], 8, n("intermediate_size"))
        }
        _ => {
            let f = n("intermediate_size");
            let mlp = [("gate_proj", vec![f, h]), ("up_proj", vec![f, h]), ("down_proj", vec![h, f])];
            return mlp.into_iter().map(|(m, shape)| (format!("{p}.mlp.{m}.weight"), shape, 0.0, 0.08)).collect();
        }
    };
    let [router, prefix, gate, up, down] = names;
    let mut out = vec![(format!("{p}.{router}.weight"), vec![experts, h], 0.0, 0.3)];
    for e in 0..experts {
        for (m, shape) in [(gate, vec![f, h]), (up, vec![f, h]), (down, vec![h, f])] {
            out.push((format!("{p}.{prefix}{e}.{m}.weight"), shape, 0.0, 0.08));
        }
    }
    if let Some(s) = c["shared_expert_intermediate_size"].as_u64().map(|s| s as usize) {
        for (m, shape) in [(gate, vec![s, h]), (up, vec![s, h]), (down, vec![h, s])] {
            out.push((format!("{p}.mlp.shared_expert.{m}.weight"), shape, 0.0, 0.08));
        }
        out.push((format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h], 0.0, 0.1));
    }
    out
}

/// Qwen3-Next layer `l`'s mixer: Gated DeltaNet, or attention whose query projection also gives each head's gate.
fn next_mixer_shapes(c: &Value, l: usize, p: &str) -> Vec<(String, Vec<usize>, f32, f32)> {
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let (h, d) = (n("hidden_size"), n("head_dim"));
    if c["layer_types"][l] == "full_attention" {
        let (q, kv) = (n("num_attention_heads") * d, n("num_key_value_heads") * d);
        let mut out: Vec<(String, Vec<usize>, f32, f32)> = [
            ("q_proj.weight", vec![2 * q, h]),
            ("k_proj.weight", vec![kv, h]),
            ("v_proj.weight", vec![kv, h]),
            ("o_proj.weight", vec![h, q]),
        ]
        .into_iter()
        .map(|(m, shape)| (format!("{p}.self_attn.{m}"), shape, 0.0, 0.08))
        .collect();
        out.push((format!("{p}.self_attn.q_norm.weight"), vec![d], 0.0, 0.1));
        out.push((format!("{p}.self_attn.k_norm.weight"), vec![d], 0.0, 0.1));
        return out;
    }
    let (nk, nv, dk, dv) =
        (n("linear_num_key_heads"), n("linear_num_value_heads"), n("linear_key_head_dim"), n("linear_value_head_dim"));
    let conv = 2 * nk * dk + nv * dv;
    [
        ("in_proj_qkvz.weight", vec![conv + nv * dv, h], 0.0, 0.08),
        ("in_proj_ba.weight", vec![2 * nv, h], 0.0, 0.08),
        ("conv1d.weight", vec![conv, 1, n("linear_conv_kernel_dim")], 0.0, 0.3),
        ("A_log", vec![nv], 0.0, 0.5),
        ("dt_bias", vec![nv], 0.0, 0.5),
        ("norm.weight", vec![dv], 1.0, 0.1),
        ("out_proj.weight", vec![h, nv * dv], 0.0, 0.08),
    ]
    .into_iter()
    .map(|(m, shape, mean, std)| (format!("{p}.linear_attn.{m}"), shape, mean, std))
    .collect()
}

/// Qwen3-Next's MTP head: its input norms and `fc`, one gated attention layer with experts, its final norm.
fn mtp_shapes(c: &Value) -> Vec<(String, Vec<usize>, f32, f32)> {
    let h = c["hidden_size"].as_u64().unwrap() as usize;
    let p = "mtp.layers.0";
    let attention = (0..).find(|&l| c["layer_types"][l] == "full_attention").unwrap();
    let mut out = next_mixer_shapes(c, attention, p);
    out.extend(mlp_shapes(c, "qwen3_next", 0, p));
    out.push(("mtp.fc.weight".into(), vec![h, 2 * h], 0.0, 0.06));
    for norm in [
        format!("{p}.input_layernorm.weight"),
        format!("{p}.post_attention_layernorm.weight"),
        "mtp.pre_fc_norm_embedding.weight".into(),
        "mtp.pre_fc_norm_hidden.weight".into(),
        "mtp.norm.weight".into(),
    ] {
        out.push((norm, vec![h], 0.0, 0.1));
    }
    out
}

/// A standard normal draw (Box-Muller).
pub fn normal(rng: &mut Rng) -> f32 {
    let u = ((rng.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let v = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
}

pub fn load(dev: &CudaDevice, dir: &Path, sizing: Sizing) -> CudaLlama {
    load_from(dev, &HfCheckpoint::open(dir).unwrap(), sizing)
}

/// `ckpt` on the GPU, in any format, with the switches the process's TF_CUDA_* settings give (as the server's).
pub fn load_from(dev: &CudaDevice, ckpt: &dyn Checkpoint, sizing: Sizing) -> CudaLlama {
    let mut alloc = dev.alloc();
    CudaLlama::load(ckpt, dev.gpu.clone(), sizing, dev.options, &mut alloc, &mut |_, _| {}).unwrap()
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

/// A `len`-token prompt (drawn with `seeds.1`) on a checkpoint of `arch` (seeded with `seeds.0`) gives every row's
/// logits the same bits whole as in chunks of each of `chunks`.
pub fn prompt_whole_equals_chunks(dev: &CudaDevice, arch: &str, seeds: (u64, u64), len: usize, chunks: &[usize]) {
    let dir = checkpoint(arch, seeds.0);
    let mut model = load(dev, dir.path(), Sizing { max_tokens: len, max_lanes: 4, context: len + 100 });
    let prompt = tokens(&mut Rng(seeds.1), len);
    let mut run = |chunk: usize| {
        let pool = dev.kv_pool(&model, PAGE_TOKENS, (len + 100) / PAGE_TOKENS + 1).unwrap();
        let mut seq = Sequence::with_pool(&mut model, pool);
        seq.extend(&prompt, chunk, Logits::All).unwrap()
    };
    let whole = run(len);
    assert_eq!(whole.len(), len * VOCAB);
    for &chunk in chunks {
        assert!(same_bits(&whole, &run(chunk)), "{arch}: chunks of {chunk} differ from the whole prompt");
    }
}

/// The relative L2 distance of `got` from `want`.
pub fn l2_gap(got: &[f32], want: &[f32]) -> f32 {
    let err = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum::<f32>().sqrt();
    err / want.iter().map(|b| b * b).sum::<f32>().sqrt()
}

/// Each row's `l2_gap` (rows of VOCAB).
pub fn row_gaps(got: &[f32], want: &[f32]) -> Vec<f32> {
    got.chunks(VOCAB).zip(want.chunks(VOCAB)).map(|(g, c)| l2_gap(g, c)).collect()
}

/// The largest difference between two rows, against the row's largest magnitude.
pub fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// The GPU path (bf16 activations) on a seeded `arch` checkpoint stays close to the CPU path in f32 on the same
/// weights: a 50-token prompt's logits, then greedy steps while the two pick the same token (at least 4).
pub fn agrees_with_the_cpu(dev: &CudaDevice, arch: &str, seed: u64) {
    let dir = checkpoint(arch, seed);
    let mut gpu_model = load(dev, dir.path(), Sizing { max_tokens: 256, max_lanes: 1, context: 256 });
    let cpu_model = Llama::load(&HfCheckpoint::open(dir.path()).unwrap()).unwrap();
    let prompt = tokens(&mut Rng(seed + 10), 50);
    let pool = dev.kv_pool(&gpu_model, PAGE_TOKENS, 8).unwrap();
    let mut on_gpu = Sequence::with_pool(&mut gpu_model, pool);
    let mut on_cpu = Sequence::new(&cpu_model, 128);
    let (mut g, mut c) =
        (on_gpu.extend(&prompt, 64, Logits::Last).unwrap(), on_cpu.extend(&prompt, 64, Logits::Last).unwrap());
    let mut agreed = 0;
    for _ in 0..16 {
        let gap = l2_gap(&g, &c);
        assert!(gap < 0.03, "{arch}: relative logits error {gap} after {agreed} steps");
        let (tg, tc) = (tensorfold_kernels::ops::argmax(&g), tensorfold_kernels::ops::argmax(&c));
        if tg != tc {
            break;
        }
        agreed += 1;
        (g, c) = (
            on_gpu.extend(&[tg as u32], 1, Logits::Last).unwrap(),
            on_cpu.extend(&[tc as u32], 1, Logits::Last).unwrap(),
        );
    }
    eprintln!("{arch}: greedy agreed for {agreed} of 16 steps");
    assert!(agreed >= 4, "{arch}: greedy tokens agree for only {agreed} steps");
}

/// A decode row after a `len`-token prompt gives the same bits alone and at a random place among one-token rows
/// of other lanes, in rounds of each of `sizes` rows.
pub fn row_alone_equals_row_in_batches(
    dev: &CudaDevice,
    model: &mut CudaLlama,
    len: usize,
    sizes: &[usize],
    seed: u64,
) {
    let mut pool: KvPool = dev.kv_pool(model, PAGE_TOKENS, 1024).unwrap();
    let mut rng = Rng(seed);
    let prompt = tokens(&mut rng, len);
    let probe_pages: Vec<u32> = (0..(len as u32 + 1).div_ceil(PAGE_TOKENS as u32)).collect();
    let first_free = probe_pages.len() as u32;
    let prefill = LaneStep { tokens: &prompt, start_pos: 0, pages: &probe_pages, logits: Logits::None, keep: None };
    model.forward(&mut pool, &[prefill]).unwrap();
    let next = [7u32];
    let step = || LaneStep { tokens: &next, start_pos: len, pages: &probe_pages, logits: Logits::Last, keep: None };
    let alone = model.forward(&mut pool, &[step()]).unwrap().remove(0);
    for &size in sizes {
        let others = tokens(&mut rng, size - 1);
        let pages: Vec<Vec<u32>> = (0..size - 1).map(|i| vec![first_free + i as u32 * 3]).collect();
        let at = rng.below(size as u64) as usize;
        let mut lanes: Vec<LaneStep> = others
            .iter()
            .zip(&pages)
            .map(|(t, p)| LaneStep {
                tokens: std::slice::from_ref(t),
                start_pos: 0,
                pages: p,
                logits: Logits::Last,
                keep: None,
            })
            .collect();
        lanes.insert(at, step());
        let out = model.forward(&mut pool, &lanes).unwrap();
        let (alone, got) = (alone.values().unwrap(), out[at].values().unwrap());
        assert!(same_bits(alone, got), "the row differs inside a batch of {size} rows at {at}");
    }
}
