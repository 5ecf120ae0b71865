//! The metric names routers read (vLLM's), rendered beside ours from the same counts.

use std::fmt::Write;

use crate::histogram::header;
use crate::metrics::Metrics;

impl Metrics {
    /// The `vllm:` names with vLLM's labels (`model_name`, `engine`), for the model requests name as `model_name`.
    pub fn render_vllm(&self, model_name: &str) -> String {
        let mut out = String::with_capacity(4096);
        let labels = format!("model_name=\"{}\",engine=\"0\"", escape_label(model_name));
        let (used, total) = self.kv_pages();
        let usage = if total == 0 { 0.0 } else { used as f64 / total as f64 };
        let (queries, hits) = self.prefix_cache();
        let scalars: [(&str, &str, &str, f64); 7] = [
            (
                "num_requests_running",
                "Requests with a lane in the current round.",
                "gauge",
                self.requests_running() as f64,
            ),
            ("num_requests_waiting", "Requests queued for a lane.", "gauge", self.requests_waiting() as f64),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge", usage),
            ("prompt_tokens_total", "Prompt tokens processed.", "counter", self.prompt_tokens_total() as f64),
            ("generation_tokens_total", "Tokens generated.", "counter", self.generated_tokens_total() as f64),
            ("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", "counter", queries as f64),
            ("prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", "counter", hits as f64),
        ];
        for (name, help, kind, value) in scalars {
            let name = format!("vllm:{name}");
            header(&mut out, &name, help, kind);
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
        let histograms = self.vllm_histograms();
        histograms.time_to_first_token.render_into(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &labels,
            python_float,
        );
        histograms.inter_token_latency.render_into(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &labels,
            python_float,
        );
        out
    }
}

/// A bound as Python's Prometheus client writes it (`1.0`, `0.5`), so `le` values match vLLM's series.
fn python_float(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.1}")
    } else {
        v.to_string()
    }
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::histogram::VLLM_ITL_BUCKETS;
    use crate::metrics::tests::{parse, value, Sample};

    fn labels(extra: Option<(&str, &str)>) -> BTreeMap<String, String> {
        let mut l =
            BTreeMap::from([("model_name".to_string(), "m".to_string()), ("engine".to_string(), "0".to_string())]);
        if let Some((k, v)) = extra {
            l.insert(k.to_string(), v.to_string());
        }
        l
    }

    fn find(samples: &[Sample], name: &str, extra: Option<(&str, &str)>) -> f64 {
        let want = labels(extra);
        samples
            .iter()
            .find(|(n, l, _)| n == name && *l == want)
            .unwrap_or_else(|| panic!("no sample {name} {extra:?}"))
            .2
    }

    fn types(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn test_vllm_names_follow_the_same_counts() {
        let metrics = Metrics::new();
        metrics.set_running(2);
        metrics.set_waiting(5);
        metrics.set_kv_pages(16, 64);
        metrics.add_prompt(30);
        metrics.add_generated(9);
        metrics.add_prefix_lookup(32, 16);
        for secs in [0.0005, 0.03, 3000.0] {
            metrics.observe_ttft(secs);
        }
        metrics.observe_itl(0.02);
        let text = metrics.render_vllm("m");
        let samples = parse(&text);
        assert_eq!(find(&samples, "vllm:num_requests_running", None), 2.0);
        assert_eq!(find(&samples, "vllm:num_requests_waiting", None), 5.0);
        assert_eq!(find(&samples, "vllm:kv_cache_usage_perc", None), 0.25);
        assert_eq!(find(&samples, "vllm:prompt_tokens_total", None), 30.0);
        assert_eq!(find(&samples, "vllm:generation_tokens_total", None), 9.0);
        assert_eq!(find(&samples, "vllm:prefix_cache_hits_total", None), 16.0);
        let ttft = "vllm:time_to_first_token_seconds_bucket";
        assert_eq!(find(&samples, ttft, Some(("le", "0.001"))), 1.0);
        assert_eq!(find(&samples, ttft, Some(("le", "0.04"))), 2.0);
        assert_eq!(find(&samples, ttft, Some(("le", "2560.0"))), 2.0);
        assert_eq!(find(&samples, ttft, Some(("le", "+Inf"))), 3.0);
        assert_eq!(find(&samples, "vllm:time_to_first_token_seconds_count", None), 3.0);
        assert_eq!(find(&samples, "vllm:inter_token_latency_seconds_bucket", Some(("le", "0.025"))), 1.0);
        let itl_buckets = samples.iter().filter(|s| s.0 == "vllm:inter_token_latency_seconds_bucket").count();
        assert_eq!(itl_buckets, VLLM_ITL_BUCKETS.len() + 1);
        let types = types(&text);
        for (name, kind) in [
            ("vllm:num_requests_running", "gauge"),
            ("vllm:num_requests_waiting", "gauge"),
            ("vllm:kv_cache_usage_perc", "gauge"),
            ("vllm:prompt_tokens_total", "counter"),
            ("vllm:generation_tokens_total", "counter"),
            ("vllm:time_to_first_token_seconds", "histogram"),
            ("vllm:inter_token_latency_seconds", "histogram"),
        ] {
            assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}");
        }
        // Our own names see the same observations in our own buckets.
        let ours = parse(&metrics.render(&Default::default()));
        assert_eq!(value(&ours, "tensorfold_time_to_first_token_seconds_count", None), 3.0);
    }

    #[test]
    fn test_empty_pool_reports_zero_usage_and_label_is_escaped() {
        let text = Metrics::new().render_vllm("a\"b\\c");
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"a\\\"b\\\\c\",engine=\"0\"} 0\n"), "{text}");
    }
}
