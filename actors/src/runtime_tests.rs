//! The runtime end to end over a fake engine: exactness across batching, cancellation, admission errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tensorfold_kernels::sampling::SamplingParams;
use tokio::sync::mpsc::Receiver;

use tensorfold_engine::boundary::{Codec, CodecJob, Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep};

use crate::coordinator::{Drafting, Schedule};
use crate::request_types::{
    Event, FinishReason, FrameSink, Output, SubmitError, TextDecoder, TokenWork, ValidRequest, Work,
};
use crate::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};

const VOCAB: usize = 64;

/// Logits that depend on the lane's last token and absolute position only.
pub(crate) struct FakeEngine;

impl Engine for FakeEngine {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4, page_tokens, elem_bytes: 4, state_elems: 0 }
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        std::thread::sleep(Duration::from_millis(1));
        let logits = lanes
            .iter()
            .map(|l| {
                for (i, t) in l.tokens.iter().enumerate() {
                    pool.write(0, l.pages, l.start_pos + i, &[*t as f32; 4], &[0.0; 4]);
                }
                let pos = l.start_pos + l.tokens.len() - 1;
                let last = *l.tokens.last().unwrap() as u64;
                l.logits.take(&fake_logits(last, pos as u64), VOCAB)
            })
            .collect();
        Ok(logits)
    }
}

/// Many logits tie, so a greedy pick shows which of them it takes.
fn fake_logits(last: u64, pos: u64) -> Vec<f32> {
    (0..VOCAB as u64).map(|v| ((last * 31 + pos * 17 + v * 7) % 23) as f32 * 0.3).collect()
}

struct Ids;

impl TextDecoder for Ids {
    fn push(&mut self, id: u32) -> String {
        format!("<{id}>")
    }
    fn finish(&mut self) -> String {
        String::new()
    }
}

pub(crate) async fn start(parallel: usize, max_waiting: usize, kv_pages: usize) -> Runtime {
    let schedule = Schedule { round_tokens: 8, parallel, max_waiting, drafting: Drafting::OFF };
    let cfg = RuntimeConfig {
        page_tokens: 4,
        kv_pages: Some(kv_pages),
        memory_limit: None,
        schedule,
        prefix_cache_tokens: 0,
    };
    let kind = ModelKind::Tokens { engine: Box::new(FakeEngine), codec: None };
    let model = ModelSpec { name: TEXT.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 };
    Runtime::start(vec![model], cfg).await.unwrap()
}

/// The fake text model's registered name.
pub(crate) const TEXT: &str = "fake";

/// A request of `work` on the registered model `model`.
pub(crate) fn on(model: &str, work: TokenWork) -> ValidRequest {
    ValidRequest { model: model.into(), work: Work::Tokens(work) }
}

/// Request `i` on the fake text model.
pub(crate) fn request(i: u64) -> ValidRequest {
    on(TEXT, work(i))
}

pub(crate) fn work(i: u64) -> TokenWork {
    let sampling =
        SamplingParams { temperature: if i.is_multiple_of(2) { 0.0 } else { 1.0 }, seed: i, ..Default::default() };
    TokenWork {
        prompt: (0..(3 + i as u32 * 5) % 29 + 1).map(|t| (t * 7 + i as u32) % VOCAB as u32).collect(),
        max_tokens: 8 + (i as usize % 5) * 3,
        sampling,
        stop_ids: vec![63],
        stop_strings: Vec::new(),
        logprobs: None,
        cache: true,
        keep_reply: false,
        draft: false,
        rules: Default::default(),
        constraint: None,
        output: Output::Text(Box::new(Ids)),
    }
}

pub(crate) async fn collect(mut rx: Receiver<Event>) -> (String, Option<FinishReason>) {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done { finish, .. } => return (text, Some(finish)),
            Event::Audio { .. } => panic!("audio on a text lane"),
            Event::Embedding { .. } => panic!("an embedding on a text lane"),
            Event::Error(e) => panic!("{e}"),
        }
    }
    (text, None)
}

pub(crate) async fn settle(rt: &Runtime) {
    for _ in 0..200 {
        let m = rt.metrics();
        if m.requests_running() == 0 && m.requests_waiting() == 0 && m.kv_pages().0 == 0 {
            return;
        }
        actix::clock::sleep(Duration::from_millis(10)).await;
    }
    panic!("lanes or pages were not returned");
}

#[actix::test]
async fn test_concurrent_equals_solo() {
    let rt = start(4, 64, 64).await;
    let mut solo = Vec::new();
    for i in 0..12 {
        solo.push(collect(rt.submit(request(i)).await.unwrap()).await);
    }
    let receivers: Vec<_> = futures_util::future::join_all((0..12).map(|i| rt.submit(request(i)))).await;
    let together = futures_util::future::join_all(receivers.into_iter().map(|r| collect(r.unwrap()))).await;
    assert_eq!(solo, together);
    assert!(solo.iter().all(|(t, f)| !t.is_empty() && f.is_some()));
    settle(&rt).await;
}

