//! Text to token ids and back: byte-level BPE rebuilt from GGUF metadata, or a Hugging Face tokenizer.json.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::checkpoint::gguf::{GgufFile, Value};
use crate::error::LoadError;

/// GPT-2's split, as the `tokenizers` ByteLevel pre-tokenizer spells it.
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token texts that end a turn in the chat formats we know, beyond the declared eos.
const END_OF_TURN: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
    "<|return|>",
    "<|call|>",
];

/// GGUF token types that `tokenizers` must match whole in text.
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// Holding back more tokens than this means the bytes will never become valid UTF-8.
const MAX_HELD_TOKENS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("encoding text: {0}")]
    Encode(String),
}

/// A tokenizer with the special tokens and chat template its model declares.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Each id's vocabulary spelling (byte-level form for GPT-2 style vocabularies).
    tokens: Vec<String>,
    bos_id: Option<u32>,
    /// The model wants BOS in front of a prompt.
    add_bos: bool,
    eos_ids: Vec<u32>,
    pad_id: Option<u32>,
    chat_template: Option<String>,
}

/// How a GGUF `tokenizer.ggml.pre` cuts text before BPE.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PreSplit {
    Gpt2,
    /// Digits one by one, then GPT-2 (the StarCoder and SmolLM tokenizers).
    Gpt2Digits,
    Llama3,
    Qwen2,
    Tekken,
    Gpt4o,
}

impl PreSplit {
    /// The split for a `tokenizer.ggml.pre` name, following llama.cpp's grouping.
    fn from_name(name: &str) -> Option<PreSplit> {
        Some(match name {
            "default" | "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "trillion" => PreSplit::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
                PreSplit::Gpt2Digits
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
            | "dbrx" | "smaug-bpe" => PreSplit::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => PreSplit::Qwen2,
            "tekken" => PreSplit::Tekken,
            "gpt-4o" | "llama4" => PreSplit::Gpt4o,
            _ => return None,
        })
    }

    fn regex(self) -> &'static str {
        match self {
            PreSplit::Gpt2 | PreSplit::Gpt2Digits => GPT2_SPLIT,
            PreSplit::Llama3 => LLAMA3_SPLIT,
            PreSplit::Qwen2 => QWEN2_SPLIT,
            PreSplit::Tekken => TEKKEN_SPLIT,
            PreSplit::Gpt4o => GPT4O_SPLIT,
        }
    }

    fn pre_tokenizer(self) -> tokenizers::Result<Sequence> {
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        if self == PreSplit::Gpt2Digits {
            steps.push(Digits::new(true).into());
        }
        let pattern = SplitPattern::Regex(self.regex().to_string());
        steps.push(Split::new(pattern, SplitDelimiterBehavior::Isolated, false)?.into());
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps))
    }
}

/// GPT-2's byte-to-character alphabet: printable bytes stand for themselves, the rest move past U+0100.
fn byte_alphabet() -> [char; 256] {
    let mut alphabet = ['\0'; 256];
    let mut num_moved = 0;
    for (byte, slot) in alphabet.iter_mut().enumerate() {
        let printable = matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            byte as u32
        } else {
            num_moved += 1;
            255 + num_moved
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    alphabet
}

fn in_byte_alphabet(c: char) -> bool {
    matches!(c as u32, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0x143)
}

fn meta_u32(metadata: &BTreeMap<String, Value>, key: &str) -> Option<u32> {
    metadata.get(key).and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok())
}

fn meta_strings<'a>(
    metadata: &'a BTreeMap<String, Value>,
    key: &str,
    fault: impl Fn(String) -> LoadError,
) -> Result<Vec<&'a str>, LoadError> {
    let array = metadata
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| fault(format!("{key} is missing or not an array")))?;
    array
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_str().ok_or_else(|| fault(format!("{key}[{i}] is not a string"))))
        .collect()
}

impl Tokenizer {
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, LoadError> {
        Self::from_gguf_metadata(&file.path, &file.metadata)
    }

    /// Rebuilds the tokenizer a GGUF file describes from its metadata; `path` names it in errors.
    pub fn from_gguf_metadata(path: &Path, metadata: &BTreeMap<String, Value>) -> Result<Tokenizer, LoadError> {
        let fault = |fault: String| LoadError::Tokenizer { path: path.to_path_buf(), fault };
        let model = metadata
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .ok_or_else(|| fault("tokenizer.ggml.model is missing".into()))?;
        if model != "gpt2" {
            return Err(fault(format!(
                "unsupported tokenizer model {model:?}: only byte-level BPE (\"gpt2\") is supported"
            )));
        }
        let pre_name = metadata.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
        let pre =
            PreSplit::from_name(pre_name).ok_or_else(|| fault(format!("unsupported pre-tokenizer {pre_name:?}")))?;

        let tokens = meta_strings(metadata, "tokenizer.ggml.tokens", fault)?;
        let merges = meta_strings(metadata, "tokenizer.ggml.merges", fault)?;
        let token_types: Vec<u64> = match metadata.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(types) => types.iter().map(|t| t.as_u64().unwrap_or(0)).collect(),
            None => Vec::new(),
        };

