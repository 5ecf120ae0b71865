//! Speech codecs: the SNAC decoder that turns Drama's audio codes into PCM.

pub mod error;
pub mod snac;

pub use error::CodecError;
pub use snac::{SnacConfig, SnacDecoder};
