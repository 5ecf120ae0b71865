//! Device memory through the driver's virtual memory calls: memory another process can take as a POSIX descriptor,
//! memory taken from one, and pieces of both mapped back to back in one address range.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::{Gpu, GpuError};

/// One device's virtual memory calls.
#[derive(Clone)]
pub struct Vmm {
    ctx: Arc<CudaContext>,
}

/// Physical device memory, released when dropped; it lives on while a mapping or another process holds it.
pub struct Physical {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

/// An address range with physical pieces mapped back to back, readable and writable by the device; unmapped,
/// given back and released when dropped.
pub struct Mapped {
    base: u64,
    bytes: usize,
    parts: Vec<Physical>,
    ctx: Arc<CudaContext>,
}

impl Gpu {
    /// The virtual memory calls of this GPU's device.
    pub fn vmm(&self) -> Vmm {
        Vmm { ctx: self.ctx.clone() }
    }
}

impl Vmm {
    /// The calls for device `ordinal`, without loading any kernel (for a process that only lends memory).
    pub fn open(ordinal: usize) -> Result<Vmm, GpuError> {
        // SAFETY: this only tries to open the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        Ok(Vmm { ctx: CudaContext::new(ordinal)? })
    }

    fn location(&self) -> sys::CUmemLocation {
        // SAFETY: a plain C struct, all zeros is a valid value.
        let mut at: sys::CUmemLocation = unsafe { std::mem::zeroed() };
        at.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        at.id = self.ctx.ordinal() as i32;
        at
    }

    fn props(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct, all zeros is a valid value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location = self.location();
        prop
    }

    /// Sizes and offsets of mappings must be whole multiples of this many bytes.
    pub fn granularity(&self) -> Result<usize, GpuError> {
        self.ctx.bind_to_thread()?;
        let mut bytes = 0usize;
        let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: both pointers are valid for the call.
        unsafe { sys::cuMemGetAllocationGranularity(&mut bytes, &self.props(), flag) }.result()?;
        Ok(bytes)
    }

    /// `bytes` of device memory (a multiple of the granularity) that can be shared as a POSIX descriptor.
    pub fn create(&self, bytes: usize) -> Result<Physical, GpuError> {
        self.ctx.bind_to_thread()?;
        let mut handle = 0;
        // SAFETY: the handle and the properties are valid for the call.
        unsafe { sys::cuMemCreate(&mut handle, bytes, &self.props(), 0) }.result()?;
        Ok(Physical { handle, bytes, ctx: self.ctx.clone() })
    }

    /// The memory behind a descriptor that `Physical::share` made, in this or another process; `bytes` of it are used.
    pub fn import(&self, fd: BorrowedFd, bytes: usize) -> Result<Physical, GpuError> {
        self.ctx.bind_to_thread()?;
        let mut handle = 0;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // The descriptor travels as the pointer's value; the driver does not take it over.
        let os_handle = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
        // SAFETY: the handle is valid for the call and the descriptor is open while it runs.
        unsafe { sys::cuMemImportFromShareableHandle(&mut handle, os_handle, kind) }.result()?;
        Ok(Physical { handle, bytes, ctx: self.ctx.clone() })
    }

    /// One address range holding `parts` in order, each readable and writable by this device.
    pub fn map(&self, parts: Vec<Physical>) -> Result<Mapped, GpuError> {
        self.ctx.bind_to_thread()?;
        let bytes: usize = parts.iter().map(|p| p.bytes).sum();
        let mut base = 0;
        // SAFETY: the out pointer is valid; a zero address and alignment let the driver choose.
        unsafe { sys::cuMemAddressReserve(&mut base, bytes, 0, 0, 0) }.result()?;
        // From here a failure's drop unmaps what was mapped and gives the range back.
        let mut mapped = Mapped { base, bytes, parts: Vec::new(), ctx: self.ctx.clone() };
        let mut at = base;
        for part in parts {
            // SAFETY: [at, at + part.bytes) lies in the reserved range and nothing is mapped there yet.
            unsafe { sys::cuMemMap(at, part.bytes, 0, part.handle, 0) }.result()?;
            at += part.bytes as u64;
            mapped.parts.push(part);
        }
        let access = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the whole range is mapped; the descriptor is valid for the call.
        unsafe { sys::cuMemSetAccess(base, bytes, &access, 1) }.result()?;
        Ok(mapped)
    }
}

impl Physical {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A POSIX descriptor for this memory, which another process turns back into it with `Vmm::import`.
    pub fn share(&self) -> Result<OwnedFd, GpuError> {
        self.ctx.bind_to_thread()?;
        let mut fd: i32 = -1;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let out = &mut fd as *mut i32 as *mut std::ffi::c_void;
        // SAFETY: for a POSIX descriptor the driver writes an int through the pointer.
        unsafe { sys::cuMemExportToShareableHandle(out, self.handle, kind, 0) }.result()?;
        // SAFETY: the driver made a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the handle came from cuMemCreate or an import and is released once.
        if let Err(e) = unsafe { sys::cuMemRelease(self.handle) }.result() {
            tracing::warn!(error = %e, "releasing device memory failed");
        }
    }
}

impl Mapped {
    /// The range's first address.
    pub fn ptr(&self) -> u64 {
        self.base
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let mapped: usize = self.parts.iter().map(|p| p.bytes).sum();
        // SAFETY: the first `mapped` bytes of the range were mapped by `Vmm::map`, and the range was reserved there.
        let done = unsafe {
            let unmapped = match mapped {
                0 => Ok(()),
                n => sys::cuMemUnmap(self.base, n).result(),
            };
            unmapped.and(sys::cuMemAddressFree(self.base, self.bytes).result())
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, "unmapping device memory failed");
        }
    }
}
