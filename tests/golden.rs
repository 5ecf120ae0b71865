//! Seeded random Llama 3, Llama 2, Qwen2, Qwen3, Qwen3-MoE and Mixtral checkpoints against transformers' f32 outputs;
//! the mixture-of-experts ones also as GGUF written by tools/hf_to_gguf.py (experts stacked as llama.cpp stacks them).

use std::path::PathBuf;

use serde_json::Value;
use tensorfold_engine::boundary::{Engine, LaneStep, Logits};
use tensorfold_engine::checkpoint::gguf_model::GgufCheckpoint;
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::checkpoint::Checkpoint;
use tensorfold_engine::generate::Sequence;
use tensorfold_engine::llama::Llama;
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_kernels::weight::QuantBytes;
use tensorfold_kernels::Weight;

const SHAPES: [&str; 4] = ["tiny-llama3", "tiny-llama2", "tiny-qwen2", "tiny-qwen3"];
const TOLERANCE: f32 = 1e-4;

fn dir(shape: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden").join(shape)
}

fn golden(shape: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir(shape).join("reference.json")).unwrap()).unwrap()
}

fn load(shape: &str) -> (Llama, Value) {
    (Llama::load(&HfCheckpoint::open(&dir(shape)).unwrap()).unwrap(), golden(shape))
}

/// `n` greedy tokens after `prompt`.
fn greedy_tokens(model: &Llama, prompt: &[u32], n: usize) -> Vec<u32> {
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    let mut seq = Sequence::new(model, prompt.len() + n);
    let mut got = Vec::new();
    seq.generate(prompt, n, &greedy, &[], |t| {
        got.push(t);
        true
    })
    .unwrap();
    got
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Largest absolute difference over the largest reference magnitude.
fn relative_error(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    let diff = ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / reference.iter().fold(0f32, |m, b| m.max(b.abs()))
}

#[test]
fn test_logits_match_the_reference_within_1e_4() {
    for shape in SHAPES {
        let (model, golden) = load(shape);
        for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
            let prompt = ids(&p["ids"]);
            let mut seq = Sequence::new(&model, prompt.len());
            let all = seq.extend(&prompt, 7, Logits::All).unwrap();
            let vocab = all.len() / prompt.len();
            let err = relative_error(&all[all.len() - vocab..], &floats(&p["last_logits"]));
            assert!(err <= TOLERANCE, "{shape} prompt {i}: last-position relative error {err}");
            if let Some(rows) = p.get("all_logits").and_then(Value::as_array) {
                for (pos, row) in rows.iter().enumerate() {
                    let err = relative_error(&all[pos * vocab..(pos + 1) * vocab], &floats(row));
                    assert!(err <= TOLERANCE, "{shape} prompt {i} position {pos}: relative error {err}");
                }
            }
        }
    }
}

#[test]
fn test_greedy_tokens_match_the_reference_for_64_steps() {
    for shape in SHAPES {
        let (model, golden) = load(shape);
        for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
            let (prompt, want) = (ids(&p["ids"]), ids(&p["greedy"]));
            assert_eq!(want.len(), 64);
            assert_eq!(greedy_tokens(&model, &prompt, want.len()), want, "{shape} prompt {i}");
        }
    }
}

/// The mixture-of-experts shapes, whose prompts also carry the router's near-ties.
const MOE_SHAPES: [&str; 3] = ["tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen3-next"];
/// A prompt whose router has a k-th and next expert closer than this may route one token differently by rounding.
const ROUTER_GAP_FLOOR: f32 = 1e-6;
/// A greedy step whose best two logits are closer than this is a tie the reference cannot decide for us.
const GREEDY_TIE: f32 = 1e-3;

#[test]
fn test_moe_logits_and_greedy_tokens_match_the_reference() {
    for shape in MOE_SHAPES {
        let (model, golden) = load(shape);
        assert!(model.config().moe.is_some(), "{shape} loaded as a dense model");
        let (mut checked, mut followed) = (0, 0);
        for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
            let prompt = ids(&p["ids"]);
            let near_tie = floats(&p["router_gaps"]).iter().any(|&gap| gap < ROUTER_GAP_FLOOR);
            if !near_tie {
                let mut seq = Sequence::new(&model, prompt.len());
                let all = seq.extend(&prompt, 7, Logits::All).unwrap();
                let vocab = all.len() / prompt.len();
                let err = relative_error(&all[all.len() - vocab..], &floats(&p["last_logits"]));
                assert!(err <= TOLERANCE, "{shape} prompt {i}: last-position relative error {err}");
                for (pos, row) in p.get("all_logits").and_then(Value::as_array).into_iter().flatten().enumerate() {
                    let err = relative_error(&all[pos * vocab..(pos + 1) * vocab], &floats(row));
                    assert!(err <= TOLERANCE, "{shape} prompt {i} position {pos}: relative error {err}");
                }
                checked += 1;
            }
            let (want, margins) = (ids(&p["greedy"]), floats(&p["greedy_margins"]));
            let decided = margins.iter().position(|&m| m < GREEDY_TIE).unwrap_or(want.len());
            let got = greedy_tokens(&model, &prompt, want.len());
            assert_eq!(got[..decided], want[..decided], "{shape} prompt {i}");
            followed += decided;
        }
        assert!(followed * 2 > 64 * golden["prompts"].as_array().unwrap().len(), "{shape}: too many greedy near-ties");
        assert!(checked * 2 > golden["prompts"].as_array().unwrap().len(), "{shape}: too many router near-ties");
    }
}

