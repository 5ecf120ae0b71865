//! The capped ledger: every byte the runtime holds is reserved under one cap before the driver sees it.

use std::ops::Index;
use std::os::fd::BorrowedFd;

use thiserror::Error;

pub use tensorfold_engine::memory::{DevicePtr, MemoryKind};

/// Why the driver could not allocate.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DriverError {
    #[error("the driver is out of memory for {bytes} bytes")]
    OutOfMemory { bytes: usize },
    #[error("{bytes} bytes cannot be laid out by this driver")]
    InvalidSize { bytes: usize },
    #[error("driver call failed: {reason}")]
    Failed { reason: String },
}

/// The raw allocator behind the ledger: the system allocator on CPU, cuMemAlloc/cuMemAllocHost on CUDA.
pub trait DriverTable: Send {
    fn alloc(&mut self, kind: MemoryKind, bytes: usize) -> Result<DevicePtr, DriverError>;
    fn free(&mut self, kind: MemoryKind, ptr: DevicePtr, bytes: usize);
    /// Whether memory of this kind can be read through its pointer on the host; device memory cannot.
    fn is_host_addressable(&self, kind: MemoryKind) -> bool {
        let _ = kind;
        false
    }
    /// Maps `lent_bytes` of device memory another process shared as `lent`, then `own_bytes` of new device memory,
    /// back to back in one range: its start, and what holds the mapping until dropped. Host drivers refuse.
    fn map_lent(&mut self, own_bytes: usize, lent: BorrowedFd, lent_bytes: usize) -> Result<Mapping, DriverError> {
        let _ = (own_bytes, lent, lent_bytes);
        Err(DriverError::Failed { reason: "this driver cannot map lent device memory".into() })
    }
}

/// A range `map_lent` mapped: its start, and what unmaps it when dropped.
pub struct Mapping {
    pub ptr: DevicePtr,
    pub holder: Box<dyn Send + Sync>,
}

/// Why the ledger did not hand out memory.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LedgerError {
    #[error("allocation of {requested} bytes of {kind} refused: {used} of {cap} bytes in use")]
    Refused { kind: MemoryKind, requested: usize, used: usize, cap: usize },
    #[error("allocation of {requested} bytes of {kind} failed in the driver: {source}")]
    Driver {
        kind: MemoryKind,
        requested: usize,
        #[source]
        source: DriverError,
    },
    #[error("the device actor has stopped")]
    DeviceGone,
    #[error("allocation of {requested} bytes of {kind} overflows the byte count")]
    Overflow { kind: MemoryKind, requested: usize },
}

/// Byte counts, one per memory kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerKind([usize; 5]);

impl PerKind {
    pub fn get(&self, kind: MemoryKind) -> usize {
        self.0[kind.index()]
    }

    pub fn iter(&self) -> impl Iterator<Item = (MemoryKind, usize)> + '_ {
        MemoryKind::ALL.into_iter().map(|kind| (kind, self.get(kind)))
    }

    fn get_mut(&mut self, kind: MemoryKind) -> &mut usize {
        &mut self.0[kind.index()]
    }
}

impl Index<MemoryKind> for PerKind {
    type Output = usize;

    fn index(&self, kind: MemoryKind) -> &usize {
        &self.0[kind.index()]
    }
}

/// The ledger's counts at one moment, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerSnapshot {
    pub cap: Option<usize>,
    pub used: PerKind,
    pub peak: PerKind,
    pub total_used: usize,
    pub total_peak: usize,
    /// Allocations and adoptions the cap turned away.
    pub refusals: u64,
}

/// Accounts every allocation under an optional cap and forwards the ones it grants to the driver.
pub struct Ledger {
    cap: Option<usize>,
    driver: Box<dyn DriverTable>,
    used: PerKind,
    peak: PerKind,
    total_used: usize,
    total_peak: usize,
    refusals: u64,
}

impl Ledger {
    /// A ledger with no cap lets the driver decide when memory runs out.
    pub fn new(cap: Option<usize>, driver: Box<dyn DriverTable>) -> Ledger {
        Ledger {
            cap,
            driver,
            used: PerKind::default(),
            peak: PerKind::default(),
            total_used: 0,
            total_peak: 0,
            refusals: 0,
        }
    }

