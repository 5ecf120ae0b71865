//! Memory pressure: under a `--memory-limit` that leaves a few KV pages, requests wait for pages and are served in
//! turn with the outputs they have alone, and a request that can never fit gets a 400 naming the sizes.

mod common;

use std::time::{Duration, Instant};

use common::server::Server;
use serde_json::{json, Value};

const COMPLETIONS: &str = "/v1/completions";
const PAGES: usize = 12;

/// A number after `key=` in the server's "memory" start-up line.
fn memory_figure(stderr: &str, key: &str) -> usize {
    let line = stderr.lines().find(|l| l.contains(" memory ")).expect("the memory line");
    let plain: String = line.chars().filter(|c| !c.is_control()).collect();
    let plain = plain.replace("[0m", "").replace("[2m", "").replace("[3m", "");
    let at = plain.find(&format!("{key}=")).unwrap_or_else(|| panic!("{key} in {plain}")) + key.len() + 1;
    plain[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().expect("a number")
}

/// A server whose KV pool holds `PAGES` pages, its limit found from the same server's figures without one.
fn pressed_server() -> Server {
    let probe = Server::start(&["--no-voice", "--parallel", "4"]);
    let stderr = probe.stderr();
    drop(probe);
    let fixed = memory_figure(&stderr, "weights_held") + memory_figure(&stderr, "activations_held");
    let page_bytes = memory_figure(&stderr, "kv_bytes") / memory_figure(&stderr, "kv_pages");
    let limit = (fixed + PAGES * page_bytes + page_bytes / 2).to_string();
    let server = Server::start(&["--no-voice", "--memory-limit", &limit, "--parallel", "4"]);
    assert_eq!(memory_figure(&server.stderr(), "kv_pages"), PAGES, "{}", server.stderr());
    server
}

fn completion(server: &Server, prompt: &str, max_tokens: usize) -> Value {
    json!({"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 5})
}

#[test]
fn test_requests_wait_for_kv_pages_and_are_served_in_turn() {
    let server = pressed_server();
    // Each needs more than half the pool (16-token pages), so no two can hold their pages at once.
    let prompts = ["The sea at night", "A list of fruits:", "Once upon a time", "def fibonacci(n):"];
    let solo: Vec<Value> = prompts
        .iter()
        .map(|p| {
            let r = server.post_json(COMPLETIONS, &completion(&server, p, 110));
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["choices"][0]["text"].clone()
        })
        .collect();
    let (done, waited) = std::thread::scope(|s| {
        let handles: Vec<_> =
            prompts.iter().map(|p| s.spawn(|| server.post_json(COMPLETIONS, &completion(&server, p, 110)))).collect();
        let (mut waited, deadline) = (0.0f64, Instant::now() + Duration::from_secs(300));
        while !handles.iter().all(|h| h.is_finished()) && Instant::now() < deadline {
            waited = waited.max(server.metrics().get("tensorfold_requests_waiting").copied().unwrap_or(0.0));
            std::thread::sleep(Duration::from_millis(10));
        }
        (handles.into_iter().map(|h| h.join().expect("a client thread")).collect::<Vec<_>>(), waited)
    });
    for ((r, want), prompt) in done.iter().zip(&solo).zip(prompts) {
        assert_eq!(r.status, 200, "{prompt}: {}", r.text());
        assert_eq!(&r.json()["choices"][0]["text"], want, "{prompt}: served in turn differs from alone");
    }
    assert!(waited >= 1.0, "no request waited for pages: the pool was never short");
    let metrics = server.metrics();
    assert_eq!(metrics.get("tensorfold_kv_pages_used").copied(), Some(0.0), "{metrics:?}");
}

#[test]
fn test_a_request_that_can_never_fit_gets_a_400_naming_the_sizes() {
    let server = pressed_server();
    let r = server.post_json(COMPLETIONS, &completion(&server, "The sea", PAGES * 16 + 1));
    assert_eq!(r.status, 400, "{}", r.text());
    let error = &r.json()["error"];
    assert_eq!(error["code"], "context_length_exceeded", "{error}");
    let message = error["message"].as_str().expect("a message");
    assert!(message.contains(&format!("but the pool has {PAGES}")), "{message}");
    let needed: usize = message.split("needs ").nth(1).and_then(|m| m.split(' ').next()?.parse().ok()).expect(message);
    assert!(needed > PAGES && message.contains(&format!("needs {needed} KV pages")), "{message}");
    let fits = server.post_json(COMPLETIONS, &completion(&server, "The sea", 8));
    assert_eq!(fits.status, 200, "the server serves on after the refusal: {}", fits.text());
}
