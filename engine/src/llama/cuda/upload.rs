//! Weights onto the GPU through the ledger. Stored bf16 rows go up through a pinned ring and are packed by a
//! kernel, the host staging one chunk while the GPU copies and packs the ones before; other formats pack on the host.

use std::time::{Duration, Instant};

use rayon::prelude::*;
use tensorfold_kernels::cuda::{gate_up_order, packed_rows, DevPtr, Event, Gpu, GpuError, PackPlace};

use super::gpu_err;
use super::pack::{pack_rows, stacked, Rows};
use crate::checkpoint::Bf16Rows;
use crate::error::LoadError;
use crate::memory::{Alloc, Held, MemoryKind};

/// Bytes of one slot of the pinned ring, and of the device staging buffer beside it.
const SLOT_BYTES: usize = 64 << 20;

/// Slots of the ring: the host fills one while the GPU copies and packs the others.
const NUM_SLOTS: usize = 3;

/// Bytes one thread copies into a slot at a time.
const COPY_BYTES: usize = 1 << 20;

/// Uploads weights through the ledger as they are read, one tensor (or the ring's chunks) in host memory at a time.
pub(super) struct Uploader<'a, 'b> {
    gpu: &'a Gpu,
    pub(super) alloc: &'a mut Alloc<'b>,
    /// Opened at the first stored bf16 weight; declared before `held` so that it waits for the GPU before they drop.
    ring: Option<Ring<'a>>,
    /// Whether the ring could not be had, so every weight packs on the host.
    ring_refused: bool,
    pub(super) held: Vec<Held>,
    pub(super) bytes: usize,
    /// Bytes of weights the GPU packed.
    pub(super) gpu_packed_bytes: usize,
    /// Host time packing weights, or staging stored bf16 rows into the ring for the GPU to pack.
    pub(super) pack_time: Duration,
    /// Host time copying to the GPU, or waiting for the ring's copies and packs.
    pub(super) upload_time: Duration,
}

impl<'a, 'b> Uploader<'a, 'b> {
    pub(super) fn new(gpu: &'a Gpu, alloc: &'a mut Alloc<'b>) -> Self {
        Uploader {
            gpu,
            alloc,
            ring: None,
            ring_refused: false,
            held: Vec::new(),
            bytes: 0,
            gpu_packed_bytes: 0,
            pack_time: Duration::ZERO,
            upload_time: Duration::ZERO,
        }
    }

    pub(super) fn buffer(&mut self, kind: MemoryKind, bytes: usize) -> Result<DevPtr, LoadError> {
        let a = (self.alloc)(kind, bytes).map_err(|e| LoadError::Device(e.to_string()))?;
        let ptr = a.ptr().0;
        self.held.push(a);
        Ok(ptr)
    }

    fn upload<T>(&mut self, data: &[T]) -> Result<DevPtr, LoadError> {
        let bytes = std::mem::size_of_val(data);
        self.bytes += bytes;
        let ptr = self.buffer(MemoryKind::Weights, bytes)?;
        let started = Instant::now();
        self.gpu.upload(ptr, data).map_err(gpu_err)?;
        self.upload_time += started.elapsed();
        Ok(ptr)
    }

    /// Lays `n` rows out for the GEMM on the host (row `r` from `source(r)`) and uploads them.
    pub(super) fn packed(
        &mut self,
        parts: &[Rows],
        n: usize,
        source: impl Fn(usize) -> (usize, usize) + Sync,
    ) -> Result<DevPtr, LoadError> {
        let k = parts.first().map_or(0, Rows::cols);
        self.laid_out(parts, n, self.gpu.natural(n, k), source)
    }

    /// `n` rows row-major in bf16, as kernels that read rows as they are take them (row `r` from `source(r)`).
    pub(super) fn natural_rows(
        &mut self,
        parts: &[Rows],
        n: usize,
        source: impl Fn(usize) -> (usize, usize) + Sync,
    ) -> Result<DevPtr, LoadError> {
        self.laid_out(parts, n, true, source)
    }

    fn laid_out(
        &mut self,
        parts: &[Rows],
        n: usize,
        natural: bool,
        source: impl Fn(usize) -> (usize, usize) + Sync,
    ) -> Result<DevPtr, LoadError> {
        let started = Instant::now();
        let k = parts.first().map_or(0, Rows::cols);
        let data = pack_rows(parts, n, k, natural, source);
        self.pack_time += started.elapsed();
        self.upload(&data)
    }

    /// Rows of several weights stacked into one bf16 matrix, packed in the GEMM's tiles.
    pub(super) fn matrices(&mut self, parts: &[Rows]) -> Result<DevPtr, LoadError> {
        let n = parts.iter().map(Rows::rows).sum();
        if let Some(ptr) = self.packed_on_gpu(parts, &stacked_places(parts), n)? {
            return Ok(ptr);
        }
        self.packed(parts, n, |r| stacked(parts, r))
    }

