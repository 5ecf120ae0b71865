//! KV buffers that span the process's own memory and lent memory: one address range each for keys and values,
//! own pages first in anonymous memory, then the lent pages mapped from the descriptor right after them. Page `p`
//! stays at `p` times the page's size from the start, so the pool's arithmetic never changes.

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use nix::sys::mman::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};
use nix::unistd::{sysconf, SysconfVar};

use crate::client::Lent;

/// The host's page size, which every mapping's offset and address is a multiple of.
pub fn host_page() -> usize {
    match sysconf(SysconfVar::PAGE_SIZE) {
        Ok(Some(size)) if size > 0 => size as usize,
        _ => 4096,
    }
}

fn align_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Where lent memory puts its pages: keys at offset 0, values at the first host page at or after the keys' end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LentLayout {
    /// Whole pages of keys and values the lent bytes hold.
    pub num_pages: usize,
    /// Offset of the values' plane in the lent memory.
    pub values_offset: u64,
}

impl LentLayout {
    /// The most pages of `plane_bytes` (one page's keys, or its values) that `lent_bytes` holds, laid out as above.
    pub fn of(lent_bytes: u64, plane_bytes: usize, host_page: usize) -> LentLayout {
        let (plane, page) = (plane_bytes.max(1) as u64, host_page as u64);
        let fits = |n: u64| align_up(n * plane, page) + n * plane <= lent_bytes;
        let mut n = lent_bytes / (2 * plane);
        // Aligning the values' plane costs less than one host page, so this walks back a page's worth at most.
        while n > 0 && !fits(n) {
            n -= 1;
        }
        LentLayout { num_pages: n as usize, values_offset: align_up(n * plane, page) }
    }
}

/// Why the KV buffers could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("the lent {bytes} bytes hold no whole KV page of {page_bytes} bytes")]
    NoWholePage { bytes: u64, page_bytes: usize },
    #[error("a KV page's plane of {0} bytes is not a whole number of floats")]
    Unaligned(usize),
    #[error("mapping KV memory failed in {call}: {errno}")]
    Map { call: &'static str, errno: nix::errno::Errno },
}

/// One buffer of floats: own pages in anonymous memory, lent pages after them in the lent descriptor's memory.
/// Unmapped on drop; it keeps the loan alive until then.
pub struct LentBuffer {
    map: NonNull<c_void>,
    map_len: usize,
    /// Bytes from the mapping's start to the first float.
    start: usize,
    floats: usize,
    _lent: Arc<Lent>,
}

// SAFETY: the buffer owns its mapping outright; access goes through `&`/`&mut` like a `Vec<f32>`'s.
unsafe impl Send for LentBuffer {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for LentBuffer {}

impl LentBuffer {
    /// `own` bytes of anonymous memory, then `lent` bytes of the descriptor from `offset`, as one range.
    fn map(lent: &Arc<Lent>, own: usize, offset: u64, len: usize, page: usize) -> Result<LentBuffer, MapError> {
        // The own part is shifted so that it ends on a host page, where the lent part's mapping must start.
        let start = (page - own % page) % page;
        let map_len = align_up((start + own + len) as u64, page as u64) as usize;
        let err = |call| move |errno| MapError::Map { call, errno };
        let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let size = NonZeroUsize::new(map_len).expect("a buffer of at least one page");
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks aliases nothing.
        let map = unsafe { mmap_anonymous(None, size, rw, MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE) }
            .map_err(err("mmap"))?;
        let buffer = LentBuffer { map, map_len, start, floats: (own + len) / 4, _lent: lent.clone() };
        if let Some(tail) = NonZeroUsize::new(align_up(len as u64, page as u64) as usize) {
            let at = NonZeroUsize::new(map.as_ptr() as usize + start + own).expect("inside a mapping");
            let flags = MapFlags::MAP_SHARED | MapFlags::MAP_FIXED;
            // SAFETY: `at..at + tail` lies inside the mapping made above, which this buffer alone owns.
            unsafe { mmap(Some(at), tail, rw, flags, lent.memory(), offset as i64) }.map_err(err("mmap lent"))?;
        }
        Ok(buffer)
    }
}

impl Deref for LentBuffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `start` keeps float alignment and the range lies inside the mapping, live until drop.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<u8>().add(self.start).cast(), self.floats) }
    }
}

impl DerefMut for LentBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes the view exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().cast::<u8>().add(self.start).cast(), self.floats) }
    }
}

