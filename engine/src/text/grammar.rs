//! Constrained decoding: JSON schemas and Lark grammars compiled by llguidance into a lane's token masks.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie_hf_tokenizers::ByteTokenizer;

use super::tokenizer::Tokenizer;
use crate::boundary::Constraint;

/// What a lane's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object.
    JsonObject,
    /// A JSON document valid under the schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax (`%json { .. }` embeds a schema).
    Lark(String),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("this model's tokenizer cannot drive a grammar: {0}")]
    Tokenizer(String),
    #[error("the grammar does not compile: {0}")]
    Compile(String),
}

/// The grammar compiler of one tokenizer: its token tables are built on the first compile and shared.
#[derive(Clone)]
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    factory: Arc<OnceLock<Result<ParserFactory, GrammarError>>>,
}

impl Grammars {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Grammars {
        Grammars { tokenizer, factory: Arc::default() }
    }

    /// A lane's constraint for `spec`; the error names what did not compile.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Box<dyn Constraint>, GrammarError> {
        let factory = self.factory.get_or_init(|| factory(&self.tokenizer)).as_ref().map_err(Clone::clone)?;
        let grammar = match spec {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema.clone())),
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        let parser = factory.create_parser(grammar).map_err(|e| GrammarError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(GrammarError::Compile(e)),
            None => Ok(Box::new(Grammar { matcher, words: self.tokenizer.vocab_size().div_ceil(32), past_end: 0 })),
        }
    }
}

/// JSON with one space after separators and no other whitespace, so a model cannot pad its output forever.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        let options = serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        map.entry("x-guidance").or_insert(options);
    }
    schema
}

fn factory(tokenizer: &Tokenizer) -> Result<ParserFactory, GrammarError> {
    let wrong = |e: anyhow::Error| GrammarError::Tokenizer(e.to_string());
    let mut bytes = ByteTokenizer::from_tokenizer(tokenizer.hf().clone()).map_err(wrong)?;
    bytes.set_eos_tokens(tokenizer.eos_ids());
    let env = bytes.into_tok_env(None).map_err(wrong)?;
    let mut factory = ParserFactory::new_simple(&env).map_err(wrong)?;
    factory.quiet();
    Ok(factory)
}

/// One lane's grammar state: the tokens committed so far.
struct Grammar {
    matcher: Matcher,
    /// Mask words over the tokenizer's vocabulary.
    words: usize,
    /// Tokens committed after the grammar was complete.
    past_end: usize,
}

impl Constraint for Grammar {
    fn allowed(&mut self) -> Result<Vec<u32>, String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        let mut words = mask.as_slice().to_vec();
        words.resize(self.words, 0);
        Ok(words)
    }

    fn commit(&mut self, id: u32) -> Result<(), String> {
        // A complete grammar allows only the end of text, which it does not consume.
        if self.matcher.is_stopped() {
            self.past_end += 1;
            return Ok(());
        }
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }

    fn rollback(&mut self, n: usize) -> Result<(), String> {
        let past_end = n.min(self.past_end);
        self.past_end -= past_end;
        match n - past_end {
            0 => Ok(()),
            rest => self.matcher.rollback(rest).map_err(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::Tokenizer;

    /// A byte-level BPE tokenizer with every byte as a token, plus an end-of-text token.
    fn bytes_tokenizer() -> Arc<Tokenizer> {
        let dir = tempfile::tempdir().expect("a temp dir");
        let alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet().into_iter().collect();
        let mut vocab: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
        vocab.sort();
        let mut map: serde_json::Map<String, Value> =
            vocab.iter().enumerate().map(|(i, t)| (t.clone(), Value::from(i))).collect();
        let eos = vocab.len();
        map.insert("<|endoftext|>".into(), Value::from(eos));
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": eos, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": map, "merges": []},
        });
        let config = serde_json::json!({"eos_token": "<|endoftext|>", "bos_token": null});
        std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).expect("writes tokenizer.json");
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("writes the config");
        Arc::new(Tokenizer::from_hf_dir(dir.path()).expect("the tokenizer loads"))
    }

    fn allowed_ids(constraint: &mut dyn Constraint) -> Vec<u32> {
        let words = constraint.allowed().expect("a mask");
        (0..words.len() as u32 * 32).filter(|&i| words[i as usize / 32] >> (i % 32) & 1 == 1).collect()
    }

    /// Follows the grammar by always taking the lowest allowed id until it is done.
    fn walk(tokenizer: &Tokenizer, constraint: &mut dyn Constraint) -> String {
        let mut ids = Vec::new();
        while ids.len() < 200 {
            let id = allowed_ids(constraint)[0];
            if tokenizer.eos_ids().contains(&id) {
                break;
            }
            constraint.commit(id).expect("an allowed token commits");
            ids.push(id);
        }
        tokenizer.decode(&ids)
    }

    #[test]
    fn test_a_schema_masks_every_step_to_json_that_matches_it() {
        let tokenizer = bytes_tokenizer();
        let grammars = Grammars::new(Arc::clone(&tokenizer));
        let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
            "additionalProperties": false});
        let mut constraint = grammars.compile(&GrammarSpec::JsonSchema(schema)).expect("compiles");
        let first = allowed_ids(constraint.as_mut());
        assert_eq!(first, vec![tokenizer.token_id("{").expect("a brace token")], "only '{{' may start");
        let text = walk(&tokenizer, constraint.as_mut());
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
        assert!(value["n"].is_number() && value.as_object().is_some_and(|o| o.len() == 1), "{text}");
    }

    #[test]
    fn test_a_complete_grammar_takes_the_end_of_text_and_gives_it_back() {
        let tokenizer = bytes_tokenizer();
        let mut constraint = Grammars::new(Arc::clone(&tokenizer)).compile(&GrammarSpec::JsonObject).expect("compiles");
        let eos = tokenizer.eos_ids()[0];
        for text in ["{", "}"] {
            constraint.commit(tokenizer.token_id(text).expect("a token")).expect("commits");
        }
        assert_eq!(allowed_ids(constraint.as_mut()), vec![eos], "only the end of text after a whole object");
        constraint.commit(eos).expect("the end of text commits");
        constraint.rollback(2).expect("rolls back past the end and the brace");
        assert!(allowed_ids(constraint.as_mut()).contains(&tokenizer.token_id("}").expect("a token")));
    }

    #[test]
    fn test_rollback_gives_back_the_mask_before_the_tokens() {
        let tokenizer = bytes_tokenizer();
        let mut constraint = Grammars::new(Arc::clone(&tokenizer)).compile(&GrammarSpec::JsonObject).expect("compiles");
        let before = constraint.allowed().expect("a mask");
        let brace = tokenizer.token_id("{").expect("a brace token");
        constraint.commit(brace).expect("commits");
        assert_ne!(constraint.allowed().expect("a mask"), before);
        constraint.rollback(1).expect("rolls back");
        assert_eq!(constraint.allowed().expect("a mask"), before);
    }

    #[test]
    fn test_a_bad_schema_or_grammar_names_the_problem() {
        let grammars = Grammars::new(bytes_tokenizer());
        let bad = GrammarSpec::JsonSchema(serde_json::json!({"type": "no-such-type"}));
        let message = grammars.compile(&bad).err().expect("refused").to_string();
        assert!(message.contains("no-such-type"), "{message}");
        let lark = grammars.compile(&GrammarSpec::Lark("start: undefined_rule".into())).err().expect("refused");
        assert!(lark.to_string().contains("undefined_rule"), "{lark}");
    }
}
