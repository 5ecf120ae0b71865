//! Qwen3-Next on a GPU (Gated DeltaNet layers, gated attention, experts beside a shared expert): agreement with the
//! CPU path, and a row's bits whatever rows share its round, however its prompt is cut, and whether its prompt
//! resumed from another lane's pages. Every test skips with a one-line reason where no GPU is found.

mod common;

use tensorfold_engine::boundary::{Engine, LaneStep, Logits};
use tensorfold_engine::generate::{Sequence, PAGE_TOKENS};
use tensorfold_engine::llama::cuda::Sizing;

use common::cuda::{
    agrees_with_the_cpu, checkpoint, gpu, load, prompt_whole_equals_chunks, row_alone_equals_row_in_batches, same_bits,
    tokens, VOCAB,
};
use common::Rng;

const ARCH: &str = "qwen3_next";

#[test]
fn test_hybrid_logits_on_the_gpu_agree_with_the_cpu_path() {
    let Some(dev) = gpu() else { return };
    agrees_with_the_cpu(&dev, ARCH, 140);
}

#[test]
fn test_a_hybrid_row_alone_equals_the_row_among_other_lanes() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint(ARCH, 150);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 512, max_lanes: 256, context: 256 });
    row_alone_equals_row_in_batches(&dev, &mut model, 90, &[2, 17, 64, 256], 151);
}

#[test]
fn test_a_hybrid_prompt_whole_equals_it_in_chunks_of_1_7_16_64() {
    let Some(dev) = gpu() else { return };
    prompt_whole_equals_chunks(&dev, ARCH, (160, 161), 150, &[1, 7, 16, 64]);
}

#[test]
fn test_a_hybrid_prompt_resumed_at_each_page_boundary_equals_it_fresh() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint(ARCH, 170);
    let len = 100;
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: len, max_lanes: 4, context: len + 16 });
    let prompt = tokens(&mut Rng(171), len);
    let mut pool = dev.kv_pool(&model, PAGE_TOKENS, 64).unwrap();
    let fresh_pages: Vec<u32> = (0..len.div_ceil(PAGE_TOKENS) as u32).collect();
    let fresh = LaneStep { tokens: &prompt, start_pos: 0, pages: &fresh_pages, logits: Logits::Last, keep: None };
    let fresh = model.forward(&mut pool, &[fresh]).unwrap().remove(0);
    for boundary in 1..len.div_ceil(PAGE_TOKENS) {
        // The first pages are the fresh lane's, as the prefix cache shares them; the rest are the resumed lane's own.
        let mut pages: Vec<u32> = fresh_pages[..boundary].to_vec();
        pages.extend((32..).take(fresh_pages.len() - boundary));
        let from = boundary * PAGE_TOKENS;
        let step =
            LaneStep { tokens: &prompt[from..], start_pos: from, pages: &pages, logits: Logits::Last, keep: None };
        let resumed = model.forward(&mut pool, &[step]).unwrap().remove(0);
        assert!(
            same_bits(fresh.values().unwrap(), resumed.values().unwrap()),
            "the prompt resumed at position {from} differs from it fresh"
        );
    }
}

#[test]
fn test_the_seeded_hybrid_checkpoints_run_on_the_cpu() {
    // The GPU tests above compare against this path, so the checkpoints must load and give finite logits here.
    for arch in [ARCH, "qwen3_next_h256"] {
        let dir = checkpoint(arch, 140);
        let ckpt = tensorfold_engine::checkpoint::hf::HfCheckpoint::open(dir.path()).unwrap();
        let model = tensorfold_engine::llama::Llama::load(&ckpt).unwrap();
        let hybrid = model.config().hybrid.as_ref().expect("a hybrid config");
        assert_eq!(hybrid.num_linear(), 3);
        let mut seq = Sequence::new(&model, 64);
        let logits = seq.extend(&tokens(&mut Rng(141), 40), 16, Logits::Last).unwrap();
        assert_eq!(logits.len(), VOCAB);
        assert!(logits.iter().all(|v| v.is_finite()) && logits.iter().any(|&v| v != 0.0), "{arch}");
    }
}

#[test]
fn test_heads_of_256_agree_with_the_cpu_and_keep_a_row_its_bits_among_others() {
    // The 80B shape's attention heads: the prompt and decode kernels built for them.
    let Some(dev) = gpu() else { return };
    agrees_with_the_cpu(&dev, "qwen3_next_h256", 180);
    let dir = checkpoint("qwen3_next_h256", 181);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 512, max_lanes: 256, context: 256 });
    row_alone_equals_row_in_batches(&dev, &mut model, 70, &[2, 33, 256], 182);
}
