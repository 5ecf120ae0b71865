//! GGUF files of the experts and the hybrid family on a GPU: seeded checkpoints written as GGUF by
//! tools/hf_to_gguf.py (experts stacked, a dense layer among them, the hybrid's MTP head as `nextn`) read as their
//! safetensors do. The CPU test runs everywhere the tests' Python has gguf; the GPU tests also skip with a
//! one-line reason where no GPU is found.

mod common;

use std::path::{Path, PathBuf};

use tensorfold::cuda_setup::CudaDevice;
use tensorfold_engine::checkpoint::gguf_model::GgufCheckpoint;
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::checkpoint::Checkpoint;
use tensorfold_engine::generate::{Sequence, PAGE_TOKENS};
use tensorfold_engine::llama::cuda::Sizing;
use tensorfold_engine::llama::Llama;

use common::cuda::{checkpoint, gpu, load_from, relative_gap, row_gaps, same_bits, tokens};
use common::{python_importing, source_path, Rng};
use tensorfold_engine::boundary::Logits;

const ARCHS: [&str; 3] = ["qwen3_moe", "mixtral", "qwen3_next_mtp"];

/// `dir`'s checkpoint written beside it as GGUF of `ty` (f32, q8_0, ...), or `None` (a skip) without gguf.
fn gguf_of(dir: &Path, ty: &str) -> Option<PathBuf> {
    let python = python_importing("gguf, numpy")?;
    let out = dir.join(format!("model-{ty}.gguf"));
    let output = std::process::Command::new(python)
        .arg(source_path("tools/hf_to_gguf.py"))
        .arg("--model")
        .arg(dir)
        .arg("--out")
        .arg(&out)
        .args(["--type", ty])
        .output()
        .expect("running hf_to_gguf.py");
    assert!(output.status.success(), "hf_to_gguf.py --type {ty}: {}", String::from_utf8_lossy(&output.stderr));
    Some(out)
}

/// Every row's logits of a 50-token prompt on the GPU.
fn gpu_logits(dev: &CudaDevice, ckpt: &dyn Checkpoint, prompt: &[u32]) -> Vec<f32> {
    let mut model = load_from(dev, ckpt, Sizing { max_tokens: 64, max_lanes: 1, context: 128 });
    let pool = dev.kv_pool(&model, PAGE_TOKENS, 4).unwrap();
    Sequence::with_pool(&mut model, pool).extend(prompt, 64, Logits::All).unwrap()
}

/// Every row's logits of a 50-token prompt on the CPU.
fn cpu_logits(ckpt: &dyn Checkpoint, prompt: &[u32]) -> Vec<f32> {
    let model = Llama::load(ckpt).unwrap();
    Sequence::new(&model, 128).extend(prompt, 64, Logits::All).unwrap()
}

#[test]
fn test_the_gguf_of_each_seeded_checkpoint_reads_on_the_cpu_as_its_safetensors() {
    for (i, arch) in ARCHS.into_iter().enumerate() {
        let dir = checkpoint(arch, 300 + i as u64);
        let Some(gguf) = gguf_of(dir.path(), "f32") else { return };
        let prompt = tokens(&mut Rng(310 + i as u64), 50);
        let from_gguf = cpu_logits(&GgufCheckpoint::open(&gguf).unwrap(), &prompt);
        let from_safetensors = cpu_logits(&HfCheckpoint::open(dir.path()).unwrap(), &prompt);
        assert_eq!(from_gguf.len(), from_safetensors.len(), "{arch}: the GGUF's vocabulary differs");
        let gap = relative_gap(&from_safetensors, &from_gguf);
        // The f32 file holds the bf16 weights' exact values; only the CPU kernels' formats may differ.
        assert!(gap < 1e-4, "{arch}: the GGUF's logits are {gap} from the safetensors' (relative)");
    }
}

#[test]
fn test_on_the_gpu_an_f32_gguf_gives_the_bits_of_its_safetensors() {
    let Some(dev) = gpu() else { return };
    for (i, arch) in ARCHS.into_iter().enumerate() {
        let dir = checkpoint(arch, 320 + i as u64);
        let Some(gguf) = gguf_of(dir.path(), "f32") else { return };
        let prompt = tokens(&mut Rng(330 + i as u64), 50);
        // Both pack the same bf16 values for the GPU, so the formats must not move a bit.
        let from_safetensors = gpu_logits(&dev, &HfCheckpoint::open(dir.path()).unwrap(), &prompt);
        let from_gguf = gpu_logits(&dev, &GgufCheckpoint::open(&gguf).unwrap(), &prompt);
        assert!(same_bits(&from_safetensors, &from_gguf), "{arch}: the f32 GGUF's logits differ on the GPU");
    }
}

/// Q8_0 on the CPU also rounds activations to 8 bits: a bound that a misread block or layout (errors of the logits'
/// own size) still fails.
const Q8_BOUND: f32 = 0.2;

#[test]
fn test_on_the_gpu_a_q8_0_gguf_agrees_with_the_cpu_reading_it() {
    let Some(dev) = gpu() else { return };
    for (i, arch) in ARCHS.into_iter().enumerate() {
        let dir = checkpoint(arch, 340 + i as u64);
        let Some(gguf) = gguf_of(dir.path(), "q8_0") else { return };
        let ckpt = GgufCheckpoint::open(&gguf).unwrap();
        let prompt = tokens(&mut Rng(350 + i as u64), 50);
        let (on_gpu, on_cpu) = (gpu_logits(&dev, &ckpt, &prompt), cpu_logits(&ckpt, &prompt));
        let worst = row_gaps(&on_gpu, &on_cpu).into_iter().fold(0f32, f32::max);
        eprintln!("{arch} q8_0: largest relative logits error of a prompt row {worst}");
        assert!(worst < Q8_BOUND, "{arch} q8_0: a prompt row's logits are {worst} from the CPU's (relative)");
    }
}
