//! SNAC's Snake activation, `x + sin²(αx) / (α + 1e-9)` with one learned α per channel.

use rayon::prelude::*;

/// Time rows per parallel task; the activation is elementwise, so any split gives the same bits.
const ROWS_PER_TASK: usize = 64;

pub(crate) struct Snake {
    alpha: Vec<f32>,
    /// `1 / (α + 1e-9)` in f32, as the reference computes it.
    inv_alpha: Vec<f32>,
}

impl Snake {
    pub(crate) fn new(alpha: Vec<f32>) -> Self {
        let inv_alpha = alpha.iter().map(|a| 1.0 / (a + 1e-9)).collect();
        Self { alpha, inv_alpha }
    }

    pub(crate) fn view(&self) -> super::view::SnakeView<'_> {
        super::view::SnakeView { alpha: &self.alpha, inv_alpha: &self.inv_alpha }
    }

    /// Applies the activation in place to time-major rows of `alpha.len()` channels.
    pub(crate) fn forward(&self, x: &mut [f32]) {
        let c = self.alpha.len();
        x.par_chunks_mut(ROWS_PER_TASK * c).for_each(|rows| {
            for row in rows.chunks_exact_mut(c) {
                for ((v, a), inv) in row.iter_mut().zip(&self.alpha).zip(&self.inv_alpha) {
                    let s = (a * *v).sin();
                    *v += inv * (s * s);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_snake_matches_its_formula_per_channel() {
        let alpha: Vec<f32> = (0..5).map(|i| 0.5 + i as f32 * 0.3).collect();
        let x: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.15).collect();
        let mut y = x.clone();
        Snake::new(alpha.clone()).forward(&mut y);
        for (j, (v, got)) in x.iter().zip(&y).enumerate() {
            let (v, a) = (*v as f64, alpha[j % 5] as f64);
            let want = v + (a * v).sin().powi(2) / (a + 1e-9);
            assert!((*got as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "at {j}: {got} vs {want}");
        }
    }
}
