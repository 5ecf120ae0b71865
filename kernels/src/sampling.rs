//! Token sampling; a lane's draw at position p depends only on (seed, p).

/// How to choose the next token; temperature 0 is greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0 keeps every token.
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Whether `sample` takes the largest logit: no penalty changes the logits, and no draw is made.
    pub fn is_greedy(&self) -> bool {
        self.repetition_penalty == 1.0 && (self.temperature == 0.0 || self.top_k == 1)
    }

    /// Checks ranges; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        let p = self;
        if !(p.temperature.is_finite() && p.temperature >= 0.0) {
            return Err(format!("temperature must be >= 0, got {}", p.temperature));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", p.top_p));
        }
        if !(0.0..=1.0).contains(&p.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", p.min_p));
        }
        if !(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0) {
            return Err(format!("repetition_penalty must be > 0, got {}", p.repetition_penalty));
        }
        Ok(())
    }
}

/// SplitMix64's finalizer: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// A uniform draw in [0, 1) from the counter (seed, position) alone.
pub fn uniform(seed: u64, position: u64) -> f64 {
    let z = mix(mix(seed ^ 0x9e3779b97f4a7c15).wrapping_add(position.wrapping_mul(0x9e3779b97f4a7c15)));
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Divides positive logits and multiplies negative ones by the penalty, once per seen token.
fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty != 1.0 {
        penalize(logits, &distinct(history), penalty);
    }
}

