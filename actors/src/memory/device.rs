//! The device actor: owns the ledger, hands out allocations that give their bytes back when dropped.

use std::alloc::Layout;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use actix::prelude::*;
use tensorfold_lend::Lent;

use crate::memory::ledger::{DevicePtr, DriverError, DriverTable, Ledger, LedgerError, LedgerSnapshot, MemoryKind};

/// Alignment of host allocations: the kernels load unaligned, and up to 16 lets large zeroed blocks map lazily.
pub const HOST_ALIGN: usize = 16;

/// The CPU backend's driver: the system allocator, zeroed, resident and 16-byte aligned.
pub struct CpuDriver;

/// The operating system's smallest page: touching one byte in each makes an allocation resident.
const OS_PAGE: usize = 4096;

/// The driver for the CPU backend.
pub fn cpu_driver() -> Box<dyn DriverTable> {
    Box::new(CpuDriver)
}

impl DriverTable for CpuDriver {
    fn alloc(&mut self, _kind: MemoryKind, bytes: usize) -> Result<DevicePtr, DriverError> {
        if bytes == 0 {
            // The system allocator must not be asked for zero bytes; an aligned dangling address stands in.
            return Ok(DevicePtr(HOST_ALIGN as u64));
        }
        let layout = Layout::from_size_align(bytes, HOST_ALIGN).map_err(|_| DriverError::InvalidSize { bytes })?;
        // SAFETY: the layout has a non-zero size, checked above.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(DriverError::OutOfMemory { bytes });
        }
        // Touched now, the bytes are resident: a machine that cannot hold them fails at start-up, not under load,
        // and resident memory stays flat while serving.
        for at in (0..bytes).step_by(OS_PAGE) {
            // SAFETY: `at` is inside the `bytes` just allocated.
            unsafe { ptr.add(at).write_volatile(0) };
        }
        Ok(DevicePtr(ptr.expose_provenance() as u64))
    }

    fn free(&mut self, _kind: MemoryKind, ptr: DevicePtr, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let Ok(layout) = Layout::from_size_align(bytes, HOST_ALIGN) else {
            return;
        };
        let raw = std::ptr::with_exposed_provenance_mut::<u8>(ptr.0 as usize);
        // SAFETY: only `Allocation` frees, with the pointer and size this driver returned for it.
        unsafe { std::alloc::dealloc(raw, layout) };
    }

    fn is_host_addressable(&self, _kind: MemoryKind) -> bool {
        true
    }
}

/// Asks for memory of one kind under the cap.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<Allocation, LedgerError>")]
pub struct Allocate {
    pub kind: MemoryKind,
    pub bytes: usize,
}

/// Accounts memory allocated before the runtime started, such as CPU weights from the loader.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<Adoption, LedgerError>")]
pub struct Adopt {
    pub kind: MemoryKind,
    pub bytes: usize,
}

/// Maps lent device memory with `own_bytes` of the process's own in one range, through the ledger.
#[derive(Message)]
#[rtype(result = "Result<MappedLent, LedgerError>")]
pub struct MapLent {
    pub own_bytes: usize,
    pub lent: Arc<Lent>,
}

/// Reads the ledger's counts.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "LedgerSnapshot")]
pub struct Snapshot;

/// Asks whether memory of a kind is host memory, which lent host memory can stand beside.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "bool")]
pub struct IsHostAddressable(pub MemoryKind);

/// Returns an allocation's or adoption's bytes; only their drops can build one, so no pointer is freed twice.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Free {
    kind: MemoryKind,
    bytes: usize,
    /// `None` for an adoption, whose memory its owner frees.
    ptr: Option<DevicePtr>,
}

/// Memory granted by the device actor; dropping it returns the bytes. Not `Clone`, so it is freed once.
pub struct Allocation {
    kind: MemoryKind,
    bytes: usize,
    ptr: DevicePtr,
    host: bool,
    owner: Recipient<Free>,
}

impl Allocation {
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Whether the memory can be read on the host; device memory has only its pointer.
    pub fn is_host_addressable(&self) -> bool {
        self.host
    }

    /// The memory as `bytes / 4` floats, zeroed at first; empty for device memory, which the host cannot read.
    pub fn as_f32(&self) -> &[f32] {
        if !self.host {
            return &[];
        }
        let raw = std::ptr::with_exposed_provenance::<f32>(self.ptr.0 as usize);
        // SAFETY: a host driver gave this aligned, initialised pointer for `bytes`, live until this handle drops.
        unsafe { std::slice::from_raw_parts(raw, self.bytes / 4) }
    }