/// Q8_0 rounds weights and, in the integer kernels, activations to 8 bits: a bound on that, far below a wrong expert.
const Q8_BOUND: f32 = 5e-2;

/// Per shape, the smallest relative error of transformers' own bf16 run on any golden prompt's last logits.
const GGUF_SHAPES: [(&str, f32); 2] = [("tiny-qwen3-moe", 6.3e-3), ("tiny-mixtral", 9.7e-3)];

#[test]
fn test_moe_gguf_logits_stay_within_transformers_bf16_error() {
    for (shape, bf16_error) in GGUF_SHAPES {
        let golden = golden(shape);
        for format in ["f16", "q8_0"] {
            let ckpt = GgufCheckpoint::open(&dir(shape).join(format!("model-{format}.gguf"))).unwrap();
            let moe = ckpt.config().moe.clone().unwrap_or_else(|| panic!("{shape} {format} loaded as a dense model"));
            assert!(moe.num_experts >= 8 && moe.num_experts_per_tok >= 2, "{shape} {format}: {moe:?}");
            let model = Llama::load(&ckpt).unwrap();
            for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
                let prompt = ids(&p["ids"]);
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

#[test]
fn test_mtp_head_logits_match_the_reference() {
    let (model, golden) = load("tiny-qwen3-next");
    assert!(model.has_draft_head(), "the MTP head was not loaded");
    let mut checked = 0;
    for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
        let (prompt, Some(rows)) = (ids(&p["ids"]), p.get("mtp_logits").and_then(Value::as_array)) else { continue };
        let layout = model.kv_layout(tensorfold_engine::generate::PAGE_TOKENS);
        let mut pool = tensorfold_engine::boundary::KvPool::new(layout, 4);
        let pages = [2u32, 0, 3];
        let step = |tokens, start_pos, logits| LaneStep { tokens, start_pos, pages: &pages, logits, keep: None };
        model.run(&mut pool, &[step(&prompt, 0, Logits::None)]);
        // In two steps, so the second reads the hidden states and keys the first left.
        let half = prompt.len() / 2;
        let mut got = Vec::new();
        for (at, part) in [(0, &prompt[..half]), (half, &prompt[half..])] {
            got.extend(model.run_draft_head(&mut pool, &[step(part, at, Logits::All)]).remove(0).values().unwrap());
        }
        let vocab = model.vocab_size();
        assert_eq!(got.len(), rows.len() * vocab, "prompt {i}");
        for (pos, row) in rows.iter().enumerate() {
            let err = relative_error(&got[pos * vocab..(pos + 1) * vocab], &floats(row));
            assert!(err <= TOLERANCE, "prompt {i} MTP row {pos}: relative error {err}");
        }
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} prompts have MTP rows");
}

/// Q8_0 rounds the decay gates' inputs too, which the decay rates then scale: a bound that a wrong tensor
/// layout or a misplaced one (errors of the logits' own size) still fails.
const HYBRID_Q8_BOUND: f32 = 0.5;

#[test]
fn test_hybrid_gguf_logits_stay_within_transformers_bf16_error() {
    let golden = golden("tiny-qwen3-next");
    for format in ["f16", "q8_0"] {
        let ckpt = GgufCheckpoint::open(&dir("tiny-qwen3-next").join(format!("model-{format}.gguf"))).unwrap();
        let c = ckpt.config();
        let hybrid = c.hybrid.as_ref().unwrap_or_else(|| panic!("{format}: loaded without linear attention"));
        assert_eq!(
            (c.arch.as_str(), &hybrid.linear[..], hybrid.mtp_layers),
            ("qwen3next", &[true, true, false, true][..], 1)
        );
        let model = Llama::load(&ckpt).unwrap();
        for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
            let prompt = ids(&p["ids"]);
            let mut seq = Sequence::new(&model, prompt.len());
            let last = seq.extend(&prompt, 7, Logits::Last).unwrap();
            let err = relative_error(&last, &floats(&p["last_logits"]));
            let bound = if format == "f16" { p["bf16_error"].as_f64().unwrap() as f32 } else { HYBRID_Q8_BOUND };
            assert!(err <= bound, "{format} prompt {i}: relative error {err} > {bound}");
        }
    }
}
