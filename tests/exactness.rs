//! A row's logits never depend on the other lanes of its round or on how its prompt was chunked, for the default
//! model and for mixture-of-experts models, whose routing must not depend on them either, and for the hybrid
//! linear-attention family, whose recurrent state must not depend on where its steps began or what they undid.

mod common;

use common::moe::{self, MoeShape};
use tensorfold_engine::boundary::{Engine, KvPool, LaneRows, LaneStep, Logits};
use tensorfold_engine::checkpoint::hf::HfCheckpoint;
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::Llama;

fn prompt(tok: &tensorfold_engine::text::tokenizer::Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, true).unwrap()
}

/// Runs `prompt` in chunks of `chunk` on its own pages and returns the logits of every position.
fn chunked_logits(mut engine: impl Engine, prompt: &[u32], chunk: usize) -> Vec<f32> {
    let num_pages = prompt.len().div_ceil(PAGE_TOKENS);
    let mut pool = KvPool::new(engine.kv_layout(PAGE_TOKENS), num_pages + 3);
    let pages: Vec<u32> = (3..3 + num_pages as u32).collect();
    let mut out = Vec::new();
    for start in (0..prompt.len()).step_by(chunk) {
        let end = (start + chunk).min(prompt.len());
        let step =
            LaneStep { tokens: &prompt[start..end], start_pos: start, pages: &pages, logits: Logits::All, keep: None };
        out.extend(engine.forward(&mut pool, &[step]).expect("a CPU pass runs").remove(0).values().unwrap_or_default());
    }
    out
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn test_prefill_whole_equals_prefill_in_chunks() {
    let model = common::default_model();
    let text = "The quick brown fox jumps over the lazy dog. Then it ran far away into the forest, where nobody could find it again for many years. ";
    let ids = prompt(&model.tokenizer, &text.repeat(3));
    assert!(ids.len() > 64, "the prompt must span several chunks of 64");
    assert_whole_equals_chunks(&model.llama, &ids);
}

fn assert_whole_equals_chunks(llama: &Llama, ids: &[u32]) {
    let whole = chunked_logits(llama, ids, ids.len());
    for chunk in [1, 7, 64] {
        assert!(same_bits(&whole, &chunked_logits(llama, ids, chunk)), "chunks of {chunk} differ");
    }
}

#[test]
fn test_lane_alone_equals_lane_among_others() {
    let model = common::default_model();
    let tok = &model.tokenizer;
    let probe = prompt(tok, "Tell me about the moon.");
    let others = [
        prompt(tok, "Hi"),
        prompt(tok, "A much longer prompt about cooking pasta with tomatoes and basil"),
        prompt(tok, "1 2 3"),
    ];
    assert_alone_equals_among_others(&model.llama, &probe, &others);
}

fn assert_alone_equals_among_others(llama: &Llama, probe: &[u32], others: &[Vec<u32>; 3]) {
    let alone = chunked_logits(llama, probe, probe.len());
    let layout = llama.kv_layout(PAGE_TOKENS);
    let mut pool = KvPool::new(layout, 64);
    let page_sets: Vec<Vec<u32>> = (0..4).map(|i| (i * 16..i * 16 + 16).rev().collect()).collect();
    let mut lanes =
        vec![LaneStep { tokens: &others[0], start_pos: 0, pages: &page_sets[0], logits: Logits::Last, keep: None }];
    lanes.push(LaneStep { tokens: &others[1], start_pos: 0, pages: &page_sets[1], logits: Logits::None, keep: None });
    lanes.push(LaneStep { tokens: probe, start_pos: 0, pages: &page_sets[2], logits: Logits::All, keep: None });
    lanes.push(LaneStep { tokens: &others[2], start_pos: 0, pages: &page_sets[3], logits: Logits::All, keep: None });
    let out = llama.run(&mut pool, &lanes);
    assert!(same_bits(&alone, out[2].values().unwrap()), "the probe's logits changed when batched with other lanes");
    assert_eq!(out[1], LaneRows::None);
    assert_eq!(out[0].values().map(<[f32]>::len), Some(llama.vocab_size()));
}

#[test]
fn test_decode_step_among_others_equals_decode_alone() {
    let model = common::default_model();
    let tok = &model.tokenizer;
    let a = prompt(tok, "Once upon a time");
    let b = prompt(tok, "In a galaxy far away, there lived");
    assert_decode_alone_equals_among_others(&model.llama, &a, &b);
}

fn assert_decode_alone_equals_among_others(llama: &Llama, a: &[u32], b: &[u32]) {
    let layout = llama.kv_layout(PAGE_TOKENS);
    let run = |with_other: bool| {
        let mut pool = KvPool::new(layout, 8);
        let (pa, pb): (Vec<u32>, Vec<u32>) = ((0..4).collect(), (4..8).collect());
        let mut lanes = vec![LaneStep { tokens: a, start_pos: 0, pages: &pa, logits: Logits::None, keep: None }];
        if with_other {
            lanes.push(LaneStep { tokens: b, start_pos: 0, pages: &pb, logits: Logits::None, keep: None });
        }
        llama.run(&mut pool, &lanes);
        let next = [42u32];
        let mut lanes =
            vec![LaneStep { tokens: &next, start_pos: a.len(), pages: &pa, logits: Logits::Last, keep: None }];
        if with_other {
            lanes.insert(
                0,
                LaneStep { tokens: &next, start_pos: b.len(), pages: &pb, logits: Logits::Last, keep: None },
            );
        }
        llama.run(&mut pool, &lanes).pop().unwrap().values().unwrap().to_vec()
    };
    assert!(same_bits(&run(false), &run(true)));
}

const MOE_SHAPES: [MoeShape; 2] = [MoeShape::Qwen3Moe, MoeShape::Mixtral];

/// A seeded random mixture-of-experts model; the directory lives as long as the model is used.
fn moe_model(shape: MoeShape, stacked: bool) -> (tempfile::TempDir, Llama) {
    let dir = tempfile::tempdir().unwrap();
    moe::write(dir.path(), shape, stacked, 7);
    let llama = Llama::load(&HfCheckpoint::open(dir.path()).unwrap()).unwrap();
    (dir, llama)
}

/// Every mixture-of-experts model the equality tests run on: the seeded ones written here, then the transformers
/// checkpoints of the goldens.
fn moe_models() -> Vec<(Option<tempfile::TempDir>, Llama)> {
    let mut models: Vec<_> =
        MOE_SHAPES.iter().map(|&shape| moe_model(shape, false)).map(|(d, l)| (Some(d), l)).collect();
    for shape in ["tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen3-next"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden").join(shape);
        models.push((None, Llama::load(&HfCheckpoint::open(&dir).unwrap()).unwrap()));
    }
    models
}

/// Token ids of the tiny vocabulary, different for each `salt`.
fn moe_ids(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 11 + 5) % 96).collect()
}