    /// The memory as mutable floats; the handle is the memory's only owner, so the borrow is exclusive.
    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        if !self.host {
            return &mut [];
        }
        let raw = std::ptr::with_exposed_provenance_mut::<f32>(self.ptr.0 as usize);
        // SAFETY: as in `as_f32`, and `&mut self` rules out any other view of this memory.
        unsafe { std::slice::from_raw_parts_mut(raw, self.bytes / 4) }
    }
}

impl Allocation {
    /// The memory as bytes; empty for device memory.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        if !self.host {
            return &mut [];
        }
        let raw = std::ptr::with_exposed_provenance_mut::<u8>(self.ptr.0 as usize);
        // SAFETY: as in `as_f32_mut`.
        unsafe { std::slice::from_raw_parts_mut(raw, self.bytes) }
    }
}

impl tensorfold_engine::memory::DeviceMemory for Allocation {
    fn kind(&self) -> MemoryKind {
        self.kind
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    fn is_host_addressable(&self) -> bool {
        self.host
    }

    fn as_bytes_mut(&mut self) -> &mut [u8] {
        Allocation::as_bytes_mut(self)
    }
}

impl Deref for Allocation {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        self.as_f32()
    }
}

impl DerefMut for Allocation {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.as_f32_mut()
    }
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("kind", &self.kind)
            .field("bytes", &self.bytes)
            .field("ptr", &self.ptr)
            .finish()
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // A stopped actor took its ledger with it, so there is nothing left to return the bytes to.
        self.owner.do_send(Free { kind: self.kind, bytes: self.bytes, ptr: Some(self.ptr) });
    }
}

/// Bytes adopted under the cap; dropping it gives them back. Not `Clone`, so it is released once.
pub struct Adoption {
    kind: MemoryKind,
    bytes: usize,
    owner: Recipient<Free>,
}

impl Adoption {
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for Adoption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adoption").field("kind", &self.kind).field("bytes", &self.bytes).finish()
    }
}

impl Drop for Adoption {
    fn drop(&mut self) {
        self.owner.do_send(Free { kind: self.kind, bytes: self.bytes, ptr: None });
    }
}

/// A range of lent and own device memory; dropping it unmaps it on the device thread, gives its bytes back to the
/// ledger, and then the lent memory to its lender.
pub struct MappedLent {
    ptr: DevicePtr,
    own_bytes: usize,
    lent: Option<Arc<Lent>>,
    holder: Option<Box<dyn Send + Sync>>,
    owner: Recipient<Unmap>,
}

impl MappedLent {
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

// Device memory has no host view.
impl Deref for MappedLent {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &[]
    }
}

impl DerefMut for MappedLent {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut []
    }
}

impl Drop for MappedLent {
    fn drop(&mut self) {
        let (holder, lent) = (self.holder.take(), self.lent.take());
        self.owner.do_send(Unmap { holder, own_bytes: self.own_bytes, lent });
    }
}

/// Returns a `MappedLent`'s range; only its drop builds one.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unmap {
    holder: Option<Box<dyn Send + Sync>>,
    own_bytes: usize,
    lent: Option<Arc<Lent>>,
}

/// Starts the device actor on a thread of its own, so code outside the actor system can allocate through it.
pub fn spawn_device(ledger: Ledger) -> std::io::Result<Addr<DeviceActor>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("device".into()).spawn(move || {
        let system = System::new();
        let addr = system.block_on(async { DeviceActor::new(ledger).start() });
        if tx.send(addr).is_ok() {
            // The actor serves until the process ends.
            let _ = system.run();
        }
    })?;
    rx.recv().map_err(|_| std::io::Error::other("the device thread stopped during start-up"))
}

/// Allocates through the device actor and waits for the answer on this thread. The answer comes on a plain channel,
/// not an actor reply: polled to completion inside an async runtime, those stall once the task's budget is spent.
pub fn allocate_blocking(
    device: &Addr<DeviceActor>,
    kind: MemoryKind,
    bytes: usize,
) -> Result<Allocation, LedgerError> {
    let (reply, answer) = std::sync::mpsc::sync_channel(1);
    // A stopped actor drops the message, and with it `reply`.
    device.do_send(AllocateFor { ask: Allocate { kind, bytes }, reply });
    answer.recv().map_err(|_| LedgerError::DeviceGone)?
}

/// `Allocate`, answered on `reply`.
#[derive(Message)]
#[rtype(result = "()")]
struct AllocateFor {
    ask: Allocate,
    reply: std::sync::mpsc::SyncSender<Result<Allocation, LedgerError>>,
}

/// Owns the ledger; every allocation in the process goes through it.
pub struct DeviceActor {
    ledger: Ledger,
}