    /// Gate and up (f x cols each) stacked in `gate_up_order`, packed in the GEMM's tiles.
    pub(super) fn gate_up(&mut self, gate: Rows, up: Rows) -> Result<DevPtr, LoadError> {
        let f = gate.rows();
        let parts = [gate, up];
        if f.is_multiple_of(8) && parts[1].rows() == f {
            if let Some(ptr) = self.packed_on_gpu(&parts, &[PackPlace::Gate, PackPlace::Up], 2 * f)? {
                return Ok(ptr);
            }
        }
        let order = move |r| match gate_up_order(r, f) {
            src if src < f => (0, src),
            src => (1, src - f),
        };
        self.packed(&parts, 2 * f, order)
    }

    /// Uploads `v`: through the ring while it is open, so the copies before it need not be waited for.
    pub(super) fn vector(&mut self, v: &[f32]) -> Result<DevPtr, LoadError> {
        let bytes = std::mem::size_of_val(v);
        if self.ring.is_none() || bytes > SLOT_BYTES {
            return self.upload(v);
        }
        self.bytes += bytes;
        let dst = self.buffer(MemoryKind::Weights, bytes)?;
        self.ring.as_mut().expect("the ring is open").copy(v, dst).map_err(gpu_err)?;
        Ok(dst)
    }

    /// Stored bf16 `parts` of one width packed on the GPU into an `n`-row matrix, each where `places` puts it;
    /// `None` where they are not all stored bf16 or there is no ring, for the host to pack them.
    fn packed_on_gpu(&mut self, parts: &[Rows], places: &[PackPlace], n: usize) -> Result<Option<DevPtr>, LoadError> {
        let stored: Vec<Bf16Rows> = parts
            .iter()
            .filter_map(|p| match p {
                Rows::Bf16(b) => Some(*b),
                Rows::F32(..) => None,
            })
            .collect();
        let k = parts.first().map_or(0, Rows::cols);
        // The slots take the checkpoint's bytes as they are, which are the device's little-endian bf16.
        let fits = cfg!(target_endian = "little")
            && !parts.is_empty()
            && stored.len() == parts.len()
            && stored.iter().all(|b| b.cols == k)
            && k > 0
            && k.is_multiple_of(32)
            && 2 * k <= SLOT_BYTES;
        if !fits || !self.open_ring() {
            return Ok(None);
        }
        let bytes = 2 * packed_rows(n) * k;
        self.bytes += bytes;
        self.gpu_packed_bytes += bytes;
        let dst = self.buffer(MemoryKind::Weights, bytes)?;
        let natural = self.gpu.natural(n, k);
        let ring = self.ring.as_mut().expect("the ring is open");
        ring.pack(&stored, places, n, natural, dst).map_err(gpu_err)?;
        Ok(Some(dst))
    }

    /// Opens the ring unless it is open or could not be had; false when there is none.
    fn open_ring(&mut self) -> bool {
        if self.ring.is_none() && !self.ring_refused {
            match Ring::open(self.gpu, &mut *self.alloc) {
                Ok(ring) => self.ring = Some(ring),
                Err(e) => {
                    tracing::warn!(error = %e, "no pinned staging ring: the weights are packed on the host");
                    self.ring_refused = true;
                }
            }
        }
        self.ring.is_some()
    }

    /// Waits for the ring's last chunks and gives its memory back to the ledger.
    pub(super) fn finish(&mut self) -> Result<(), LoadError> {
        let started = Instant::now();
        if let Some(ring) = self.ring.take() {
            self.gpu.sync().map_err(gpu_err)?;
            self.pack_time += ring.stage_time;
            self.upload_time += ring.wait_time;
        }
        self.upload_time += started.elapsed();
        Ok(())
    }
}

/// The places of weights stacked in order.
fn stacked_places(parts: &[Rows]) -> Vec<PackPlace> {
    let firsts = parts.iter().scan(0, |next, p| Some(std::mem::replace(next, *next + p.rows())));
    firsts.map(PackPlace::Stacked).collect()
}

/// Pinned host slots, each with a device staging buffer, reused chunk after chunk.
struct Ring<'a> {
    gpu: &'a Gpu,
    slots: Vec<Slot>,
    next: usize,
    /// Host time filling slots, and waiting for the GPU to free them.
    stage_time: Duration,
    wait_time: Duration,
}

struct Slot {
    pinned: Held,
    staging: Held,
    /// Follows the GPU's last copy out of `pinned` and pack out of `staging`.
    done: Option<Event>,
}

impl Drop for Ring<'_> {
    fn drop(&mut self) {
        // The slots go back to the ledger only once no copy or pack queued on them can still run.
        if let Err(e) = self.gpu.sync() {
            tracing::warn!(error = %e, "waiting for the weight uploads failed");
        }
    }
}

