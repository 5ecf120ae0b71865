//! The per-bin factors of a frame's three branches, eight bins at a time in f32 where the CPU has AVX2 and FMA.
//!
//! exp, tanh and sincos are polynomials after range reduction (Cephes' forms), within a few units in the last
//! place of libm's; where AVX2 is missing, and for the bins past the last whole vector, libm computes them.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::spectrum::{gain, FrameParts};

/// Per bin: the harmonic branch's gain as a complex factor, the noise gain, and the free-phase branch's value.
#[derive(Clone, Debug)]
pub(super) struct Branches {
    pub harmonic_re: Vec<f32>,
    pub harmonic_im: Vec<f32>,
    pub noise: Vec<f32>,
    pub free_re: Vec<f32>,
    pub free_im: Vec<f32>,
}

impl Branches {
    pub fn new(num_bins: usize) -> Branches {
        let zeros = vec![0.0f32; num_bins];
        Branches {
            harmonic_re: zeros.clone(),
            harmonic_im: zeros.clone(),
            noise: zeros.clone(),
            free_re: zeros.clone(),
            free_im: zeros,
        }
    }

    /// `e^lh · e^{iπ·tanh θ}`, `e^ln` and `e^lr · e^{iφ}` for every bin of `parts`.
    pub fn compute(&mut self, parts: &FrameParts) {
        let done = self.compute_vectors(parts);
        for b in done..self.noise.len() {
            let harmonic = gain(parts.lh[b]);
            let turn = parts.theta[b].tanh() * std::f32::consts::PI;
            self.harmonic_re[b] = turn.cos() * harmonic;
            self.harmonic_im[b] = turn.sin() * harmonic;
            self.noise[b] = gain(parts.ln[b]);
            let free = gain(parts.lr[b]);
            self.free_re[b] = parts.phi[b].cos() * free;
            self.free_im[b] = parts.phi[b].sin() * free;
        }
    }

