//! Speech codecs and PCM: the SNAC decoder for Drama's codes, the hibari voice's signal stage, and their wire forms
//! (PCM, WAV and the encoded response formats).

pub mod encode;
pub mod error;
pub mod hibari;
pub(crate) mod normal;
pub mod pcm;
pub mod snac;

pub use error::CodecError;
pub use snac::{SnacConfig, SnacDecoder};
