//! AVX-512 forms of the quantized row dots: half the vector work per block of the AVX2 forms.
// A tile's rows index its activations, accumulators and outputs in step, so the loops run over row indices.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::simd::Tile;

static AVX2_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keeps the kernels to their AVX2 forms; the binary calls it once at start-up, before any kernel runs.
pub fn limit_to_avx2() {
    AVX2_ONLY.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the AVX-512 paths run on this machine and were not turned off.
pub fn has_avx512() -> bool {
    static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let detected = *DETECTED.get_or_init(|| {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    });
    detected && !AVX2_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

/// How far ahead weight blocks are prefetched; the hardware prefetcher alone leaves loads waiting.
pub const PREFETCH_BYTES: usize = 1024;

/// Hardware f16 to f32; exact.
#[inline]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn f16c_at(b: &[u8], i: usize) -> f32 {
    let bits = u16::from_le_bytes([b[i], b[i + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sum of 32 weights (two vectors of 16) times 32 activations.
#[inline]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn block_dot(lo: __m512, hi: __m512, x: *const f32) -> __m512 {
    _mm512_fmadd_ps(hi, _mm512_loadu_ps(x.add(16)), _mm512_mul_ps(lo, _mm512_loadu_ps(x)))
}

/// # Safety
/// The CPU must support AVX-512F, FMA and F16C; each row holds 32 floats per block of `w`.
#[target_feature(enable = "avx512f,fma,f16c")]
pub unsafe fn q8_0_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R]) {
    let mut acc = [_mm512_setzero_ps(); R];
    for (b, blk) in w.chunks_exact(34).enumerate() {
        _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH_BYTES) as *const i8);
        let d = _mm512_set1_ps(f16c_at(blk, 0));
        let p = blk.as_ptr().add(2);
        let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)));
        let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(16) as *const __m128i)));
        for r in 0..R {
            acc[r] = _mm512_fmadd_ps(d, block_dot(lo, hi, t.rows[r].as_ptr().add(b * 32)), acc[r]);
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]);
    }
}

/// # Safety
/// As for `q8_0_dot`; block sums hold one value per block.
#[target_feature(enable = "avx512f,fma,f16c")]
pub unsafe fn q4_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R], with_min: bool) {
    let (bytes, qs) = if with_min { (20, 4) } else { (18, 2) };
    let mask = _mm_set1_epi8(15);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut mins = [0f32; R];
    for (b, blk) in w.chunks_exact(bytes).enumerate() {
        _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH_BYTES) as *const i8);
        let d = f16c_at(blk, 0);
        let offset = if with_min { f16c_at(blk, 2) } else { -8.0 * d };
        let raw = _mm_loadu_si128(blk.as_ptr().add(qs) as *const __m128i);
        let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, mask)));
        let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), mask)));
        let dv = _mm512_set1_ps(d);
        for r in 0..R {
            acc[r] = _mm512_fmadd_ps(dv, block_dot(lo, hi, t.rows[r].as_ptr().add(b * 32)), acc[r]);
            mins[r] = offset.mul_add(t.block_sums[r][b], mins[r]);
        }
    }
    for r in 0..R {
        out[r] = _mm512_reduce_add_ps(acc[r]) + mins[r];
    }
}
