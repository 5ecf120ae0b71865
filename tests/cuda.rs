//! The CUDA backend on a GPU: batch invariance, chunked prefill, agreement with the CPU path and the ledger
//! (the runtime on CUDA is in cuda_runtime.rs). Every test skips with a one-line reason where no GPU is found.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tensorfold::cuda_setup::CudaDevice;
use tensorfold_actors::memory::cuda_driver::CudaDriver;
use tensorfold_actors::memory::device::{spawn_device, Allocate, Snapshot};
use tensorfold_actors::memory::ledger::{DevicePtr, DriverError, DriverTable, Ledger, LedgerError, MemoryKind};
use tensorfold_engine::boundary::{Engine, KvPool, LaneRows, LaneStep, Logits};
use tensorfold_engine::generate::{Sequence, PAGE_TOKENS};
use tensorfold_engine::llama::cuda::{CudaLlama, Sizing};

use common::cuda::{
    agrees_with_the_cpu, checkpoint, gpu, load, row_alone_equals_row_in_batches, same_bits, switch, tokens, VOCAB,
};
use common::Rng;

#[test]
fn test_a_row_alone_equals_the_row_in_batches_of_2_to_256() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("llama", 1);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 512, max_lanes: 256, context: 256 });
    // 150 positions span three attention splits, folded in one block or by the combine kernel.
    row_alone_equals_row_in_batches(&dev, &mut model, 150, &[2, 3, 16, 17, 64, 100, 255, 256], 2);
}

/// Decode rounds replayed from recorded graphs, with RoPE and the cache write fused into attention, or with the
/// norms folded into the GEMMs, equal the same rounds launched kernel by kernel with none of these (Qwen2 biases,
/// Qwen3 q/k norms, Llama's one query head per KV head).
#[test]
fn test_graph_replays_fused_rope_and_folded_norms_equal_direct_launches_over_decode_steps() {
    let Some(dev) = gpu() else { return };
    for (arch, seed) in [("qwen2", 5), ("qwen3", 6), ("llama", 7)] {
        let dir = checkpoint(arch, seed);
        let mut model = load(&dev, dir.path(), Sizing { max_tokens: 64, max_lanes: 3, context: 128 });
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| tokens(&mut Rng(30 + i), 5 + 3 * i as usize)).collect();
        let mut run = |graphs: bool, fuse: bool, fold: bool| {
            switch(&mut model, |o| (o.graphs, o.fuse_rope, o.fold_norms) = (graphs, fuse, fold));
            let mut pool = dev.kv_pool(&model, PAGE_TOKENS, 24).unwrap();
            let pages: Vec<Vec<u32>> = (0..3).map(|i| (8 * i..8 * i + 8).collect()).collect();
            let mut seqs: Vec<Vec<u32>> = prompts.clone();
            let mut logits = Vec::new();
            for step in 0..20 {
                let lanes: Vec<LaneStep> = seqs
                    .iter()
                    .zip(&pages)
                    .map(|(s, p)| match step {
                        0 => LaneStep { tokens: s, start_pos: 0, pages: p, logits: Logits::Last, keep: None },
                        _ => LaneStep {
                            tokens: &s[s.len() - 1..],
                            start_pos: s.len() - 1,
                            pages: p,
                            logits: Logits::Last,
                            keep: None,
                        },
                    })
                    .collect();
                let out = model.forward(&mut pool, &lanes).unwrap();
                for (s, l) in seqs.iter_mut().zip(&out) {
                    s.push(tensorfold_kernels::ops::argmax(l.values().unwrap()) as u32);
                }
                logits.extend(out.iter().flat_map(|l| l.values().unwrap().iter().copied()));
            }
            (seqs, logits)
        };
        let direct = run(false, false, false);
        let variants = [(true, false, false), (false, true, false), (false, false, true), (true, true, true)];
        for (graphs, fuse, fold) in variants {
            let other = run(graphs, fuse, fold);
            let what = format!("{arch}, graphs {graphs}, fused RoPE {fuse}, folded norms {fold}");
            assert_eq!(direct.0, other.0, "{what}: other tokens than direct launches");
            assert!(same_bits(&direct.1, &other.1), "{what}: other logits than direct launches");
        }
    }
}

