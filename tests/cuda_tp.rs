//! Tensor parallelism on one GPU: ranks loaded from their shards, their kernels on the GPU's one stream, their
//! partial outputs added by the rank-order sum kernel. One rank equals the whole model bit for bit; two agree with
//! it within rounding; at two ranks a lane among others equals it alone, in prefill and in decode rounds of every
//! kernel path, and a prompt in chunks equals it whole. A group of one NCCL rank (all-gather, then the same sum)
//! equals the whole model too; more NCCL ranks need more GPUs. Every test skips with a one-line reason where no GPU
//! (or, for NCCL, no NCCL library) is found.

mod common;

use tensorfold::cuda_setup::CudaDevice;
use tensorfold_actors::memory::device::allocate_blocking;
use tensorfold_engine::boundary::{Engine, LaneStep, Logits};
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::cuda::{CudaOptions, Sizing};
use tensorfold_engine::memory::{Held, MemoryError, OwnedAlloc};
use tensorfold_engine::tp::TensorParallel;

use common::cuda::{checkpoint, gpu, load, prefill, relative_gap, same_bits, tokens};
use common::Rng;

const SIZING: Sizing = Sizing { max_tokens: 160, max_lanes: 40, context: 256 };

/// The ledger's grants, for the KV pools of ranks past 0.
fn kv_alloc(dev: &CudaDevice) -> OwnedAlloc {
    let device = dev.device.clone();
    Box::new(move |kind, bytes| {
        allocate_blocking(&device, kind, bytes).map(|a| Box::new(a) as Held).map_err(|e| MemoryError(e.to_string()))
    })
}

fn ranks(dev: &CudaDevice, dir: &std::path::Path, n: usize) -> TensorParallel {
    let ckpt = HfCheckpoint::open(dir).unwrap();
    let (mut alloc, kv) = (dev.alloc(), kv_alloc(dev));
    TensorParallel::load_cuda(&ckpt, dev.gpu.clone(), n, SIZING, CudaOptions::default(), &mut alloc, kv).unwrap()
}

/// The last row's logits after `prompt` goes into a fresh pool `chunk` tokens a round.
fn fresh(dev: &CudaDevice, engine: &mut dyn Engine, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let mut pool = dev.kv_pool(engine, PAGE_TOKENS, 8).unwrap();
    prefill(engine, &mut pool, prompt, chunk)
}

#[test]
fn test_one_rank_on_the_gpu_equals_the_whole_model_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen2", 21);
    let prompt = tokens(&mut Rng(1), 40);
    let mut whole = load(&dev, dir.path(), SIZING);
    let mut one = ranks(&dev, dir.path(), 1);
    let want = fresh(&dev, &mut whole, &prompt, 40);
    let got = fresh(&dev, &mut one, &prompt, 40);
    assert!(same_bits(&want, &got), "one rank differs from the whole model");
}

#[test]
fn test_two_ranks_on_the_gpu_agree_with_one_within_rounding_on_each_variant() {
    let Some(dev) = gpu() else { return };
    for arch in ["llama", "qwen2", "qwen3"] {
        let dir = checkpoint(arch, 22);
        let prompt = tokens(&mut Rng(2), 33);
        let mut whole = load(&dev, dir.path(), SIZING);
        let mut two = ranks(&dev, dir.path(), 2);
        let want = fresh(&dev, &mut whole, &prompt, 33);
        let got = fresh(&dev, &mut two, &prompt, 33);
        let gap = relative_gap(&want, &got);
        eprintln!("{arch}: two ranks differ from one by {gap:.2e} of the largest logit");
        assert!(gap < 2e-2, "{arch}: two ranks differ from one by {gap} of the largest logit");
    }
}

#[test]
fn test_at_two_ranks_on_the_gpu_a_lane_among_others_equals_it_alone_and_chunks_equal_the_whole_prompt() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen3", 23);
    let mut two = ranks(&dev, dir.path(), 2);
    let mut rng = Rng(3);
    let prompts: Vec<Vec<u32>> = [21, 40, 9].iter().map(|&n| tokens(&mut rng, n)).collect();
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(fresh(&dev, &mut two, p, p.len()));
    }
    for chunk in [1, 7, 16] {
        let chunked = fresh(&dev, &mut two, &prompts[1], chunk);
        assert!(same_bits(&alone[1], &chunked), "the prompt in chunks of {chunk} differs from it whole");
    }
    let mut pool = dev.kv_pool(&two, PAGE_TOKENS, 128).unwrap();
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
    // A decode step of lane 1 alone, then among 2, 9 and 36 rows: folded norms, split attention and wide rounds.
    let next = [5u32];
    let step = || LaneStep { tokens: &next, start_pos: 40, pages: &pages[1], logits: Logits::Last, keep: None };
    let solo = two.forward(&mut pool, &[step()]).unwrap().remove(0);
    let fillers = tokens(&mut rng, 35);
    let filler_pages: Vec<Vec<u32>> = (0..35u32).map(|i| vec![16 + i]).collect();
    for width in [2usize, 9, 36] {
        let mut lanes: Vec<LaneStep> = (0..width - 1)
            .map(|i| LaneStep {
                tokens: std::slice::from_ref(&fillers[i]),
                start_pos: 0,
                pages: &filler_pages[i],
                logits: Logits::Last,
                keep: None,
            })
            .collect();
        let at = width / 2;
        lanes.insert(at, step());
        let out = two.forward(&mut pool, &lanes).unwrap();
        let (solo, got) = (solo.values().unwrap(), out[at].values().unwrap());
        assert!(same_bits(solo, got), "a decode row differs inside a round of {width} rows");
    }
}

#[test]
fn test_a_group_of_one_nccl_rank_equals_the_whole_model_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen2", 24);
    let ckpt = HfCheckpoint::open(dir.path()).unwrap();
    let (mut alloc, kv) = (dev.alloc(), kv_alloc(&dev));
    let gpus = [(0, dev.gpu.clone())];
    let mut one = match TensorParallel::load_nccl(&ckpt, &gpus, SIZING, CudaOptions::default(), &mut alloc, kv) {
        Err(e) if e.to_string().contains("no NCCL library") => return eprintln!("skipped: {e}"),
        loaded => loaded.unwrap(),
    };
    drop(alloc);
    let mut whole = load(&dev, dir.path(), SIZING);
    let prompt = tokens(&mut Rng(4), 40);
    let want = fresh(&dev, &mut whole, &prompt, 40);
    let got = fresh(&dev, &mut one, &prompt, 40);
    assert!(same_bits(&want, &got), "one NCCL rank differs from the whole model");
}
