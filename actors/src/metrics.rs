//! Runtime metrics in atomics, shared as `Arc<Metrics>`, rendered in Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::histogram::{header, Histogram, VllmHistograms};
use crate::memory::ledger::{LedgerSnapshot, MemoryKind};

/// Counters, gauges and latency histograms of the running server.
#[derive(Default)]
pub struct Metrics {
    requests_total: AtomicU64,
    requests_running: AtomicU64,
    requests_waiting: AtomicU64,
    rounds_total: AtomicU64,
    generated_tokens_total: AtomicU64,
    prompt_tokens_total: AtomicU64,
    kv_pages_used: AtomicU64,
    kv_pages_total: AtomicU64,
    kv_pages_cached: AtomicU64,
    prefix_cache_queries_total: AtomicU64,
    prefix_cache_hits_total: AtomicU64,
    drafted_tokens_total: AtomicU64,
    draft_accepted_tokens_total: AtomicU64,
    draft_head_tokens_total: AtomicU64,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    /// The same latencies in vLLM's buckets, for the names routers read.
    vllm: VllmHistograms,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    pub fn inc_requests(&self) {
        self.requests_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_running(&self, n: usize) {
        self.requests_running.store(n as u64, Ordering::Relaxed);
    }

    pub fn set_waiting(&self, n: usize) {
        self.requests_waiting.store(n as u64, Ordering::Relaxed);
    }

    pub fn inc_rounds(&self) {
        self.rounds_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_generated(&self, n: usize) {
        self.generated_tokens_total.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_prompt(&self, n: usize) {
        self.prompt_tokens_total.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A prompt of `queried` tokens looked up in the prefix cache, `hit` of them found.
    pub fn add_prefix_lookup(&self, queried: usize, hit: usize) {
        self.prefix_cache_queries_total.fetch_add(queried as u64, Ordering::Relaxed);
        self.prefix_cache_hits_total.fetch_add(hit as u64, Ordering::Relaxed);
    }

    /// A round's verdict on a lane's draft: (tokens drafted, tokens accepted).
    pub fn add_draft(&self, (drafted, accepted): (usize, usize)) {
        self.drafted_tokens_total.fetch_add(drafted as u64, Ordering::Relaxed);
        self.draft_accepted_tokens_total.fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// Tokens a model's own draft head drafted this round for one lane.
    pub fn add_head_draft(&self, drafted: usize) {
        self.draft_head_tokens_total.fetch_add(drafted as u64, Ordering::Relaxed);
    }

    /// Tokens models' own draft heads drafted.
    pub fn head_drafts(&self) -> u64 {
        self.draft_head_tokens_total.load(Ordering::Relaxed)
    }

    /// Tokens drafted and tokens of drafts accepted.
    pub fn drafts(&self) -> (u64, u64) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (load(&self.drafted_tokens_total), load(&self.draft_accepted_tokens_total))
    }

    pub fn set_kv_pages_cached(&self, cached: usize) {
        self.kv_pages_cached.store(cached as u64, Ordering::Relaxed);
    }

    pub fn set_kv_pages(&self, used: usize, total: usize) {
        self.kv_pages_used.store(used as u64, Ordering::Relaxed);
        self.kv_pages_total.store(total as u64, Ordering::Relaxed);
    }

    pub fn observe_ttft(&self, secs: f64) {
        self.time_to_first_token.observe(secs);
        self.vllm.time_to_first_token.observe(secs);
    }

    pub fn observe_itl(&self, secs: f64) {
        self.inter_token_latency.observe(secs);
        self.vllm.inter_token_latency.observe(secs);
    }

    pub fn requests_total(&self) -> u64 {
        self.requests_total.load(Ordering::Relaxed)
    }

    pub fn requests_running(&self) -> u64 {
        self.requests_running.load(Ordering::Relaxed)
    }

    pub fn requests_waiting(&self) -> u64 {
        self.requests_waiting.load(Ordering::Relaxed)
    }

    pub fn rounds_total(&self) -> u64 {
        self.rounds_total.load(Ordering::Relaxed)
    }

    pub fn generated_tokens_total(&self) -> u64 {
        self.generated_tokens_total.load(Ordering::Relaxed)
    }

    pub fn prompt_tokens_total(&self) -> u64 {
        self.prompt_tokens_total.load(Ordering::Relaxed)
    }

    /// Pages in use and pages in the pool.
    pub fn kv_pages(&self) -> (u64, u64) {
        (self.kv_pages_used.load(Ordering::Relaxed), self.kv_pages_total.load(Ordering::Relaxed))
    }

    /// Prompt tokens looked up in the prefix cache, and those found.
    pub fn prefix_cache(&self) -> (u64, u64) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (load(&self.prefix_cache_queries_total), load(&self.prefix_cache_hits_total))
    }

    pub fn time_to_first_token(&self) -> &Histogram {
        &self.time_to_first_token
    }

    pub fn inter_token_latency(&self) -> &Histogram {
        &self.inter_token_latency
    }

    pub(crate) fn vllm_histograms(&self) -> &VllmHistograms {
        &self.vllm
    }

    /// Every metric, with the ledger's counts, in Prometheus text format.
    pub fn render(&self, ledger: &LedgerSnapshot) -> String {
        let mut out = String::with_capacity(4096);
        let (drafted, accepted) = self.drafts();
        let scalars: [(&str, &str, &str, u64); 15] = [
            ("requests_total", "Requests accepted.", "counter", self.requests_total()),
            ("requests_running", "Requests with a lane in the current round.", "gauge", self.requests_running()),
            ("requests_waiting", "Requests queued for a lane.", "gauge", self.requests_waiting()),
            ("rounds_total", "Rounds the engine ran.", "counter", self.rounds_total()),
            ("generated_tokens_total", "Tokens generated.", "counter", self.generated_tokens_total()),
            ("prompt_tokens_total", "Prompt tokens processed.", "counter", self.prompt_tokens_total()),
            ("kv_pages_used", "KV cache pages held by requests.", "gauge", self.kv_pages().0),
            ("kv_pages_total", "KV cache pages in the pool.", "gauge", self.kv_pages().1),
            (
                "kv_pages_cached",
                "KV cache pages the prefix cache holds.",
                "gauge",
                self.kv_pages_cached.load(Ordering::Relaxed),
            ),
            (
                "prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
                "counter",
                self.prefix_cache().0,
            ),
            ("prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", "counter", self.prefix_cache().1),
            ("drafted_tokens_total", "Tokens decoding lanes drafted and verified.", "counter", drafted),
            ("draft_accepted_tokens_total", "Drafted tokens the draws kept.", "counter", accepted),
            ("draft_rejected_tokens_total", "Drafted tokens the draws did not keep.", "counter", drafted - accepted),
            (
                "draft_head_tokens_total",
                "Tokens a model's own draft head (multi-token prediction) drafted.",
                "counter",
                self.draft_head_tokens_total.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, kind, value) in scalars {
            let name = format!("tensorfold_{name}");
            header(&mut out, &name, help, kind);
            let _ = writeln!(out, "{name} {value}");
        }
        self.time_to_first_token.render_into(
            &mut out,
            "tensorfold_time_to_first_token_seconds",
            "Seconds from accepting a request to its first token.",
            "",
            prometheus_float,
        );
        self.inter_token_latency.render_into(
            &mut out,
            "tensorfold_inter_token_latency_seconds",
            "Seconds between consecutive tokens of one request.",
            "",
            prometheus_float,
        );
        render_ledger(&mut out, ledger);
        out
    }
}

fn render_ledger(out: &mut String, ledger: &LedgerSnapshot) {
    let per_kind = [
        ("tensorfold_ledger_bytes", "Bytes held, by memory kind.", &ledger.used),
        ("tensorfold_ledger_peak_bytes", "Most bytes held at once, by memory kind.", &ledger.peak),
    ];
    for (name, help, counts) in per_kind {
        header(out, name, help, "gauge");
        for kind in MemoryKind::ALL {
            let _ = writeln!(out, "{name}{{kind=\"{}\"}} {}", kind.as_str(), counts[kind]);
        }
    }
    header(out, "tensorfold_ledger_total_bytes", "Bytes held under the cap: every kind but lent.", "gauge");
    let _ = writeln!(out, "tensorfold_ledger_total_bytes {}", ledger.total_used);
    header(out, "tensorfold_ledger_total_peak_bytes", "Most bytes held at once under the cap.", "gauge");
    let _ = writeln!(out, "tensorfold_ledger_total_peak_bytes {}", ledger.total_peak);
    header(out, "tensorfold_ledger_cap_bytes", "The allocation cap in bytes; +Inf when uncapped.", "gauge");
    match ledger.cap {
        Some(cap) => {
            let _ = writeln!(out, "tensorfold_ledger_cap_bytes {cap}");
        }
        None => {
            let _ = writeln!(out, "tensorfold_ledger_cap_bytes +Inf");
        }
    }
    header(out, "tensorfold_ledger_refusals_total", "Allocations the cap refused.", "counter");
    let _ = writeln!(out, "tensorfold_ledger_refusals_total {}", ledger.refusals);
}

/// A bound as Rust writes it (`1`, `0.5`).
fn prometheus_float(v: f64) -> String {
    v.to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::histogram::LATENCY_BUCKETS;
    use crate::memory::ledger::tests::FakeDriver;
    use crate::memory::ledger::Ledger;

    /// A sample's name, labels and value.
    pub(crate) type Sample = (String, BTreeMap<String, String>, f64);

    /// One sample line split into its name, its labels and its value.
    fn parse_sample(line: &str) -> Option<Sample> {
        let (series, value) = line.rsplit_once(' ')?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().ok()?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}')?;
                let mut labels = BTreeMap::new();
                for pair in body.split(',') {
                    let (key, quoted) = pair.split_once('=')?;
                    let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
                    labels.insert(key.to_string(), inner.to_string());
                }
                (name, labels)
            }
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
        (!name.is_empty() && name.chars().all(valid)).then(|| (name.to_string(), labels, value))
    }

    pub(crate) fn parse(text: &str) -> Vec<Sample> {
        let mut samples = Vec::new();
        let mut typed = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.push(rest.split(' ').next().expect("a name").to_string());
            } else if !line.starts_with("# HELP ") {
                let sample = parse_sample(line).unwrap_or_else(|| panic!("not a sample line: {line:?}"));
                let family = typed.last().expect("a TYPE before each sample");
                assert!(sample.0.starts_with(family.as_str()), "{} outside its family {family}", sample.0);
                assert!(sample.0.starts_with("tensorfold_") || sample.0.starts_with("vllm:"));
                samples.push(sample);
            }
        }
        samples
    }