    pub fn cap(&self) -> Option<usize> {
        self.cap
    }

    /// Whether a pointer of this kind can be viewed as host memory.
    pub fn is_host_addressable(&self, kind: MemoryKind) -> bool {
        self.driver.is_host_addressable(kind)
    }

    /// Reserves under the cap, then calls the driver; a refused reservation never reaches it.
    pub fn allocate(&mut self, kind: MemoryKind, bytes: usize) -> Result<DevicePtr, LedgerError> {
        self.reserve(kind, bytes)?;
        match self.driver.alloc(kind, bytes) {
            Ok(ptr) => {
                self.record_peak(kind);
                Ok(ptr)
            }
            Err(source) => {
                // The driver holds nothing for a failed call, so its reservation must not linger.
                self.unreserve(kind, bytes);
                Err(LedgerError::Driver { kind, requested: bytes, source })
            }
        }
    }

    /// Returns memory from `allocate` to the driver and the cap.
    pub fn free(&mut self, kind: MemoryKind, ptr: DevicePtr, bytes: usize) {
        self.driver.free(kind, ptr, bytes);
        self.unreserve(kind, bytes);
    }

    /// Accounts memory allocated before the runtime started, under the same cap, without a driver call.
    pub fn adopt(&mut self, kind: MemoryKind, bytes: usize) -> Result<(), LedgerError> {
        self.reserve(kind, bytes)?;
        self.record_peak(kind);
        Ok(())
    }

    /// Reserves `own_bytes` under the cap and counts `lent_bytes` as lent, then maps both through the driver; a
    /// refused reservation never reaches it, and a failed call gives both back.
    pub fn map_lent(&mut self, own_bytes: usize, lent: BorrowedFd, lent_bytes: usize) -> Result<Mapping, LedgerError> {
        self.reserve(MemoryKind::KvCache, own_bytes)?;
        if let Err(e) = self.reserve(MemoryKind::Lent, lent_bytes) {
            self.unreserve(MemoryKind::KvCache, own_bytes);
            return Err(e);
        }
        match self.driver.map_lent(own_bytes, lent, lent_bytes) {
            Ok(mapping) => {
                self.record_peak(MemoryKind::KvCache);
                self.record_peak(MemoryKind::Lent);
                Ok(mapping)
            }
            Err(source) => {
                self.unreserve(MemoryKind::KvCache, own_bytes);
                self.unreserve(MemoryKind::Lent, lent_bytes);
                Err(LedgerError::Driver { kind: MemoryKind::Lent, requested: lent_bytes, source })
            }
        }
    }

    /// Gives back bytes taken by `adopt`; their owner frees the memory itself.
    pub fn release_adopted(&mut self, kind: MemoryKind, bytes: usize) {
        self.unreserve(kind, bytes);
    }

    pub fn snapshot(&self) -> LedgerSnapshot {
        LedgerSnapshot {
            cap: self.cap,
            used: self.used,
            peak: self.peak,
            total_used: self.total_used,
            total_peak: self.total_peak,
            refusals: self.refusals,
        }
    }

    fn reserve(&mut self, kind: MemoryKind, bytes: usize) -> Result<(), LedgerError> {
        if kind == MemoryKind::Lent {
            // Lent bytes are another process's: the ledger counts them, but they are not the cap's to spend.
            let used = self.used.get_mut(kind);
            *used = used.checked_add(bytes).ok_or(LedgerError::Overflow { kind, requested: bytes })?;
            return Ok(());
        }
        let Some(total) = self.total_used.checked_add(bytes) else {
            return Err(LedgerError::Overflow { kind, requested: bytes });
        };
        if let Some(cap) = self.cap {
            if total > cap {
                self.refusals += 1;
                return Err(LedgerError::Refused { kind, requested: bytes, used: self.total_used, cap });
            }
        }
        // Per-kind counts never exceed the total, so this cannot overflow once the total did not.
        *self.used.get_mut(kind) += bytes;
        self.total_used = total;
        Ok(())
    }

