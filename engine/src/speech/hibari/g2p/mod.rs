//! English text to the voice's phonemes and ids, a native port of the hibari-tts wheel's US English front end.

mod files;
mod lexicon;
mod lexicon_number;
mod normalize;
mod numbers;
mod oov;
mod pipeline;
mod pyre;
mod pystr;
mod tagger;
mod token;
mod tokenize;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fancy_regex::Regex;

use crate::checkpoint::onnx::OnnxError;
use pipeline::Pipeline;
use pyre::{compile, find_ranges, split, NOT_SPACE, SPACE};

/// Sentences whose phonemes are longer than this are split at clause punctuation.
pub const MAX_PHONEMES: usize = 400;

#[derive(Debug, thiserror::Error)]
pub enum G2pError {
    #[error("{}: missing", path.display())]
    Missing { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: bad JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{}: {reason}", path.display())]
    Format { path: PathBuf, reason: String },
    #[error("{source}")]
    Onnx { path: PathBuf, source: OnnxError },
    #[error("pattern {pattern:?} does not compile: {reason}")]
    Pattern { pattern: String, reason: String },
}

/// The English front end: text to phoneme strings and phoneme strings to ids.
pub struct G2p {
    pipeline: Pipeline,
    vocab: HashMap<char, i64>,
    paragraph: Regex,
    sentence_end: Regex,
    clause: Regex,
}

impl G2p {
    /// Loads the lexicons, tagger, tables and OOV network from the voice's directory.
    pub fn load(dir: &Path) -> Result<G2p, G2pError> {
        let (lexicon, tagger, rest) = std::thread::scope(|s| {
            let lexicon = s.spawn(|| lexicon::Lexicon::load(dir));
            let tagger = s.spawn(|| tagger::Tagger::load(dir));
            let rest = (normalize::Normalizer::load(dir), tokenize::Tokenizer::load(dir), oov::Oov::load(dir));
            (lexicon.join(), tagger.join(), rest)
        });
        let joined =
            |what: &str| G2pError::Format { path: dir.to_path_buf(), reason: format!("loading the {what} panicked") };
        let lexicon = lexicon.map_err(|_| joined("lexicon"))??;
        let tagger = tagger.map_err(|_| joined("tagger"))??;
        let (normalizer, tokenizer, oov) = (rest.0?, rest.1?, rest.2?);
        let vocab_path = dir.join("vocab.json");
        let vocab: HashMap<String, i64> = files::json(dir, "vocab.json")?;
        let mut by_char = HashMap::with_capacity(vocab.len());
        for (k, v) in vocab {
            let mut chars = k.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => by_char.insert(c, v),
                _ => {
                    return Err(G2pError::Format {
                        path: vocab_path,
                        reason: format!("key {k:?} is not one character"),
                    })
                }
            };
        }
        Ok(G2p {
            pipeline: Pipeline::new(normalizer, tokenizer, tagger, lexicon, oov)?,
            vocab: by_char,
            paragraph: compile(&format!(r"\n{SPACE}*\n|\n"))?,
            sentence_end: compile(&format!(r#"(?<=[.!?…])["”’)\]]*{SPACE}+(?={NOT_SPACE})"#))?,
            clause: compile(&format!("(?<=[,;:—]){SPACE}+"))?,
        })
    }

    /// False for a period after a title or an initial ("Dr. Smith", "J. K. Rowling") or before a lowercase word.
    fn ends_sentence(&self, para: &str, end: usize, next: char) -> bool {
        if pystr::str_is_lower(&next.to_string()) {
            return false;
        }
        if !para[..end].ends_with('.') {
            return true;
        }
        let start = para[..end].rfind(' ').map_or(0, |i| i + 1);
        let word = para[start..end - 1].trim_start_matches(['(', '"', '“', '\'', '‘']);
        !(self.pipeline.normalizer.is_title(word) || (pystr::len(word) == 1 && pystr::str_is_upper(word)))
    }

    /// Sentences: paragraph breaks and end punctuation, each a string the model sees at once.
    pub fn split_sentences(&self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        for para in split(&self.paragraph, pystr::strip(text)) {
            let para = pystr::strip(para);
            let mut cut = 0;
            for (start, end) in find_ranges(&self.sentence_end, para) {
                let next = para[end..].chars().next().unwrap_or(' ');
                if self.ends_sentence(para, start, next) {
                    out.push(para[cut..start].to_string());
                    cut = end;
                }
            }
            out.push(para[cut..].to_string());
        }
        out.retain(|s| !pystr::strip(s).is_empty());
        out
    }

    /// The phonemes of one sentence, without splitting.
    pub fn phonemize_sentence(&self, sentence: &str) -> String {
        self.pipeline.phonemize(sentence)
    }

    /// Phoneme strings, one per sentence, long sentences split at clause punctuation.
    pub fn phonemize(&self, text: &str) -> Vec<String> {
        let mut chunks = Vec::new();
        for sentence in self.split_sentences(text) {
            let ps = self.phonemize_sentence(&sentence);
            if ps.is_empty() {
                continue;
            }
            if pystr::len(&ps) <= MAX_PHONEMES {
                chunks.push(ps);
                continue;
            }
            let mut cur = String::new();
            for part in split(&self.clause, &ps) {
                if !cur.is_empty() && pystr::len(&cur) + pystr::len(part) + 1 > MAX_PHONEMES {
                    chunks.push(std::mem::replace(&mut cur, part.to_string()));
                } else if cur.is_empty() {
                    cur = part.to_string();
                } else {
                    cur = format!("{cur} {part}");
                }
            }
            if !cur.is_empty() {
                chunks.push(cur);
            }
        }
        chunks
    }

    /// The acoustic network's ids for a phoneme string, 0 before and after; unknown characters are dropped.
    pub fn ids(&self, phonemes: &str) -> Vec<i64> {
        let mut out = vec![0];
        out.extend(phonemes.chars().filter_map(|c| self.vocab.get(&c).copied()));
        out.push(0);
        out
    }

    /// The OOV network's reading of one word (None when it has no letter the network knows).
    pub fn read_unknown(&self, word: &str) -> Option<String> {
        self.pipeline.oov.read(word)
    }
}
