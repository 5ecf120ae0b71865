//! The speech families: Drama (a Llama over SNAC codes), hibari (the default voice), the voice set they share, and their speakers.

pub mod drama;
pub mod hibari;
pub mod speakers;
pub mod voices;