    fn unreserve(&mut self, kind: MemoryKind, bytes: usize) {
        let used = self.used.get_mut(kind);
        if bytes > *used {
            tracing::warn!(kind = kind.as_str(), bytes, held = *used, "ledger asked to release more than it holds");
        }
        let released = bytes.min(*used);
        *used -= released;
        if kind != MemoryKind::Lent {
            self.total_used -= released;
        }
    }

    fn record_peak(&mut self, kind: MemoryKind) {
        let peak = self.peak.get_mut(kind);
        *peak = (*peak).max(self.used.get(kind));
        self.total_peak = self.total_peak.max(self.total_used);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// Counts driver calls and can be told to fail; shared so a test can watch it after handing it over.
    #[derive(Default)]
    pub(crate) struct FakeDriverState {
        pub alloc_calls: AtomicUsize,
        pub free_calls: AtomicUsize,
        pub live_bytes: AtomicUsize,
        pub fail: AtomicBool,
        next_ptr: AtomicUsize,
    }

    pub(crate) struct FakeDriver(pub Arc<FakeDriverState>);

    impl FakeDriver {
        pub(crate) fn boxed() -> (Box<dyn DriverTable>, Arc<FakeDriverState>) {
            let state = Arc::new(FakeDriverState::default());
            (Box::new(FakeDriver(Arc::clone(&state))), state)
        }
    }

    impl DriverTable for FakeDriver {
        fn alloc(&mut self, _kind: MemoryKind, bytes: usize) -> Result<DevicePtr, DriverError> {
            self.0.alloc_calls.fetch_add(1, Ordering::SeqCst);
            if self.0.fail.load(Ordering::SeqCst) {
                return Err(DriverError::OutOfMemory { bytes });
            }
            self.0.live_bytes.fetch_add(bytes, Ordering::SeqCst);
            let id = self.0.next_ptr.fetch_add(1, Ordering::SeqCst) as u64 + 1;
            Ok(DevicePtr(id << 12))
        }

        fn free(&mut self, _kind: MemoryKind, _ptr: DevicePtr, bytes: usize) {
            self.0.free_calls.fetch_add(1, Ordering::SeqCst);
            self.0.live_bytes.fetch_sub(bytes, Ordering::SeqCst);
        }

        fn map_lent(&mut self, own: usize, _lent: BorrowedFd, lent_bytes: usize) -> Result<Mapping, DriverError> {
            let ptr = self.alloc(MemoryKind::KvCache, own + lent_bytes)?;
            Ok(Mapping { ptr, holder: Box::new(()) })
        }
    }

    #[test]
    fn test_mapping_lent_memory_counts_own_bytes_under_the_cap_and_lent_bytes_beside_it() {
        let (driver, state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(100), driver);
        let fd = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsFd::as_fd(&fd);
        ledger.map_lent(60, fd, 1000).unwrap();
        let snap = ledger.snapshot();
        assert_eq!(
            (snap.used.get(MemoryKind::KvCache), snap.used.get(MemoryKind::Lent), snap.total_used),
            (60, 1000, 60)
        );
        // Over the cap: refused before the driver, and nothing lingers.
        assert!(matches!(ledger.map_lent(50, fd, 10), Err(LedgerError::Refused { .. })));
        assert_eq!(state.alloc_calls.load(Ordering::SeqCst), 1);
        // A failed driver call gives both kinds back.
        state.fail.store(true, Ordering::SeqCst);
        assert!(matches!(ledger.map_lent(20, fd, 10), Err(LedgerError::Driver { .. })));
        let snap = ledger.snapshot();
        assert_eq!(
            (snap.used.get(MemoryKind::KvCache), snap.used.get(MemoryKind::Lent), snap.total_used),
            (60, 1000, 60)
        );
        ledger.release_adopted(MemoryKind::KvCache, 60);
        ledger.release_adopted(MemoryKind::Lent, 1000);
        assert_eq!(ledger.snapshot().total_used, 0);
    }

    #[test]
    fn test_cap_refusal_never_calls_driver() {
        let (driver, state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(1000), driver);
        let ptr = ledger.allocate(MemoryKind::KvCache, 600).expect("fits under the cap");
        let before = ledger.snapshot();
        let err = ledger.allocate(MemoryKind::Activations, 401).unwrap_err();
        assert_eq!(err, LedgerError::Refused { kind: MemoryKind::Activations, requested: 401, used: 600, cap: 1000 });
        assert_eq!(state.alloc_calls.load(Ordering::SeqCst), 1);
        let after = ledger.snapshot();
        assert_eq!(after.refusals, 1);
        assert_eq!(LedgerSnapshot { refusals: 0, ..after }, before);
        ledger.allocate(MemoryKind::Activations, 400).expect("exactly at the cap is allowed");
        assert_eq!(ledger.snapshot().total_used, 1000);
        ledger.free(MemoryKind::KvCache, ptr, 600);
        assert_eq!(ledger.snapshot().total_used, 400);
    }

    #[test]
    fn test_driver_failure_refunds_reservation() {
        let (driver, state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(1000), driver);
        ledger.allocate(MemoryKind::Weights, 300).expect("fits");
        let before = ledger.snapshot();
        state.fail.store(true, Ordering::SeqCst);
        let err = ledger.allocate(MemoryKind::KvCache, 500).unwrap_err();
        assert!(matches!(err, LedgerError::Driver { kind: MemoryKind::KvCache, requested: 500, .. }));
        assert_eq!(state.alloc_calls.load(Ordering::SeqCst), 2);
        assert_eq!(ledger.snapshot(), before, "usage, peak and refusals unchanged by a failed driver call");
        state.fail.store(false, Ordering::SeqCst);
        ledger.allocate(MemoryKind::KvCache, 700).expect("the refunded bytes are available again");
        assert_eq!(ledger.snapshot().total_used, 1000);
    }

    #[test]
    fn test_uncapped_ledger_grants_and_tracks() {
        let (driver, _state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(None, driver);
        let ptr = ledger.allocate(MemoryKind::PinnedHost, usize::MAX / 2).expect("no cap");
        assert_eq!(
            ledger.allocate(MemoryKind::PinnedHost, usize::MAX),
            Err(LedgerError::Overflow { kind: MemoryKind::PinnedHost, requested: usize::MAX })
        );
        ledger.free(MemoryKind::PinnedHost, ptr, usize::MAX / 2);
        let snap = ledger.snapshot();
        assert_eq!((snap.total_used, snap.total_peak, snap.refusals), (0, usize::MAX / 2, 0));
    }

    #[test]
    fn test_adopt_counts_against_cap() {
        let (driver, state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(1000), driver);
        ledger.adopt(MemoryKind::Weights, 900).expect("weights fit");
        assert_eq!(state.alloc_calls.load(Ordering::SeqCst), 0, "adoption makes no driver call");
        let err = ledger.allocate(MemoryKind::KvCache, 200).unwrap_err();
        assert!(matches!(err, LedgerError::Refused { used: 900, cap: 1000, .. }));
        assert!(matches!(ledger.adopt(MemoryKind::Weights, 101), Err(LedgerError::Refused { .. })));
        assert_eq!(state.alloc_calls.load(Ordering::SeqCst), 0);
        let snap = ledger.snapshot();
        assert_eq!((snap.used[MemoryKind::Weights], snap.total_used, snap.refusals), (900, 900, 2));
        ledger.release_adopted(MemoryKind::Weights, 900);
        ledger.allocate(MemoryKind::KvCache, 1000).expect("released adoption frees the cap");
    }

    #[test]
    fn test_over_release_saturates() {
        let (driver, _state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(100), driver);
        ledger.adopt(MemoryKind::Weights, 10).expect("fits");
        ledger.adopt(MemoryKind::KvCache, 20).expect("fits");
        ledger.release_adopted(MemoryKind::Weights, 50);
        let snap = ledger.snapshot();
        assert_eq!((snap.used[MemoryKind::Weights], snap.used[MemoryKind::KvCache], snap.total_used), (0, 20, 20));
    }

    #[test]
    fn test_lent_bytes_are_counted_beside_the_cap_not_against_it() {
        let (driver, state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(1000), driver);
        ledger.adopt(MemoryKind::Lent, 1 << 30).expect("lent bytes are not the cap's");
        ledger.allocate(MemoryKind::KvCache, 1000).expect("the whole cap is still there");
        let snap = ledger.snapshot();
        assert_eq!((snap.used[MemoryKind::Lent], snap.total_used, snap.total_peak), (1 << 30, 1000, 1000));
        assert_eq!((snap.peak[MemoryKind::Lent], snap.refusals), (1 << 30, 0));
        ledger.release_adopted(MemoryKind::Lent, 1 << 30);
        let snap = ledger.snapshot();
        assert_eq!((snap.used[MemoryKind::Lent], snap.total_used), (0, 1000));
        assert_eq!(state.alloc_calls.load(Ordering::SeqCst), 1);
    }

    /// A small deterministic generator so the interleaving is the same on every run.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, below: usize) -> usize {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 33) as usize) % below
        }
    }

