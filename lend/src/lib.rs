//! Memory lent to tensorfold by another process: the lending protocol, its client, the reference daemon, and KV
//! buffers whose tail lies in the lent memory. Linux only: descriptors pass over `SOCK_SEQPACKET` unix sockets.

pub mod client;
pub mod daemon;
pub mod key;
pub mod kv;
pub mod pool;
pub mod wire;

pub use client::{claim, claim_drm, Claim, Lent, Refusal};
pub use key::{KeyError, KeySource};

/// Memory is asked for, lent and counted in whole slices of this many bytes.
pub const SLICE_BYTES: u64 = 2 << 20;

/// How long the client waits for the daemon's answer.
pub const ANSWER_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An ask in bytes rounded up to whole slices.
pub fn round_to_slices(bytes: u64) -> u64 {
    bytes.div_ceil(SLICE_BYTES).saturating_mul(SLICE_BYTES)
}

#[cfg(test)]
mod client_tests;
#[cfg(test)]
mod daemon_tests;
