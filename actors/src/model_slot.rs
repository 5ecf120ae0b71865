//! One model as the engine thread holds it.

use tensorfold_engine::boundary::{Codec, Engine, KvPool, Synth};

/// One model as the engine thread holds it: a token model with its KV pool (and codec, for speech), or a voice.
pub enum ModelSlot {
    Tokens { engine: Box<dyn Engine>, pool: KvPool, codec: Option<Box<dyn Codec>> },
    Voice(Box<dyn Synth>),
}
