//! Drafting end to end on the default model: with drafts a request gives, bit for bit, what it gives with
//! `"draft": false` (text, token logprobs, finish reason), greedy and seeded, alone and among other lanes.

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;

use common::server::Server;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

/// Held by each test that serves: a server times its steps at start-up to decide what drafts earn, and another
/// server's work on the same cores would make rows look dearer than they are.
static ONE_SERVER: Mutex<()> = Mutex::new(());

/// Tasks that copy from their prompt, where drafts are accepted, and free text, where they mostly fail.
const TASKS: [&str; 6] = [
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, apple, banana, cherry, date.",
    "Copy this sentence three times: The quick brown fox jumps over the lazy dog.",
    "Rewrite this code with the same names: def add(total, item): total = total + item; return total",
    "Echo back: one two three four five six seven eight nine ten one two three four five six.",
    "Write a short poem about autumn leaves.",
    "What is the capital of France?",
];

/// Request `i`: task i / 2, greedy for even i; odd ones draw hot enough that a draw at the wrong position differs.
fn body(server: &Server, i: usize, draft: Option<bool>) -> Value {
    let mut body = json!({
        "model": server.model,
        "messages": [{"role": "user", "content": TASKS[i / 2]}],
        "max_tokens": 48 + 7 * (i / 2),
        "logprobs": true,
        "top_logprobs": 2,
    });
    if i.is_multiple_of(2) {
        body["temperature"] = json!(0);
    } else {
        body["temperature"] = json!(1.3);
        body["seed"] = json!(40 + i);
    }
    if i == 7 {
        body["repetition_penalty"] = json!(1.1);
    }
    if let Some(draft) = draft {
        body["draft"] = json!(draft);
    }
    body
}

/// Tokens drafted and drafted tokens kept since the metrics `before`.
fn drafts_since(server: &Server, before: &BTreeMap<String, f64>) -> (f64, f64) {
    let metrics = server.metrics();
    let count = |name: &str| metrics.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0);
    (count("tensorfold_drafted_tokens_total"), count("tensorfold_draft_accepted_tokens_total"))
}

/// The reply's choice: text, token logprobs and finish reason.
fn choice(server: &Server, body: &Value) -> Value {
    let response = server.post_json(CHAT, body);
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()["choices"][0].clone()
}

#[test]
fn test_drafted_output_equals_plain_output_alone_and_among_other_lanes() {
    let _alone = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    // Untimed, drafting does not depend on how busy the machine was at start-up, so drafts are surely made.
    let server = Server::start_with_env(&["--parallel", "8", "--draft-tokens", "4"], &[("TF_DRAFT_TIMING", "0")]);
    let requests: Vec<usize> = (0..2 * TASKS.len()).collect();
    let plain: Vec<Value> = requests.iter().map(|&i| choice(&server, &body(&server, i, Some(false)))).collect();
    let before = server.metrics();
    for (&i, plain) in requests.iter().zip(&plain) {
        assert_eq!(&choice(&server, &body(&server, i, None)), plain, "drafted alone: request {i}");
    }
    let (drafted, accepted) = drafts_since(&server, &before);
    assert!(accepted > 0.0 && drafted >= accepted, "drafted {drafted}, accepted {accepted}: no draft was kept");
    // All at once, with plain lanes of the same tasks beside the drafting ones.
    std::thread::scope(|scope| {
        let server = &server;
        let plain_again: Vec<_> =
            requests.iter().map(|&i| scope.spawn(move || choice(server, &body(server, i, Some(false))))).collect();
        let drafted: Vec<_> =
            requests.iter().map(|&i| scope.spawn(move || choice(server, &body(server, i, None)))).collect();
        for (i, (handle, again)) in drafted.into_iter().zip(plain_again).enumerate() {
            assert_eq!(handle.join().unwrap(), plain[i], "drafted among others: request {i}");
            assert_eq!(again.join().unwrap(), plain[i], "plain among others: request {i}");
        }
    });
}

#[test]
fn test_with_the_model_as_its_own_draft_model_every_greedy_draft_is_kept_and_output_equals_plain() {
    let _alone = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let model = tensorfold::settings::process_fetcher().and_then(|f| f.default_model_path()).expect("the model");
    let path = model.to_str().expect("a UTF-8 path");
    let server = Server::start_with_model(&model, &["--parallel", "4", "--draft-tokens", "3", "--draft-model", path]);
    // Its drafts are the greedy tokens a batch-invariant forward gives, so a greedy lane keeps every one. Without
    // log-probabilities the engine picks each verifying row's token itself.
    let greedy: Vec<usize> = (0..TASKS.len()).map(|t| 2 * t).collect();
    let bare = |i: usize, draft| {
        let mut b = body(&server, i, draft);
        b.as_object_mut().map(|o| (o.remove("logprobs"), o.remove("top_logprobs")));
        b
    };
    let plain: Vec<Value> = greedy.iter().map(|&i| choice(&server, &bare(i, Some(false)))).collect();
    let before = server.metrics();
    for (&i, plain) in greedy.iter().zip(&plain) {
        assert_eq!(&choice(&server, &bare(i, None)), plain, "drafted alone: request {i}");
    }
    let (drafted, accepted) = drafts_since(&server, &before);
    assert!(drafted > 0.0 && accepted == drafted, "drafted {drafted}, accepted {accepted}");
    // Seeded lanes beside greedy ones, all at once: the draft model's guesses never change a token.
    let all: Vec<usize> = (0..8).collect();
    let alone: Vec<Value> = all.iter().map(|&i| choice(&server, &body(&server, i, Some(false)))).collect();
    std::thread::scope(|scope| {
        let server = &server;
        let drafted: Vec<_> =
            all.iter().map(|&i| scope.spawn(move || choice(server, &body(server, i, None)))).collect();
        for (i, handle) in drafted.into_iter().enumerate() {
            assert_eq!(handle.join().unwrap(), alone[i], "drafted by the draft model among others: request {i}");
        }
    });
}

#[test]
fn test_a_draft_model_that_does_not_load_is_a_clear_error_naming_the_flag() {
    let output = std::process::Command::new(common::server::binary())
        .args(["serve", "--port", "0", "--draft-model", "/nonexistent/draft.gguf", "--no-voice"])
        .output()
        .expect("running tensorfold");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--draft-model"), "{stderr}");
}
