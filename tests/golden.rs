//! Seeded random Llama 3, Llama 2, Qwen2, Qwen3, Qwen3-MoE and Mixtral checkpoints against transformers' f32 outputs.

use std::path::PathBuf;

use serde_json::Value;
use tensorfold_engine::boundary::Logits;
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::generate::Sequence;
use tensorfold_engine::llama::Llama;
use tensorfold_engine::sampling::SamplingParams;

const SHAPES: [&str; 4] = ["tiny-llama3", "tiny-llama2", "tiny-qwen2", "tiny-qwen3"];
const TOLERANCE: f32 = 1e-4;

fn load(shape: &str) -> (Llama, Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden").join(shape);
    let model = Llama::load(&HfCheckpoint::open(&dir).unwrap()).unwrap();
    let golden = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    (model, golden)
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
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    for shape in SHAPES {
        let (model, golden) = load(shape);
        for (i, p) in golden["prompts"].as_array().unwrap().iter().enumerate() {
            let (prompt, want) = (ids(&p["ids"]), ids(&p["greedy"]));
            assert_eq!(want.len(), 64);
            let mut seq = Sequence::new(&model, prompt.len() + want.len());
            let mut got = Vec::new();
            seq.generate(&prompt, want.len(), &greedy, &[], |t| {
                got.push(t);
                true
            })
            .unwrap();
            assert_eq!(got, want, "{shape} prompt {i}");
        }
    }
}

/// The mixture-of-experts shapes, whose prompts also carry the router's near-ties.
const MOE_SHAPES: [&str; 2] = ["tiny-qwen3-moe", "tiny-mixtral"];
/// A prompt whose router has a k-th and next expert closer than this may route one token differently by rounding.
const ROUTER_GAP_FLOOR: f32 = 1e-6;
/// A greedy step whose best two logits are closer than this is a tie the reference cannot decide for us.
const GREEDY_TIE: f32 = 1e-3;

#[test]
fn test_moe_logits_and_greedy_tokens_match_the_reference() {
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
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
            let mut seq = Sequence::new(&model, prompt.len() + want.len());
            let mut got = Vec::new();
            seq.generate(&prompt, want.len(), &greedy, &[], |t| {
                got.push(t);
                true
            })
            .unwrap();
            assert_eq!(got[..decided], want[..decided], "{shape} prompt {i}");
            followed += decided;
        }
        assert!(followed * 2 > 64 * golden["prompts"].as_array().unwrap().len(), "{shape}: too many greedy near-ties");
        assert!(checked * 2 > golden["prompts"].as_array().unwrap().len(), "{shape}: too many router near-ties");
    }
}
