//! Drama speech through the runtime's rounds: the same tokens and PCM as one lane alone and as the reference,
//! whatever runs beside it, and text lanes unchanged by speech beside them.

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::join_all;
use tensorfold::drama::{orpheus_sampling, DramaModel};
use tensorfold::generate::PAGE_TOKENS;
use tensorfold::sampling::SamplingParams;
use tensorfold::server::validate::TokenizerDecoder;
use tensorfold::speech::SpeechFrontEnd;
use tensorfold_actors::coordinator::Schedule;
use tensorfold_actors::request_types::{Event, Output, ValidRequest};
use tensorfold_actors::runtime::{ModelSpec, Runtime, RuntimeConfig};
use tokio::sync::mpsc::Receiver;

const TEXTS: [(&str, &str); 3] = [
    ("tara", "Hello there, how are you today?"),
    ("leo", "The quick brown fox <laugh> jumps over the lazy dog."),
    ("zoe", "Well, um, I think that might actually work."),
];
const MAX_TOKENS: usize = 160;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama")
}

/// A runtime with the checkpoint as text model 0 (when `with_text`) and as speech model; the front end for speech.
async fn start(
    with_text: bool,
    parallel: usize,
) -> (Runtime, SpeechFrontEnd, Option<Arc<tensorfold::tokenizer::Tokenizer>>) {
    let mut models = Vec::new();
    let mut text_tokenizer = None;
    if with_text {
        let loaded = tensorfold::model::load(&dir(), &mut |_, _| {}).unwrap();
        let context = loaded.llama.config().max_position;
        text_tokenizer = Some(Arc::new(loaded.tokenizer));
        models.push(ModelSpec {
            weight_bytes: loaded.llama.num_weight_bytes(),
            activation_bytes: 0,
            engine: Box::new(loaded.llama),
            codec: None,
            context,
        });
    }
    let (spec, front) = SpeechFrontEnd::open(&dir(), models.len(), 64, parallel).unwrap();
    models.push(spec);
    let schedule = Schedule { round_tokens: 64, parallel, max_waiting: 64 };
    let cfg = RuntimeConfig { page_tokens: PAGE_TOKENS, kv_pages: Some(256), memory_limit: None, schedule };
    (Runtime::start(models, cfg).await.unwrap(), front, text_tokenizer)
}

fn speech(front: &SpeechFrontEnd, i: usize, sampling: SamplingParams) -> ValidRequest {
    let (voice, text) = TEXTS[i % TEXTS.len()];
    let voice = front.voices().check(Some(voice)).unwrap();
    let request = front.request(&voice, text, sampling.seed).unwrap();
    ValidRequest { max_tokens: MAX_TOKENS, sampling, ..request }
}

fn chat(tokenizer: &Arc<tensorfold::tokenizer::Tokenizer>, i: usize) -> ValidRequest {
    let prompt = tokenizer.encode(&format!("A short story number {i} about"), true).unwrap();
    ValidRequest {
        model: 0,
        prompt,
        max_tokens: 24 + i * 5,
        sampling: SamplingParams { temperature: 0.9, seed: i as u64, ..Default::default() },
        stop_ids: Vec::new(),
        stop_strings: Vec::new(),
        logprobs: None,
        output: Output::Text(Box::new(TokenizerDecoder::new(tokenizer.clone()))),
    }
}

/// The audio's bit patterns and how many pieces it came in, or the text.
async fn drain(mut rx: Receiver<Event>) -> (Vec<u32>, usize, String) {
    let (mut bits, mut pieces, mut text) = (Vec::new(), 0, String::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Audio { pcm } => {
                bits.extend(pcm.iter().map(|s| s.to_bits()));
                pieces += 1;
            }
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done { .. } => return (bits, pieces, text),
            Event::Error { message } => panic!("{message}"),
        }
    }
    panic!("the stream ended without Done");
}

#[actix::test]
async fn test_rounds_speak_what_one_lane_alone_speaks() {
    let (rt, front, _) = start(false, 4).await;
    let drama = DramaModel::open(&dir()).unwrap();
    let mut streamed_in_pieces = false;
    for i in 0..TEXTS.len() {
        let sampling = orpheus_sampling(11 + i as u64);
        let (bits, pieces, _) = drain(rt.submit(speech(&front, i, sampling.clone())).await.unwrap()).await;
        let (voice, text) = TEXTS[i];
        let alone = drama.synthesize(voice, text, &sampling, MAX_TOKENS).unwrap();
        assert!(!alone.pcm.is_empty(), "{voice}: no frames");
        assert_eq!(bits, alone.pcm.iter().map(|s| s.to_bits()).collect::<Vec<_>>(), "{voice}: {text}");
        streamed_in_pieces |= pieces > 1;
    }
    assert!(streamed_in_pieces, "no request's audio arrived in more than one piece");
}

#[actix::test]
async fn test_speech_beside_text_and_speech_equals_speech_alone() {
    let (rt, front, tokenizer) = start(true, 8).await;
    let tokenizer = tokenizer.unwrap();
    let sampling = |i: usize| SamplingParams { seed: 100 + i as u64, ..orpheus_sampling(0) };
    let mut solo_speech = Vec::new();
    let mut solo_text = Vec::new();
    for i in 0..4 {
        solo_speech.push(drain(rt.submit(speech(&front, i, sampling(i))).await.unwrap()).await.0);
        solo_text.push(drain(rt.submit(chat(&tokenizer, i)).await.unwrap()).await.2);
    }
    let mut receivers = Vec::new();
    for i in 0..4 {
        receivers.push(rt.submit(chat(&tokenizer, i)).await.unwrap());
        receivers.push(rt.submit(speech(&front, i, sampling(i))).await.unwrap());
    }
    let together = join_all(receivers.into_iter().map(drain)).await;
    for i in 0..4 {
        assert_eq!(together[2 * i].2, solo_text[i], "chat {i} changed beside speech");
        assert!(!solo_speech[i].is_empty(), "speech {i} made no audio");
        assert!(together[2 * i + 1].0 == solo_speech[i], "speech {i} changed beside other lanes");
    }
}
