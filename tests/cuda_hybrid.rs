//! Qwen3-Next on a GPU (Gated DeltaNet layers, gated attention, experts beside a shared expert): agreement with the
//! CPU path, and a row's bits whatever rows share its round, however its prompt is cut, and whether its prompt
//! resumed from another lane's pages; its MTP draft head against the CPU's, and a head row's bits among other
//! lanes. Every test skips with a one-line reason where no GPU is found.

mod common;

use tensorfold_engine::boundary::{Engine, KvPool, LaneRows, LaneStep, Logits};
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::generate::{Sequence, PAGE_TOKENS};
use tensorfold_engine::llama::cuda::Sizing;
use tensorfold_engine::llama::Llama;

use common::cuda::{
    agrees_with_the_cpu, checkpoint, gpu, l2_gap, load, prompt_whole_equals_chunks, row_alone_equals_row_in_batches,
    row_gaps, same_bits, tokens, VOCAB,
};
use common::Rng;

const ARCH: &str = "qwen3_next";

#[test]
fn test_hybrid_logits_on_the_gpu_agree_with_the_cpu_path() {
    let Some(dev) = gpu() else { return };
    agrees_with_the_cpu(&dev, ARCH, 140);
}

#[test]
fn test_a_model_with_a_draft_head_gives_the_bits_it_gives_without_one() {
    // The head's hidden-state stores share the rows' pages with the linear layers' rows and states and the keys.
    let Some(dev) = gpu() else { return };
    let with_head = checkpoint("qwen3_next_mtp", 145);
    let without = tempfile::tempdir().unwrap();
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(with_head.path().join("config.json")).unwrap()).unwrap();
    c["num_nextn_predict_layers"] = 0.into();
    std::fs::write(without.path().join("config.json"), c.to_string()).unwrap();
    std::fs::copy(with_head.path().join("model.safetensors"), without.path().join("model.safetensors")).unwrap();
    let prompt = tokens(&mut Rng(146), 50);
    let run = |dir: &std::path::Path| {
        let mut model = load(&dev, dir, Sizing { max_tokens: 64, max_lanes: 1, context: 128 });
        let pool = dev.kv_pool(&model, PAGE_TOKENS, 8).unwrap();
        let mut seq = Sequence::with_pool(&mut model, pool);
        let mut out = seq.extend(&prompt, 16, Logits::All).unwrap();
        for _ in 0..8 {
            let pick = tensorfold_kernels::ops::argmax(&out[out.len() - VOCAB..]) as u32;
            out.extend(seq.extend(&[pick], 1, Logits::Last).unwrap());
        }
        out
    };
    let (a, b) = (run(with_head.path()), run(without.path()));
    assert!(same_bits(&a, &b), "a head changes its model's own logits");
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
    for arch in [ARCH, "qwen3_next_h256", "qwen3_next_mtp"] {
        let dir = checkpoint(arch, 140);
        let model = Llama::load(&HfCheckpoint::open(dir.path()).unwrap()).unwrap();
        assert_eq!(model.has_draft_head(), arch == "qwen3_next_mtp", "{arch}");
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

/// Token ids the head picked, or its rows of logits.
fn head(engine: &mut dyn Engine, pool: &mut KvPool, tokens: &[u32], start_pos: usize, logits: Logits) -> LaneRows {
    let pages: Vec<u32> = (0..4).collect();
    let lane = LaneStep { tokens, start_pos, pages: &pages, logits, keep: None };
    engine.draft_head(pool, &[lane]).unwrap().remove(0)
}

/// How far the GPU's head rows may stray from the CPU's: 0.03, or twice the largest error of the model's own rows
/// whose hidden states the head reads, which it carries on; a misplaced key or state errs by the logits' own size.
fn head_bound(main_gaps: &[f32]) -> f32 {
    main_gaps.iter().fold(0.03f32, |b, &g| b.max(2.0 * g))
}

/// The row of `got` (rows of VOCAB) farthest from `want`'s, and its `l2_gap`.
fn worst_row(got: &[f32], want: &[f32]) -> (usize, f32) {
    let gaps = row_gaps(got, want).into_iter();
    gaps.enumerate().fold((0, 0.0), |w, (r, gap)| if gap > w.1 { (r, gap) } else { w })
}

/// Whether `row`'s largest logit leads the next by a margin no rounding of the GPU's can close.
fn clear_pick(row: &[f32]) -> bool {
    let pick = tensorfold_kernels::ops::argmax(row);
    let runner_up = (0..row.len()).filter(|&i| i != pick).map(|i| row[i]).fold(f32::MIN, f32::max);
    row[pick] - runner_up >= 0.05 * row[pick].abs().max(1.0)
}

#[test]
fn test_the_draft_head_on_the_gpu_agrees_with_the_cpu_head() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen3_next_mtp", 190);
    let mut on_gpu = load(&dev, dir.path(), Sizing { max_tokens: 64, max_lanes: 4, context: 64 });
    let mut on_cpu = Llama::load(&HfCheckpoint::open(dir.path()).unwrap()).unwrap();
    assert!(on_gpu.has_draft_head() && on_cpu.has_draft_head(), "the head was not loaded");
    let mut gpu_pool = dev.kv_pool(&on_gpu, PAGE_TOKENS, 4).unwrap();
    let mut cpu_pool = KvPool::new(on_cpu.kv_layout(PAGE_TOKENS), 4);
    // The main pass over 40 tokens leaves their hidden states; token 40 is the lane's newest, not yet run.
    let text = tokens(&mut Rng(191), 41);
    let pages: Vec<u32> = (0..4).collect();
    let main = || LaneStep { tokens: &text[..40], start_pos: 0, pages: &pages, logits: Logits::All, keep: None };
    let main_gpu = on_gpu.forward(&mut gpu_pool, &[main()]).unwrap().remove(0);
    let main_cpu = on_cpu.forward(&mut cpu_pool, &[main()]).unwrap().remove(0);
    let main_gaps = row_gaps(main_gpu.values().unwrap(), main_cpu.values().unwrap());
    // The head in two steps, so the second reads the keys the first left: rows for tokens 1 to 40.
    let vocab = VOCAB;
    let mut rows = [Vec::new(), Vec::new()];
    for (from, to) in [(0, 20), (20, 41)] {
        let g = head(&mut on_gpu, &mut gpu_pool, &text[from..to], from, Logits::All);
        let c = head(&mut on_cpu, &mut cpu_pool, &text[from..to], from, Logits::All);
        rows[0].extend_from_slice(g.values().unwrap());
        rows[1].extend_from_slice(c.values().unwrap());
    }
    assert_eq!(rows[0].len(), 40 * vocab);
    let (worst, gap) = worst_row(&rows[0], &rows[1]);
    let bound = head_bound(&main_gaps);
    eprintln!("largest relative logits error of a head row: {gap} (row {worst}; bound {bound})");
    assert!(gap < bound, "head row {worst}: relative logits error {gap}");
    // A pick's own state: the head's next step reads what its last row left for position 40.
    let last = &rows[1][39 * vocab..];
    let pick = tensorfold_kernels::ops::argmax(last);
    if !clear_pick(last) {
        eprintln!("skipped the guess's step: the CPU's pick after token 40 is a near tie");
        return;
    }
    let g = head(&mut on_gpu, &mut gpu_pool, &text[39..41], 39, Logits::Argmax);
    let c = head(&mut on_cpu, &mut cpu_pool, &text[39..41], 39, Logits::Argmax);
    assert!(matches!((&g, &c), (LaneRows::Picks(a), LaneRows::Picks(b)) if a == b && b[0] == pick as u32));
    let guess = [pick as u32];
    let g = head(&mut on_gpu, &mut gpu_pool, &guess, 41, Logits::Last);
    let c = head(&mut on_cpu, &mut cpu_pool, &guess, 41, Logits::Last);
    let gap = l2_gap(g.values().unwrap(), c.values().unwrap());
    assert!(gap < bound, "the step on the head's own guess: relative logits error {gap}");
}