impl<'a> Ring<'a> {
    fn open(gpu: &'a Gpu, alloc: &mut Alloc) -> Result<Ring<'a>, String> {
        let mut slots = Vec::with_capacity(NUM_SLOTS);
        for _ in 0..NUM_SLOTS {
            let mut pinned = alloc(MemoryKind::PinnedHost, SLOT_BYTES).map_err(|e| e.to_string())?;
            if pinned.as_bytes_mut().len() < SLOT_BYTES {
                return Err("pinned memory that the host cannot write".into());
            }
            let staging = alloc(MemoryKind::Activations, SLOT_BYTES).map_err(|e| e.to_string())?;
            slots.push(Slot { pinned, staging, done: None });
        }
        Ok(Ring { gpu, slots, next: 0, stage_time: Duration::ZERO, wait_time: Duration::ZERO })
    }

    /// Queues `parts` (k bf16 values a row) into the packed (or `natural`) `n`-row matrix at `dst`, each where
    /// `places` puts it.
    fn pack(
        &mut self,
        parts: &[Bf16Rows],
        places: &[PackPlace],
        n: usize,
        natural: bool,
        dst: DevPtr,
    ) -> Result<(), GpuError> {
        let k = parts[0].cols;
        self.gpu.bind()?;
        if let Some((at, len)) = padding(n, k) {
            self.gpu.zero_async(dst + at as u64, len)?;
        }
        let sizes: Vec<(usize, PackPlace)> = parts.iter().map(|p| p.rows).zip(places.iter().copied()).collect();
        for c in chunks(&sizes, k, SLOT_BYTES) {
            let from = &parts[c.part].bytes[2 * k * c.row0..2 * k * (c.row0 + c.rows)];
            let fill = |to: &mut [u8]| {
                to.par_chunks_mut(COPY_BYTES).zip(from.par_chunks(COPY_BYTES)).for_each(|(d, s)| d.copy_from_slice(s))
            };
            let staging = self.stage(from.len(), fill, None)?;
            self.gpu.pack_rows(staging, dst, c.rows, k, c.row0, c.place, natural)?;
            self.mark()?;
        }
        Ok(())
    }

    /// Queues the copy of `v` to `dst`, which holds it.
    fn copy(&mut self, v: &[f32], dst: DevPtr) -> Result<(), GpuError> {
        self.gpu.bind()?;
        let fill = |to: &mut [u8]| to.chunks_exact_mut(4).zip(v).for_each(|(d, x)| d.copy_from_slice(&x.to_le_bytes()));
        self.stage(4 * v.len(), fill, Some(dst))?;
        self.mark()
    }

    /// Waits until the GPU is done with the next slot, fills its first `len` pinned bytes with `fill` and queues
    /// their copy to `dst`, or to the slot's device staging with `None`; returns that staging's address.
    fn stage(&mut self, len: usize, fill: impl FnOnce(&mut [u8]), dst: Option<DevPtr>) -> Result<DevPtr, GpuError> {
        let slot = &mut self.slots[self.next];
        let waited = Instant::now();
        if let Some(done) = slot.done.take() {
            done.wait()?;
        }
        let staged = Instant::now();
        self.wait_time += staged - waited;
        let to = &mut slot.pinned.as_bytes_mut()[..len];
        fill(to);
        self.stage_time += staged.elapsed();
        let staging = slot.staging.ptr().0;
        // SAFETY: `staging` holds SLOT_BYTES and a given `dst` holds `len`; the slot's pinned bytes are written
        // again only after its next mark is waited for, and go back to the ledger only after the stream syncs.
        unsafe { self.gpu.upload_async(dst.unwrap_or(staging), &*to)? };
        Ok(staging)
    }

    /// Marks the current slot busy until the GPU has done the work queued so far, and moves to the next.
    fn mark(&mut self) -> Result<(), GpuError> {
        self.slots[self.next].done = Some(self.gpu.record()?);
        self.next = (self.next + 1) % NUM_SLOTS;
        Ok(())
    }
}

/// One trip through a slot: rows `row0..row0 + rows` of part `part`, each landing where `place` puts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Chunk {
    part: usize,
    row0: usize,
    rows: usize,
    place: PackPlace,
}

/// The trips that move parts of `(rows, place)`, k bf16 values a row, each trip whole rows within `slot_bytes`.
fn chunks(parts: &[(usize, PackPlace)], k: usize, slot_bytes: usize) -> Vec<Chunk> {
    assert!(2 * k <= slot_bytes, "a row of {k} values does not fit a slot of {slot_bytes} bytes");
    let per_trip = slot_bytes / (2 * k);
    let trips = parts.iter().enumerate().flat_map(|(part, &(rows, place))| {
        (0..rows).step_by(per_trip).map(move |row0| Chunk { part, row0, rows: per_trip.min(rows - row0), place })
    });
    trips.collect()
}

