//! Mixtures of experts on a GPU (Qwen3-MoE with a dense layer, Mixtral): agreement with the CPU path, and a row's
//! bits whatever other rows share its experts or however its prompt is cut. Every test skips with a one-line
//! reason where no GPU is found.

mod common;

use tensorfold_engine::llama::cuda::Sizing;

use common::cuda::{
    agrees_with_the_cpu, checkpoint, gpu, load, prompt_whole_equals_chunks, row_alone_equals_row_in_batches,
};

const ARCHS: [&str; 2] = ["qwen3_moe", "mixtral"];

#[test]
fn test_moe_logits_on_the_gpu_agree_with_the_cpu_path() {
    let Some(dev) = gpu() else { return };
    for (i, arch) in ARCHS.into_iter().enumerate() {
        agrees_with_the_cpu(&dev, arch, 40 + i as u64);
    }
}

#[test]
fn test_a_moe_row_alone_equals_the_row_among_rows_that_share_its_experts() {
    let Some(dev) = gpu() else { return };
    for (i, arch) in ARCHS.into_iter().enumerate() {
        let dir = checkpoint(arch, 60 + i as u64);
        let mut model = load(&dev, dir.path(), Sizing { max_tokens: 512, max_lanes: 256, context: 256 });
        // With 256 rows every expert serves several tiles' worth of rows, the probe's among them.
        row_alone_equals_row_in_batches(&dev, &mut model, 90, &[2, 17, 64, 256], 70 + i as u64);
    }
}

#[test]
fn test_a_moe_prompt_whole_equals_it_in_chunks_of_1_7_64() {
    let Some(dev) = gpu() else { return };
    for (i, arch) in ARCHS.into_iter().enumerate() {
        prompt_whole_equals_chunks(&dev, arch, (80 + i as u64, 90 + i as u64), 300, &[1, 7, 64]);
    }
}