#[actix::test]
async fn test_a_greedy_lane_takes_the_first_largest_logit_at_each_step() {
    let rt = start(4, 64, 64).await;
    let req = work(2);
    assert!(req.sampling.is_greedy());
    let (mut tokens, max_tokens) = (req.prompt.clone(), req.max_tokens);
    let (text, _) = collect(rt.submit(on(TEXT, req)).await.unwrap()).await;
    let mut want = String::new();
    for _ in 0..max_tokens {
        let logits = fake_logits(*tokens.last().unwrap() as u64, tokens.len() as u64 - 1);
        let best = logits.iter().copied().fold(f32::MIN, f32::max);
        let id = logits.iter().position(|&v| v == best).unwrap() as u32;
        want.push_str(&format!("<{id}>"));
        tokens.push(id);
    }
    assert_eq!(text, want);
    settle(&rt).await;
}

#[actix::test]
async fn test_dropped_receivers_return_lanes_and_pages() {
    let rt = start(3, 64, 1024).await;
    for i in 0..10 {
        let mut rx = rt.submit(on(TEXT, TokenWork { max_tokens: 200, stop_ids: Vec::new(), ..work(i) })).await.unwrap();
        if i % 2 == 0 {
            for _ in 0..3 {
                rx.recv().await.unwrap();
            }
        }
        drop(rx);
    }
    settle(&rt).await;
    let generated = rt.metrics().generated_tokens_total();
    assert!(generated < 200, "cancelled lanes kept decoding: {generated} tokens");
    let (text, finish) = collect(rt.submit(request(1)).await.unwrap()).await;
    assert!(!text.is_empty() && finish.is_some());
}

#[actix::test]
async fn test_full_queue_and_oversized_requests_are_refused() {
    let rt = start(1, 1, 16).await;
    let too_big = on(TEXT, TokenWork { max_tokens: 100, ..work(0) });
    assert!(matches!(rt.submit(too_big).await, Err(SubmitError::TooLarge { .. })));
    let _a = rt.submit(request(2)).await.unwrap();
    let _b = rt.submit(request(4)).await.unwrap();
    let mut refused = false;
    for i in 0..4 {
        refused |= matches!(rt.submit(request(6 + i)).await, Err(SubmitError::QueueFull(_)));
    }
    assert!(refused, "a second waiting request should be refused with max_waiting 1");
}

/// Every third token makes a window of one-token "frames".
struct Frames {
    ids: Vec<u32>,
    sent: usize,
}

impl Frames {
    fn window(&mut self) -> Option<CodecJob> {
        let job = CodecJob { codes: vec![self.ids[self.sent..].to_vec()], first_frame: self.sent, keep: 0..0 };
        self.sent = self.ids.len();
        Some(CodecJob { keep: 0..job.codes[0].len(), ..job }).filter(|j| !j.keep.is_empty())
    }
}

impl FrameSink for Frames {
    fn push(&mut self, id: u32) -> Option<CodecJob> {
        self.ids.push(id);
        if self.ids.len() - self.sent < 3 {
            return None;
        }
        self.window()
    }
    fn finish(&mut self) -> Option<CodecJob> {
        self.window()
    }
}

/// Samples that carry each frame's code and absolute index.
struct FakeCodec;

impl Codec for FakeCodec {
    fn sample_rate(&self) -> u32 {
        8000
    }
    fn decode(&self, job: &CodecJob) -> Result<Vec<f32>, EngineError> {
        let frames = job.keep.clone().map(|f| job.codes[0][f] as f32 + (job.first_frame + f) as f32 * 1000.0);
        Ok(frames.collect())
    }
}

