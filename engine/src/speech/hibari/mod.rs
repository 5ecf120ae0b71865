//! The hibari English voice, natively: its text front end (`g2p`), its network (`acoustic`), and its lanes (`voice`).

pub mod acoustic;
pub mod g2p;
pub mod voice;

pub use voice::{HibariText, HibariVoice, HIBARI_VOICES};
