//! Exact GELU, `x · (1 + erf(x / √2)) / 2`, eight values at a time in f32; the scalar path does the same fused steps.
//!
//! erf is 1 − erfc with erfc from a Chebyshev fit (fractional error below 1.2e-7) times an exponential from
//! a degree-6 polynomial after range reduction; both paths round alike, so they give the same bits.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The erfc fit, highest power first: erfc(z) = t · exp(−z² + Σ c·tⁱ) with t = 1 / (1 + z / 2).
const ERFC: [f32; 10] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_9,
    -1.135_204,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_7,
    -1.265_512_2,
];
/// exp(r) − 1 − r over r²  for |r| ≤ ln 2 / 2, highest power first.
const EXP: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5e-1];
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this, exp is taken at the bound: its value is then far under what 1 − erfc can resolve.
const MIN_EXPONENT: f32 = -87.0;
const SHIFT: f32 = 12_582_912.0;

/// GELU of every value of `x`, in place.
pub fn gelu_in_place(x: &mut [f32]) {
    let done = gelu_vectors(x);
    x[done..].iter_mut().for_each(|v| *v = gelu(*v));
}

/// GELU of the leading whole vectors of `x` where the CPU has them; returns how many values it did.
fn gelu_vectors(x: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        let done = x.len() / 8 * 8;
        // SAFETY: the CPU has AVX2 and FMA; `done` is a multiple of 8 within `x`.
        unsafe { avx2::gelu(&mut x[..done]) };
        return done;
    }
    0
}

/// GELU of one value, step for step as the vector path.
pub fn gelu(v: f32) -> f32 {
    let u = v * std::f32::consts::FRAC_1_SQRT_2;
    let z = u.abs();
    let t = 1.0 / (0.5f32).mul_add(z, 1.0);
    let poly = ERFC[1..].iter().fold(ERFC[0], |acc, c| acc.mul_add(t, *c));
    let e = (-z).mul_add(z, poly).max(MIN_EXPONENT);
    let n = e.mul_add(std::f32::consts::LOG2_E, SHIFT) - SHIFT;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, e));
    let p = EXP[1..].iter().fold(EXP[0], |acc, c| acc.mul_add(r, *c));
    let y = (p * r).mul_add(r, r) + 1.0;
    let exp = y * f32::from_bits(((n as i32 + 127) << 23) as u32);
    let erf = (1.0 - t * exp).copysign(u);
    v * (1.0 + erf) * 0.5
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gelu(x: &mut [f32]) {
        let (one, half) = (_mm256_set1_ps(1.0), _mm256_set1_ps(0.5));
        let sign = _mm256_set1_ps(-0.0);
        for chunk in x.chunks_exact_mut(8) {
            let v = _mm256_loadu_ps(chunk.as_ptr());
            let u = _mm256_mul_ps(v, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
            let z = _mm256_andnot_ps(sign, u);
            let t = _mm256_div_ps(one, _mm256_fmadd_ps(half, z, one));
            let mut poly = _mm256_set1_ps(ERFC[0]);
            for c in &ERFC[1..] {
                poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(*c));
            }
            let e = _mm256_max_ps(_mm256_fmadd_ps(_mm256_xor_ps(z, sign), z, poly), _mm256_set1_ps(MIN_EXPONENT));
            let shift = _mm256_set1_ps(SHIFT);
            let n = _mm256_sub_ps(_mm256_fmadd_ps(e, _mm256_set1_ps(std::f32::consts::LOG2_E), shift), shift);
            let neg_n = _mm256_xor_ps(n, sign);
            let r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(LN2_LO), _mm256_fmadd_ps(neg_n, _mm256_set1_ps(LN2_HI), e));
            let mut p = _mm256_set1_ps(EXP[0]);
            for c in &EXP[1..] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
            }
            let y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), one);
            let scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
            let exp = _mm256_mul_ps(y, _mm256_castsi256_ps(scale));
            let erfc = _mm256_sub_ps(one, _mm256_mul_ps(t, exp));
            let erf = _mm256_or_ps(_mm256_andnot_ps(sign, erfc), _mm256_and_ps(sign, u));
            let out = _mm256_mul_ps(_mm256_mul_ps(v, _mm256_add_ps(one, erf)), half);
            _mm256_storeu_ps(chunk.as_mut_ptr(), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(v: f32) -> f64 {
        let v = v as f64;
        v * (1.0 + libm_erf(v / std::f64::consts::SQRT_2)) * 0.5
    }

    /// erf from its Maclaurin series near 0 and its continued fraction beyond, to about 1e-15.
    fn libm_erf(x: f64) -> f64 {
        let z = x.abs();
        let r = if z < 2.5 {
            let (mut term, mut sum, mut k) = (z, z, 0.0);
            while term.abs() > 1e-17 {
                k += 1.0;
                term *= -z * z / k;
                sum += term / (2.0 * k + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (z + f);
            }
            1.0 - (-z * z).exp() / std::f64::consts::PI.sqrt() / (z + f)
        };
        r.copysign(x)
    }

    #[test]
    fn test_gelu_is_within_4e_7_of_the_exact_value_relative_to_max_1_x() {
        let worst = (-12000..=12000)
            .map(|i| i as f32 * 1e-3)
            .map(|v| (gelu(v) as f64 - reference(v)).abs() / (v.abs() as f64).max(1.0))
            .fold(0.0, f64::max);
        assert!(worst < 4e-7, "gelu is off by {worst}");
        assert_eq!(gelu(0.0), 0.0);
        assert_eq!(gelu(40.0), 40.0);
        assert_eq!(gelu(-40.0), 0.0);
    }

    #[test]
    fn test_vector_path_equals_scalar_path() {
        let mut x: Vec<f32> = (-40000..40000).map(|i| i as f32 * 3.1e-4).collect();
        x.extend([f32::MAX, f32::MIN, 1e-30, -1e-30, 100.0, -100.0, 7.0]);
        let want: Vec<u32> = x.iter().map(|v| gelu(*v).to_bits()).collect();
        gelu_in_place(&mut x);
        assert_eq!(x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
    }
}
