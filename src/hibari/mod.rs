//! The hibari English voice, natively: its text front end (`g2p`) and its acoustic network (`acoustic`).

pub mod acoustic;
pub mod g2p;
