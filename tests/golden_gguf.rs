//! The mixture-of-experts goldens written as GGUF by tools/hf_to_gguf.py (experts stacked as llama.cpp stacks them)
//! against transformers' f32 outputs: f16 weights stay within the error transformers' own bf16 run makes, Q8_0
//! within the 8-bit format's own.

use std::path::PathBuf;

use serde_json::Value;
use tensorfold_engine::boundary::Logits;
use tensorfold_engine::checkpoint::gguf_model::GgufCheckpoint;
use tensorfold_engine::checkpoint::Checkpoint;
use tensorfold_engine::generate::Sequence;
use tensorfold_engine::llama::Llama;
use tensorfold_kernels::weight::QuantBytes;
use tensorfold_kernels::Weight;

/// Q8_0 rounds weights and, in the integer kernels, activations to 8 bits: a bound on that, far below a wrong expert.
const Q8_BOUND: f32 = 5e-2;

/// Per shape, the smallest relative error of transformers' own bf16 run on any golden prompt's last logits.
const SHAPES: [(&str, f32); 2] = [("tiny-qwen3-moe", 6.3e-3), ("tiny-mixtral", 9.7e-3)];

fn dir(shape: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden").join(shape)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Largest absolute difference over the largest reference magnitude.
fn relative_error(ours: &[f32], reference: &[f32]) -> f32 {
    let diff = ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / reference.iter().fold(0f32, |m, b| m.max(b.abs()))
}

#[test]
fn test_moe_gguf_logits_stay_within_transformers_bf16_error() {
    for (shape, bf16_error) in SHAPES {
        let golden: Value = serde_json::from_slice(&std::fs::read(dir(shape).join("reference.json")).unwrap()).unwrap();
        for format in ["f16", "q8_0"] {
            let ckpt = GgufCheckpoint::open(&dir(shape).join(format!("model-{format}.gguf"))).unwrap();
            let moe = ckpt.config().moe.clone().unwrap_or_else(|| panic!("{shape} {format} loaded as a dense model"));
            assert!(moe.num_experts >= 8 && moe.num_experts_per_tok >= 2, "{shape} {format}: {moe:?}");
            let model = Llama::load(&ckpt).unwrap();
            for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
                let prompt: Vec<u32> =
                    p["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
                let mut seq = Sequence::new(&model, prompt.len());
                let last = seq.extend(&prompt, 7, Logits::Last).unwrap();
                let err = relative_error(&last, &floats(&p["last_logits"]));
                let bound = if format == "f16" { bf16_error } else { Q8_BOUND };
                assert!(err <= bound, "{shape} {format} prompt {i}: relative error {err} > {bound}");
            }
        }
    }
}

#[test]
fn test_a_gguf_expert_is_its_rows_of_the_stack() {
    let ckpt = GgufCheckpoint::open(&dir("tiny-qwen3-moe").join("model-q8_0.gguf")).unwrap();
    let c = ckpt.config();
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((c.arch.as_str(), moe.num_experts, moe.num_experts_per_tok), ("qwen3moe", 16, 4));
    assert_eq!(moe.dense_layers, vec![1], "the layer without a router keeps its dense MLP");
    let name = |e: usize, p: &str| format!("model.layers.0.mlp.experts.{e}.{p}_proj.weight");
    let gate = ckpt.weight(&name(15, "gate")).unwrap();
    assert_eq!((gate.rows(), gate.cols()), (moe.expert_intermediate_size, c.hidden_size));
    assert!(
        matches!(&gate, Weight::Quant { data, .. } if matches!(data, QuantBytes::Shared { .. })),
        "a Q8_0 expert stays quantized, mapped"
    );
    let down = ckpt.weight(&name(3, "down")).unwrap();
    assert_eq!((down.rows(), down.cols()), (c.hidden_size, moe.expert_intermediate_size));
    assert!(ckpt.weight(&name(0, "gate")).unwrap().to_f32() != gate.to_f32(), "experts 0 and 15 read the same rows");
    let err = ckpt.weight(&name(16, "gate")).unwrap_err().to_string();
    assert!(err.contains("no expert 16"), "{err}");
    assert!(!ckpt.contains(&name(16, "up")) && ckpt.contains(&name(15, "up")));
    let router = ckpt.weight("model.layers.2.mlp.gate.weight").unwrap();
    assert!(matches!(router, Weight::F32 { .. }), "routers stay f32");
}