impl DeviceActor {
    pub fn new(ledger: Ledger) -> DeviceActor {
        DeviceActor { ledger }
    }
}

impl Actor for DeviceActor {
    type Context = Context<Self>;
}

impl Handler<Allocate> for DeviceActor {
    type Result = Result<Allocation, LedgerError>;

    fn handle(&mut self, msg: Allocate, ctx: &mut Context<Self>) -> Self::Result {
        let ptr = self.ledger.allocate(msg.kind, msg.bytes)?;
        let host = self.ledger.is_host_addressable(msg.kind);
        Ok(Allocation { kind: msg.kind, bytes: msg.bytes, ptr, host, owner: ctx.address().recipient() })
    }
}

impl Handler<AllocateFor> for DeviceActor {
    type Result = ();

    fn handle(&mut self, msg: AllocateFor, ctx: &mut Context<Self>) {
        // An answer nobody waits for drops here, which frees its memory.
        let _ = msg.reply.send(self.handle(msg.ask, ctx));
    }
}

impl Handler<Adopt> for DeviceActor {
    type Result = Result<Adoption, LedgerError>;

    fn handle(&mut self, msg: Adopt, ctx: &mut Context<Self>) -> Self::Result {
        self.ledger.adopt(msg.kind, msg.bytes)?;
        Ok(Adoption { kind: msg.kind, bytes: msg.bytes, owner: ctx.address().recipient() })
    }
}

impl Handler<MapLent> for DeviceActor {
    type Result = Result<MappedLent, LedgerError>;

    fn handle(&mut self, msg: MapLent, ctx: &mut Context<Self>) -> Self::Result {
        let mapping = self.ledger.map_lent(msg.own_bytes, msg.lent.memory(), msg.lent.bytes() as usize)?;
        let owner = ctx.address().recipient();
        let (holder, own_bytes) = (Some(mapping.holder), msg.own_bytes);
        Ok(MappedLent { ptr: mapping.ptr, own_bytes, lent: Some(msg.lent), holder, owner })
    }
}

impl Handler<Unmap> for DeviceActor {
    type Result = ();

    fn handle(&mut self, msg: Unmap, _ctx: &mut Context<Self>) {
        drop(msg.holder);
        self.ledger.release_adopted(MemoryKind::KvCache, msg.own_bytes);
        if let Some(lent) = msg.lent {
            self.ledger.release_adopted(MemoryKind::Lent, lent.bytes() as usize);
        }
    }
}

impl Handler<Snapshot> for DeviceActor {
    type Result = MessageResult<Snapshot>;

    fn handle(&mut self, _msg: Snapshot, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.ledger.snapshot())
    }
}

impl Handler<IsHostAddressable> for DeviceActor {
    type Result = bool;

    fn handle(&mut self, msg: IsHostAddressable, _ctx: &mut Context<Self>) -> bool {
        self.ledger.is_host_addressable(msg.0)
    }
}

impl Handler<Free> for DeviceActor {
    type Result = ();

