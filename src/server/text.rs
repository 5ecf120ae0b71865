//! The text endpoints: chat completions, completions and embeddings, from OpenAI's wire types through
//! validation to streamed or collected replies.

pub mod embeddings;
pub mod openai;
pub mod reply;
pub mod responses;
pub mod routes;
pub mod rules;
pub mod sse;
pub mod tools;
pub mod validate;