    pub(crate) fn value(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> f64 {
        samples
            .iter()
            .find(|(n, labels, _)| {
                n == name && label.map_or(labels.is_empty(), |(k, v)| labels.get(k).map(String::as_str) == Some(v))
            })
            .unwrap_or_else(|| panic!("no sample {name} {label:?}"))
            .2
    }

    fn check_histogram(samples: &[Sample], name: &str, expected_count: u64) {
        let buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|(n, _, _)| *n == format!("{name}_bucket"))
            .map(|(_, labels, v)| {
                let le = labels["le"].as_str();
                (if le == "+Inf" { f64::INFINITY } else { le.parse().expect("numeric le") }, *v)
            })
            .collect();
        assert_eq!(buckets.len(), LATENCY_BUCKETS.len() + 1);
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "bounds rise, counts cumulative");
        let (last_le, last_count) = *buckets.last().expect("buckets");
        assert_eq!(last_le, f64::INFINITY);
        assert_eq!(last_count, value(samples, &format!("{name}_count"), None));
        assert_eq!(last_count, expected_count as f64);
    }

    #[test]
    fn test_render_parses_and_histograms_are_cumulative() {
        let metrics = Metrics::new();
        metrics.inc_requests();
        metrics.inc_requests();
        metrics.set_running(1);
        metrics.set_waiting(3);
        metrics.inc_rounds();
        metrics.add_generated(7);
        metrics.add_prompt(12);
        metrics.set_kv_pages(5, 64);
        for secs in [0.0005, 0.003, 0.003, 0.2, 2.0, 45.0, 120.0, f64::NAN, -1.0] {
            metrics.observe_ttft(secs);
        }
        metrics.observe_itl(0.02);
        let (driver, _state) = FakeDriver::boxed();
        let mut ledger = Ledger::new(Some(1 << 20), driver);
        ledger.adopt(MemoryKind::Weights, 4096).expect("fits");
        ledger.allocate(MemoryKind::KvCache, 2048).expect("fits");
        assert!(ledger.allocate(MemoryKind::Activations, 1 << 20).is_err());

        let samples = parse(&metrics.render(&ledger.snapshot()));
        assert_eq!(value(&samples, "tensorfold_requests_total", None), 2.0);
        assert_eq!(value(&samples, "tensorfold_requests_waiting", None), 3.0);
        assert_eq!(value(&samples, "tensorfold_generated_tokens_total", None), 7.0);
        assert_eq!(value(&samples, "tensorfold_kv_pages_used", None), 5.0);
        assert_eq!(value(&samples, "tensorfold_kv_pages_total", None), 64.0);
        assert_eq!(value(&samples, "tensorfold_ledger_bytes", Some(("kind", "kv_cache"))), 2048.0);
        assert_eq!(value(&samples, "tensorfold_ledger_peak_bytes", Some(("kind", "weights"))), 4096.0);
        assert_eq!(value(&samples, "tensorfold_ledger_cap_bytes", None), (1 << 20) as f64);
        assert_eq!(value(&samples, "tensorfold_ledger_refusals_total", None), 1.0);
        check_histogram(&samples, "tensorfold_time_to_first_token_seconds", 7);
        check_histogram(&samples, "tensorfold_inter_token_latency_seconds", 1);
        let ttft = "tensorfold_time_to_first_token_seconds_bucket";
        assert_eq!(value(&samples, ttft, Some(("le", "0.001"))), 1.0);
        assert_eq!(value(&samples, ttft, Some(("le", "0.005"))), 3.0);
        assert_eq!(value(&samples, ttft, Some(("le", "60"))), 6.0);
        let sum = value(&samples, "tensorfold_time_to_first_token_seconds_sum", None);
        assert!((sum - 167.2065).abs() < 1e-6, "sum {sum}");
    }

    #[test]
    fn test_uncapped_ledger_renders_infinite_cap() {
        let samples = parse(&Metrics::new().render(&LedgerSnapshot::default()));
        assert_eq!(value(&samples, "tensorfold_ledger_cap_bytes", None), f64::INFINITY);
        check_histogram(&samples, "tensorfold_inter_token_latency_seconds", 0);
    }
}
