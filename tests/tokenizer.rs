//! The tokenizer against transformers' goldens on the default model, and on small synthetic vocabularies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tensorfold_engine::checkpoint::gguf::{GgufFile, Value};
use tensorfold_engine::error::LoadError;
use tensorfold_engine::text::chat::{render_chat, ChatMessage};
use tensorfold_engine::text::tokenizer::{StreamDecoder, Tokenizer};

#[derive(Deserialize)]
struct Golden {
    bos_id: u32,
    eos_id: u32,
    bos_token: String,
    eos_token: String,
    chat_template: String,
    cases: Vec<Case>,
    chat: Vec<ChatCase>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    /// The model's own tokenizer.json pipeline, present where transformers' GGUF loader differs from it.
    tokenizer_json_ids: Option<Vec<u32>>,
}

#[derive(Deserialize)]
struct ChatCase {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    text: String,
}

fn golden() -> Golden {
    serde_json::from_str(include_str!("data/tokenizer_smollm2.json")).expect("golden json parses")
}

fn model_path() -> PathBuf {
    match std::env::var_os("TF_MODEL") {
        Some(path) => PathBuf::from(path),
        None => tensorfold::settings::process_fetcher().and_then(|f| f.default_model_path()).expect("default model"),
    }
}

fn model_tokenizer() -> Tokenizer {
    let file = GgufFile::open(&model_path()).expect("open default model");
    Tokenizer::from_gguf(&file).expect("tokenizer from GGUF")
}

#[test]
fn test_default_model_ids_match_reference() {
    let tok = model_tokenizer();
    let golden = golden();
    let mut mismatches = Vec::new();
    let mut num_quirks = 0;
    for case in &golden.cases {
        // transformers' GGUF loader skips SmolLM's one-digit-at-a-time split; the model was trained with it.
        let expected = match &case.tokenizer_json_ids {
            Some(ids) => {
                num_quirks += 1;
                ids
            }
            None => &case.ids,
        };
        let ids = tok.encode(&case.text, false).expect("encode");
        if &ids != expected {
            mismatches.push(format!("{:?}\n  got  {ids:?}\n  want {expected:?}", case.text));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} corpus strings differ:\n{}",
        mismatches.len(),
        golden.cases.len(),
        mismatches.join("\n")
    );
    assert!(golden.cases.len() >= 200 && num_quirks <= 2);
}