/// Lane steps over `texts[i][from..to]` on `pages[i]`, for each (i, from, to, logits) of `spans`.
fn steps<'a>(
    texts: &'a [Vec<u32>],
    pages: &'a [Vec<u32>],
    spans: &[(usize, usize, usize, Logits)],
) -> Vec<LaneStep<'a>> {
    let step = |&(i, from, to, logits): &(usize, usize, usize, Logits)| LaneStep {
        tokens: &texts[i][from..to],
        start_pos: from,
        pages: &pages[i],
        logits,
        keep: None,
    };
    spans.iter().map(step).collect()
}

#[test]
fn test_a_draft_head_row_alone_equals_it_among_other_lanes() {
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen3_next_mtp", 200);
    let mut model = load(&dev, dir.path(), Sizing { max_tokens: 256, max_lanes: 8, context: 64 });
    let mut pool = dev.kv_pool(&model, PAGE_TOKENS, 32).unwrap();
    let mut rng = Rng(201);
    let texts: Vec<Vec<u32>> = (0..8).map(|_| tokens(&mut rng, 21)).collect();
    let pages: Vec<Vec<u32>> = (0..8u32).map(|l| vec![2 * l, 2 * l + 1]).collect();
    let main: Vec<_> = (0..8).map(|l| (l, 0, 20, Logits::None)).collect();
    model.forward(&mut pool, &steps(&texts, &pages, &main)).unwrap();
    // A catch-up over 20 tokens, then a one-token step, alone and beside the other lanes' same steps.
    for (from, to) in [(0, 20), (20, 21)] {
        let alone =
            model.draft_head(&mut pool, &steps(&texts, &pages, &[(3, from, to, Logits::All)])).unwrap().remove(0);
        let all: Vec<_> = (0..8).map(|l| (l, from, to, Logits::All)).collect();
        let among = model.draft_head(&mut pool, &steps(&texts, &pages, &all)).unwrap().remove(3);
        assert!(same_bits(alone.values().unwrap(), among.values().unwrap()), "head rows {from}..{to} among 8 lanes");
    }
}

