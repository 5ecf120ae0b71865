//! Drama speech through the runtime's rounds: the same tokens and PCM as one lane alone and as the reference,
//! whatever runs beside it, and text lanes unchanged by speech beside them.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::events::drain;
use futures_util::future::join_all;
use tensorfold::server::text::validate::TokenizerDecoder;
use tensorfold::wiring::drama_spec;
use tensorfold_actors::coordinator::{Drafting, Schedule};
use tensorfold_actors::request_types::{Output, TokenWork, ValidRequest, Work};
use tensorfold_actors::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_engine::speech::drama::{orpheus_sampling, DramaModel};
use tensorfold_engine::speech::speakers::SpeechFrontEnd;
use tensorfold_engine::text::tokenizer::Tokenizer;

const TEXTS: [(&str, &str); 3] = [
    ("tara", "Hello there, how are you today?"),
    ("leo", "The quick brown fox <laugh> jumps over the lazy dog."),
    ("zoe", "Well, um, I think that might actually work."),
];
const MAX_TOKENS: usize = 160;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama")
}

/// How text lanes run beside speech lanes.
#[derive(Clone, Copy, Debug)]
enum Text {
    None,
    /// On the speech model itself: text and speech tokens share every batched forward.
    SameModel,
    /// On a second copy of the checkpoint: the round runs one forward per model.
    OtherModel,
}

/// A runtime serving the checkpoint's speech, and text as `text` says; the speech front end; the text lanes' model.
async fn start(text: Text, parallel: usize) -> (Runtime, SpeechFrontEnd, String) {
    let mut models = Vec::new();
    if let Text::OtherModel = text {
        let loaded = tensorfold_engine::model::load(&dir(), &mut |_, _| {}).unwrap();
        let context = loaded.llama.config().max_position;
        models.push(ModelSpec {
            name: "text".into(),
            weight_bytes: loaded.llama.num_weight_bytes(),
            activation_bytes: 0,
            kind: ModelKind::Tokens { engine: Box::new(loaded.llama), codec: None },
            context,
        });
    }
    let (llama, codec, front) = SpeechFrontEnd::open(&dir()).unwrap();
    let text_model = match text {
        Text::OtherModel => "text".to_string(),
        Text::None | Text::SameModel => front.model.clone(),
    };
    models.push(drama_spec(front.model.clone(), llama, codec, 64, parallel));
    let schedule = Schedule { round_tokens: 64, parallel, max_waiting: 64, drafting: Drafting::OFF };
    let cfg = RuntimeConfig {
        page_tokens: PAGE_TOKENS,
        kv_pages: Some(256),
        memory_limit: None,
        schedule,
        prefix_cache_tokens: 0,
    };
    (Runtime::start(models, cfg).await.unwrap(), front, text_model)
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_hf_dir(&dir()).unwrap())
}

fn speech(front: &SpeechFrontEnd, i: usize, sampling: SamplingParams) -> ValidRequest {
    let (voice, text) = TEXTS[i % TEXTS.len()];
    let voice = front.voices().check(Some(voice)).unwrap();
    let work = front.request(&voice, text, sampling.seed).unwrap();
    ValidRequest {
        model: front.model.clone(),
        work: Work::Tokens(TokenWork { max_tokens: MAX_TOKENS, sampling, ..work }),
    }
}

fn chat(tokenizer: &Arc<Tokenizer>, model: &str, i: usize) -> ValidRequest {
    let prompt = tokenizer.encode(&format!("A short story number {i} about"), true).unwrap();
    let work = TokenWork {
        prompt,
        max_tokens: 24 + i * 5,
        sampling: SamplingParams { temperature: 0.9, seed: i as u64, ..Default::default() },
        stop_ids: Vec::new(),
        stop_strings: Vec::new(),
        logprobs: None,
        cache: false,
        keep_reply: false,
        draft: false,
        rules: Default::default(),
        constraint: None,
        output: Output::Text(Box::new(TokenizerDecoder::new(tokenizer.clone()))),
    };
    ValidRequest { model: model.to_string(), work: Work::Tokens(work) }
}

#[actix::test]
async fn test_rounds_speak_what_one_lane_alone_speaks() {
    let (rt, front, _) = start(Text::None, 4).await;
    let drama = DramaModel::open(&dir()).unwrap();
    let mut streamed_in_pieces = false;
    for (i, (voice, text)) in TEXTS.iter().enumerate() {
        let sampling = orpheus_sampling(11 + i as u64);
        let (bits, pieces, _) = drain(rt.submit(speech(&front, i, sampling.clone())).await.unwrap()).await;
        let alone = drama.synthesize(voice, text, &sampling, MAX_TOKENS).unwrap();
        assert!(!alone.pcm.is_empty(), "{voice}: no frames");
        assert_eq!(bits, alone.pcm.iter().map(|s| s.to_bits()).collect::<Vec<_>>(), "{voice}: {text}");
        streamed_in_pieces |= pieces > 1;
    }
    assert!(streamed_in_pieces, "no request's audio arrived in more than one piece");
}

async fn check_speech_beside_text_and_speech(text: Text) {
    let (rt, front, text_model) = start(text, 8).await;
    let tokenizer = tokenizer();
    let sampling = |i: usize| SamplingParams { seed: 100 + i as u64, ..orpheus_sampling(0) };
    let mut solo_speech = Vec::new();
    let mut solo_text = Vec::new();
    for i in 0..4 {
        solo_speech.push(drain(rt.submit(speech(&front, i, sampling(i))).await.unwrap()).await.0);
        solo_text.push(drain(rt.submit(chat(&tokenizer, &text_model, i)).await.unwrap()).await.2);
    }
    let mut receivers = Vec::new();
    for i in 0..4 {
        receivers.push(rt.submit(chat(&tokenizer, &text_model, i)).await.unwrap());
        receivers.push(rt.submit(speech(&front, i, sampling(i))).await.unwrap());
    }
    let together = join_all(receivers.into_iter().map(drain)).await;
    for i in 0..4 {
        assert!(!solo_text[i].is_empty() && !solo_speech[i].is_empty(), "{text:?}: lane {i} made nothing");
        assert_eq!(together[2 * i].2, solo_text[i], "{text:?}: chat {i} changed beside speech");
        assert!(together[2 * i + 1].0 == solo_speech[i], "{text:?}: speech {i} changed beside other lanes");
    }
}

#[actix::test]
async fn test_speech_and_text_sharing_one_forward_equal_each_alone() {
    check_speech_beside_text_and_speech(Text::SameModel).await;
}

#[actix::test]
async fn test_speech_and_text_on_two_models_equal_each_alone() {
    check_speech_beside_text_and_speech(Text::OtherModel).await;
}