impl Drop for LentBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping is this buffer's and no view of it outlives the buffer.
        let _ = unsafe { munmap(self.map, self.map_len) };
    }
}

impl std::fmt::Debug for LentBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentBuffer").field("floats", &self.floats).finish()
    }
}

/// The keys' and values' buffers of `own_pages + layout.num_pages` pages, the further pages in `lent`.
pub struct KvBuffers {
    pub keys: LentBuffer,
    pub values: LentBuffer,
    pub layout: LentLayout,
}

/// Maps the KV buffers of a pool whose pages take `plane_bytes` each for keys and again for values.
pub fn map_kv(lent: Arc<Lent>, own_pages: usize, plane_bytes: usize) -> Result<KvBuffers, MapError> {
    if plane_bytes == 0 || !plane_bytes.is_multiple_of(4) {
        return Err(MapError::Unaligned(plane_bytes));
    }
    let page = host_page();
    let layout = LentLayout::of(lent.bytes(), plane_bytes, page);
    if layout.num_pages == 0 {
        return Err(MapError::NoWholePage { bytes: lent.bytes(), page_bytes: 2 * plane_bytes });
    }
    let (own, len) = (own_pages * plane_bytes, layout.num_pages * plane_bytes);
    let keys = LentBuffer::map(&lent, own, 0, len, page)?;
    let values = LentBuffer::map(&lent, own, layout.values_offset, len, page)?;
    Ok(KvBuffers { keys, values, layout })
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use nix::sys::memfd::{memfd_create, MFdFlags};
    use nix::sys::uio::pread;
    use nix::unistd::ftruncate;

    use super::*;

    fn memfd(bytes: u64) -> Arc<Lent> {
        let fd = memfd_create(CString::new("kv-test").unwrap().as_c_str(), MFdFlags::MFD_CLOEXEC).unwrap();
        ftruncate(&fd, bytes as i64).unwrap();
        Arc::new(Lent::from_descriptor(fd, bytes, "test"))
    }

    #[test]
    fn test_lent_bytes_hold_their_whole_pages() {
        let two_mib = 2 << 20;
        assert_eq!(LentLayout::of(two_mib, 4096, 4096), LentLayout { num_pages: 256, values_offset: 1 << 20 });
        assert_eq!(LentLayout::of(two_mib, 368_640, 4096).num_pages, 2);
        // A plane that is not a host page's multiple loses at most what aligning the values costs.
        assert_eq!(LentLayout::of(two_mib, 1000, 4096), LentLayout { num_pages: 1048, values_offset: 1 << 20 });
        assert_eq!(LentLayout::of(3 * 4096, 3000, 4096), LentLayout { num_pages: 1, values_offset: 4096 });
        assert_eq!(LentLayout::of(4095, 4096, 4096).num_pages, 0);
    }

    #[test]
    fn test_pages_past_the_own_ones_live_in_the_lent_memory() {
        let (own_pages, plane) = (3, 1000);
        let lent = memfd(2 << 20);
        let mut kv = map_kv(lent.clone(), own_pages, plane).unwrap();
        let total = own_pages + kv.layout.num_pages;
        assert_eq!((kv.keys.len(), kv.values.len()), (total * plane / 4, total * plane / 4));
        for (i, x) in kv.keys.iter_mut().enumerate() {
            *x = i as f32;
        }
        for (i, x) in kv.values.iter_mut().enumerate() {
            *x = -(i as f32);
        }
        // The lent memory holds the keys of page 3 at offset 0 and its values at the values' plane.
        let read = |offset: u64| {
            let mut b = [0u8; 4];
            pread(lent.memory(), &mut b, offset as i64).unwrap();
            f32::from_ne_bytes(b)
        };
        let first_lent = (own_pages * plane / 4) as f32;
        assert_eq!(read(0), first_lent);
        assert_eq!(read(kv.layout.values_offset), -first_lent);
        let last = total * plane / 4 - 1;
        assert_eq!(read(kv.layout.values_offset + (kv.layout.num_pages * plane) as u64 - 4), -(last as f32));
        assert_eq!(kv.keys[last], last as f32, "the own pages and the lent ones do not overlap");
        assert_eq!(kv.keys[own_pages * plane / 4 - 1], first_lent - 1.0);
    }

    #[test]
    fn test_lent_memory_too_small_for_a_page_is_refused() {
        let err = map_kv(memfd(4096), 1, 4096).err().unwrap();
        assert_eq!(err.to_string(), "the lent 4096 bytes hold no whole KV page of 8192 bytes");
    }
}
