//! Row-tile dot products of activations with one weight row; each output's arithmetic is fixed by the shape.
// A tile's rows index its activations, accumulators and outputs in step, so the loops run over row indices.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::f16;

/// Whether the AVX2+FMA+F16C paths run on this machine.
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Activations for one tile of rows: each row is `cols` long, and for blocked weights its per-block sums.
pub struct Tile<'a, const R: usize> {
    pub rows: [&'a [f32]; R],
    pub block_sums: [&'a [f32]; R],
}

/// Scalar reference arithmetic, used where AVX2 is missing; same shape of sums as the SIMD path.
mod scalar {
    use super::*;

    pub fn f32_dot<const R: usize>(w: &[f32], t: &Tile<R>, out: &mut [f32; R]) {
        for r in 0..R {
            let mut acc = [0f32; 8];
            let x = t.rows[r];
            for (wc, xc) in w.chunks_exact(8).zip(x.chunks_exact(8)) {
                for l in 0..8 {
                    acc[l] = wc[l].mul_add(xc[l], acc[l]);
                }
            }
            out[r] = hsum8(acc) + tail(w, x);
        }
    }

    pub fn q8_0_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R]) {
        for r in 0..R {
            let mut acc = 0f32;
            for (b, blk) in w.chunks_exact(34).enumerate() {
                let x = &t.rows[r][b * 32..b * 32 + 32];
                let s: f32 = (0..32).map(|i| blk[2 + i] as i8 as f32 * x[i]).sum();
                acc = f16_at(blk, 0).mul_add(s, acc);
            }
            out[r] = acc;
        }
    }

    pub fn q4_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R], with_min: bool) {
        let bytes = if with_min { 20 } else { 18 };
        let qs = if with_min { 4 } else { 2 };
        for r in 0..R {
            let (mut acc, mut mins) = (0f32, 0f32);
            for (b, blk) in w.chunks_exact(bytes).enumerate() {
                let x = &t.rows[r][b * 32..b * 32 + 32];
                let q = &blk[qs..qs + 16];
                let s: f32 = (0..16).map(|i| (q[i] & 15) as f32 * x[i] + (q[i] >> 4) as f32 * x[i + 16]).sum();
                acc = f16_at(blk, 0).mul_add(s, acc);
                let offset = if with_min { f16_at(blk, 2) } else { -8.0 * f16_at(blk, 0) };
                mins = offset.mul_add(t.block_sums[r][b], mins);
            }
            out[r] = acc + mins;
        }
    }

    pub fn hsum8(a: [f32; 8]) -> f32 {
        ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
    }

    pub fn tail(w: &[f32], x: &[f32]) -> f32 {
        let n = w.len() / 8 * 8;
        w[n..].iter().zip(&x[n..]).fold(0.0, |s, (a, b)| a.mul_add(*b, s))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    /// Hardware f16 to f32; exact, so it equals the software conversion bit for bit.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16c_at(b: &[u8], i: usize) -> f32 {
        let bits = u16::from_le_bytes([b[i], b[i + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f32_dot<const R: usize>(w: &[f32], t: &Tile<R>, out: &mut [f32; R]) {
        let mut acc = [_mm256_setzero_ps(); R];
        let n = w.len() / 8 * 8;
        let mut k = 0;
        while k < n {
            let wv = _mm256_loadu_ps(w.as_ptr().add(k));
            for r in 0..R {
                acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(t.rows[r].as_ptr().add(k)), acc[r]);
            }
            k += 8;
        }
        for r in 0..R {
            out[r] = hsum(acc[r]) + scalar::tail(w, t.rows[r]);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_dot(q: [__m256; 4], x: *const f32) -> __m256 {
        let mut s = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
        s = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x.add(8)), s);
        s = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x.add(16)), s);
        _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x.add(24)), s)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let a = _mm256_set1_ps(alpha);
        let n = x.len() / 8 * 8;
        let mut k = 0;
        while k < n {
            let acc = _mm256_fmadd_ps(a, _mm256_loadu_ps(x.as_ptr().add(k)), _mm256_loadu_ps(y.as_ptr().add(k)));
            _mm256_storeu_ps(y.as_mut_ptr().add(k), acc);
            k += 8;
        }
        for i in n..x.len() {
            y[i] = alpha.mul_add(x[i], y[i]);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn i8x8(p: *const u8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn u8x8(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8_0_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R]) {
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, blk) in w.chunks_exact(34).enumerate() {
            _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(crate::simd512::PREFETCH_BYTES) as *const i8);
            let d = _mm256_set1_ps(f16c_at(blk, 0));
            let p = blk.as_ptr().add(2);
            let q = [i8x8(p), i8x8(p.add(8)), i8x8(p.add(16)), i8x8(p.add(24))];
            for r in 0..R {
                acc[r] = _mm256_fmadd_ps(d, block_dot(q, t.rows[r].as_ptr().add(b * 32)), acc[r]);
            }
        }
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q4_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R], with_min: bool) {
        let bytes = if with_min { 20 } else { 18 };
        let qs = if with_min { 4 } else { 2 };
        let mask = _mm_set1_epi8(15);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut mins = [0f32; R];
        for (b, blk) in w.chunks_exact(bytes).enumerate() {
            _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(crate::simd512::PREFETCH_BYTES) as *const i8);
            let d = f16c_at(blk, 0);
            let offset = if with_min { f16c_at(blk, 2) } else { -8.0 * d };
            let raw = _mm_loadu_si128(blk.as_ptr().add(qs) as *const __m128i);
            let lo = _mm_and_si128(raw, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
            let q = [u8x8(lo), u8x8(_mm_srli_si128(lo, 8)), u8x8(hi), u8x8(_mm_srli_si128(hi, 8))];
            let dv = _mm256_set1_ps(d);
            for r in 0..R {
                acc[r] = _mm256_fmadd_ps(dv, block_dot(q, t.rows[r].as_ptr().add(b * 32)), acc[r]);
                mins[r] = offset.mul_add(t.block_sums[r][b], mins[r]);
            }
        }
        for r in 0..R {
            out[r] = hsum(acc[r]) + mins[r];
        }
    }
}

