//! The runtime on a GPU: concurrent equals solo, resumed equals fresh, and drafted equals plain with a draft model
//! (the server's drafts tests, run with TF_TEST_DEVICE=cuda, draft from each lane's own text). Every test skips with a one-line reason where no GPU is found.
//! The checkpoint is a seeded Qwen2 unless TF_TEST_ARCH names another of `common::cuda`'s (qwen3_moe, mixtral,
//! qwen3_next, qwen3_next_mtp), so the same equalities hold for experts and hybrids; with qwen3_next_mtp the model's
//! own draft head drafts too.

mod common;

use std::sync::Arc;

use tensorfold::cuda_setup::CudaDevice;
use tensorfold_actors::coordinator::{Drafting, Schedule};
use tensorfold_actors::request_types::{Event, Output, TextDecoder, TokenWork, ValidRequest, Work};
use tensorfold_actors::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::cuda::Sizing;
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_lend::Lent;

use common::cuda::{checkpoint, config, gpu, load, tokens};
use common::Rng;

struct Ids;

impl TextDecoder for Ids {
    fn push(&mut self, id: u32) -> String {
        format!("{id} ")
    }
    fn finish(&mut self) -> String {
        String::new()
    }
}

fn request(prompt: Vec<u32>, seed: u64) -> ValidRequest {
    cached_request(prompt, seed, false)
}

fn cached_request(prompt: Vec<u32>, seed: u64, cache: bool) -> ValidRequest {
    lane_request(prompt, seed, cache, false, 0.9)
}

fn drafted_request(prompt: Vec<u32>, seed: u64, draft: bool, temperature: f32) -> ValidRequest {
    lane_request(prompt, seed, false, draft, temperature)
}

/// A request with the cache and drafting on or off, seeded at `temperature` (0: greedy).
fn lane_request(prompt: Vec<u32>, seed: u64, cache: bool, draft: bool, temperature: f32) -> ValidRequest {
    let sampling = SamplingParams { temperature, top_k: 50, top_p: 0.95, min_p: 0.0, repetition_penalty: 1.0, seed };
    let work = TokenWork {
        prompt,
        max_tokens: 24,
        sampling,
        stop_ids: Vec::new(),
        stop_strings: Vec::new(),
        logprobs: None,
        cache,
        keep_reply: false,
        draft,
        rules: Default::default(),
        constraint: None,
        output: Output::Text(Box::new(Ids)),
    };
    ValidRequest { model: "qwen2".into(), work: Work::Tokens(work) }
}

/// Seconds a request may go without an event before its test fails instead of waiting on.
const STALL_SECONDS: u64 = 60;

async fn collect(runtime: &Runtime, req: ValidRequest) -> Vec<u32> {
    let mut events = runtime.submit(req).await.unwrap();
    let mut ids = Vec::new();
    let stall = std::time::Duration::from_secs(STALL_SECONDS);
    loop {
        let Ok(next) = actix::clock::timeout(stall, events.recv()).await else {
            let m = runtime.metrics();
            let (rounds, running, waiting) = (m.rounds_total(), m.requests_running(), m.requests_waiting());
            panic!(
                "no event for {STALL_SECONDS} s after {} tokens: {rounds} rounds, {running} running, {waiting} waiting, \
                 pages (used, all) {:?}, drafts (made, kept) {:?}",
                ids.len(),
                m.kv_pages(),
                m.drafts()
            );
        };
        let Some(e) = next else { break };
        match e {
            Event::Token { id, .. } => ids.push(id),
            Event::Done { .. } => return ids,
            Event::Error(e) => panic!("{e}"),
            Event::Audio { .. } | Event::Embedding { .. } => panic!("audio from a text lane"),
        }
    }
    ids
}

/// The architecture of the checkpoints the runtime serves.
fn arch() -> String {
    std::env::var("TF_TEST_ARCH").unwrap_or_else(|_| "qwen2".into())
}

/// The runtime over a seeded checkpoint on the GPU, with a prefix cache of `cache_tokens` positions.
async fn cuda_runtime(dev: &CudaDevice, cache_tokens: usize) -> Runtime {
    drafting_runtime(dev, cache_tokens, 0, None).await
}

/// As `cuda_runtime`, drafting up to `draft_tokens`, with a draft model of the checkpoint seeded `draft_seed` (30 is
/// the target's own weights), or from each lane's own text.
async fn drafting_runtime(
    dev: &CudaDevice,
    cache_tokens: usize,
    draft_tokens: usize,
    draft_seed: Option<u64>,
) -> Runtime {
    lent_runtime(dev, cache_tokens, draft_tokens, draft_seed, (512, None)).await
}

