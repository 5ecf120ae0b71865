//! Latency histograms with fixed buckets, in our bounds and in vLLM's, and the Prometheus header both render.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds in seconds, from a fast decode step to a very long first token.
pub const LATENCY_BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0];

const NANOS_PER_SECOND: f64 = 1e9;

/// A histogram with fixed buckets; each slot counts only its own range, made cumulative when rendered.
pub struct Histogram {
    /// Upper bounds in seconds, rising.
    bounds: &'static [f64],
    /// One slot per bound, and a last one for values above every bound.
    slots: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::new(&LATENCY_BUCKETS)
    }
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        let slots = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Histogram { bounds, slots, sum_nanos: AtomicU64::new(0) }
    }

    /// Records one value; negative or non-finite values are dropped, since no latency can be one.
    pub fn observe(&self, secs: f64) {
        if !secs.is_finite() || secs < 0.0 {
            return;
        }
        let slot = self.bounds.iter().position(|&le| secs <= le).unwrap_or(self.bounds.len());
        self.slots[slot].fetch_add(1, Ordering::Relaxed);
        // The float-to-int cast saturates, so an absurd value cannot wrap the sum by itself.
        self.sum_nanos.fetch_add((secs * NANOS_PER_SECOND) as u64, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.slots.iter().map(|slot| slot.load(Ordering::Relaxed)).sum()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos.load(Ordering::Relaxed) as f64 / NANOS_PER_SECOND
    }

    /// Cumulative counts per bound, the last one for +Inf.
    pub fn cumulative(&self) -> Vec<u64> {
        let mut running = 0;
        self.slots
            .iter()
            .map(|slot| {
                running += slot.load(Ordering::Relaxed);
                running
            })
            .collect()
    }

    /// Renders the histogram; `labels` (`a="x",b="y"` or empty) go on every sample, `le` writes a bound.
    pub(crate) fn render_into(&self, out: &mut String, name: &str, help: &str, labels: &str, le: fn(f64) -> String) {
        header(out, name, help, "histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        let braced = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        // Buckets and count come from one read of the slots, so +Inf equals _count even under writes.
        let cumulative = self.cumulative();
        for (&bound, count) in self.bounds.iter().zip(&cumulative) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{}\"}} {count}", le(bound));
        }
        let total = cumulative[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {total}");
        let _ = writeln!(out, "{name}_sum{braced} {}", self.sum_seconds());
        let _ = writeln!(out, "{name}_count{braced} {total}");
    }
}

/// vLLM's time-to-first-token bounds, so buckets add up across a fleet that mixes both servers.
pub const VLLM_TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];

/// vLLM's inter-token latency bounds.
pub const VLLM_ITL_BUCKETS: [f64; 19] =
    [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];

/// The latency histograms in vLLM's buckets.
pub struct VllmHistograms {
    pub(crate) time_to_first_token: Histogram,
    pub(crate) inter_token_latency: Histogram,
}

impl Default for VllmHistograms {
    fn default() -> VllmHistograms {
        VllmHistograms {
            time_to_first_token: Histogram::new(&VLLM_TTFT_BUCKETS),
            inter_token_latency: Histogram::new(&VLLM_ITL_BUCKETS),
        }
    }
}

pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}