async fn start_with_speech(parallel: usize) -> Runtime {
    let schedule = Schedule { round_tokens: 8, parallel, max_waiting: 64, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(256), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    let model = |name: &str, codec: Option<Box<dyn Codec>>| ModelSpec {
        name: name.into(),
        kind: ModelKind::Tokens { engine: Box::new(FakeEngine), codec },
        context: 256,
        weight_bytes: 0,
        activation_bytes: 0,
    };
    Runtime::start(vec![model(TEXT, None), model(SPEECH, Some(Box::new(FakeCodec)))], cfg).await.unwrap()
}

const SPEECH: &str = "speech";

fn speech_work(i: u64) -> TokenWork {
    TokenWork { output: Output::Speech(Box::new(Frames { ids: Vec::new(), sent: 0 })), ..work(i) }
}

fn speech(i: u64) -> ValidRequest {
    on(SPEECH, speech_work(i))
}

async fn collect_audio(mut rx: Receiver<Event>) -> (Vec<f32>, usize, Option<FinishReason>) {
    let (mut pcm, mut chunks) = (Vec::new(), 0);
    while let Some(event) = rx.recv().await {
        match event {
            Event::Audio { pcm: p } => {
                pcm.extend(p);
                chunks += 1;
            }
            Event::Done { finish, .. } => return (pcm, chunks, Some(finish)),
            Event::Token { .. } => panic!("a text token on a speech lane"),
            Event::Embedding { .. } => panic!("an embedding on a speech lane"),
            Event::Error(e) => panic!("{e}"),
        }
    }
    (pcm, chunks, None)
}

#[actix::test]
async fn test_speech_lanes_beside_text_lanes_equal_each_alone() {
    let rt = start_with_speech(6).await;
    let (mut solo_speech, mut solo_text) = (Vec::new(), Vec::new());
    for i in 0..6 {
        solo_speech.push(collect_audio(rt.submit(speech(i)).await.unwrap()).await);
        solo_text.push(collect(rt.submit(request(i)).await.unwrap()).await);
    }
    let speech_rx: Vec<_> = futures_util::future::join_all((0..6).map(|i| rt.submit(speech(i)))).await;
    let text_rx: Vec<_> = futures_util::future::join_all((0..6).map(|i| rt.submit(request(i)))).await;
    let together_speech =
        futures_util::future::join_all(speech_rx.into_iter().map(|r| collect_audio(r.unwrap()))).await;
    let together_text = futures_util::future::join_all(text_rx.into_iter().map(|r| collect(r.unwrap()))).await;
    assert_eq!(solo_speech, together_speech);
    assert_eq!(solo_text, together_text);
    for (pcm, chunks, finish) in &solo_speech {
        assert!(finish.is_some() && *chunks >= 2, "{chunks} chunks");
        let frames: Vec<usize> = pcm.iter().map(|s| (*s / 1000.0) as usize).collect();
        assert_eq!(frames, (0..pcm.len()).collect::<Vec<_>>(), "every frame once, in order");
    }
    settle(&rt).await;
}

#[actix::test]
async fn test_dropped_speech_streams_free_lanes_and_codec_windows() {
    let rt = start_with_speech(4).await;
    for i in 0..8 {
        let speech = TokenWork { max_tokens: 200, stop_ids: Vec::new(), ..speech_work(i) };
        let mut rx = rt.submit(on(SPEECH, speech)).await.unwrap();
        for _ in 0..i % 3 {
            rx.recv().await.unwrap();
        }
        drop(rx);
    }
    settle(&rt).await;
    assert!(rt.metrics().generated_tokens_total() < 8 * 200, "cancelled speech lanes kept decoding");
    let (pcm, _, finish) = collect_audio(rt.submit(speech(3)).await.unwrap()).await;
    assert!(!pcm.is_empty() && finish.is_some());
}

#[actix::test]
async fn test_a_request_for_a_model_not_loaded_is_refused() {
    let rt = start(1, 4, 16).await;
    assert_eq!(rt.submit(speech(0)).await.err(), Some(SubmitError::NoModel(SPEECH.into())));
}

/// The fake engine, counting its forward passes.
struct Counting(Arc<AtomicUsize>);

impl Engine for Counting {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        FakeEngine.kv_layout(page_tokens)
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        FakeEngine.forward(pool, lanes)
    }
}

/// The fake codec, noting for each window the frames it ends at and the forward passes run when it decodes.
struct Noting(Arc<AtomicUsize>, Arc<Mutex<Vec<(usize, usize)>>>);

impl Codec for Noting {
    fn sample_rate(&self) -> u32 {
        8000
    }
    fn decode(&self, job: &CodecJob) -> Result<Vec<f32>, EngineError> {
        let end = job.first_frame + job.keep.end;
        self.1.lock().expect("not poisoned").push((end, self.0.load(Ordering::SeqCst)));
        FakeCodec.decode(job)
    }
}