/// As `drafting_runtime`, with `kv.0` pages of the process's own and the KV room `kv.1` lends.
async fn lent_runtime(
    dev: &CudaDevice,
    cache_tokens: usize,
    draft_tokens: usize,
    draft_seed: Option<u64>,
    kv: (usize, Option<Lent>),
) -> Runtime {
    let dir = checkpoint(&arch(), 30);
    let sizing = Sizing { max_tokens: 64, max_lanes: 8, context: 512 };
    let spec =
        |name: &str, kind| ModelSpec { name: name.into(), kind, context: 512, weight_bytes: 0, activation_bytes: 0 };
    let mut specs =
        vec![spec("qwen2", ModelKind::Tokens { engine: Box::new(load(dev, dir.path(), sizing)), codec: None })];
    if let Some(seed) = draft_seed {
        let engine = Box::new(load(dev, checkpoint(&arch(), seed).path(), sizing));
        specs.push(spec("qwen2 (draft)", ModelKind::Draft { engine, target: "qwen2".into() }));
    }
    let cfg = RuntimeConfig {
        page_tokens: PAGE_TOKENS,
        kv_pages: Some(kv.0),
        memory_limit: None,
        // Untimed, so a busy GPU's step times never stop the drafts these tests need.
        schedule: Schedule {
            round_tokens: 64,
            parallel: 8,
            max_waiting: 64,
            drafting: Drafting { timed: false, ..Drafting::on_gpu(draft_tokens) },
        },
        prefix_cache_tokens: cache_tokens,
    };
    Runtime::start_on_lent(dev.device.clone(), specs, cfg, kv.1).await.unwrap()
}

#[actix::test]
async fn test_on_cuda_a_prompt_resumed_from_cached_pages_gives_its_fresh_tokens() {
    let Some(dev) = gpu() else { return };
    let runtime = Arc::new(cuda_runtime(&dev, 1 << 16).await);
    let mut rng = Rng(57);
    let shared = tokens(&mut rng, 3 * PAGE_TOKENS + 3);
    // Tails after one, two or three shared pages, so prompts resume at each page boundary.
    let prompts: Vec<Vec<u32>> =
        (0..9).map(|i| [&shared[..PAGE_TOKENS * (1 + i % 3)], &tokens(&mut rng, 4 + 5 * i)[..]].concat()).collect();
    let mut fresh = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        fresh.push(collect(&runtime, cached_request(p.clone(), i as u64, false)).await);
    }
    for (i, p) in prompts.iter().enumerate() {
        let resumed = collect(&runtime, cached_request(p.clone(), i as u64, true)).await;
        assert_eq!(resumed, fresh[i], "prompt {i} resumed alone");
    }
    let handles: Vec<_> = (prompts.iter().enumerate())
        .map(|(i, p)| {
            let (rt, req) = (runtime.clone(), cached_request(p.clone(), i as u64, true));
            actix::spawn(async move { collect(&rt, req).await })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.await.unwrap(), fresh[i], "prompt {i} resumed among others");
    }
}

#[actix::test]
async fn test_the_runtime_on_cuda_gives_each_request_its_solo_tokens_among_others() {
    let Some(dev) = gpu() else { return };
    let runtime = cuda_runtime(&dev, 0).await;
    let mut rng = Rng(31);
    let prompts: Vec<Vec<u32>> = (0..12).map(|i| tokens(&mut rng, 5 + 17 * i)).collect();
    let mut solo = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        solo.push(collect(&runtime, request(p.clone(), i as u64)).await);
    }
    let runtime = Arc::new(runtime);
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (rt, req) = (runtime.clone(), request(p.clone(), i as u64));
            actix::spawn(async move { collect(&rt, req).await })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let together = h.await.unwrap();
        assert_eq!(together.len(), 24);
        assert_eq!(together, solo[i], "request {i} differs among others");
    }
}

#[actix::test]
async fn test_on_cuda_kv_partly_in_lent_device_memory_gives_each_request_its_plain_tokens() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng(31);
    let prompts: Vec<Vec<u32>> = (0..12).map(|i| tokens(&mut rng, 5 + 17 * i)).collect();
    let plain = cuda_runtime(&dev, 0).await;
    let mut solo = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        solo.push(collect(&plain, request(p.clone(), i as u64)).await);
    }
    drop(plain);
    // Another process would share this through `tensorfold lend --device cuda`; the driver takes it alike.
    let lender = dev.gpu.vmm().create(2 << 20).unwrap();
    let lent = Lent::from_descriptor(lender.share().unwrap(), 2 << 20, "test");
    // 300 own pages of 8 KiB keys and 8 KiB values round down to 4 MiB; with the 2 MiB lent first, 384 pages whose
    // keys below page 256 lie in lent memory, so every page these requests take has its keys there.
    let runtime = Arc::new(lent_runtime(&dev, 0, 0, None, (300, Some(lent))).await);
    // Other checkpoints' pages hold keys of other sizes, and a hybrid's own memory holds its states too; the lent
    // 2 MiB alone holds keys for this many pages.
    let c = config(&arch());
    let n = |k: &str| c[k].as_u64().unwrap_or(0) as usize;
    let attention = c["layer_types"].as_array().map_or(n("num_hidden_layers"), |t| {
        t.iter().filter(|l| *l == "full_attention").count() + n("num_nextn_predict_layers")
    });
    let lent_pages = (2 << 20) / (attention * n("num_key_value_heads") * n("head_dim") * PAGE_TOKENS * 2);
    let pages = runtime.metrics().kv_pages().1 as usize;
    eprintln!("{}: {pages} pages with 2 MiB lent", arch());
    assert!(pages >= lent_pages, "{pages} pages: the lent memory's {lent_pages} are not among them");
    if arch() == "qwen2" {
        assert_eq!(pages, 384);
    }
    let handles: Vec<_> = (prompts.iter().enumerate())
        .map(|(i, p)| {
            let (rt, req) = (runtime.clone(), request(p.clone(), i as u64));
            actix::spawn(async move { collect(&rt, req).await })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.await.unwrap(), solo[i], "request {i} with KV in lent memory, among others");
    }
}