        // Tokens spelled outside the byte alphabet are respelled, as transformers' GGUF loader does.
        let alphabet = byte_alphabet();
        let in_alphabet = |t: &str| t.chars().all(in_byte_alphabet);
        let mut vocab = Vocab::with_capacity(tokens.len());
        let mut spellings = Vec::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            let spelling = if in_alphabet(token) {
                token.to_string()
            } else {
                token.bytes().map(|b| alphabet[b as usize]).collect()
            };
            vocab.insert(spelling.clone(), id as u32);
            spellings.push(spelling);
        }
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| fault(format!("merge {i} {m:?} is not two symbols")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre == PreSplit::Llama3)
            .build()
            .map_err(|e| fault(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let pre_tokenizer = pre.pre_tokenizer().map_err(|e| fault(format!("pre-tokenizer regex: {e}")))?;
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevel::default()));

        let bos_id = meta_u32(metadata, "tokenizer.ggml.bos_token_id");
        let eos_id = meta_u32(metadata, "tokenizer.ggml.eos_token_id");
        let pad_id = meta_u32(metadata, "tokenizer.ggml.padding_token_id");
        let unk_id = meta_u32(metadata, "tokenizer.ggml.unknown_token_id");
        let mut special = Vec::new();
        let mut user_defined = Vec::new();
        for (id, token) in tokens.iter().enumerate() {
            let ty = token_types.get(id).copied().unwrap_or(0);
            // The declared specials are special whatever their type, as in transformers.
            let declared = [bos_id, eos_id, pad_id, unk_id].contains(&Some(id as u32));
            // Outside the byte alphabet a control type is a mislabel; adding it would grow the vocabulary.
            if (ty == TOKEN_TYPE_CONTROL || declared) && !token.is_empty() && in_alphabet(token) {
                special.push(AddedToken::from(token.to_string(), true).normalized(false));
            } else if ty == TOKEN_TYPE_USER_DEFINED && !token.is_empty() && in_alphabet(token) {
                user_defined.push(AddedToken::from(token.to_string(), false).normalized(false));
            }
        }
        inner.add_special_tokens(&special);
        inner.add_tokens(&user_defined);

        let is_added =
            |id: u32| matches!(token_types.get(id as usize), Some(&TOKEN_TYPE_CONTROL | &TOKEN_TYPE_USER_DEFINED));
        let mut eos_ids: Vec<u32> = [
            eos_id,
            meta_u32(metadata, "tokenizer.ggml.eot_token_id"),
            meta_u32(metadata, "tokenizer.ggml.eom_token_id"),
        ]
        .into_iter()
        .flatten()
        .collect();
        eos_ids.extend(end_of_turn_ids(&tokens, is_added));
        dedup_in_order(&mut eos_ids);

        let add_bos =
            metadata.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(pre == PreSplit::Llama3);
        let chat_template = metadata.get("tokenizer.chat_template").and_then(Value::as_str).map(str::to_string);
        Ok(Tokenizer { inner, tokens: spellings, bos_id, add_bos, eos_ids, pad_id, chat_template })
    }

    /// Loads `tokenizer.json`, `tokenizer_config.json`, `generation_config.json` and `chat_template.jinja`.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, LoadError> {
        let json_path = dir.join("tokenizer.json");
        if !json_path.is_file() {
            return Err(LoadError::Tokenizer {
                path: dir.to_path_buf(),
                fault: "no tokenizer.json in this directory".into(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&json_path)
            .map_err(|e| LoadError::Tokenizer { path: json_path.clone(), fault: e.to_string() })?;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let generation = read_json(&dir.join("generation_config.json"))?;
        let token_text = |key: &str| -> Option<String> {
            match config.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let id_of = |text: Option<String>| text.and_then(|t| inner.token_to_id(&t));

        let bos_id = id_of(token_text("bos_token")).or_else(|| json_ids(&generation, "bos_token_id").first().copied());
        let pad_id = id_of(token_text("pad_token"));
        let mut eos_ids: Vec<u32> = id_of(token_text("eos_token")).into_iter().collect();
        eos_ids.extend(json_ids(&generation, "eos_token_id"));
        let added = inner.get_added_tokens_decoder();
        let vocab = inner.get_vocab(true);
        let tokens = spellings_by_id(&vocab);
        let texts: Vec<&str> = tokens.iter().map(String::as_str).collect();
        eos_ids.extend(end_of_turn_ids(&texts, |id| added.get(&id).is_some_and(|t| t.special)));
        dedup_in_order(&mut eos_ids);

        // Without a flag, the tokenizer.json post-processor says whether the model wants BOS.
        let add_bos = match config.get("add_bos_token").and_then(|v| v.as_bool()) {
            Some(flag) => flag,
            None => {
                inner.encode_fast("", true).is_ok_and(|e| bos_id.is_some() && e.get_ids().first().copied() == bos_id)
            }
        };
        let jinja_path = dir.join("chat_template.jinja");
        let chat_template = match std::fs::read_to_string(&jinja_path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => template_from_config(config.get("chat_template")),
            Err(source) => return Err(LoadError::Io { path: jinja_path, source }),
        };
        Ok(Tokenizer { inner, tokens, bos_id, add_bos, eos_ids, pad_id, chat_template })
    }

    /// Token ids for `text`; special tokens written in it are honoured; BOS goes first only when
    /// the model wants it and `add_bos` is set.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self.inner.encode_fast(text, false).map_err(|e| TokenizeError::Encode(e.to_string()))?;
        let mut ids = Vec::with_capacity(encoding.len() + 1);
        if add_bos && self.add_bos {
            ids.extend(self.bos_id);
        }
        ids.extend_from_slice(encoding.get_ids());
        Ok(ids)
    }

    /// The text of `ids`, special tokens included; unknown ids contribute nothing.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_else(|e| {
            tracing::warn!("decoding {} ids: {e}", ids.len());
            String::new()
        })
    }

    /// The vocabulary's spelling of a token (byte-level form for GPT-2 style vocabularies).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The Hugging Face tokenizer underneath, for libraries that take one.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Every id that ends generation, the declared eos first.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_id.and_then(|id| self.token_str(id))
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_ids.first().and_then(|&id| self.token_str(id))
    }
}

