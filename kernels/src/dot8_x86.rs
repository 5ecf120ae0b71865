//! The x86 forms of `dot8`'s integer row dots; each reproduces `dot8::dot_scalar`'s arithmetic exactly.
//!
//! Activations are stored as `q + 128` (u8) and weights as i8, so a lane's `Σ (q + 128) w` less `128 Σ w` is the
//! exact `Σ q w`. AVX2's `vpmaddubsw` would saturate on Q8_0 weights that way, so it takes `|w|` and `sign(q, w)`.
// A tile's rows index its activations, accumulators and outputs in step, so the loops run over row indices.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::dot8_block::{finish, Format, Row, BLOCK, LANES};

/// Hardware f16 to f32; exact, so it equals the software conversion bit for bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16c_at(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The 8-lane sum in `simd`'s fixed tree: ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// A block's 32 weights as i8, in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weights(fmt: Format, blk: *const u8) -> __m256i {
    if fmt == Format::Q8_0 {
        return _mm256_loadu_si256(blk.add(2) as *const __m256i);
    }
    let raw = _mm_loadu_si128(blk.add(if fmt == Format::Q4_1 { 4 } else { 2 }) as *const __m128i);
    let mask = _mm_set1_epi8(15);
    let lo = _mm_and_si128(raw, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    let w = _mm256_set_m128i(hi, lo);
    if fmt == Format::Q4_0 {
        _mm256_sub_epi8(w, _mm256_set1_epi8(8))
    } else {
        w
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn min_of(fmt: Format, blk: *const u8) -> f32 {
    if fmt == Format::Q4_1 {
        f16c_at(blk.add(2))
    } else {
        0.0
    }
}

/// Block `b` of a weight row: its 32 weights as i8, each lane's weight scale, and its minimum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn operand(fmt: Format, row: *const u8, b: usize) -> (__m256i, __m256, f32) {
    if fmt.is_k() {
        return crate::dot8_k::operand_avx2(fmt, row, b);
    }
    let blk = row.add(b * fmt.unit_bytes());
    (weights(fmt, blk), _mm256_set1_ps(f16c_at(blk)), min_of(fmt, blk))
}

/// Block `b` of one weight row into one accumulator per row, the AVX2 way.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_avx2<const R: usize>(
    fmt: Format,
    op: (__m256i, __m256),
    b: usize,
    rows: &[Row; R],
    acc: &mut [__m256; R],
) {
    let ones = _mm256_set1_epi16(1);
    let (wv, dw) = op;
    let abs_w = _mm256_abs_epi8(wv);
    let corr = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(-128), wv), ones);
    for r in 0..R {
        let xu = _mm256_loadu_si256(rows[r].biased.as_ptr().add(b * BLOCK) as *const __m256i);
        let p = if fmt == Format::Q8_0 {
            let q = _mm256_xor_si256(xu, _mm256_set1_epi8(-128));
            _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(q, wv)), ones)
        } else {
            _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(xu, wv), ones), corr)
        };
        let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(rows[r].scales.as_ptr().add(b * LANES)));
        acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), acc[r]);
    }
}

/// Block `b` of one weight row into one accumulator per row, by 256-bit `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn block_avx_vnni<const R: usize>(op: (__m256i, __m256), b: usize, rows: &[Row; R], acc: &mut [__m256; R]) {
    let zero = _mm256_setzero_si256();
    let (wv, dw) = op;
    let neg_corr = _mm256_sub_epi32(zero, _mm256_dpbusd_avx_epi32(zero, _mm256_set1_epi8(-128), wv));
    for r in 0..R {
        let xu = _mm256_loadu_si256(rows[r].biased.as_ptr().add(b * BLOCK) as *const __m256i);
        let p = _mm256_dpbusd_avx_epi32(neg_corr, xu, wv);
        let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(rows[r].scales.as_ptr().add(b * LANES)));
        acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), acc[r]);
    }
}

