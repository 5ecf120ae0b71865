//! Voice lanes over a fake voice: audio equal alone and beside other lanes, cancellation, refusals.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::mpsc::Receiver;

use tensorfold_engine::boundary::{EngineError, Synth, VoiceInput, VoiceState};

use crate::coordinator::{Drafting, Schedule};
use crate::request_types::{Event, SubmitError, ValidRequest, Work};
use crate::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use crate::runtime_tests::{collect, on, request, settle, work, FakeEngine, TEXT};

/// A sentence step, then windows of three samples per id that carry (seed, chunk, id, window).
struct FakeVoice;

struct FakeState {
    input: VoiceInput,
    chunk: usize,
    window: Option<usize>,
}

impl Synth for FakeVoice {
    fn start(&self, input: VoiceInput) -> Box<dyn VoiceState> {
        Box::new(FakeState { input, chunk: 0, window: None })
    }
}

impl VoiceState for FakeState {
    fn step(&mut self) -> Result<Option<Vec<f32>>, EngineError> {
        std::thread::sleep(Duration::from_millis(1));
        let Some(ids) = self.input.chunks.get(self.chunk) else { return Ok(None) };
        if ids.contains(&-1) {
            return Err(EngineError::Voice(format!("chunk {} holds an id the voice cannot read", self.chunk)));
        }
        let Some(w) = self.window else {
            // The sentence step makes no audio.
            self.window = Some(0);
            return Ok(Some(Vec::new()));
        };
        let pcm = (0..3).map(|k| (self.input.seed * 1000 + self.chunk as u64 * 100) as f32 + (ids[w] * 3 + k) as f32);
        let pcm = pcm.collect();
        self.window = (w + 1 < ids.len()).then_some(w + 1);
        if self.window.is_none() {
            self.chunk += 1;
        }
        Ok(Some(pcm))
    }
}

async fn start(parallel: usize) -> Runtime {
    let schedule = Schedule { round_tokens: 8, parallel, max_waiting: 64, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(256), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    let text = ModelSpec {
        name: TEXT.into(),
        kind: ModelKind::Tokens { engine: Box::new(FakeEngine), codec: None },
        context: 256,
        weight_bytes: 0,
        activation_bytes: 0,
    };
    let kind = ModelKind::Voice(Box::new(FakeVoice));
    let voice = ModelSpec { name: VOICE.into(), kind, context: 0, weight_bytes: 0, activation_bytes: 0 };
    Runtime::start(vec![text, voice], cfg).await.unwrap()
}

const VOICE: &str = "voice";

fn speak(input: VoiceInput) -> ValidRequest {
    ValidRequest { model: VOICE.into(), work: Work::Voice(input) }
}

fn input(i: u64) -> VoiceInput {
    let chunks = (0..1 + i % 3).map(|c| (0..2 + (i + c) % 4).map(|k| (k + c + i) as i64).collect()).collect();
    VoiceInput { chunks, speed: 1.0, seed: i }
}

async fn audio(mut rx: Receiver<Event>) -> Result<Vec<f32>, String> {
    let mut pcm = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Audio { pcm: p } => pcm.extend(p),
            Event::Done { .. } => return Ok(pcm),
            Event::Error(e) => return Err(e.to_string()),
            Event::Token { .. } => return Err("a token on a voice lane".into()),
            Event::Embedding { .. } => return Err("an embedding on a voice lane".into()),
        }
    }
    Err("the stream ended without Done".into())
}

#[actix::test]
async fn test_voice_lanes_beside_text_lanes_equal_each_alone() {
    let rt = start(5).await;
    let mut solo = Vec::new();
    let mut solo_text = Vec::new();
    for i in 0..5 {
        solo.push(audio(rt.submit(speak(input(i))).await.unwrap()).await.unwrap());
        solo_text.push(collect(rt.submit(request(i)).await.unwrap()).await);
    }
    let voices = join_all((0..5).map(|i| rt.submit(speak(input(i))))).await;
    let texts = join_all((0..5).map(|i| rt.submit(request(i)))).await;
    let voices = join_all(voices.into_iter().map(|r| audio(r.unwrap()))).await;
    let texts = join_all(texts.into_iter().map(|r| collect(r.unwrap()))).await;
    for i in 0..5 {
        let want = input(i as u64).chunks.iter().map(Vec::len).sum::<usize>() * 3;
        assert_eq!(solo[i].len(), want, "voice {i}: every window once");
        assert_eq!(voices[i].as_ref().unwrap(), &solo[i], "voice {i} changed beside other lanes");
    }
    assert_eq!(texts, solo_text);
    settle(&rt).await;
}

#[actix::test]
async fn test_dropped_voice_streams_free_their_lanes() {
    let rt = start(2).await;
    let long = VoiceInput { chunks: vec![(0..400).collect(); 4], speed: 1.0, seed: 9 };
    for skip in 0..4 {
        let mut rx = rt.submit(speak(long.clone())).await.unwrap();
        for _ in 0..skip {
            rx.recv().await.unwrap();
        }
        drop(rx);
    }
    settle(&rt).await;
    let rounds = rt.metrics().rounds_total();
    assert!(rounds < 4 * 1600, "cancelled voice lanes kept running: {rounds} rounds");
    assert!(!audio(rt.submit(speak(input(2))).await.unwrap()).await.unwrap().is_empty());
}

#[actix::test]
async fn test_voice_errors_and_wrong_models_are_reported() {
    let rt = start(2).await;
    let bad = VoiceInput { chunks: vec![vec![1, 2], vec![3, -1]], speed: 1.0, seed: 0 };
    let err = audio(rt.submit(speak(bad)).await.unwrap()).await.unwrap_err();
    assert!(err.contains("chunk 1"), "{err}");
    let on_text = ValidRequest { model: TEXT.into(), work: Work::Voice(input(0)) };
    let runs = "token lanes";
    assert_eq!(rt.submit(on_text).await.err(), Some(SubmitError::WrongKind { model: TEXT.into(), runs }));
    let unknown = ValidRequest { model: "nova".into(), work: Work::Voice(input(0)) };
    assert_eq!(rt.submit(unknown).await.err(), Some(SubmitError::NoModel("nova".into())));
    let runs = "voice lanes";
    assert_eq!(rt.submit(on(VOICE, work(0))).await.err(), Some(SubmitError::WrongKind { model: VOICE.into(), runs }));
    settle(&rt).await;
}