    /// The leading whole vectors of bins where the CPU has AVX2; returns how many bins it did.
    fn compute_vectors(&mut self, parts: &FrameParts) -> usize {
        #[cfg(target_arch = "x86_64")]
        if tensorfold_kernels::simd::has_avx2() {
            let done = self.noise.len() / 8 * 8;
            // SAFETY: the CPU has AVX2 and FMA; every slice holds at least `done` bins.
            unsafe { avx2::compute(parts, self, done) };
            return done;
        }
        0
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    /// exp(r) − 1 − r over r² for |r| ≤ ln 2 / 2, highest power first.
    const EXP: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5e-1];
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// π/2 in three parts, so that x − k·π/2 is exact for the k that phases take.
    const HALF_PI: [f32; 3] = [1.570_312_5, 4.837_513e-4, 7.549_79e-8];
    const SIN: [f32; 3] = [-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1];
    const COS: [f32; 3] = [2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2];
    /// Where exp is 0 in f32; the clamp of the gains keeps the other end finite.
    const MIN_EXP: f32 = -87.0;
    const MAX_LOG_GAIN: f32 = 7.0;
    /// tanh is ±1 in f32 beyond this.
    const TANH_LIMIT: f32 = 9.0;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn poly(x: __m256, coefficients: &[f32]) -> __m256 {
        let mut p = _mm256_set1_ps(coefficients[0]);
        for c in &coefficients[1..] {
            p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(*c));
        }
        p
    }

    /// e^x, 0 below MIN_EXP; x at most 88.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp(x: __m256) -> __m256 {
        let under = _mm256_cmp_ps(x, _mm256_set1_ps(MIN_EXP), _CMP_LT_OQ);
        // max takes its second operand when either is NaN, so a NaN stays NaN.
        let x = _mm256_max_ps(_mm256_set1_ps(MIN_EXP), x);
        let n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)), _MM_FROUND_TO_NEAREST_INT);
        let neg_n = _mm256_sub_ps(_mm256_setzero_ps(), n);
        let r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(LN2_LO), _mm256_fmadd_ps(neg_n, _mm256_set1_ps(LN2_HI), x));
        let p = poly(r, &EXP);
        let y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0));
        let scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(scale)))
    }

    /// e^min(x, 7), as `spectrum::gain`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gain(x: __m256) -> __m256 {
        // min takes its second operand when either is NaN, so a NaN stays NaN.
        exp(_mm256_min_ps(_mm256_set1_ps(MAX_LOG_GAIN), x))
    }

    /// tanh x = sign(x) · (1 − 2 / (e^{2|x|} + 1)).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tanh(x: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let a = _mm256_min_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(TANH_LIMIT));
        let e = exp(_mm256_add_ps(a, a));
        let t = _mm256_sub_ps(
            _mm256_set1_ps(1.0),
            _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, _mm256_set1_ps(1.0))),
        );
        _mm256_or_ps(t, _mm256_and_ps(sign, x))
    }

    /// (sin x, cos x): x reduced by the nearest multiple k of π/2, the quadrant k mod 4 picks and signs.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sincos(x: __m256) -> (__m256, __m256) {
        let k =
            _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::FRAC_2_PI)), _MM_FROUND_TO_NEAREST_INT);
        let neg_k = _mm256_sub_ps(_mm256_setzero_ps(), k);
        let mut r = x;
        for part in HALF_PI {
            r = _mm256_fmadd_ps(neg_k, _mm256_set1_ps(part), r);
        }
        let r2 = _mm256_mul_ps(r, r);
        let s = _mm256_fmadd_ps(_mm256_mul_ps(poly(r2, &SIN), r2), r, r);
        let c = _mm256_fmadd_ps(
            _mm256_mul_ps(poly(r2, &COS), r2),
            r2,
            _mm256_fnmadd_ps(_mm256_set1_ps(0.5), r2, _mm256_set1_ps(1.0)),
        );
        let q = _mm256_cvtps_epi32(k);
        let swap =
            _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(1)));
        let (sin, cos) = (_mm256_blendv_ps(s, c, swap), _mm256_blendv_ps(c, s, swap));
        // sin is negative in quadrants 2 and 3, cos in quadrants 1 and 2.
        let sin_sign = _mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(2)), 30);
        let cos_sign =
            _mm256_slli_epi32(_mm256_and_si256(_mm256_add_epi32(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(2)), 30);
        (_mm256_xor_ps(sin, _mm256_castsi256_ps(sin_sign)), _mm256_xor_ps(cos, _mm256_castsi256_ps(cos_sign)))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn compute(parts: &FrameParts, out: &mut Branches, num_bins: usize) {
        let load = |v: &[f32], b: usize| _mm256_loadu_ps(v.as_ptr().add(b));
        let store = |v: &mut [f32], b: usize, x: __m256| _mm256_storeu_ps(v.as_mut_ptr().add(b), x);
        for b in (0..num_bins).step_by(8) {
            let harmonic = gain(load(parts.lh, b));
            let turn = _mm256_mul_ps(tanh(load(parts.theta, b)), _mm256_set1_ps(std::f32::consts::PI));
            let (sin, cos) = sincos(turn);
            store(&mut out.harmonic_re, b, _mm256_mul_ps(cos, harmonic));
            store(&mut out.harmonic_im, b, _mm256_mul_ps(sin, harmonic));
            store(&mut out.noise, b, gain(load(parts.ln, b)));
            let free = gain(load(parts.lr, b));
            let (sin, cos) = sincos(load(parts.phi, b));
            store(&mut out.free_re, b, _mm256_mul_ps(cos, free));
            store(&mut out.free_im, b, _mm256_mul_ps(sin, free));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_vector_factors_are_within_a_few_ulp_of_libm() {
        let n = 4096;
        let ramp =
            |scale: f32, offset: f32| (0..n).map(|i| (i as f32 / n as f32 - 0.5) * scale + offset).collect::<Vec<_>>();
        let (lh, theta, ln, lr, phi) =
            (ramp(40.0, -8.0), ramp(24.0, 0.0), ramp(200.0, -60.0), ramp(18.0, 0.0), ramp(400.0, 3.0));
        let parts = FrameParts { lh: &lh, theta: &theta, ln: &ln, lr: &lr, phi: &phi };
        let mut fast = Branches::new(n);
        fast.compute(&parts);
        for b in 0..n {
            let (h, turn, free) = (gain(lh[b]), theta[b].tanh() * std::f32::consts::PI, gain(lr[b]));
            let close = |got: f32, want: f32, scale: f32| (got - want).abs() <= 4e-7 * scale.max(want.abs()) + 1e-37;
            assert!(
                close(fast.harmonic_re[b], turn.cos() * h, h),
                "bin {b}: {} vs {}",
                fast.harmonic_re[b],
                turn.cos() * h
            );
            assert!(close(fast.harmonic_im[b], turn.sin() * h, h), "bin {b}");
            assert!(close(fast.noise[b], gain(ln[b]), 0.0), "bin {b}: {} vs {}", fast.noise[b], gain(ln[b]));
            // φ reaches ±200, where one ulp of the angle is 1.5e-5.
            assert!(close(fast.free_re[b], phi[b].cos() * free, free * 40.0), "bin {b}");
            assert!(close(fast.free_im[b], phi[b].sin() * free, free * 40.0), "bin {b}");
        }
    }

    #[test]
    fn test_silent_and_nan_bins_match_gain() {
        let v = [f32::NEG_INFINITY, -1e9, -100.0, f32::NAN, 9.0, 0.0, -3.0, 1.0, 2.0];
        let parts = FrameParts { lh: &v, theta: &v, ln: &v, lr: &v, phi: &[0.0; 9] };
        let mut fast = Branches::new(9);
        fast.compute(&parts);
        assert_eq!(&fast.noise[..3], &[0.0, 0.0, 0.0]);
        assert!(fast.noise[3].is_nan());
        assert!((fast.noise[4] / gain(7.0) - 1.0).abs() < 4e-7);
        assert_eq!(fast.free_re[5], 1.0);
    }
}
