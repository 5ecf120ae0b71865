//! NoiseBlock noise drawn from (seed, block, absolute position) alone, so a window decodes like the whole.

/// Positions of one block stay below 2^48, so (block, position) pairs never share a counter.
const POSITION_BITS: u32 = 48;

/// A standard normal draw for `position` of decoder block `block`, by Box-Muller on two uniforms.
pub(crate) fn normal(seed: u64, block: usize, position: u64) -> f32 {
    crate::normal::normal(seed, ((block as u64) << POSITION_BITS) | position)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_draws_are_standard_normal_and_differ_by_block_and_seed() {
        let draws: Vec<f64> = (0..20_000).map(|p| normal(3, 1, p) as f64).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        let var = draws.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / draws.len() as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean}, variance {var}");
        assert_ne!(normal(3, 1, 10), normal(3, 2, 10));
        assert_ne!(normal(3, 1, 10), normal(4, 1, 10));
        assert_eq!(normal(3, 1, 10).to_bits(), normal(3, 1, 10).to_bits());
    }
}