#[test]
fn test_moe_prefill_whole_equals_prefill_in_chunks() {
    for (_dir, llama) in moe_models() {
        assert_whole_equals_chunks(&llama, &moe_ids(150, 0));
    }
}

#[test]
fn test_moe_lane_alone_equals_lane_among_others() {
    for (_dir, llama) in moe_models() {
        let others = [moe_ids(2, 1), moe_ids(70, 2), moe_ids(5, 3)];
        assert_alone_equals_among_others(&llama, &moe_ids(23, 4), &others);
    }
}

#[test]
fn test_moe_decode_step_among_others_equals_decode_alone() {
    for (_dir, llama) in moe_models() {
        assert_decode_alone_equals_among_others(&llama, &moe_ids(9, 5), &moe_ids(31, 6));
    }
}

#[test]
fn test_moe_stacked_experts_give_the_per_expert_logits() {
    for shape in MOE_SHAPES {
        let ids = moe_ids(40, 7);
        let (_a, per_expert) = moe_model(shape, false);
        let (_b, stacked) = moe_model(shape, true);
        let want = chunked_logits(&per_expert, &ids, ids.len());
        assert!(same_bits(&want, &chunked_logits(&stacked, &ids, ids.len())), "{shape:?}: layouts disagree");
    }
}

/// The hybrid golden: Gated DeltaNet layers around a gated attention layer.
fn hybrid() -> Llama {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden/tiny-qwen3-next");
    let llama = Llama::load(&HfCheckpoint::open(&dir).unwrap()).unwrap();
    assert!(llama.config().hybrid.is_some(), "tiny-qwen3-next loaded without linear attention");
    llama
}

