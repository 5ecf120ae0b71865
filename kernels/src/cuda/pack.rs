//! Host side of the packing kernel (pack.cu): bf16 rows on the device into the GEMM's tiles, and the stream's
//! events and fills that a pipelined upload needs.

use cudarc::driver::{result, CudaEvent};

use super::{packed_index, Arg, DevPtr, Gpu, GpuError};

/// Where the rows of one weight land among the rows of a packed matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackPlace {
    /// Row r lands on row `first + r`: weights stacked in order.
    Stacked(usize),
    /// Gate row r lands on row 16 (r / 8) + r % 8: the even tiles of `gate_up_order`.
    Gate,
    /// Up row r lands on row 16 (r / 8) + 8 + r % 8: the odd tiles of `gate_up_order`.
    Up,
}

impl PackPlace {
    /// The kernel's base and stride of 8-row groups: row r lands on base + (r / 8) stride + r % 8.
    fn base_stride(self) -> (usize, usize) {
        match self {
            PackPlace::Stacked(first) => (first, 8),
            PackPlace::Gate => (0, 16),
            PackPlace::Up => (8, 16),
        }
    }

    /// The packed matrix's row that row `r` of this weight lands on.
    pub fn dest_row(self, r: usize) -> usize {
        let (base, stride) = self.base_stride();
        base + (r / 8) * stride + r % 8
    }
}

/// The 16-byte vector of the packed matrix (row-major where `natural`) that vector `v` of rows `row0..` (k values
/// each) lands on: pack.cu's formula.
pub fn packed_vector(place: PackPlace, row0: usize, k: usize, v: usize, natural: bool) -> usize {
    let per_row = k / 8;
    let (row, i) = (place.dest_row(row0 + v / per_row), (v % per_row) * 8);
    match natural {
        true => (row * k + i) / 8,
        false => packed_index(row, i, k) / 8,
    }
}

/// A point in the stream's queued work, to wait for from the host.
pub struct Event(CudaEvent);

impl Event {
    /// Waits until the GPU has done everything queued before the event.
    pub fn wait(&self) -> Result<(), GpuError> {
        Ok(self.0.synchronize()?)
    }
}

impl Gpu {
    /// Queues the copy of `rows` row-major bf16 rows of `k` at `src`, rows `row0..` of one weight, into the packed
    /// matrix at `dst` (row-major where `natural`), each where `place` puts it; `dst` must hold every row they land on.
    #[allow(clippy::too_many_arguments)]
    pub fn pack_rows(
        &self,
        src: DevPtr,
        dst: DevPtr,
        rows: usize,
        k: usize,
        row0: usize,
        place: PackPlace,
        natural: bool,
    ) -> Result<(), GpuError> {
        assert!(k.is_multiple_of(32), "pack_rows: K = {k} is not a multiple of 32");
        assert!(src.is_multiple_of(16) && dst.is_multiple_of(16), "pack_rows: buffers must be 16-byte aligned");
        if rows == 0 {
            return Ok(());
        }
        let (base, stride) = place.base_stride();
        let dims = [rows, k, row0, base, stride].map(|v| Arg::Int(i32::try_from(v).expect("pack_rows: too large")));
        let args =
            [Arg::Ptr(src), Arg::Ptr(dst), dims[0], dims[1], dims[2], dims[3], dims[4], Arg::Int(natural as i32)];
        let threads = 256;
        self.launch(&self.f.pack_rows, ((rows * k / 8).div_ceil(threads), 1, 1), threads as u32, 0, &args)
    }

    /// Queues zeroing `bytes` bytes of device memory at `dst`, which must hold them.
    pub fn zero_async(&self, dst: DevPtr, bytes: usize) -> Result<(), GpuError> {
        // SAFETY: stream-ordered fill of device memory the caller owns, after what is queued before it.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream.cu_stream())? };
        Ok(())
    }

    /// Marks the work queued so far, for `Event::wait`.
    pub fn record(&self) -> Result<Event, GpuError> {
        Ok(Event(self.stream.record_event(None)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::gate_up_order;

    /// Checks every vector of rows `row0..row0 + rows` against `packed_index` at the row `dest(r)`.
    fn check(place: PackPlace, row0: usize, rows: usize, k: usize, dest: impl Fn(usize) -> usize) {
        for v in 0..rows * k / 8 {
            let (r, i) = (row0 + v / (k / 8), (v % (k / 8)) * 8);
            for j in 0..8 {
                let want = packed_index(dest(r), i + j, k);
                assert_eq!(8 * packed_vector(place, row0, k, v, false) + j, want, "{place:?} row {r} value {}", i + j);
                assert_eq!(8 * packed_vector(place, row0, k, v, true) + j, dest(r) * k + i + j, "natural row {r}");
            }
        }
    }

    #[test]
    fn test_stacked_rows_land_where_packed_index_puts_them() {
        let k = 96;
        for (first, row0, rows) in [(0, 0, 13), (13, 0, 5), (13, 3, 7), (40, 17, 1)] {
            check(PackPlace::Stacked(first), row0, rows, k, |r| first + r);
        }
    }

    #[test]
    fn test_gate_and_up_rows_land_where_gate_up_order_reads_them() {
        let (f, k) = (24, 64);
        let gemm_row = |src: usize| (0..2 * f).find(|&r| gate_up_order(r, f) == src).unwrap();
        for (row0, rows) in [(0, f), (5, 11), (23, 1)] {
            check(PackPlace::Gate, row0, rows, k, gemm_row);
            check(PackPlace::Up, row0, rows, k, |r| gemm_row(f + r));
        }
        for r in 0..f {
            assert_eq!(gate_up_order(PackPlace::Gate.dest_row(r), f), r);
            assert_eq!(gate_up_order(PackPlace::Up.dest_row(r), f), f + r);
        }
    }

    #[test]
    fn test_the_kernel_computes_the_formula_packed_vector_mirrors() {
        let src = include_str!("../../cuda/pack.cu");
        let lines = [
            "const u64 r = (u64)row0 + v / per_row, i = (v % per_row) * 8;",
            "const u64 dest = (u64)base + (r / 8) * (u64)stride + r % 8;",
            "dst[(((dest / 8) * ((u64)k / 32) + i / 32) * 256 + (dest % 8) * 32 + i % 32) / 8] = src[v];",
            "dst[(dest * (u64)k + i) / 8] = src[v];",
        ];
        for line in lines {
            assert!(src.contains(line), "pack.cu no longer has `{line}`: update packed_vector with it");
        }
    }

    #[test]
    fn test_kernels_compile_with_the_pack_kernel() {
        match super::super::compile_ptx("sm_90") {
            Ok(ptx) => assert!(ptx.contains(".entry pack_rows("), "PTX lacks pack_rows"),
            Err(GpuError::NoNvrtc) => eprintln!("skipped: no NVRTC library on this machine"),
            Err(e) => panic!("{e}"),
        }
    }
}
