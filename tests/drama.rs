//! The Drama family on a seeded Orpheus-layout checkpoint against the reference (tools/make_drama.py):
//! prompt ids, greedy tokens, the frames they form and the PCM the reference SNAC decodes from them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use tensorfold_engine::boundary::FinishReason;
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_engine::speech::drama::{DramaError, DramaLayout, DramaModel, ORPHEUS_VOICES};
use tensorfold_engine::text::tokenizer::Tokenizer;

const MIN_SNR_DB: f64 = 60.0;
/// The language model's files, without the codec.
const LM_FILES: [&str; 5] =
    ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama")
}

fn model() -> &'static DramaModel {
    static MODEL: OnceLock<DramaModel> = OnceLock::new();
    MODEL.get_or_init(|| DramaModel::open(&dir()).expect("opening tests/data/drama"))
}

struct Golden {
    voice: String,
    text: String,
    max_tokens: usize,
    prompt_ids: Vec<u32>,
    greedy: Vec<u32>,
    stop: Option<u32>,
    codes: Vec<Vec<u32>>,
    dropped_frames: usize,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn goldens() -> Vec<Golden> {
    let json: Value = serde_json::from_slice(&std::fs::read(dir().join("goldens.json")).unwrap()).unwrap();
    let inputs = json["inputs"].as_array().unwrap();
    inputs
        .iter()
        .map(|g| Golden {
            voice: g["voice"].as_str().unwrap().into(),
            text: g["text"].as_str().unwrap().into(),
            max_tokens: g["max_tokens"].as_u64().unwrap() as usize,
            prompt_ids: ids(&g["prompt_ids"]),
            greedy: ids(&g["greedy"]),
            stop: g["greedy_stop"].as_u64().map(|t| t as u32),
            codes: g["codes"].as_array().unwrap().iter().map(ids).collect(),
            dropped_frames: g["dropped_frames"].as_u64().unwrap() as usize,
        })
        .collect()
}

fn reference_pcm(index: usize) -> Vec<f32> {
    let bytes = std::fs::read(dir().join("goldens.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(&format!("pcm.{index}")).unwrap();
    view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn snr_db(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len());
    let signal: f64 = reference.iter().map(|r| (*r as f64).powi(2)).sum();
    let noise: f64 = ours.iter().zip(reference).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
    10.0 * (signal / noise.max(f64::MIN_POSITIVE)).log10()
}

fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, ..Default::default() }
}

#[test]
fn test_prompt_ids_match_the_reference() {
    let m = model();
    for g in goldens() {
        let voice = m.voices.check(Some(&g.voice)).unwrap();
        let prompt = m.layout.build_prompt(&m.tokenizer, &voice, &g.text).unwrap();
        assert_eq!(prompt, g.prompt_ids, "{}: {}", g.voice, g.text);
    }
}

#[test]
fn test_layout_ids_sit_where_the_reference_prompt_has_them() {
    let l = &model().layout;
    for g in goldens() {
        let p = &g.prompt_ids;
        assert_eq!(p[..2], [l.start_of_human, l.bos]);
        assert_eq!(p[p.len() - 4..], [l.end_of_text, l.end_of_human, l.start_of_ai, l.start_of_speech]);
    }
}

#[test]
fn test_greedy_tokens_and_frames_match_the_reference() {
    let m = model();
    let goldens = goldens();
    assert!(goldens.iter().any(|g| g.stop.is_some()) && goldens.iter().any(|g| g.stop.is_none()));
    for g in goldens {
        let out = m.synthesize(&g.voice, &g.text, &greedy(), g.max_tokens).unwrap();
        assert_eq!(out.tokens, g.greedy, "{}: {}", g.voice, g.text);
        match g.stop {
            Some(stop) => assert!(m.layout.is_end_of_speech(stop) && out.finish == FinishReason::Stop, "{}", g.voice),
            None => assert_eq!(out.finish, FinishReason::Length, "{}", g.voice),
        }
        let codes: Vec<Vec<u32>> = out.frames.codes().iter().map(|c| c.to_vec()).collect();
        assert!(out.frames.num_frames() > 0, "{}", g.voice);
        assert_eq!(codes, g.codes, "{}", g.voice);
        assert_eq!(out.num_dropped_frames, g.dropped_frames, "{}", g.voice);
    }
}

#[test]
fn test_pcm_matches_the_reference_decode_above_60_db() {
    let m = model();
    for (i, g) in goldens().iter().enumerate() {
        let out = m.synthesize(&g.voice, &g.text, &greedy(), g.max_tokens).unwrap();
        assert_eq!(out.pcm.len(), out.frames.num_frames() * m.codec.hop_length());
        let snr = snr_db(&out.pcm, &reference_pcm(i));
        assert!(snr >= MIN_SNR_DB, "{}: SNR {snr:.1} dB", g.voice);
    }
}

#[test]
fn test_seeded_synthesis_is_deterministic_and_follows_the_seed() {
    let m = model();
    let text = "Well, um, I think that might actually work.";
    let sampling = |seed| SamplingParams { temperature: 1.0, seed, ..Default::default() };
    let run = |params: &SamplingParams| m.synthesize("mia", text, params, 160).unwrap();
    let (a, b, c) = (run(&sampling(7)), run(&sampling(7)), run(&sampling(8)));
    assert_eq!(a.tokens, b.tokens);
    let bits = |pcm: &[f32]| pcm.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.pcm), bits(&b.pcm));
    assert!(a.frames.num_frames() > 0);
    assert_ne!(a.tokens, c.tokens, "another seed should give other speech");
    let orpheus = tensorfold_engine::speech::drama::orpheus_sampling(3);
    assert_eq!(run(&orpheus).tokens, run(&orpheus).tokens);
}

