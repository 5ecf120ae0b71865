//! Tensor parallelism on the CPU, ranks joined by a host group: one rank equals the plain model bit for bit, more
//! ranks agree with it within float rounding, and for a fixed rank count a lane among others equals it alone and a
//! prompt in chunks equals it whole, bit for bit.

mod common;

use tensorfold_engine::boundary::{Engine, KvPool, LaneStep, Logits};
use tensorfold_engine::checkpoint::gguf_model::GgufCheckpoint;
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::checkpoint::Checkpoint;
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::Llama;
use tensorfold_engine::tp::TensorParallel;

use common::cuda::{checkpoint, prefill, relative_gap, same_bits, tokens};
use common::Rng;

/// The last row's logits after `prompt` goes into a fresh pool `chunk` tokens a round.
fn last_logits(engine: &mut dyn Engine, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let mut pool = pool_for(engine);
    prefill(engine, &mut pool, prompt, chunk)
}

fn pool_for(engine: &dyn Engine) -> KvPool {
    KvPool::new(engine.kv_layout(PAGE_TOKENS), 64)
}

#[test]
fn test_one_rank_equals_the_plain_model_bit_for_bit() {
    let dir = checkpoint("qwen2", 11);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let prompt = tokens(&mut Rng(1), 40);
    let mut plain = Llama::load(&ckpt).unwrap();
    let mut one = TensorParallel::load_cpu(&ckpt, 1, 2).unwrap();
    let want = last_logits(&mut plain, &prompt, 40);
    let got = last_logits(&mut one, &prompt, 40);
    assert!(same_bits(&want, &got), "one rank differs from the plain model");
}

#[test]
fn test_two_ranks_agree_with_one_within_rounding_on_each_variant() {
    for arch in ["llama", "qwen2", "qwen3"] {
        let dir = checkpoint(arch, 12);
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        let prompt = tokens(&mut Rng(2), 33);
        let mut plain = Llama::load(&ckpt).unwrap();
        let mut two = TensorParallel::load_cpu(&ckpt, 2, 2).unwrap();
        assert_eq!(two.kv_layout(PAGE_TOKENS).num_kv_heads * 2, plain.kv_layout(PAGE_TOKENS).num_kv_heads);
        let want = last_logits(&mut plain, &prompt, 33);
        let got = last_logits(&mut two, &prompt, 33);
        let gap = relative_gap(&want, &got);
        assert!(gap < 1e-4, "{arch}: two ranks differ from one by {gap} of the largest logit");
    }
}

#[test]
fn test_at_two_ranks_a_lane_among_others_equals_it_alone_and_chunks_equal_the_whole_prompt() {
    let dir = checkpoint("qwen2", 13);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let mut two = TensorParallel::load_cpu(&ckpt, 2, 2).unwrap();
    let mut rng = Rng(3);
    let prompts: Vec<Vec<u32>> = [21, 40, 9].iter().map(|&n| tokens(&mut rng, n)).collect();
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| last_logits(&mut two, p, p.len())).collect();
    for chunk in [1, 7, 16] {
        let chunked = last_logits(&mut two, &prompts[1], chunk);
        assert!(same_bits(&alone[1], &chunked), "the prompt in chunks of {chunk} differs from it whole");
    }
    let mut pool = pool_for(&two);
    let pages: Vec<Vec<u32>> = (0..3u32).map(|i| (i * 4..i * 4 + 3).collect()).collect();
    let lanes: Vec<LaneStep> = prompts
        .iter()
        .zip(&pages)
        .map(|(p, pg)| LaneStep { tokens: p, start_pos: 0, pages: pg, logits: Logits::Last, keep: None })
        .collect();
    let together = two.forward(&mut pool, &lanes).unwrap();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert!(same_bits(a, b.values().unwrap()), "lane {i} among others differs from it alone");
    }
}

#[test]
fn test_the_default_model_over_three_ranks_keeps_its_greedy_tokens() {
    let path = tensorfold::settings::process_fetcher().and_then(|f| f.default_model_path()).expect("the default model");
    let ckpt = GgufCheckpoint::open(&path).unwrap();
    let tokenizer = &common::default_model().tokenizer;
    let prompt = tokenizer.encode("The capital of France is", true).unwrap();
    let mut plain = Llama::load(&ckpt).unwrap();
    let mut three = TensorParallel::load_cpu(&ckpt, 3, 2).unwrap();
    let greedy = |engine: &mut dyn Engine| {
        let mut pool = pool_for(engine);
        let mut seq = prompt.clone();
        let mut logits = prefill(engine, &mut pool, &seq, seq.len());
        let first = logits.clone();
        for _ in 0..12 {
            let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a))).unwrap();
            seq.push(next as u32);
            let pages: Vec<u32> = (0..seq.len().div_ceil(PAGE_TOKENS) as u32).collect();
            let step = LaneStep {
                tokens: &seq[seq.len() - 1..],
                start_pos: seq.len() - 1,
                pages: &pages,
                logits: Logits::Last,
                keep: None,
            };
            logits = engine.forward(&mut pool, &[step]).unwrap().remove(0).values().unwrap().to_vec();
        }
        (seq, first)
    };
    let (want, want_first) = greedy(&mut plain);
    let (got, got_first) = greedy(&mut three);
    let gap = relative_gap(&want_first, &got_first);
    assert!(gap < 1e-3, "three ranks differ from one by {gap} of the largest logit");
    assert_eq!(tokenizer.decode(&got), tokenizer.decode(&want), "greedy tokens over three ranks");
    assert_eq!(ckpt.config().num_kv_heads, 3 * three.kv_layout(PAGE_TOKENS).num_kv_heads);
}
