//! Standard normal draws from a counter alone, shared by the codecs, so noise never depends on batching or windows.

use tensorfold_kernels::sampling::uniform;

/// Box-Muller's radius and angle from the uniforms at counters 2·index and 2·index + 1.
fn polar(seed: u64, index: u64) -> (f64, f64) {
    let counter = index.wrapping_mul(2);
    let (u1, u2) = (uniform(seed, counter), uniform(seed, counter + 1));
    ((-2.0 * (1.0 - u1).ln()).sqrt(), 2.0 * std::f64::consts::PI * u2)
}

/// One standard normal for `index`: the cosine half of its Box-Muller pair.
pub(crate) fn normal(seed: u64, index: u64) -> f32 {
    let (radius, angle) = polar(seed, index);
    (radius * angle.cos()) as f32
}

/// Two independent standard normals for `index`; the first equals `normal(seed, index)`.
pub(crate) fn normal_pair(seed: u64, index: u64) -> (f32, f32) {
    let (radius, angle) = polar(seed, index);
    ((radius * angle.cos()) as f32, (radius * angle.sin()) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_pairs_are_independent_standard_normals() {
        let pairs: Vec<(f64, f64)> = (0..20_000)
            .map(|i| {
                let (re, im) = normal_pair(5, i);
                (re as f64, im as f64)
            })
            .collect();
        let n = pairs.len() as f64;
        for part in [|p: &(f64, f64)| p.0, |p: &(f64, f64)| p.1] {
            let mean = pairs.iter().map(part).sum::<f64>() / n;
            let var = pairs.iter().map(|p| (part(p) - mean).powi(2)).sum::<f64>() / n;
            assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean}, variance {var}");
        }
        let corr = pairs.iter().map(|p| p.0 * p.1).sum::<f64>() / n;
        assert!(corr.abs() < 0.03, "correlation {corr}");
        assert_eq!(normal_pair(5, 9).0.to_bits(), normal(5, 9).to_bits());
        assert_ne!(normal_pair(5, 9), normal_pair(6, 9));
    }
}
