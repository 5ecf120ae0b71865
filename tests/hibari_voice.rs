//! The hibari voice through the runtime's rounds: streamed windows equal one pass per sentence, bit for bit,
//! alone or beside text and other voice lanes, and text lanes are unchanged beside it.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use common::events::drain;
use futures_util::future::join_all;
use tensorfold::server::text::validate::TokenizerDecoder;
use tensorfold_actors::coordinator::{Drafting, Schedule};
use tensorfold_actors::request_types::{Output, TokenWork, ValidRequest, VoiceInput, Work};
use tensorfold_actors::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_engine::speech::hibari::voice::HibariModel;
use tensorfold_engine::speech::hibari::{HibariText, HibariVoice};
use tensorfold_engine::speech::speakers::VoiceText;
use tensorfold_engine::text::tokenizer::Tokenizer;

const TEXTS: [&str; 4] = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore!",
    "Is it raining in Paris today? I think it might be.",
    "Twenty-one people, three cats and a dog walked two miles along the river before lunch.",
];

/// The voice's files, or `None` (a skip) when they cannot be fetched outside CI.
fn voice_dir() -> Option<PathBuf> {
    match tensorfold::settings::process_fetcher().and_then(|f| f.hibari_dir()) {
        Ok(dir) => Some(dir),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "CI fetches the voice first: {e}");
            println!("skipping: the hibari voice could not be fetched: {e}");
            None
        }
    }
}

struct Loaded {
    voice: Arc<HibariVoice>,
    text: HibariText,
}

fn loaded() -> Option<&'static Loaded> {
    static LOADED: OnceLock<Option<Loaded>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dir = voice_dir()?;
            Some(Loaded { voice: HibariVoice::open(&dir).unwrap(), text: HibariText::open(&dir).unwrap() })
        })
        .as_ref()
}

fn input(l: &Loaded, i: usize, speed: f32) -> VoiceInput {
    l.text.input(TEXTS[i % TEXTS.len()], speed, 40 + i as u64).unwrap()
}

fn voice(input: VoiceInput) -> ValidRequest {
    ValidRequest { model: "voice".into(), work: Work::Voice(input) }
}

/// A runtime with the drama checkpoint as the text model `text` and the voice as `voice`.
async fn start(l: &Loaded) -> Runtime {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama");
    let text = tensorfold_engine::model::load(&dir, &mut |_, _| {}).unwrap();
    let context = text.llama.config().max_position;
    let models = vec![
        ModelSpec {
            name: "text".into(),
            kind: ModelKind::Tokens { engine: Box::new(text.llama), codec: None },
            context,
            weight_bytes: 0,
            activation_bytes: 0,
        },
        ModelSpec {
            name: "voice".into(),
            kind: ModelKind::Voice(Box::new(HibariModel(l.voice.clone()))),
            context: 0,
            weight_bytes: 0,
            activation_bytes: 0,
        },
    ];
    let schedule = Schedule { round_tokens: 64, parallel: 8, max_waiting: 64, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 16, kv_pages: Some(64), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    Runtime::start(models, cfg).await.unwrap()
}

fn chat(i: usize) -> ValidRequest {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama");
    let tokenizer = Arc::new(Tokenizer::from_hf_dir(&dir).unwrap());
    let work = TokenWork {
        prompt: tokenizer.encode(&format!("Story {i}:"), true).unwrap(),
        max_tokens: 30,
        sampling: SamplingParams { temperature: 0.8, seed: i as u64, ..Default::default() },
        stop_ids: Vec::new(),
        stop_strings: Vec::new(),
        logprobs: None,
        cache: false,
        keep_reply: false,
        draft: false,
        rules: Default::default(),
        constraint: None,
        output: Output::Text(Box::new(TokenizerDecoder::new(tokenizer))),
    };
    ValidRequest { model: "text".into(), work: Work::Tokens(work) }
}

#[actix::test]
async fn test_streamed_windows_equal_one_pass_per_sentence() {
    let Some(l) = loaded() else { return };
    let rt = start(l).await;
    for (i, speed) in [(0, 1.0), (1, 1.0), (2, 1.25), (3, 0.8)] {
        let input = input(l, i, speed);
        let one_pass: Vec<u32> = l.voice.synthesize(&input).unwrap().iter().map(|s| s.to_bits()).collect();
        let (streamed, pieces, _) = drain(rt.submit(voice(input)).await.unwrap()).await;
        assert!(!one_pass.is_empty(), "text {i}: no audio");
        assert!(streamed == one_pass, "text {i}: streamed audio differs from one pass");
        assert!(pieces > 1, "text {i}: the audio came in one piece");
    }
}

#[actix::test]
async fn test_voice_beside_text_and_other_voices_equals_voice_alone() {
    let Some(l) = loaded() else { return };
    let rt = start(l).await;
    let mut solo_voice = Vec::new();
    let mut solo_text = Vec::new();
    for i in 0..4 {
        solo_voice.push(drain(rt.submit(voice(input(l, i, 1.0))).await.unwrap()).await.0);
        solo_text.push(drain(rt.submit(chat(i)).await.unwrap()).await.2);
    }
    let mut receivers = Vec::new();
    for i in 0..4 {
        receivers.push(rt.submit(chat(i)).await.unwrap());
        receivers.push(rt.submit(voice(input(l, i, 1.0))).await.unwrap());
    }
    let together = join_all(receivers.into_iter().map(drain)).await;
    for i in 0..4 {
        assert!(!solo_text[i].is_empty(), "chat {i} made no text");
        assert_eq!(together[2 * i].2, solo_text[i], "chat {i} changed beside the voice");
        assert!(together[2 * i + 1].0 == solo_voice[i], "voice {i} changed beside other lanes");
    }
}

#[test]
fn test_seeds_change_only_the_noise() {
    let Some(l) = loaded() else { return };
    let a = l.voice.synthesize(&l.text.input(TEXTS[0], 1.0, 1).unwrap()).unwrap();
    let b = l.voice.synthesize(&l.text.input(TEXTS[0], 1.0, 1).unwrap()).unwrap();
    let c = l.voice.synthesize(&l.text.input(TEXTS[0], 1.0, 2).unwrap()).unwrap();
    assert!(a == b, "the same seed gave other audio");
    assert_eq!(a.len(), c.len());
    let diff: f64 = a.iter().zip(&c).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum::<f64>() / a.len() as f64;
    let power: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / a.len() as f64;
    assert!(diff > 0.0 && diff < 0.5 * power, "seeds should move the noise, not the speech: {diff} vs {power}");
}

#[test]
fn test_text_without_phonemes_is_refused() {
    let Some(l) = loaded() else { return };
    let err = l.text.input("\u{1F642}\u{1F642}", 1.0, 0).unwrap_err();
    assert!(err.contains("nothing to speak"), "{err}");
}