/// The byte offset and length of an `n x k` packed matrix's last 8-row group where it holds padding rows, which
/// must be zero: the group is zeroed before its rows land. Both layouts keep each 8-row group in its own bytes.
fn padding(n: usize, k: usize) -> Option<(usize, usize)> {
    let padded = packed_rows(n);
    (padded > n).then(|| (2 * (padded - 8) * k, 2 * 8 * k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorfold_kernels::cuda::packed_vector;

    /// What the ring and the kernel leave on the GPU, done on the host: memory that is not zero, the padding
    /// zeroed, then each trip's 16-byte vectors where the kernel puts them.
    fn on_host(parts: &[Bf16Rows], places: &[PackPlace], n: usize, slot_bytes: usize, natural: bool) -> Vec<u16> {
        let k = parts[0].cols;
        let mut out = vec![0xdead_u16; packed_rows(n) * k];
        if let Some((at, len)) = padding(n, k) {
            out[at / 2..(at + len) / 2].fill(0);
        }
        let sizes: Vec<(usize, PackPlace)> = parts.iter().map(|p| p.rows).zip(places.iter().copied()).collect();
        for c in chunks(&sizes, k, slot_bytes) {
            let staged = &parts[c.part].bytes[2 * k * c.row0..2 * k * (c.row0 + c.rows)];
            for (v, vector) in staged.chunks_exact(16).enumerate() {
                let at = 8 * packed_vector(c.place, c.row0, k, v, natural);
                for (j, pair) in vector.chunks_exact(2).enumerate() {
                    out[at + j] = u16::from_le_bytes([pair[0], pair[1]]);
                }
            }
        }
        out
    }

    /// Little-endian bf16 bytes of a `rows x k` weight, none of them zero.
    fn weight(rows: usize, k: usize, seed: usize) -> Vec<u8> {
        let value = |i: usize| half::bf16::from_f32(((i * seed) % 89) as f32 * 0.25 + 1.0);
        (0..rows * k).flat_map(|i| value(i).to_le_bytes()).collect()
    }

    fn bits(values: &[half::bf16]) -> Vec<u16> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn test_stacked_weights_packed_on_the_gpu_match_the_host_packing() {
        let k = 64;
        let stored = [weight(13, k, 3), weight(5, k, 5), weight(4, k, 7)];
        let parts: Vec<Bf16Rows> =
            stored.iter().map(|b| Bf16Rows { rows: b.len() / (2 * k), cols: k, bytes: b }).collect();
        let rows: Vec<Rows> = parts.iter().map(|&b| Rows::Bf16(b)).collect();
        let n = 22;
        for natural in [false, true] {
            let want = bits(&pack_rows(&rows, n, k, natural, |r| stacked(&rows, r)));
            for slot_rows in [1, 3, 8, 64] {
                let got = on_host(&parts, &stacked_places(&rows), n, slot_rows * 2 * k, natural);
                assert_eq!(got, want, "{slot_rows} rows a trip, natural {natural}");
            }
        }
    }

    #[test]
    fn test_gate_and_up_packed_on_the_gpu_match_the_host_packing() {
        let (f, k) = (24, 32);
        let stored = [weight(f, k, 11), weight(f, k, 13)];
        let parts: Vec<Bf16Rows> = stored.iter().map(|b| Bf16Rows { rows: f, cols: k, bytes: b }).collect();
        let rows: Vec<Rows> = parts.iter().map(|&b| Rows::Bf16(b)).collect();
        let order = |r| match gate_up_order(r, f) {
            src if src < f => (0, src),
            src => (1, src - f),
        };
        for natural in [false, true] {
            let want = bits(&pack_rows(&rows, 2 * f, k, natural, order));
            for slot_rows in [1, 5, 16, 100] {
                let got = on_host(&parts, &[PackPlace::Gate, PackPlace::Up], 2 * f, slot_rows * 2 * k, natural);
                assert_eq!(got, want, "{slot_rows} rows a trip, natural {natural}");
            }
        }
    }

    #[test]
    fn test_trips_cover_every_row_once_in_whole_rows_within_a_slot() {
        let k = 32;
        let trips = chunks(&[(10, PackPlace::Stacked(0)), (0, PackPlace::Stacked(10)), (7, PackPlace::Up)], k, 4 * 64);
        let spans: Vec<(usize, usize, usize)> = trips.iter().map(|c| (c.part, c.row0, c.rows)).collect();
        assert_eq!(spans, [(0, 0, 4), (0, 4, 4), (0, 8, 2), (2, 0, 4), (2, 4, 3)]);
        assert_eq!(padding(16, k), None);
        assert_eq!(padding(13, k), Some((2 * 8 * k, 2 * 8 * k)));
    }
}
