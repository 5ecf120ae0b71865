//! Text in and out of a model: the tokenizer, the chat template and grammars for constrained decoding.

pub mod chat;
pub mod grammar;
pub mod reasoning;
pub mod tokenizer;
pub mod tool_calls;