#[test]
fn test_unknown_voice_is_an_error_listing_the_valid_voices() {
    let err = model().synthesize("nova", "Hello.", &greedy(), 16).unwrap_err();
    assert!(matches!(err, DramaError::UnknownVoice(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("\"nova\""), "{message}");
    assert!(message.contains(&ORPHEUS_VOICES.join(", ")), "{message}");
}

fn copy_lm(to: &Path) {
    for file in LM_FILES {
        std::fs::copy(dir().join(file), to.join(file)).unwrap();
    }
}

#[test]
fn test_a_directory_without_the_codec_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    copy_lm(tmp.path());
    let err = DramaModel::open(tmp.path()).err().expect("opening without a codec should fail");
    assert!(matches!(err, DramaError::MissingCodec { .. }), "{err:?}");
    assert!(err.to_string().contains(&tmp.path().join("snac").display().to_string()), "{err}");

    std::fs::create_dir(tmp.path().join("snac")).unwrap();
    let err = DramaModel::open(tmp.path()).err().expect("opening with an empty codec directory should fail");
    assert!(matches!(err, DramaError::Codec(_)) && err.to_string().contains("config.json"), "{err}");
}

/// Our tokenizer.json with its vocabulary changed by `edit`, loaded from a temporary directory.
fn edited_tokenizer(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Tokenizer {
    let tmp = tempfile::tempdir().unwrap();
    let mut json: Value = serde_json::from_slice(&std::fs::read(dir().join("tokenizer.json")).unwrap()).unwrap();
    edit(json["model"]["vocab"].as_object_mut().unwrap());
    std::fs::write(tmp.path().join("tokenizer.json"), serde_json::to_vec(&json).unwrap()).unwrap();
    std::fs::copy(dir().join("tokenizer_config.json"), tmp.path().join("tokenizer_config.json")).unwrap();
    Tokenizer::from_hf_dir(tmp.path()).unwrap()
}

#[test]
fn test_a_text_tokenizer_is_not_a_drama_layout() {
    let text_only = edited_tokenizer(|vocab| vocab.retain(|name, _| !name.starts_with("<custom_token_")));
    let err = DramaLayout::from_tokenizer(&text_only).unwrap_err();
    assert!(matches!(err, DramaError::MissingToken { .. }), "{err:?}");
    assert!(err.to_string().contains("<custom_token_10>"), "{err}");
}

#[test]
fn test_code_tokens_out_of_order_are_refused() {
    let swapped = edited_tokenizer(|vocab| {
        let (a, b) = (vocab["<custom_token_100>"].clone(), vocab["<custom_token_101>"].clone());
        vocab.insert("<custom_token_100>".into(), b);
        vocab.insert("<custom_token_101>".into(), a);
    });
    let err = DramaLayout::from_tokenizer(&swapped).unwrap_err();
    assert!(matches!(err, DramaError::ScatteredCodes { .. }), "{err:?}");
    assert!(err.to_string().contains("<custom_token_100>"), "{err}");
}