#[test]
fn test_default_model_decode_round_trips() {
    let tok = model_tokenizer();
    let mut mismatches = Vec::new();
    for case in &golden().cases {
        let decoded = tok.decode(&case.ids);
        if decoded != case.decoded || (case.decoded == case.text && decoded != case.text) {
            mismatches.push(format!("{:?} decoded as {decoded:?}", case.text));
        }
        let mut stream = StreamDecoder::new();
        let mut pieces: Vec<String> = case.ids.iter().filter_map(|&id| stream.push(&tok, id)).collect();
        pieces.extend(stream.finish(&tok));
        if pieces.concat() != decoded {
            mismatches.push(format!("{:?} streamed as {pieces:?}", case.text));
        }
        if !decoded.contains('\u{FFFD}') && pieces.iter().any(|p| p.contains('\u{FFFD}')) {
            mismatches.push(format!("{:?} streamed a split character: {pieces:?}", case.text));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn test_default_model_special_tokens_and_chat_template() {
    let tok = model_tokenizer();
    let golden = golden();
    assert_eq!(tok.bos_id(), Some(golden.bos_id));
    assert_eq!(tok.eos_ids().first(), Some(&golden.eos_id));
    assert!(tok.eos_ids().contains(&tok.token_id("<|endoftext|>").unwrap()));
    assert_eq!(tok.bos_token(), Some(golden.bos_token.as_str()));
    assert_eq!(tok.eos_token(), Some(golden.eos_token.as_str()));
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.encode("Hi", true).unwrap(), tok.encode("Hi", false).unwrap());
    let template = tok.chat_template().expect("the model has a chat template");
    assert_eq!(template, golden.chat_template);
    for case in &golden.chat {
        let bos = tok.bos_token().unwrap_or_default();
        let eos = tok.eos_token().unwrap_or_default();
        let text = render_chat(template, &case.messages, case.add_generation_prompt, bos, eos);
        assert_eq!(text.expect("renders"), case.text);
    }
}

const ALPHABET_SIZE: u32 = 256;

/// GPT-2's byte alphabet, in byte order.
fn byte_alphabet() -> Vec<String> {
    let mut num_moved = 0;
    (0..ALPHABET_SIZE)
        .map(|b| {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let code = if printable {
                b
            } else {
                num_moved += 1;
                255 + num_moved
            };
            char::from_u32(code).unwrap().to_string()
        })
        .collect()
}

const SPECIALS: [&str; 4] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"];
const MERGES: [&str; 5] = ["Ġ t", "h e", "Ġt he", "1 2", "' S"];

/// A vocabulary of specials, every byte, and a few merges; `<think>` is user-defined.
fn synthetic_metadata(pre: &str) -> BTreeMap<String, Value> {
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    tokens.extend(byte_alphabet());
    tokens.extend(MERGES.iter().map(|m| m.replace(' ', "")));
    let types = (0..tokens.len())
        .map(|i| {
            Value::I32(if i < 3 {
                3
            } else if i == 3 {
                4
            } else {
                1
            })
        })
        .collect();
    let mut meta = BTreeMap::new();
    let mut set = |k: &str, v: Value| meta.insert(k.to_string(), v);
    set("tokenizer.ggml.model", Value::String("gpt2".into()));
    set("tokenizer.ggml.pre", Value::String(pre.into()));
    set("tokenizer.ggml.tokens", strings(tokens));
    set("tokenizer.ggml.merges", strings(MERGES.iter().map(|m| m.to_string()).collect()));
    set("tokenizer.ggml.token_type", Value::Array(types));
    set("tokenizer.ggml.bos_token_id", Value::U32(1));
    set("tokenizer.ggml.eos_token_id", Value::U32(2));
    set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    set("tokenizer.chat_template", Value::String("{{ messages[0].content }}".into()));
    meta
}

fn synthetic(pre: &str) -> Tokenizer {
    Tokenizer::from_gguf_metadata(Path::new("synthetic.gguf"), &synthetic_metadata(pre)).unwrap()
}

#[test]
fn test_merges_specials_and_bos() {
    let tok = synthetic("smollm");
    let id = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(tok.encode(" the", false).unwrap(), vec![id("Ġthe")]);
    assert_eq!(tok.encode("the", false).unwrap(), vec![id("t"), id("he")]);
    let with_specials = tok.encode("a<|im_end|><think>b", true).unwrap();
    assert_eq!(with_specials, vec![1, id("a"), 2, 3, id("b")]);
    assert_eq!(tok.decode(&with_specials), "<|im_start|>a<|im_end|><think>b");
    assert_eq!(tok.eos_ids(), &[2, 0]);
    assert_eq!((tok.bos_token(), tok.eos_token()), (Some("<|im_start|>"), Some("<|im_end|>")));
    assert_eq!(tok.chat_template(), Some("{{ messages[0].content }}"));
    assert_eq!(tok.vocab_size(), SPECIALS.len() + ALPHABET_SIZE as usize + MERGES.len());
    assert_eq!(tok.token_str(id("Ġthe")), Some("Ġthe"));
}

#[test]
fn test_pre_tokenizer_follows_metadata() {
    let digits = synthetic("smollm").encode("12", false).unwrap();
    assert_eq!(digits.len(), 2, "smollm splits digits one by one");
    let gpt2 = synthetic("gpt-2");
    assert_eq!(gpt2.encode("12", false).unwrap(), vec![gpt2.token_id("12").unwrap()]);
    // Llama 3 keeps "'S" whole as a contraction; GPT-2 only knows the lower-case one.
    let llama3 = synthetic("llama-bpe");
    assert_eq!(llama3.encode("'S", false).unwrap(), vec![llama3.token_id("'S").unwrap()]);
    assert_eq!(gpt2.encode("'S", false).unwrap().len(), 2);
    assert_eq!(synthetic("qwen2").encode("12", false).unwrap().len(), 2);
}

#[test]
fn test_unsupported_metadata_is_a_clear_error() {
    let mut meta = synthetic_metadata("smollm");
    meta.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
    let err = Tokenizer::from_gguf_metadata(Path::new("m.gguf"), &meta).err().unwrap();
    assert!(err.to_string().contains("unsupported tokenizer model \"llama\""), "{err}");
    let meta = synthetic_metadata("no-such-pre");
    let err = Tokenizer::from_gguf_metadata(Path::new("m.gguf"), &meta).err().unwrap();
    assert!(err.to_string().contains("no-such-pre"), "{err}");
    let mut meta = synthetic_metadata("smollm");
    meta.remove("tokenizer.ggml.merges");
    let err = Tokenizer::from_gguf_metadata(Path::new("m.gguf"), &meta).err().unwrap();
    assert!(matches!(err, LoadError::Tokenizer { .. }), "{err}");
}

#[test]
fn test_stream_decoder_holds_split_characters() {
    let tok = synthetic("smollm");
    for text in ["héllo 😀 wörld", "你好，世界", "👨‍👩‍👧‍👦 family", "🇺🇸🇯🇵", "a\u{FFFD}b"]
    {
        let ids = tok.encode(text, false).unwrap();
        let mut stream = StreamDecoder::new();
        let mut pieces: Vec<String> = ids.iter().filter_map(|&id| stream.push(&tok, id)).collect();
        pieces.extend(stream.finish(&tok));
        assert_eq!(pieces.concat(), text);
        assert_eq!(tok.decode(&ids), text);
        let split = pieces.iter().filter(|p| p.contains('\u{FFFD}')).count();
        assert_eq!(split, usize::from(text.contains('\u{FFFD}')), "{pieces:?}");
    }
    // An incomplete character at the end comes out as U+FFFD on finish.
    let mut stream = StreamDecoder::new();
    let first_byte = tok.token_id(&byte_alphabet()[0xE4]).unwrap();
    assert_eq!(stream.push(&tok, first_byte), None);
    assert_eq!(stream.finish(&tok).as_deref(), Some("\u{FFFD}"));
}

/// Writes a Hugging Face directory whose tokenizer.json adds BOS through its post-processor.
fn write_hf_dir(dir: &Path, config: serde_json::Value, generation: serde_json::Value) {
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "added_tokens": [
            {"id": 0, "content": "<s>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
            {"id": 1, "content": "</s>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false},
            {"id": 2, "content": "<|eot_id|>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}
        ],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "vocab": {"<s>": 0, "</s>": 1, "<|eot_id|>": 2, "h": 3, "i": 4, "hi": 5}, "merges": ["h i"]}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("generation_config.json"), generation.to_string()).unwrap();
}

#[test]
fn test_hf_dir_reads_configs() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "bos_token": {"content": "<s>", "special": true},
        "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    });
    write_hf_dir(dir.path(), config, serde_json::json!({"eos_token_id": [1, 2]}));
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.encode("hi", true).unwrap(), vec![0, 5]);
    assert_eq!(tok.encode("hi", false).unwrap(), vec![5]);
    assert_eq!((tok.bos_id(), tok.eos_ids()), (Some(0), &[1, 2][..]));
    assert_eq!((tok.bos_token(), tok.eos_token()), (Some("<s>"), Some("</s>")));
    assert_eq!(tok.chat_template(), Some("D"));

    let config = serde_json::json!({"bos_token": "<s>", "add_bos_token": false, "chat_template": "S"});
    write_hf_dir(dir.path(), config, serde_json::json!({"eos_token_id": 2}));
    std::fs::write(dir.path().join("chat_template.jinja"), "J").unwrap();
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.encode("hi", true).unwrap(), vec![5]);
    assert_eq!(tok.eos_ids(), &[2]);
    assert_eq!(tok.chat_template(), Some("J"));
}

#[test]
fn test_hf_dir_without_tokenizer_json_names_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).err().unwrap();
    let text = err.to_string();
    assert!(text.contains(&dir.path().display().to_string()) && text.contains("tokenizer.json"), "{text}");
}