/// The minimum `mw`'s share of block `b`, added in block order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_mins<const R: usize>(fmt: Format, mw: f32, b: usize, rows: &[Row; R], mins: &mut [f32; R]) {
    if fmt.has_mins() {
        for r in 0..R {
            mins[r] = mw.mul_add(rows[r].sums[b], mins[r]);
        }
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C; each row holds the blocks of `w`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_avx2<const R: usize>(fmt: Format, w: &[u8], rows: &[Row; R], out: &mut [f32; R]) {
    let num_blocks = w.len() / fmt.unit_bytes() * (fmt.unit_len() / BLOCK);
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    let mut mins = [0f32; R];
    for b in 0..num_blocks {
        let ahead = w.as_ptr().wrapping_add(fmt.byte_of(b) + crate::simd512::PREFETCH_BYTES);
        _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        let (wv, dw, mw) = operand(fmt, w.as_ptr(), b);
        block_avx2(fmt, (wv, dw), b, rows, if b % 2 == 0 { &mut even } else { &mut odd });
        add_mins(fmt, mw, b, rows, &mut mins);
    }
    for r in 0..R {
        out[r] = finish(fmt, hsum(_mm256_add_ps(even[r], odd[r])), mins[r]);
    }
}

/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-VNNI; each row holds the blocks of `w`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn dot_avx_vnni<const R: usize>(fmt: Format, w: &[u8], rows: &[Row; R], out: &mut [f32; R]) {
    let num_blocks = w.len() / fmt.unit_bytes() * (fmt.unit_len() / BLOCK);
    let (mut even, mut odd) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
    let mut mins = [0f32; R];
    for b in 0..num_blocks {
        let ahead = w.as_ptr().wrapping_add(fmt.byte_of(b) + crate::simd512::PREFETCH_BYTES);
        _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        let (wv, dw, mw) = operand(fmt, w.as_ptr(), b);
        block_avx_vnni((wv, dw), b, rows, if b % 2 == 0 { &mut even } else { &mut odd });
        add_mins(fmt, mw, b, rows, &mut mins);
    }
    for r in 0..R {
        out[r] = finish(fmt, hsum(_mm256_add_ps(even[r], odd[r])), mins[r]);
    }
}

/// Blocks `b` and `b + 1` of a weight row: lanes 0..8 of the sums come from the first, 8..16 from the second.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn operand_pair(fmt: Format, row: *const u8, b: usize) -> (__m512i, __m512, f32, f32) {
    if fmt.is_k() {
        let ((w0, d0, m0), (w1, d1, m1)) = (operand(fmt, row, b), operand(fmt, row, b + 1));
        let w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
        return (w, join(d0, d1), m0, m1);
    }
    let (blk0, blk1) = (row.add(b * fmt.unit_bytes()), row.add((b + 1) * fmt.unit_bytes()));
    let dw = join(_mm256_set1_ps(f16c_at(blk0)), _mm256_set1_ps(f16c_at(blk1)));
    let (mw0, mw1) = (min_of(fmt, blk0), min_of(fmt, blk1));
    if fmt == Format::Q8_0 {
        let w0 = _mm256_loadu_si256(blk0.add(2) as *const __m256i);
        let w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), _mm256_loadu_si256(blk1.add(2) as *const __m256i), 1);
        return (w, dw, mw0, mw1);
    }
    let at = if fmt == Format::Q4_1 { 4 } else { 2 };
    let raw0 = _mm_loadu_si128(blk0.add(at) as *const __m128i);
    let raw1 = _mm_loadu_si128(blk1.add(at) as *const __m128i);
    let v = _mm256_set_m128i(raw1, raw0);
    let mask = _mm256_set1_epi8(15);
    let lo = _mm256_and_si256(v, mask);
    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    // [lo0, lo1, hi0, hi1] in 128-bit quarters becomes [lo0, hi0, lo1, hi1].
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    let w = _mm512_shuffle_i64x2(z, z, 0b11_01_10_00);
    let w = if fmt == Format::Q4_0 { _mm512_sub_epi8(w, _mm512_set1_epi8(8)) } else { w };
    (w, dw, mw0, mw1)
}

/// Two 8-lane vectors as the low and high halves of one.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn join(lo: __m256, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1))
}

/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI, AVX2, FMA and F16C; each row holds the blocks of `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn dot_avx512_vnni<const R: usize>(fmt: Format, w: &[u8], rows: &[Row; R], out: &mut [f32; R]) {
    let num_blocks = w.len() / fmt.unit_bytes() * (fmt.unit_len() / BLOCK);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut mins = [0f32; R];
    let zero = _mm512_setzero_si512();
    let mut b = 0;
    while b + 2 <= num_blocks {
        let ahead = w.as_ptr().wrapping_add(fmt.byte_of(b) + crate::simd512::PREFETCH_BYTES);
        _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        let (wv, dw, mw0, mw1) = operand_pair(fmt, w.as_ptr(), b);
        let neg_corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(-128), wv));
        for r in 0..R {
            let xu = _mm512_loadu_si512(rows[r].biased.as_ptr().add(b * BLOCK) as *const _);
            let p = _mm512_dpbusd_epi32(neg_corr, xu, wv);
            let scale = _mm512_mul_ps(dw, _mm512_loadu_ps(rows[r].scales.as_ptr().add(b * LANES)));
            acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(p), acc[r]);
            if fmt.has_mins() {
                mins[r] = mw0.mul_add(rows[r].sums[b], mins[r]);
                mins[r] = mw1.mul_add(rows[r].sums[b + 1], mins[r]);
            }
        }
        b += 2;
    }
    if b < num_blocks {
        // An odd last block has an even index, so it feeds lanes 0..8 alone.
        let (wv, dw, mw) = operand(fmt, w.as_ptr(), b);
        let zero = _mm256_setzero_si256();
        let neg_corr = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(-128), wv));
        for r in 0..R {
            let xu = _mm256_loadu_si256(rows[r].biased.as_ptr().add(b * BLOCK) as *const __m256i);
            let p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(neg_corr, xu, wv));
            let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(rows[r].scales.as_ptr().add(b * LANES)));
            let (scale, p) = (_mm512_castps256_ps512(scale), _mm512_castps256_ps512(p));
            acc[r] = _mm512_mask3_fmadd_ps(scale, p, acc[r], 0x00FF);
            if fmt.has_mins() {
                mins[r] = mw.mul_add(rows[r].sums[b], mins[r]);
            }
        }
    }
    for r in 0..R {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1));
        out[r] = finish(fmt, hsum(_mm256_add_ps(_mm512_castps512_ps256(acc[r]), hi)), mins[r]);
    }
}