/// A window is decoded in the round after the one that drew its last frame, beside that round's forward pass.
#[actix::test]
async fn test_a_speech_window_is_decoded_in_the_round_after_its_last_frame_was_drawn() {
    let (forwards, noted) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
    let schedule = Schedule { round_tokens: 8, parallel: 1, max_waiting: 4, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(64), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    let kind = ModelKind::Tokens {
        engine: Box::new(Counting(forwards.clone())),
        codec: Some(Box::new(Noting(forwards.clone(), noted.clone()))),
    };
    let spec = ModelSpec { name: SPEECH.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 };
    let rt = Runtime::start(vec![spec], cfg).await.unwrap();
    let w = TokenWork { stop_ids: Vec::new(), ..speech_work(4) };
    let prefill_rounds = w.prompt.len().div_ceil(8);
    let (pcm, chunks, _) = collect_audio(rt.submit(on(SPEECH, w)).await.unwrap()).await;
    assert!(chunks >= 2 && !pcm.is_empty(), "{chunks} windows");
    // Frame j (one token each) is drawn by forward pass prefill_rounds + j - 1; its window decodes in the next
    // round, after that round's pass, except the last: the round after the last token runs no pass.
    let noted = noted.lock().expect("not poisoned").clone();
    let last = noted.iter().map(|&(end, _)| end).max().expect("windows were decoded");
    for (end, at) in noted {
        let want = prefill_rounds + end - usize::from(end == last);
        assert_eq!(at, want, "the window ending at frame {end} was decoded after {at} passes");
    }
    settle(&rt).await;
}

/// The fake engine, except that a round holding token `POISON` fails as a device would, or panics as a bug would,
/// and one holding `GREEDY` is refused memory as a driver at its limit refuses it.
struct Faulty {
    panics: bool,
}

const POISON: u32 = 999;
const GREEDY: u32 = 998;

impl Engine for Faulty {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        FakeEngine.kv_layout(page_tokens)
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        if lanes.iter().any(|l| l.tokens.contains(&POISON)) {
            assert!(!self.panics, "the poisoned token reached the engine");
            return Err(EngineError::Device("an injected fault in the attention kernel".into()));
        }
        if lanes.iter().any(|l| l.tokens.contains(&GREEDY)) {
            return Err(EngineError::OutOfMemory("the GPU: an injected refusal".into()));
        }
        FakeEngine.forward(pool, lanes)
    }
}

async fn start_faulty(panics: bool, parallel: usize) -> Runtime {
    let schedule = Schedule { round_tokens: 64, parallel, max_waiting: 64, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(256), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    let kind = ModelKind::Tokens { engine: Box::new(Faulty { panics }), codec: None };
    let spec = ModelSpec { name: TEXT.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 };
    Runtime::start(vec![spec], cfg).await.unwrap()
}

/// The error event a request's stream ends with.
async fn error_of(mut rx: Receiver<Event>) -> Option<EngineError> {
    let mut error = None;
    while let Some(event) = rx.recv().await {
        if let Event::Error(e) = event {
            error = Some(e);
        }
    }
    error
}

#[actix::test]
async fn test_an_engine_error_ends_its_rounds_lanes_with_the_named_error_and_other_requests_go_on() {
    let rt = start_faulty(false, 1).await;
    let healthy = collect(rt.submit(request(3)).await.unwrap()).await;
    let poisoned = rt.submit(on(TEXT, TokenWork { prompt: vec![1, 2, POISON], ..work(1) })).await.unwrap();
    // With one lane the healthy request waits behind the poisoned one, then runs in the rounds after the fault.
    let waiting = rt.submit(request(3)).await.unwrap();
    let error = error_of(poisoned).await.expect("the poisoned request ends with an error event, not a silent close");
    assert_eq!(error, EngineError::Device("an injected fault in the attention kernel".into()));
    assert_eq!(error.code(), "engine_device_error");
    assert_eq!(collect(waiting).await, healthy, "the request behind the fault is served as if alone");
    settle(&rt).await;
}

#[actix::test]
async fn test_a_panicking_round_ends_its_lanes_with_an_error_and_the_runtime_goes_on() {
    let rt = start_faulty(true, 4).await;
    let healthy = collect(rt.submit(request(3)).await.unwrap()).await;
    let poisoned = on(TEXT, TokenWork { prompt: vec![1, 2, POISON], ..work(1) });
    let error = error_of(rt.submit(poisoned).await.unwrap()).await;
    let error = error.expect("the poisoned request should end with an error event, not hang or close silently");
    assert!(matches!(&error, EngineError::Panicked(m) if m.contains("poisoned token")), "{error}");
    assert_eq!(collect(rt.submit(request(3)).await.unwrap()).await, healthy, "the runtime serves on after a failure");
    settle(&rt).await;
}

#[actix::test]
async fn test_a_round_refused_memory_ends_its_lanes_with_out_of_memory_and_later_requests_are_served() {
    let rt = start_faulty(false, 1).await;
    let healthy = collect(rt.submit(request(3)).await.unwrap()).await;
    let refused = rt.submit(on(TEXT, TokenWork { prompt: vec![1, GREEDY], ..work(1) })).await.unwrap();
    let waiting = rt.submit(request(3)).await.unwrap();
    let error = error_of(refused).await.expect("the refused request ends with an error event");
    assert_eq!(error.code(), "out_of_memory", "{error}");
    assert_eq!(collect(waiting).await, healthy, "the request behind the refused round is served as if alone");
    settle(&rt).await;
}
