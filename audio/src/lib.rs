//! Speech codecs and PCM: the SNAC decoder that turns Drama's audio codes into samples, and their wire forms.

pub mod error;
pub mod hibari;
pub mod pcm;
pub mod snac;

pub use error::CodecError;
pub use snac::{SnacConfig, SnacDecoder};