    #[test]
    fn test_overlapping_lanes_account_exactly() {
        const CAP: usize = 64 * 1024;
        const NUM_LANES: usize = 6;
        let (driver, state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(CAP), driver);
        ledger.adopt(MemoryKind::Weights, 8 * 1024).expect("weights fit");
        let mut lanes: Vec<Vec<(MemoryKind, DevicePtr, usize)>> = vec![Vec::new(); NUM_LANES];
        let mut used = PerKind::default();
        *used.get_mut(MemoryKind::Weights) = 8 * 1024;
        let mut peak = used;
        let mut total_peak = 8 * 1024;
        let mut refusals = 0u64;
        let mut failures = 0usize;
        let mut rng = Lcg(0x5eed);
        for step in 0..4000 {
            let lane = rng.next(NUM_LANES);
            let freeing = !lanes[lane].is_empty() && rng.next(3) == 0;
            if freeing {
                let at = rng.next(lanes[lane].len());
                let (kind, ptr, bytes) = lanes[lane].swap_remove(at);
                ledger.free(kind, ptr, bytes);
                *used.get_mut(kind) -= bytes;
            } else {
                let kind = [MemoryKind::KvCache, MemoryKind::Activations, MemoryKind::PinnedHost][rng.next(3)];
                let bytes = 64 * (1 + rng.next(64));
                let fail = step % 97 == 0;
                state.fail.store(fail, Ordering::SeqCst);
                let total: usize = used.iter().map(|(_, b)| b).sum();
                match ledger.allocate(kind, bytes) {
                    Ok(ptr) => {
                        assert!(!fail && total + bytes <= CAP, "step {step}: granted past the cap or a failure");
                        lanes[lane].push((kind, ptr, bytes));
                        *used.get_mut(kind) += bytes;
                        *peak.get_mut(kind) = peak.get(kind).max(used.get(kind));
                        total_peak = total_peak.max(total + bytes);
                    }
                    Err(LedgerError::Refused { used: at, .. }) => {
                        assert!(total + bytes > CAP, "step {step}: refused under the cap");
                        assert_eq!(at, total);
                        refusals += 1;
                    }
                    Err(LedgerError::Driver { .. }) => {
                        assert!(fail && total + bytes <= CAP);
                        failures += 1;
                    }
                    Err(other) => panic!("step {step}: unexpected {other}"),
                }
            }
            let snap = ledger.snapshot();
            let total: usize = used.iter().map(|(_, b)| b).sum();
            assert_eq!(snap.used, used, "step {step}");
            assert_eq!(snap.peak, peak, "step {step}");
            assert_eq!((snap.total_used, snap.total_peak, snap.refusals), (total, total_peak, refusals));
            assert_eq!(state.live_bytes.load(Ordering::SeqCst), total - used.get(MemoryKind::Weights));
        }
        assert!(refusals > 0 && failures > 0, "the run must exercise both refusals and driver failures");
        assert!(total_peak < MemoryKind::ALL.iter().map(|&k| peak.get(k)).sum::<usize>());
        for lane in lanes {
            for (kind, ptr, bytes) in lane {
                ledger.free(kind, ptr, bytes);
            }
        }
        ledger.release_adopted(MemoryKind::Weights, 8 * 1024);
        let snap = ledger.snapshot();
        assert_eq!((snap.total_used, state.live_bytes.load(Ordering::SeqCst)), (0, 0));
        assert_eq!(snap.total_peak, total_peak);
    }
}