/// A recorded round holds the KV pool's addresses: a pool sharing only its keys' address with an earlier one must
/// not replay the earlier pool's graph.
#[test]
fn test_a_graph_is_not_replayed_on_a_pool_with_other_values() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("llama", 6);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 64, max_lanes: 1, context: 128 });
    let pages: Vec<u32> = (0..8).collect();
    let run = |model: &mut CudaLlama, pool: &mut KvPool, prompt: &[u32], graphs: bool| {
        switch(model, |o| o.graphs = graphs);
        let mut seq = prompt.to_vec();
        let mut logits = model
            .forward(pool, &[LaneStep { tokens: &seq, start_pos: 0, pages: &pages, logits: Logits::Last, keep: None }])
            .unwrap();
        for _ in 0..4 {
            seq.push(tensorfold_kernels::ops::argmax(logits[0].values().unwrap()) as u32);
            let step = LaneStep {
                tokens: &seq[seq.len() - 1..],
                start_pos: seq.len() - 1,
                pages: &pages,
                logits: Logits::Last,
                keep: None,
            };
            logits = model.forward(pool, &[step]).unwrap();
        }
        logits.remove(0).values().unwrap().to_vec()
    };
    let mut first = dev.kv_pool(&model, PAGE_TOKENS, 8).unwrap();
    let [keys, _] = first.device_ptrs().unwrap();
    let layout = model.kv_layout(PAGE_TOKENS);
    let values = dev.allocate(MemoryKind::KvCache, layout.buffer_bytes(8)).unwrap();
    let owner = dev.allocate(MemoryKind::KvCache, 4).unwrap();
    let ptrs = [keys, values.ptr().0];
    let mut second = KvPool::on_device(layout, 8, Box::new((owner, values)), ptrs);
    let (a, b) = (tokens(&mut Rng(40), 5), tokens(&mut Rng(41), 5));
    let direct = run(&mut model, &mut second, &b, false);
    run(&mut model, &mut first, &a, true);
    let replayed = run(&mut model, &mut second, &b, true);
    assert!(same_bits(&direct, &replayed), "a graph recorded on another pool was replayed");
}

/// The GPU's greedy pick of a row is the index `ops::argmax` takes: the first on ties, never a NaN, 0 after a
/// leading NaN; -0 and +0 tie.
#[test]
fn test_gpu_argmax_picks_as_the_host_does() {
    let Some(dev) = gpu() else { return };
    let vocab = 5000;
    let mut rng = Rng(50);
    let mut rows: Vec<Vec<f32>> = (0..6).map(|_| (0..vocab).map(|_| (rng.next() % 7) as f32 - 3.0).collect()).collect();
    rows[1][0] = f32::NAN;
    rows[2][10] = f32::NAN;
    rows[2][4000] = 9.0;
    rows[2][4500] = 9.0;
    rows[3].fill(f32::NEG_INFINITY);
    rows[4].fill(f32::NAN);
    rows[5].fill(-1.0);
    rows[5][300] = 0.0;
    rows[5][200] = -0.0;
    let flat: Vec<f32> = rows.concat();
    let g = &dev.gpu;
    let (logits, picks) = (g.malloc(4 * flat.len(), false).unwrap(), g.malloc(4 * rows.len(), false).unwrap());
    g.upload(logits, &flat).unwrap();
    g.argmax_rows(logits, rows.len(), vocab, picks).unwrap();
    let mut got = vec![0u32; rows.len()];
    // SAFETY: `picks` holds one u32 per row; `got` stays alive until the sync.
    unsafe { g.download_async(&mut got, picks).unwrap() };
    g.sync().unwrap();
    g.free(logits, false);
    g.free(picks, false);
    let want: Vec<u32> = rows.iter().map(|r| tensorfold_kernels::ops::argmax(r) as u32).collect();
    assert_eq!(got, want);
    assert_eq!(&want[1..], &[0, 4000, 0, 0, 200]);
}

/// Greedy decode rounds that bring back only the picks equal the argmax of the full logits, graphed and not.
#[test]
fn test_greedy_rounds_with_picks_on_the_gpu_equal_the_host_argmax() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("llama", 8);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 64, max_lanes: 3, context: 128 });
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| tokens(&mut Rng(60 + i), 4 + 5 * i as usize)).collect();
    let mut run = |on_gpu: bool, kind: Logits| {
        switch(&mut model, |o| o.gpu_argmax = on_gpu);
        let mut pool = dev.kv_pool(&model, PAGE_TOKENS, 24).unwrap();
        let pages: Vec<Vec<u32>> = (0..3).map(|i| (8 * i..8 * i + 8).collect()).collect();
        let mut seqs = prompts.clone();
        for step in 0..12 {
            let lanes: Vec<LaneStep> = seqs
                .iter()
                .zip(&pages)
                .map(|(s, p)| {
                    let start = if step == 0 { 0 } else { s.len() - 1 };
                    LaneStep { tokens: &s[start..], start_pos: start, pages: p, logits: kind, keep: None }
                })
                .collect();
            let out = model.forward(&mut pool, &lanes).unwrap();
            for (s, l) in seqs.iter_mut().zip(&out) {
                s.push(match l {
                    LaneRows::Picks(ids) => ids[0],
                    rows => tensorfold_kernels::ops::argmax(rows.values().unwrap()) as u32,
                });
            }
        }
        seqs
    };
    let host = run(false, Logits::Last);
    assert_eq!(run(false, Logits::Argmax), host, "picks from the staging buffer");
    assert_eq!(run(true, Logits::Argmax), host, "picks on the GPU");
}

