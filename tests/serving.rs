//! Serving beside others: the metric names routers read, `/health` through start-up, and each model's context length.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::server::{parse_metrics, Server};
use serde_json::json;
use tensorfold_lend::daemon::Daemon;
use tensorfold_lend::pool::MemfdPool;

fn default_model() -> PathBuf {
    tensorfold::settings::process_fetcher().and_then(|f| f.default_model_path()).expect("fetching the default model")
}

/// Each family's `# TYPE` from a scrape.
fn types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

/// The value of the one sample of `name` that carries `labels`, as written between the braces.
fn sample(samples: &BTreeMap<String, f64>, name: &str, labels: &str) -> f64 {
    let key = format!("{name}{{{labels}}}");
    *samples.get(&key).unwrap_or_else(|| panic!("no sample {key} in {:?}", samples.keys().collect::<Vec<_>>()))
}

#[test]
fn test_metrics_export_router_names_that_move_with_requests() {
    let server = Server::start(&["--no-voice"]);
    let labels = format!("model_name=\"{}\",engine=\"0\"", server.model);
    let scrape = server.get("/metrics");
    assert_eq!(scrape.status, 200);
    let types = types(&scrape.text());
    for (name, kind) in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("tensorfold_requests_running", "gauge"),
        ("tensorfold_time_to_first_token_seconds", "histogram"),
    ] {
        assert_eq!(types.get(name).map(String::as_str), Some(kind), "# TYPE of {name}");
    }
    let before = parse_metrics(&scrape.text());
    let usage = sample(&before, "vllm:kv_cache_usage_perc", &labels);
    assert!((0.0..=1.0).contains(&usage), "kv_cache_usage_perc {usage} is a fraction");
    assert_eq!(sample(&before, "vllm:num_requests_running", &labels), 0.0);

    let body = json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let completion = server.complete("/v1/completions", &body);
    let after = server.metrics();
    let moved = |name: &str| sample(&after, name, &labels) - sample(&before, name, &labels);
    assert_eq!(moved("vllm:prompt_tokens_total"), completion.usage["prompt_tokens"].as_f64().unwrap());
    assert_eq!(moved("vllm:generation_tokens_total"), completion.usage["completion_tokens"].as_f64().unwrap());
    assert_eq!(moved("vllm:time_to_first_token_seconds_count"), 1.0);
    let gaps = completion.usage["completion_tokens"].as_f64().unwrap() - 1.0;
    assert_eq!(moved("vllm:inter_token_latency_seconds_count"), gaps, "one gap between each two tokens");
    let inf = format!("{labels},le=\"+Inf\"");
    let ttft_inf = sample(&after, "vllm:time_to_first_token_seconds_bucket", &inf);
    assert_eq!(ttft_inf, sample(&after, "vllm:time_to_first_token_seconds_count", &labels));
    // Ours and vLLM's names count the same tokens.
    assert_eq!(after["tensorfold_generated_tokens_total"], sample(&after, "vllm:generation_tokens_total", &labels));
}

#[test]
fn test_models_give_each_text_model_its_context_length() {
    let server = Server::start(&["--context", "512"]);
    let models = server.get("/v1/models").json();
    let text = &models["data"][0];
    assert_eq!(text["id"], server.model.as_str());
    assert_eq!(text["max_model_len"], 512);
    assert_eq!(text["context_length"], 512);
    let one = server.get(&format!("/v1/models/{}", server.model)).json();
    assert_eq!(one["max_model_len"], 512);
    // The voice has no token context, so it has no such field.
    let voice = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "hibari").expect("the default voice");
    assert!(voice.get("max_model_len").is_none(), "{voice}");
}

#[test]
fn test_health_is_503_until_every_model_is_loaded() {
    // A lending daemon bound but not serving holds start-up at the carveout claim, before the weights load.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let socket = dir.path().join("lend.sock");
    let silent = Daemon::bind(&socket, b"sesame".to_vec(), Box::new(MemfdPool::new(4))).expect("binding the daemon");
    let socket = socket.to_str().expect("a UTF-8 path").to_string();
    let env = [("TF_CARVEOUT", "1"), ("TF_CARVEOUT_SOCKET", socket.as_str()), ("TF_CARVEOUT_KEY", "sesame")];
    let mut server = Server::spawn(&default_model(), &["--no-voice"], &env);

    let health = server.get("/health");
    assert_eq!(health.status, 503, "{}", health.text());
    assert_eq!(health.json(), json!({"status": "loading"}));
    let early = server.post_json("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(early.status, 503);
    assert_eq!(early.header("retry-after"), Some("1"));
    assert_eq!(early.json()["error"]["code"], "service_unavailable");
    let models = server.get("/v1/models");
    assert_eq!(models.status, 503, "{}", models.text());

    // Closing the daemon's socket refuses the claim; the server then loads without lent memory and turns ready.
    drop(silent);
    server.wait_ready();
    assert_eq!(server.get("/health").json(), json!({"status": "ok"}));
    let models = server.get("/v1/models");
    assert_eq!(models.status, 200);
    assert!(server.stderr().contains("carveout refused"), "{}", server.stderr());
}
