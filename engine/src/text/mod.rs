//! Text in and out of a model: the tokenizer and the chat template.

pub mod chat;
pub mod tokenizer;