/// One lane's step over `tokens` from `start` on `pages`; its logits of every row.
fn step(llama: &Llama, pool: &mut KvPool, tokens: &[u32], start: usize, pages: &[u32]) -> Vec<f32> {
    let lane = LaneStep { tokens, start_pos: start, pages, logits: Logits::All, keep: None };
    llama.run(pool, &[lane]).remove(0).values().unwrap().to_vec()
}

#[test]
fn test_hybrid_resumed_at_every_page_boundary_equals_fresh() {
    let llama = hybrid();
    let ids = moe_ids(70, 8);
    let vocab = llama.vocab_size();
    let fresh = chunked_logits(&llama, &ids, ids.len());
    let mut pool = KvPool::new(llama.kv_layout(PAGE_TOKENS), 16);
    let cached: Vec<u32> = (0..5).collect();
    step(&llama, &mut pool, &ids, 0, &cached);
    for boundary in 1..ids.len().div_ceil(PAGE_TOKENS) {
        // The first pages are the cached prompt's; the rest are the resumed lane's own.
        let pages: Vec<u32> = cached[..boundary].iter().copied().chain(10..16).collect();
        let from = boundary * PAGE_TOKENS;
        let resumed = step(&llama, &mut pool, &ids[from..], from, &pages);
        assert!(same_bits(&resumed, &fresh[from * vocab..]), "resumed at position {from} differs from fresh");
    }
}

#[test]
fn test_hybrid_state_after_rejected_drafts_equals_never_drafted() {
    let llama = hybrid();
    let prompt = moe_ids(14, 9);
    // Drafts at positions 14 to 17 cross the first page's end; only the first is kept, then another token follows.
    let (drafted, taken) = ([7u32, 8, 9, 10], [7u32, 11, 12]);
    let plain: Vec<u32> = prompt.iter().chain(&taken).copied().collect();
    let want = chunked_logits(&llama, &plain, plain.len());
    let mut pool = KvPool::new(llama.kv_layout(PAGE_TOKENS), 2);
    let pages = [1u32, 0];
    step(&llama, &mut pool, &prompt, 0, &pages);
    step(&llama, &mut pool, &drafted, 14, &pages);
    let vocab = llama.vocab_size();
    for (i, &t) in taken[1..].iter().enumerate() {
        let pos = 15 + i;
        let got = step(&llama, &mut pool, &[t], pos, &pages);
        assert!(same_bits(&got, &want[pos * vocab..(pos + 1) * vocab]), "position {pos} kept a rejected draft");
    }
}

#[test]
fn test_hybrid_draft_head_keeps_a_shared_prefix_page_the_prefix_s() {
    let llama = hybrid();
    let a = moe_ids(24, 10);
    let b: Vec<u32> = a[..16].iter().copied().chain(moe_ids(8, 11)).collect();
    let head = |pool: &mut KvPool, tokens: &[u32], start: usize, pages: &[u32]| {
        let lane = LaneStep { tokens, start_pos: start, pages, logits: Logits::All, keep: None };
        llama.run_draft_head(pool, &[lane]).remove(0).values().unwrap().to_vec()
    };
    let run = |with_b: bool| {
        let mut pool = KvPool::new(llama.kv_layout(PAGE_TOKENS), 4);
        let (pa, pb) = ([0u32, 1], [0u32, 2]);
        step(&llama, &mut pool, &a[..20], 0, &pa);
        head(&mut pool, &a[..20], 0, &pa);
        if with_b {
            // B resumes from A's first page and its head catches up over all of B's tokens.
            step(&llama, &mut pool, &b[16..], 16, &pb);
            head(&mut pool, &b, 0, &pb);
        }
        step(&llama, &mut pool, &a[20..], 20, &pa);
        head(&mut pool, &a[20..], 20, &pa)
    };
    assert!(same_bits(&run(false), &run(true)), "another lane's head changed a shared page");
}