/// Ids of added tokens whose text is a known end-of-turn marker.
fn end_of_turn_ids<'a>(tokens: &'a [&str], is_added: impl Fn(u32) -> bool + 'a) -> impl Iterator<Item = u32> + 'a {
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| END_OF_TURN.contains(t))
        .map(|(id, _)| id as u32)
        .filter(move |&id| is_added(id))
}

fn dedup_in_order(ids: &mut Vec<u32>) {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
}

/// A dense id-to-spelling table; ids nobody names get an empty spelling.
fn spellings_by_id(vocab: &std::collections::HashMap<String, u32>) -> Vec<String> {
    let len = vocab.values().max().map_or(0, |&m| m as usize + 1);
    let mut tokens = vec![String::new(); len];
    for (text, &id) in vocab {
        tokens[id as usize] = text.clone();
    }
    tokens
}

/// A JSON file as a value; a missing file is an empty object.
fn read_json(path: &Path) -> Result<serde_json::Value, LoadError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(serde_json::json!({})),
        Err(source) => return Err(LoadError::Io { path: path.to_path_buf(), source }),
    };
    serde_json::from_str(&text).map_err(|e| LoadError::Tokenizer { path: PathBuf::from(path), fault: e.to_string() })
}

/// A token id field that may be one integer or a list of them.
fn json_ids(json: &serde_json::Value, key: &str) -> Vec<u32> {
    let as_id = |v: &serde_json::Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match json.get(key) {
        Some(serde_json::Value::Array(list)) => list.iter().filter_map(as_id).collect(),
        Some(v) => as_id(v).into_iter().collect(),
        None => Vec::new(),
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which "default" is the one to use.
fn template_from_config(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => {
            let named = |name: &str| list.iter().find(|t| t.get("name").and_then(|n| n.as_str()) == Some(name));
            named("default").or_else(|| list.first()).and_then(|t| t.get("template")?.as_str()).map(str::to_string)
        }
        _ => None,
    }
}

/// Turns a stream of ids into text pieces, holding back bytes until they complete a character.
#[derive(Default)]
pub struct StreamDecoder {
    /// Ids from the start of the previous piece on; decoding with that context keeps spacing right.
    ids: Vec<u32>,
    /// How many of `ids` were already returned as text.
    num_read: usize,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// The text `id` completes, if any.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        self.ids.push(id);
        let incomplete = |text: &str| text.ends_with('\u{FFFD}');
        let before = tok.decode(&self.ids[..self.num_read]);
        let after = tok.decode(&self.ids);
        let held = self.ids.len() - self.num_read;
        if after.len() <= before.len() || (incomplete(&after) && held < MAX_HELD_TOKENS) {
            return None;
        }
        let piece = after[char_boundary_from(&after, before.len())..].to_string();
        self.ids.drain(..self.num_read);
        self.num_read = self.ids.len();
        Some(piece)
    }

    /// Whatever is still held back, with incomplete bytes as U+FFFD.
    pub fn finish(&mut self, tok: &Tokenizer) -> Option<String> {
        let before = tok.decode(&self.ids[..self.num_read]);
        let after = tok.decode(&self.ids);
        self.ids.clear();
        self.num_read = 0;
        let piece = &after[char_boundary_from(&after, before.len())..];
        (!piece.is_empty()).then(|| piece.to_string())
    }
}

/// The first char boundary at or after `at`: bytes forced out as U+FFFD may decode differently later.
fn char_boundary_from(text: &str, at: usize) -> usize {
    (at..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len())
}