#[test]
fn test_a_prompt_prefilled_whole_equals_it_in_chunks_of_1_7_64_512() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen3", 3);
    // 2,200 positions: 35 attention splits, more than the 32 blocks a row runs side by side.
    let len = 2200;
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: len, max_lanes: 4, context: len + 100 });
    let prompt = tokens(&mut Rng(4), len);
    let mut run = |chunk: usize, fuse: bool| {
        switch(&mut model, |o| o.fuse_rope = fuse);
        let pool = dev.kv_pool(&model, PAGE_TOKENS, (len + 100) / PAGE_TOKENS + 1).unwrap();
        let mut seq = Sequence::with_pool(&mut model, pool);
        seq.extend(&prompt, chunk, Logits::All).unwrap()
    };
    let whole = run(len, false);
    assert_eq!(whole.len(), len * VOCAB);
    for chunk in [1, 7, 64, 512] {
        assert!(same_bits(&whole, &run(chunk, false)), "chunks of {chunk} differ from the whole prompt");
    }
    assert!(same_bits(&whole, &run(1, true)), "chunks of 1 with RoPE fused into attention differ");
}

/// An 8,192-token prompt (128 attention splits, four for each of a decode row's 32 parallel blocks) prefilled
/// whole, in row groups, and in chunks of 512 gives the bits of the same prompt decoded one token at a time.
#[test]
fn test_an_8k_prompt_prefilled_whole_or_in_chunks_of_512_equals_it_token_by_token() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen3", 9);
    let len = 8192;
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: len, max_lanes: 1, context: len });
    let prompt = tokens(&mut Rng(12), len);
    let mut run = |chunk: usize| {
        let pool = dev.kv_pool(&model, PAGE_TOKENS, len / PAGE_TOKENS).unwrap();
        let mut seq = Sequence::with_pool(&mut model, pool);
        seq.extend(&prompt, chunk, Logits::All).unwrap()
    };
    let stepped = run(1);
    assert_eq!(stepped.len(), len * VOCAB);
    for chunk in [len, 512] {
        let prefilled = run(chunk);
        let differs = (0..len).find(|&r| !same_bits(&stepped[r * VOCAB..][..VOCAB], &prefilled[r * VOCAB..][..VOCAB]));
        assert_eq!(differs, None, "chunks of {chunk}: the first row whose logits differ from decoding one by one");
    }
}

/// The GPU path, with bf16 activations, stays close to the CPU path in f32 on the same bf16 weights.
#[test]
fn test_gpu_logits_agree_with_the_cpu_path_on_each_variant() {
    let Some(dev) = gpu() else { return };
    for (i, arch) in ["llama", "qwen2", "qwen3"].into_iter().enumerate() {
        agrees_with_the_cpu(&dev, arch, 10 + i as u64);
    }
}

/// How often the ledger reached the driver, to show a refusal never does.
#[derive(Default)]
struct Calls {
    allocs: AtomicUsize,
    failures: AtomicUsize,
}

/// The CUDA driver, counting the calls that reach it.
struct Counted(CudaDriver, Arc<Calls>);

impl DriverTable for Counted {
    fn alloc(&mut self, kind: MemoryKind, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.1.allocs.fetch_add(1, Ordering::SeqCst);
        let result = self.0.alloc(kind, bytes);
        self.1.failures.fetch_add(result.is_err() as usize, Ordering::SeqCst);
        result
    }

    fn free(&mut self, kind: MemoryKind, ptr: DevicePtr, bytes: usize) {
        self.0.free(kind, ptr, bytes);
    }

    fn is_host_addressable(&self, kind: MemoryKind) -> bool {
        self.0.is_host_addressable(kind)
    }
}

fn counted(dev: &CudaDevice) -> (Counted, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    (Counted(CudaDriver::new(dev.gpu.clone()), calls.clone()), calls)
}