#[test]
fn test_draft_head_lanes_of_one_round_agree_with_the_cpu_heads() {
    // Each lane's hidden states and guess state land at its own rows and pages: lanes of other lengths, on scattered
    // pages, the one whose pick is not asked for first.
    let Some(dev) = gpu() else { return };
    let dir = checkpoint("qwen3_next_mtp", 220);
    let mut on_gpu = load(&dev, dir.path(), Sizing { max_tokens: 128, max_lanes: 4, context: 64 });
    let mut on_cpu = Llama::load(&HfCheckpoint::open(dir.path()).unwrap()).unwrap();
    let mut gpu_pool = dev.kv_pool(&on_gpu, PAGE_TOKENS, 16).unwrap();
    let mut cpu_pool = KvPool::new(on_cpu.kv_layout(PAGE_TOKENS), 16);
    let mut rng = Rng(221);
    let lens = [30, 45, 20];
    let mut texts: Vec<Vec<u32>> = lens.iter().map(|&n| tokens(&mut rng, n + 1)).collect();
    let pages: Vec<Vec<u32>> = vec![vec![9, 4, 12, 7], vec![0, 15, 3, 10], vec![6, 1, 13, 2]];
    let main: Vec<_> = (0..3).map(|i| (i, 0, lens[i], Logits::All)).collect();
    let g = on_gpu.forward(&mut gpu_pool, &steps(&texts, &pages, &main)).unwrap();
    let c = on_cpu.forward(&mut cpu_pool, &steps(&texts, &pages, &main)).unwrap();
    let bounds: Vec<f32> =
        (0..3).map(|l| head_bound(&row_gaps(g[l].values().unwrap(), c[l].values().unwrap()))).collect();
    let all: Vec<_> = (0..3).map(|i| (i, 0, lens[i] + 1, Logits::All)).collect();
    let g = on_gpu.draft_head(&mut gpu_pool, &steps(&texts, &pages, &all)).unwrap();
    let c = on_cpu.draft_head(&mut cpu_pool, &steps(&texts, &pages, &all)).unwrap();
    for lane in 0..3 {
        let (worst, gap) = worst_row(g[lane].values().unwrap(), c[lane].values().unwrap());
        eprintln!(
            "lane {lane}: largest relative logits error of a head row {gap} (row {worst}; bound {})",
            bounds[lane]
        );
        assert!(gap < bounds[lane], "lane {lane}'s head row {worst}: relative logits error {gap}");
    }
    // Picks for the last two lanes, then a step on each guess that reads the state its pick left.
    let picking =
        [(0, 0, lens[0] + 1, Logits::None), (1, 0, lens[1] + 1, Logits::Argmax), (2, 0, lens[2] + 1, Logits::Argmax)];
    let g_picks = on_gpu.draft_head(&mut gpu_pool, &steps(&texts, &pages, &picking)).unwrap();
    on_cpu.draft_head(&mut cpu_pool, &steps(&texts, &pages, &picking)).unwrap();
    for lane in [1, 2] {
        let last = &c[lane].values().unwrap()[(lens[lane] - 1) * VOCAB..];
        let pick = tensorfold_kernels::ops::argmax(last) as u32;
        if clear_pick(last) {
            assert!(matches!(&g_picks[lane], LaneRows::Picks(p) if p == &[pick]), "lane {lane}'s pick on the GPU");
        }
        texts[lane].push(pick);
    }
    let guessed: Vec<_> = [1, 2].iter().map(|&i| (i, lens[i] + 1, lens[i] + 2, Logits::All)).collect();
    let g = on_gpu.draft_head(&mut gpu_pool, &steps(&texts, &pages, &guessed)).unwrap();
    let c = on_cpu.draft_head(&mut cpu_pool, &steps(&texts, &pages, &guessed)).unwrap();
    for (lane, (g, c)) in [1, 2].iter().zip(g.iter().zip(&c)) {
        let gap = l2_gap(g.values().unwrap(), c.values().unwrap());
        assert!(gap < bounds[*lane], "lane {lane}'s step on its guess: relative logits error {gap}");
    }
}
