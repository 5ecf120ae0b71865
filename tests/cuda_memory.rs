//! The CUDA engine when the GPU is full: a round whose driver calls are refused memory ends with `OutOfMemory`
//! (never a panic or another error), and the same round runs with its bits once memory is back. Skips with a
//! one-line reason where no GPU is found.

mod common;

use tensorfold_engine::boundary::{Engine, EngineError, KvPool, LaneStep, Logits};
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::cuda::Sizing;
use tensorfold_kernels::cuda::{DevPtr, Gpu};

use common::cuda::{checkpoint, gpu, load, same_bits, switch, tokens};
use common::Rng;

/// Takes every byte of device memory the driver still grants, largest blocks first, as another process could.
fn fill(gpu: &Gpu) -> Vec<DevPtr> {
    let (mut taken, mut block) = (Vec::new(), 8usize << 30);
    while block >= 1 << 16 {
        match gpu.malloc(block, false) {
            Ok(ptr) => taken.push(ptr),
            Err(_) => block /= 2,
        }
    }
    taken
}

#[test]
fn test_a_round_on_a_full_gpu_ends_with_out_of_memory_or_runs_and_the_engine_serves_on_after() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("llama", 3);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 64, max_lanes: 8, context: 128 });
    let mut pool: KvPool = dev.kv_pool(&model, PAGE_TOKENS, 64).unwrap();
    let mut rng = Rng(4);
    let prompts: Vec<Vec<u32>> = (0..5).map(|_| tokens(&mut rng, 9)).collect();
    let pages: Vec<Vec<u32>> = (0..5u32).map(|i| vec![i]).collect();
    let lane = |tokens: &'static [u32], at: usize, i: usize, logits| LaneStep {
        tokens: if at == 0 { &prompts[i] } else { tokens },
        start_pos: at,
        pages: &pages[i],
        logits,
        keep: None,
    };
    let prefill: Vec<LaneStep> = (0..5).map(|i| lane(&[], 0, i, Logits::None)).collect();
    model.forward(&mut pool, &prefill).unwrap();
    let decode: Vec<LaneStep> = (0..5).map(|i| lane(&[3], 9, i, Logits::Last)).collect();
    // The reference runs without graphs, so the round below records its graph for five rows on the full GPU.
    switch(&mut model, |o| o.graphs = false);
    let want = model.forward(&mut pool, &decode).unwrap();
    switch(&mut model, |o| o.graphs = true);
    let taken = fill(&dev.gpu);
    let full = model.forward(&mut pool, &decode);
    taken.iter().for_each(|&ptr| dev.gpu.free(ptr, false));
    match full {
        Ok(got) => {
            assert!(
                got.iter().zip(&want).all(|(a, b)| same_bits(a.values().unwrap(), b.values().unwrap())),
                "a round on a full GPU changed its rows"
            );
            eprintln!("the round needed no new device memory: it ran on the full GPU");
        }
        Err(EngineError::OutOfMemory(why)) => eprintln!("the round on the full GPU was refused: {why}"),
        Err(other) => panic!("a round refused memory must end with OutOfMemory, not: {other}"),
    }
    let after = model.forward(&mut pool, &decode).expect("the same round once memory is back");
    assert!(
        after.iter().zip(&want).all(|(a, b)| same_bits(a.values().unwrap(), b.values().unwrap())),
        "the round after a refusal changed its rows"
    );
}
