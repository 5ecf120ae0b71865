//! The K-quants' sub-blocks as `dot8` meets them: each 32-element block of a 256-element super-block with its
//! scales and minimum, in the scalar form and the AVX2 form, which decode to the same integers and floats.
//!
//! A Q4_K or Q5_K block's value is `d·sc·q − dmin·m`, so its minimum is `−(dmin·m)`; Q6_K has a scale per 16
//! elements, so lanes 0..4 and 4..8 of a block take their own. Each product of an f16 and a 6- or 8-bit integer is
//! exact in f32.

use crate::dot8_block::{f16_at, Format, BLOCK};
use crate::quant::k_scale_min;

/// The scales of sub-block `j`'s halves and its minimum, from super-block `sup`.
fn scales(fmt: Format, sup: &[u8], j: usize) -> ([f32; 2], f32) {
    if fmt == Format::Q6K {
        let d = f16_at(sup, 208);
        let sc = |i: usize| d * sup[192 + 2 * j + i] as i8 as f32;
        return ([sc(0), sc(1)], 0.0);
    }
    let (sc, m) = k_scale_min(&sup[4..16], j);
    let d = f16_at(sup, 0) * sc as f32;
    ([d, d], -(f16_at(sup, 2) * m as f32))
}

/// Sub-block `j` (0..8) of super-block `sup` as 32 signed integers, its halves' scales and its minimum.
pub(crate) fn decode(fmt: Format, sup: &[u8], j: usize) -> ([i8; BLOCK], [f32; 2], f32) {
    let mut w = [0u8; BLOCK];
    match fmt {
        Format::Q4K => {
            let chunk = &sup[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
            w.iter_mut().zip(chunk).for_each(|(w, &q)| *w = (q >> (4 * (j % 2))) & 15);
        }
        Format::Q5K => {
            let (qh, chunk) = (&sup[16..48], &sup[48 + 32 * (j / 2)..48 + 32 * (j / 2) + 32]);
            for l in 0..BLOCK {
                w[l] = ((chunk[l] >> (4 * (j % 2))) & 15) | (((qh[l] >> j) & 1) << 4);
            }
        }
        _ => {
            let (half, s) = (j / 4, j % 4);
            let ql = &sup[64 * half + 32 * (s % 2)..64 * half + 32 * (s % 2) + 32];
            let qh = &sup[128 + 32 * half..128 + 32 * half + 32];
            for l in 0..BLOCK {
                w[l] = (((ql[l] >> (4 * (s / 2))) & 15) | (((qh[l] >> (2 * s)) & 3) << 4)).wrapping_sub(32);
            }
        }
    }
    let (dw, mw) = scales(fmt, sup, j);
    (w.map(|v| v as i8), dw, mw)
}

/// Bytes `at..at + 32` of `p`, shifted right by `shift` within 16-bit words, masked per byte.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits(p: *const u8, at: usize, shift: usize, mask: i8) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let v = _mm256_loadu_si256(p.add(at) as *const __m256i);
    _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32)), _mm256_set1_epi8(mask))
}

/// Block `b` of a weight row as `decode` gives it: 32 i8 weights, per-lane weight scales, and the minimum.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `row` holds block `b`'s super-block.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn operand_avx2(
    fmt: Format,
    row: *const u8,
    b: usize,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256, f32) {
    use std::arch::x86_64::*;
    let (sup, j) = (row.add(b / 8 * fmt.unit_bytes()), b % 8);
    let w = match fmt {
        Format::Q4K => bits(sup, 16 + 32 * (j / 2), 4 * (j % 2), 15),
        Format::Q5K => {
            let lo = bits(sup, 48 + 32 * (j / 2), 4 * (j % 2), 15);
            _mm256_or_si256(lo, _mm256_slli_epi16(bits(sup, 16, j, 1), 4))
        }
        _ => {
            let (half, s) = (j / 4, j % 4);
            let lo = bits(sup, 64 * half + 32 * (s % 2), 4 * (s / 2), 15);
            let hi = bits(sup, 128 + 32 * half, 2 * s, 3);
            _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32))
        }
    };
    let ([d0, d1], mw) = scales(fmt, std::slice::from_raw_parts(sup, fmt.unit_bytes()), j);
    (w, _mm256_setr_ps(d0, d0, d0, d0, d1, d1, d1, d1), mw)
}