/// The repetition penalty on each of `distinct` tokens; ids outside the vocabulary change nothing.
pub fn penalize(logits: &mut [f32], distinct: &[u32], penalty: f32) {
    for &t in distinct {
        if let Some(l) = logits.get_mut(t as usize) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// A token whose weight `exp((logit - max) / temperature)` is below 2^-40 is never drawn nor counted: the test is on
/// the exponent in f64, so any backend that computes it decides alike.
pub const KEEP_BELOW_MAX: f64 = 40.0 * std::f64::consts::LN_2;

/// Whether a draw at `temperature` keeps a token of `logit` beside the largest logit `max`.
pub fn is_kept(logit: f32, max: f32, temperature: f32) -> bool {
    (logit as f64 - max as f64) / temperature as f64 >= -KEEP_BELOW_MAX
}

/// The ids, in order, and logits of the tokens a non-greedy draw at `temperature` can take.
pub fn kept(logits: &[f32], temperature: f32) -> (Vec<u32>, Vec<f32>) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let ids: Vec<u32> = (0..logits.len() as u32).filter(|&i| is_kept(logits[i as usize], max, temperature)).collect();
    let values = ids.iter().map(|&i| logits[i as usize]).collect();
    (ids, values)
}

/// The distinct tokens of a history, in first-seen order: the ones a repetition penalty changes.
pub fn distinct(history: &[u32]) -> Vec<u32> {
    let mut seen = std::collections::HashSet::new();
    history.iter().copied().filter(|t| seen.insert(*t)).collect()
}

/// Picks the token at `position` from `logits`, given the tokens the lane holds so far.
pub fn sample(logits: &[f32], params: &SamplingParams, history: &[u32], position: u64) -> u32 {
    // Only a repetition penalty changes the logits, so only then are they copied.
    let logits: std::borrow::Cow<[f32]> = match params.repetition_penalty == 1.0 {
        true => std::borrow::Cow::Borrowed(logits),
        false => {
            let mut owned = logits.to_vec();
            apply_repetition_penalty(&mut owned, history, params.repetition_penalty);
            std::borrow::Cow::Owned(owned)
        }
    };
    if params.temperature == 0.0 || params.top_k == 1 {
        return crate::ops::argmax(&logits) as u32;
    }
    let (ids, values) = kept(&logits, params.temperature);
    sample_kept(&ids, &values, params, position)
}

/// `sample` over the tokens `kept` left, their repetition penalty already applied; the same draw.
pub fn sample_kept(ids: &[u32], logits: &[f32], params: &SamplingParams, position: u64) -> u32 {
    if params.temperature == 0.0 || params.top_k == 1 {
        return ids[crate::ops::argmax(logits)];
    }
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
    let t = params.temperature as f64;
    let filtered = params.top_k > 0 || params.top_p < 1.0 || params.min_p > 0.0;
    // Without filters the draw walks the tokens in id order; sorting them would only cost time.
    let (order, probs) = match filtered {
        true => candidates(logits, params, max),
        false => {
            let weights: Vec<f64> = logits.iter().map(|&l| ((l as f64 - max) / t).exp()).collect();
            let total: f64 = weights.iter().sum();
            ((0..logits.len()).collect(), weights.iter().map(|w| w / total).collect())
        }
    };
    let mut keep = probs.len();
    if params.top_p < 1.0 {
        let mut cum = 0.0;
        keep = probs
            .iter()
            .position(|p| {
                cum += p;
                cum >= params.top_p as f64
            })
            .map_or(keep, |i| i + 1);
    }
    if params.min_p > 0.0 {
        let floor = probs[0] * params.min_p as f64;
        keep = keep.min(probs.iter().take_while(|p| **p >= floor).count().max(1));
    }
    let total: f64 = probs[..keep].iter().sum();
    let mut target = uniform(params.seed, position) * total;
    for (i, p) in probs[..keep].iter().enumerate() {
        target -= p;
        if target < 0.0 {
            return ids[order[i]];
        }
    }
    ids[order[keep - 1]]
}

/// The tokens a filtered draw may take, largest logit first (ties to the lower id), with their probabilities: the
/// top k when `top_k` is set, normalized over them; otherwise, normalized over the whole vocabulary (summed in id
/// order), every token whose weight's binary exponent reaches the one where the top-p mass, or the min-p floor, is
/// crossed. Only those are sorted; the walk over them finds the same tokens a sort of the whole vocabulary would.
fn candidates(logits: &[f32], params: &SamplingParams, max: f64) -> (Vec<usize>, Vec<f64>) {
    let t = params.temperature as f64;
    let weight = |i: usize| ((logits[i] as f64 - max) / t).exp();
    let desc = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let n = logits.len();
    if params.top_k > 0 && params.top_k < n {
        let mut order: Vec<usize> = (0..n).collect();
        order.select_nth_unstable_by(params.top_k - 1, desc);
        order.truncate(params.top_k);
        order.sort_unstable_by(desc);
        let weights: Vec<f64> = order.iter().map(|&i| weight(i)).collect();
        let total: f64 = weights.iter().sum();
        return (order, weights.iter().map(|w| w / total).collect());
    }
    let weights: Vec<f64> = (0..n).map(weight).collect();
    let total: f64 = weights.iter().sum();
    let exponent = |w: f64| (w.to_bits() >> 52) as usize & 0x7ff;
    let mut mass = vec![0f64; 0x800];
    weights.iter().for_each(|&w| mass[exponent(w)] += w);
    // The largest weight is 1, so min-p's floor on probabilities is min_p on weights.
    let mut threshold = match params.min_p > 0.0 {
        true => exponent(params.min_p as f64),
        false => 0,
    };
    if params.top_p < 1.0 {
        let (goal, mut cum) = (params.top_p as f64 * total, 0.0);
        let crossed = (0..0x800).rev().find(|&e| {
            cum += mass[e];
            cum >= goal
        });
        threshold = threshold.max(crossed.unwrap_or(0));
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| exponent(weights[i]) >= threshold).collect();
    order.sort_unstable_by(desc);
    let probs = order.iter().map(|&i| weights[i] / total).collect();
    (order, probs)
}

/// Log-probability of each token under the raw logits, computed in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
    let lse = max + logits.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln();
    logits.iter().map(|v| (*v as f64 - lse) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams { temperature, seed: 42, ..Default::default() }
    }

    #[test]
    fn test_greedy_takes_the_first_maximum() {
        assert_eq!(sample(&[0.1, 3.0, 3.0, -1.0], &params(0.0), &[], 0), 1);
    }

    #[test]
    fn test_is_greedy_exactly_where_sample_takes_the_largest_logit() {
        let logits = [0.1, 0.7, 0.7, -0.2, 0.5];
        let top1 = SamplingParams { top_k: 1, ..params(1.0) };
        let penalised = SamplingParams { repetition_penalty: 2.0, ..params(0.0) };
        assert_eq!(
            [params(0.0).is_greedy(), top1.is_greedy(), params(0.8).is_greedy(), penalised.is_greedy()],
            [true, true, false, false]
        );
        for p in [params(0.0), top1] {
            assert_eq!(sample(&logits, &p, &[1], 3), crate::ops::argmax(&logits) as u32);
        }
        // A penalty on a seen token can move the pick away from the largest raw logit.
        assert_eq!(sample(&logits, &penalised, &[1], 3), 2);
    }

    #[test]
    fn test_draw_depends_only_on_seed_and_position() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let a: Vec<u32> = (0..64).map(|p| sample(&logits, &params(1.0), &[], p)).collect();
        let b: Vec<u32> = (0..64).rev().map(|p| sample(&logits, &params(1.0), &[], p)).collect();
        assert_eq!(a, b.into_iter().rev().collect::<Vec<_>>());
        assert!(a.iter().any(|t| *t != a[0]), "a seeded draw should vary with position");
        let other = SamplingParams { seed: 43, ..params(1.0) };
        assert_ne!(a, (0..64).map(|p| sample(&logits, &other, &[], p)).collect::<Vec<_>>());
    }

    #[test]
    fn test_top_k_and_top_p_and_min_p_restrict_the_draw() {
        let logits = [5.0, 4.9, 0.0, -1.0, -2.0];
        let top_k = SamplingParams { top_k: 2, ..params(1.0) };
        let top_p = SamplingParams { top_p: 0.5, ..params(1.0) };
        let min_p = SamplingParams { min_p: 0.5, ..params(1.0) };
        for p in 0..200 {
            assert!(sample(&logits, &top_k, &[], p) < 2);
            assert_eq!(sample(&logits, &top_p, &[], p), 0);
            assert!(sample(&logits, &min_p, &[], p) < 2);
        }
    }

    /// The draw with every kept token sorted, as the sampler made it before it sorted only its candidates.
    fn sample_by_full_sort(logits: &[f32], params: &SamplingParams, position: u64) -> u32 {
        let top = logits.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        let mut order: Vec<usize> =
            (0..logits.len()).filter(|&i| is_kept(logits[i], top, params.temperature)).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if params.top_k > 0 {
            order.truncate(params.top_k);
        }
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
        let t = params.temperature as f64;
        let mut probs: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - max) / t).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut cum = 0.0;
        let mut keep = probs.iter().position(|p| {
            cum += p;
            cum >= params.top_p as f64
        });
        let mut keep = keep.take().map_or(probs.len(), |i| i + 1);
        let floor = probs[0] * params.min_p as f64;
        keep = keep.min(probs.iter().take_while(|p| **p >= floor).count().max(1));
        let mut target = uniform(params.seed, position) * probs[..keep].iter().sum::<f64>();
        for (i, p) in probs[..keep].iter().enumerate() {
            target -= p;
            if target < 0.0 {
                return order[i] as u32;
            }
        }
        order[keep - 1] as u32
    }

    #[test]
    fn test_sorting_only_the_candidates_draws_what_sorting_the_vocabulary_draws() {
        let mut seed = 0x1234_5678_u64;
        let mut next = || {
            seed = mix(seed);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        // Wide and narrow spreads, and many ties: logits rounded to a coarse grid.
        let vocabs: Vec<Vec<f32>> = (0..6)
            .map(|v| {
                let scale = [0.5, 2.0, 6.0, 12.0, 3.0, 1.0][v];
                (0..5000)
                    .map(|_| ((next() * 2.0 - 1.0) * scale * if v == 5 { 4.0 } else { 1.0 }) as f32)
                    .map(|l| if v == 5 { (l * 2.0).round() / 2.0 } else { l })
                    .collect()
            })
            .collect();
        let settings = [
            (0, 0.8, 0.0),
            (0, 0.95, 0.0),
            (0, 0.3, 0.0),
            (0, 1.0, 0.05),
            (0, 0.9, 0.1),
            (50, 0.8, 0.0),
            (40, 1.0, 0.0),
        ];
        let mut differ = 0;
        for logits in &vocabs {
            for &(top_k, top_p, min_p) in &settings {
                for temperature in [0.6, 1.0, 1.7] {
                    let p = SamplingParams { temperature, top_k, top_p, min_p, seed: 9, ..Default::default() };
                    for position in 0..40 {
                        differ +=
                            usize::from(sample(logits, &p, &[], position) != sample_by_full_sort(logits, &p, position));
                    }
                }
            }
        }
        assert_eq!(differ, 0, "draws that differ from the full sort's");
    }

    #[test]
    fn test_a_draw_never_takes_nor_counts_a_token_below_the_cutoff() {
        // Token 1 sits just below 2^-40 of the largest weight at temperature 1: its probability would be about 1e-12.
        let logits = [0.0, -(KEEP_BELOW_MAX as f32) - 1e-3, -1.0];
        assert_eq!(kept(&logits, 1.0).0, vec![0, 2]);
        assert_eq!(kept(&logits, 2.0).0, vec![0, 1, 2], "a hotter draw keeps it");
        let p = params(1.0);
        for position in 0..500 {
            let (ids, values) = kept(&logits, 1.0);
            assert_eq!(sample(&logits, &p, &[], position), sample_kept(&ids, &values, &p, position));
        }
    }

    #[test]
    fn test_repetition_penalty_lowers_seen_tokens() {
        let p = SamplingParams { repetition_penalty: 2.0, ..params(0.0) };
        assert_eq!(sample(&[2.0, 1.5], &p, &[0], 0), 1);
        assert_eq!(sample(&[-1.0, -1.5], &p, &[0, 0], 0), 1);
    }

    #[test]
    fn test_uniform_is_in_range_and_spread() {
        let draws: Vec<f64> = (0..10_000).map(|p| uniform(7, p)).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }
}
