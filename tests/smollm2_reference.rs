//! The default GGUF against transformers' own GGUF loading (dequantized, f32): prompts, greedy tokens, logits.

mod common;

use serde_json::Value;
use tensorfold_engine::boundary::Logits;
use tensorfold_engine::generate::Sequence;
use tensorfold_engine::sampling::SamplingParams;

fn golden() -> Value {
    serde_json::from_str(include_str!("data/smollm2_greedy.json")).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn test_prompt_tokens_equal_the_reference() {
    let model = common::default_model();
    for case in golden()["cases"].as_array().unwrap() {
        let ours = model.tokenizer.encode(case["text"].as_str().unwrap(), true).unwrap();
        assert_eq!(ours, ids(&case["prompt_ids"]), "prompt {}", case["prompt"]);
    }
}

#[test]
fn test_greedy_tokens_equal_the_reference_for_64_steps() {
    let model = common::default_model();
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    let mut failures = Vec::new();
    for case in golden()["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy"]);
        let mut seq = Sequence::new(&model.llama, prompt.len() + want.len());
        let mut got = Vec::new();
        seq.generate(&prompt, want.len(), &greedy, &[], |t| {
            got.push(t);
            true
        })
        .unwrap();
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
            failures.push(format!("{}: first difference at step {at}", case["prompt"]));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn test_first_step_logits_are_close_to_the_reference() {
    let model = common::default_model();
    for case in golden()["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let mut seq = Sequence::new(&model.llama, prompt.len());
        let logits = seq.extend(&prompt, 64, Logits::Last).unwrap();
        for pair in case["first_top20"].as_array().unwrap() {
            let (id, want) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
            let got = logits[id];
            assert!(
                (got - want).abs() <= 2e-3 * want.abs().max(1.0),
                "{}: token {id}: {got} vs {want}",
                case["prompt"]
            );
        }
    }
}