#[actix::test]
async fn test_a_refused_allocation_never_reaches_the_driver_and_a_failed_one_is_refunded() {
    let Some(dev) = gpu() else { return };
    let (driver, calls) = counted(&dev);
    let device = spawn_device(Ledger::new(Some(1 << 30), Box::new(driver))).unwrap();
    let held = device.send(Allocate { kind: MemoryKind::KvCache, bytes: 1 << 29 }).await.unwrap().unwrap();
    let pinned = device.send(Allocate { kind: MemoryKind::PinnedHost, bytes: 1 << 20 }).await.unwrap().unwrap();
    assert!(pinned.is_host_addressable() && !held.is_host_addressable());
    assert_eq!(calls.allocs.load(Ordering::SeqCst), 2);
    let refused = device.send(Allocate { kind: MemoryKind::Weights, bytes: 1 << 29 }).await.unwrap();
    assert!(matches!(refused, Err(LedgerError::Refused { .. })), "{refused:?}");
    assert_eq!(calls.allocs.load(Ordering::SeqCst), 2, "the refusal reached the driver");
    drop((held, pinned));
    let before = device.send(Snapshot).await.unwrap();
    assert_eq!(before.total_used, 0);
    let (driver, calls) = counted(&dev);
    let device = spawn_device(Ledger::new(Some(usize::MAX / 2), Box::new(driver))).unwrap();
    let failed = device.send(Allocate { kind: MemoryKind::Activations, bytes: 1 << 50 }).await.unwrap();
    assert!(matches!(failed, Err(LedgerError::Driver { .. })), "{failed:?}");
    assert_eq!((calls.allocs.load(Ordering::SeqCst), calls.failures.load(Ordering::SeqCst)), (1, 1));
    let after = device.send(Snapshot).await.unwrap();
    assert_eq!(after.total_used, 0, "the failed allocation was not refunded");
}

/// A sampled row cut on the GPU to the tokens its draw can take is the CPU's cut of the whole row, penalty and all,
/// so a lane draws the same token either way; greedy and whole-row lanes in the same round are unchanged.
#[test]
fn test_rows_kept_on_the_gpu_are_the_cpus_cut_of_the_whole_row() {
    use tensorfold_engine::boundary::Keep;
    use tensorfold_kernels::sampling::{distinct, kept, penalize, sample, sample_kept, SamplingParams};
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("llama", 8);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 64, max_lanes: 4, context: 128 });
    let mut pool: KvPool = dev.kv_pool(&model, PAGE_TOKENS, 32).unwrap();
    let mut rng = Rng(12);
    let prompts: Vec<Vec<u32>> = (0..3).map(|_| tokens(&mut rng, 20)).collect();
    let pages: Vec<Vec<u32>> = (0..3u32).map(|i| vec![2 * i, 2 * i + 1]).collect();
    let history: Vec<u32> = distinct(&prompts[0]);
    // At temperature 0.05 the cut leaves out most of this checkpoint's vocabulary; hotter draws keep more of it.
    for (temperature, penalty) in [(0.05f32, 1.3f32), (0.6, 1.3), (1.0, 1.0), (3.0, 0.8)] {
        let step =
            |i: usize, logits, keep| LaneStep { tokens: &prompts[i], start_pos: 0, pages: &pages[i], logits, keep };
        let LaneRows::Logits(whole) = model.forward(&mut pool, &[step(0, Logits::Last, None)]).unwrap().remove(0)
        else {
            panic!("a whole row for the lane that asked for its last row");
        };
        let keep = Keep { temperature, repetition_penalty: penalty, history: &history };
        let round = [step(1, Logits::Argmax, None), step(0, Logits::Last, Some(keep)), step(2, Logits::Last, None)];
        let out = model.forward(&mut pool, &round).unwrap();
        let params =
            SamplingParams { temperature, top_p: 0.9, repetition_penalty: penalty, seed: 3, ..Default::default() };
        let mut penalized = whole.clone();
        penalize(&mut penalized, &history, penalty);
        let (ids, values) = kept(&penalized, temperature);
        let LaneRows::Kept(pairs) = &out[1] else { panic!("(id, logit) pairs for the lane that keeps its row") };
        let (got_ids, got_values): (Vec<u32>, Vec<f32>) = pairs.iter().copied().unzip();
        assert_eq!(got_ids, ids, "temperature {temperature}, penalty {penalty}: other kept tokens");
        assert!(same_bits(&got_values, &values), "temperature {temperature}, penalty {penalty}: other kept logits");
        assert!(temperature > 0.1 || ids.len() < whole.len() / 2, "too little was cut at temperature {temperature}");
        for position in 0..64 {
            let plain = sample(&whole, &params, &prompts[0], position);
            assert_eq!(sample_kept(&got_ids, &got_values, &params, position), plain, "the draw at {position}");
        }
        assert!(matches!(&out[0], LaneRows::Picks(ids) if ids.len() == 1), "the greedy lane beside it gets its pick");
        assert_eq!(out[2].values().map(<[f32]>::len), Some(whole.len()), "the whole-row lane beside it gets its row");
    }
}