    fn handle(&mut self, msg: Free, _ctx: &mut Context<Self>) {
        match msg.ptr {
            Some(ptr) => self.ledger.free(msg.kind, ptr, msg.bytes),
            None => self.ledger.release_adopted(msg.kind, msg.bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::memory::ledger::tests::FakeDriver;

    fn assert_send<T: Send>() {}

    #[test]
    fn test_handles_are_send() {
        assert_send::<Allocation>();
        assert_send::<Adoption>();
    }

    #[actix::test]
    async fn test_allocate_and_drop_returns_to_baseline() {
        let device = DeviceActor::new(Ledger::new(Some(1 << 20), cpu_driver())).start();
        let baseline = device.send(Snapshot).await.expect("actor alive");
        let mut kv =
            device.send(Allocate { kind: MemoryKind::KvCache, bytes: 4096 }).await.expect("alive").expect("fits");
        let pinned =
            device.send(Allocate { kind: MemoryKind::PinnedHost, bytes: 1000 }).await.expect("alive").expect("fits");
        assert_eq!(kv.len(), 1024);
        assert_eq!(kv.as_ptr() as usize % HOST_ALIGN, 0);
        assert!(kv.iter().all(|&x| x == 0.0), "host memory starts zeroed");
        kv.as_f32_mut()[1023] = 3.5;
        kv[0] = 1.0;
        assert_eq!((kv.as_f32()[0], kv[1023]), (1.0, 3.5));
        assert_eq!(pinned.len(), 250);
        let held = device.send(Snapshot).await.expect("alive");
        assert_eq!(held.used[MemoryKind::KvCache], 4096);
        assert_eq!(held.total_used, baseline.total_used + 5096);
        drop(kv);
        drop(pinned);
        let after = device.send(Snapshot).await.expect("alive");
        assert_eq!(after.used, baseline.used);
        assert_eq!((after.total_used, after.total_peak), (baseline.total_used, 5096));
    }

    #[actix::test]
    async fn test_refusal_over_cap_reaches_no_driver() {
        let (driver, state) = FakeDriver::boxed();
        let device = DeviceActor::new(Ledger::new(Some(1000), driver)).start();
        let first =
            device.send(Allocate { kind: MemoryKind::Activations, bytes: 800 }).await.expect("alive").expect("fits");
        assert!(!first.is_host_addressable() && first.is_empty(), "no host view of driver memory it cannot read");
        let refused = device.send(Allocate { kind: MemoryKind::KvCache, bytes: 201 }).await.expect("alive");
        assert!(matches!(refused, Err(LedgerError::Refused { requested: 201, used: 800, cap: 1000, .. })));
        assert_eq!(state.alloc_calls.load(Ordering::SeqCst), 1);
        drop(first);
        let snap = device.send(Snapshot).await.expect("alive");
        assert_eq!((snap.total_used, snap.refusals), (0, 1));
        assert_eq!((state.free_calls.load(Ordering::SeqCst), state.live_bytes.load(Ordering::SeqCst)), (1, 0));
    }

    #[actix::test]
    async fn test_adoption_counts_and_returns_on_drop() {
        let (driver, state) = FakeDriver::boxed();
        let device = DeviceActor::new(Ledger::new(Some(1000), driver)).start();
        let weights = device.send(Adopt { kind: MemoryKind::Weights, bytes: 900 }).await.expect("alive").expect("fits");
        let refused = device.send(Allocate { kind: MemoryKind::KvCache, bytes: 200 }).await.expect("alive");
        assert!(matches!(refused, Err(LedgerError::Refused { .. })));
        drop(weights);
        let kv = device.send(Allocate { kind: MemoryKind::KvCache, bytes: 200 }).await.expect("alive");
        assert!(kv.is_ok(), "the adoption's bytes came back on drop");
        assert_eq!((state.alloc_calls.load(Ordering::SeqCst), state.free_calls.load(Ordering::SeqCst)), (1, 0));
    }

    #[test]
    fn test_blocking_allocations_inside_an_actor_system_never_stall() {
        // GPU models load this way from the server's start-up and from async tests, many buffers each.
        let device = spawn_device(Ledger::new(None, cpu_driver())).expect("the device thread");
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let take = |_| allocate_blocking(&device, MemoryKind::Weights, 64).expect("fits");
                let held: Vec<Allocation> = (0..1000).map(take).collect();
                done.send(held.len()).expect("the test waits");
            })
        });
        let got = finished.recv_timeout(std::time::Duration::from_secs(30));
        assert_eq!(got, Ok(1000), "1,000 allocations from inside an actor system did not all come back");
    }

    #[test]
    fn test_cpu_driver_zero_and_oversized() {
        let mut driver = CpuDriver;
        let empty = driver.alloc(MemoryKind::KvCache, 0).expect("zero bytes is fine");
        assert_eq!(empty.0 as usize % HOST_ALIGN, 0);
        driver.free(MemoryKind::KvCache, empty, 0);
        assert_eq!(driver.alloc(MemoryKind::KvCache, usize::MAX), Err(DriverError::InvalidSize { bytes: usize::MAX }));
    }

    /// Resident bytes of the mapping that holds `addr`, from the kernel's table of this process's mappings.
    fn resident_bytes_at(addr: usize) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            if let Some((lo, hi)) =
                range.and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)))
            {
                inside = (lo..hi).contains(&addr);
            } else if let Some(kb) = line.strip_prefix("Rss:").filter(|_| inside) {
                return kb.trim().trim_end_matches("kB").trim().parse::<usize>().ok().map(|k| k * 1024);
            }
        }
        None
    }

    #[test]
    fn test_cpu_driver_memory_is_resident_when_granted() {
        // Large enough that the system allocator maps it alone, zeroed by the kernel and not yet touched.
        let bytes = 64 << 20;
        let mut driver = CpuDriver;
        let ptr = driver.alloc(MemoryKind::KvCache, bytes).expect("64 MiB");
        let Some(resident) = resident_bytes_at(ptr.0 as usize) else {
            driver.free(MemoryKind::KvCache, ptr, bytes);
            eprintln!("skipped: /proc/self/smaps is not readable here");
            return;
        };
        driver.free(MemoryKind::KvCache, ptr, bytes);
        assert!(resident >= bytes, "{resident} of {bytes} bytes resident when granted");
    }
}
