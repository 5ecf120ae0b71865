//! The default GGUF with integer (8-bit activation) and f32-activation matmuls: how far logits and greedy tokens move.

mod common;

use serde_json::Value;
use tensorfold_engine::boundary::Logits;
use tensorfold_engine::generate::Sequence;
use tensorfold_engine::llama::cpu::Llama;
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_kernels::matmul::Activations;

fn golden() -> Value {
    serde_json::from_str(include_str!("data/smollm2_greedy.json")).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn first_logits(llama: &Llama, prompt: &[u32]) -> Vec<f32> {
    Sequence::new(llama, prompt.len()).extend(prompt, 64, Logits::Last).unwrap()
}

fn greedy(llama: &Llama, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut seq = Sequence::new(llama, prompt.len() + steps);
    let mut got = Vec::new();
    let params = SamplingParams { temperature: 0.0, ..Default::default() };
    seq.generate(prompt, steps, &params, &[], |t| {
        got.push(t);
        true
    })
    .unwrap();
    got
}

fn first_difference(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()))
}

/// Prints, per prompt, the logit movement between the two paths and each path's greedy agreement with the reference.
#[test]
#[ignore]
fn report_int8_against_f32_activations() {
    let path = tensorfold::settings::process_fetcher().and_then(|f| f.default_model_path()).unwrap();
    let mut model = tensorfold_engine::model::load(&path, &mut |_, _| {}).unwrap();
    for case in golden()["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy"]);
        model.llama.set_activations(Activations::F32);
        let (f32_logits, f32_greedy) = (first_logits(&model.llama, &prompt), greedy(&model.llama, &prompt, want.len()));
        model.llama.set_activations(Activations::Int8);
        let (int8_logits, int8_greedy) =
            (first_logits(&model.llama, &prompt), greedy(&model.llama, &prompt, want.len()));
        let max_abs = f32_logits.iter().zip(&int8_logits).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let top20 = |logits: &[f32]| {
            case["first_top20"].as_array().unwrap().iter().fold(0f32, |m, p| {
                let (id, want) = (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap() as f32);
                m.max((logits[id] - want).abs() / want.abs().max(1.0))
            })
        };
        println!(
            "{}: max |int8 - f32| logit {max_abs:.4}; top-20 relative error vs reference f32 {:.2e} int8 {:.2e}; \
             greedy {} steps: int8 = f32 for {}, f32 = reference for {}, int8 = reference for {}",
            case["prompt"],
            top20(&f32_logits),
            top20(&int8_logits),
            want.len(),
            first_difference(&int8_greedy, &f32_greedy),
            first_difference(&f32_greedy, &want),
            first_difference(&int8_greedy, &want),
        );
    }
}
