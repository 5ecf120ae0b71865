//! What the engine knows of memory: the kinds the runtime's ledger counts, and a handle to memory it granted.

use std::ops::DerefMut;

/// What a block of memory is for; every kind but `Lent` counts against the same cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    Weights,
    KvCache,
    Activations,
    PinnedHost,
    /// Memory another process lent (the carveout): counted beside the cap, never against it.
    Lent,
}

impl MemoryKind {
    pub const ALL: [MemoryKind; 5] =
        [MemoryKind::Weights, MemoryKind::KvCache, MemoryKind::Activations, MemoryKind::PinnedHost, MemoryKind::Lent];

    /// The label used in metrics and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryKind::Weights => "weights",
            MemoryKind::KvCache => "kv_cache",
            MemoryKind::Activations => "activations",
            MemoryKind::PinnedHost => "pinned_host",
            MemoryKind::Lent => "lent",
        }
    }

    /// The kind's place in per-kind tables.
    pub fn index(self) -> usize {
        match self {
            MemoryKind::Weights => 0,
            MemoryKind::KvCache => 1,
            MemoryKind::Activations => 2,
            MemoryKind::PinnedHost => 3,
            MemoryKind::Lent => 4,
        }
    }
}

impl std::fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An address the driver handed out; a host address for host drivers, a device address otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub u64);

/// Memory granted under the runtime's cap; dropping it gives the bytes back. Host memory reads as floats.
pub trait DeviceMemory: DerefMut<Target = [f32]> + Send + Sync + std::fmt::Debug {
    fn kind(&self) -> MemoryKind;
    fn bytes(&self) -> usize;
    fn ptr(&self) -> DevicePtr;
    /// Whether the memory can be read on the host; device memory has only its pointer.
    fn is_host_addressable(&self) -> bool;
    /// The memory as bytes; empty for device memory.
    fn as_bytes_mut(&mut self) -> &mut [u8];
}

/// A grant of memory, owned by whoever holds it.
pub type Held = Box<dyn DeviceMemory>;

/// Why memory was not granted, as the ledger said it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MemoryError(pub String);

/// Asks the runtime's ledger for memory of a kind.
pub type Alloc<'a> = dyn FnMut(MemoryKind, usize) -> Result<Held, MemoryError> + 'a;

/// An `Alloc` a holder keeps and may call from another thread.
pub type OwnedAlloc = Box<dyn FnMut(MemoryKind, usize) -> Result<Held, MemoryError> + Send>;