/// Each request's tokens with drafting off, then on alone, then (if `together`) on all at once.
async fn drafted_and_plain(runtime: Arc<Runtime>, temperatures: &[f32], together: bool) -> Vec<[Vec<u32>; 3]> {
    let mut rng = Rng(77);
    let prompts: Vec<Vec<u32>> = (0..temperatures.len()).map(|i| tokens(&mut rng, 9 + 13 * i)).collect();
    let make = |i: usize, draft| drafted_request(prompts[i].clone(), i as u64, draft, temperatures[i]);
    let mut out = Vec::new();
    for i in 0..prompts.len() {
        out.push([collect(&runtime, make(i, false)).await, collect(&runtime, make(i, true)).await, Vec::new()]);
    }
    if together {
        let handles: Vec<_> = (0..prompts.len())
            .map(|i| {
                let (rt, req) = (runtime.clone(), make(i, true));
                actix::spawn(async move { collect(&rt, req).await })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            out[i][2] = h.await.unwrap();
        }
    }
    out
}

#[actix::test]
async fn test_on_cuda_a_draft_model_of_other_weights_changes_no_token() {
    let Some(dev) = gpu() else { return };
    let runtime = Arc::new(drafting_runtime(&dev, 0, 7, Some(31)).await);
    let temperatures = [0.0, 0.9, 0.0, 1.2, 0.0, 0.7];
    for (i, [plain, alone, together]) in
        drafted_and_plain(runtime.clone(), &temperatures, true).await.into_iter().enumerate()
    {
        assert_eq!(alone, plain, "request {i} drafted alone");
        assert_eq!(together, plain, "request {i} drafted among others");
    }
    // Rejected drafts leave stale KV past the kept tokens, which the next steps must write over.
    let (drafted, accepted) = runtime.metrics().drafts();
    assert!(drafted > accepted, "no draft was rejected: {accepted} of {drafted} kept");
}

#[actix::test]
async fn test_on_cuda_a_draft_model_equal_to_its_target_has_every_greedy_draft_kept_and_drafted_equals_plain() {
    let Some(dev) = gpu() else { return };
    let runtime = Arc::new(drafting_runtime(&dev, 0, 7, Some(30)).await);
    for (i, [plain, alone, _]) in drafted_and_plain(runtime.clone(), &[0.0; 6], false).await.into_iter().enumerate() {
        assert_eq!(alone, plain, "greedy request {i} drafted alone");
    }
    let (drafted, accepted) = runtime.metrics().drafts();
    // A verifying step's rows equal one-row steps bit for bit, so greedy drafts of the same weights all hold.
    assert!(drafted > 0 && accepted == drafted, "drafted {drafted}, accepted {accepted}");
    let mixed = [0.0, 0.9, 1.2, 0.0, 0.7, 0.0];
    for (i, [plain, alone, together]) in drafted_and_plain(runtime.clone(), &mixed, true).await.into_iter().enumerate()
    {
        assert_eq!(alone, plain, "request {i} drafted by the draft model alone");
        assert_eq!(together, plain, "request {i} drafted by the draft model among others");
    }
}

#[actix::test]
async fn test_on_cuda_the_models_own_draft_head_changes_no_token() {
    let Some(dev) = gpu() else { return };
    if config(&arch())["num_nextn_predict_layers"].as_u64().unwrap_or(0) == 0 {
        eprintln!("skipped: {} has no draft head of its own (TF_TEST_ARCH=qwen3_next_mtp has)", arch());
        return;
    }
    let runtime = Arc::new(drafting_runtime(&dev, 0, 7, None).await);
    let mixed = [0.0, 0.9, 1.2, 0.0, 0.7, 0.0];
    for (i, [plain, alone, together]) in drafted_and_plain(runtime.clone(), &mixed, true).await.into_iter().enumerate()
    {
        assert_eq!(alone, plain, "request {i} drafted by the head alone");
        assert_eq!(together, plain, "request {i} drafted by the head among others");
    }
    assert!(runtime.metrics().head_drafts() > 0, "the head drafted nothing");
}