/// Dot of each tile row with a row of f32 weights.
pub fn f32_dot<const R: usize>(w: &[f32], t: &Tile<R>, out: &mut [f32; R]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA; every row is at least `w.len()` long.
        return unsafe { avx2::f32_dot(w, t, out) };
    }
    scalar::f32_dot(w, t, out)
}

/// `y += alpha * x`, fused where the CPU has FMA.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA; both slices have the same length.
        return unsafe { avx2::axpy(alpha, x, y) };
    }
    y.iter_mut().zip(x).for_each(|(y, x)| *y += alpha * x);
}

/// Dot of each tile row with a row of Q8_0 blocks.
pub fn q8_0_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd512::has_avx512() {
        // SAFETY: the CPU supports AVX-512F, FMA and F16C; each row holds 32 floats per block.
        return unsafe { crate::simd512::q8_0_dot(w, t, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: as above; each row holds 32 floats per block.
        return unsafe { avx2::q8_0_dot(w, t, out) };
    }
    scalar::q8_0_dot(w, t, out)
}

/// Whether the 8- and 4-bit row dots take tiles of 8 rows (their AVX-512 forms); the AVX2 forms take 4.
pub fn wide_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::simd512::has_avx512() {
        return true;
    }
    false
}

/// Dot of each tile row with a row of Q4_0 (`with_min` false) or Q4_1 blocks.
pub fn q4_dot<const R: usize>(w: &[u8], t: &Tile<R>, out: &mut [f32; R], with_min: bool) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd512::has_avx512() {
        // SAFETY: the CPU supports AVX-512F, FMA and F16C; block sums hold one value per block.
        return unsafe { crate::simd512::q4_dot(w, t, out, with_min) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: as above; block sums hold one value per block.
        return unsafe { avx2::q4_dot(w, t, out, with_min) };
    }
    scalar::q4_dot(w, t, out, with_min)
}
