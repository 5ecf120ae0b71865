//! Exactness with shaped logits on the default model: a request whose draws are masked by a JSON schema, biased or
//! penalized gives, bit for bit, the same choice alone and among other lanes, resumed from the prefix cache and
//! fresh, drafted and plain.

mod common;

use std::collections::BTreeMap;

use common::server::Server;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

const TASKS: [&str; 4] = [
    "Give the city and country of the Eiffel Tower as JSON: {\"city\": \"Paris\", \"country\": \"France\"}",
    "Copy this JSON exactly: {\"city\": \"Rome\", \"country\": \"Italy\"}, then say why.",
    "Describe a cat called Tom who is 3 years old, as JSON.",
    "List three fruits.",
];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["city", "country"],
        "additionalProperties": false,
    })
}

/// Request `i`: a JSON schema, a JSON object with penalties, or a bias with penalties; greedy for even `i`, seeded
/// and hot for odd `i`.
fn body(server: &Server, i: usize) -> Value {
    let mut body = json!({
        "model": server.model,
        "messages": [{"role": "user", "content": TASKS[i % TASKS.len()]}],
        "max_tokens": 40,
        "logprobs": true,
        "top_logprobs": 2,
        "cache": false,
        "draft": false,
    });
    match i % 3 {
        0 => {
            body["response_format"] =
                json!({"type": "json_schema", "json_schema": {"name": "place", "schema": schema()}})
        }
        1 => {
            body["response_format"] = json!({"type": "json_object"});
            body["presence_penalty"] = json!(0.5);
        }
        _ => {
            body["logit_bias"] = json!({"11": 2.5, "28": -1.5});
            body["frequency_penalty"] = json!(0.7);
        }
    }
    match i % 2 {
        0 => body["temperature"] = json!(0),
        _ => {
            body["temperature"] = json!(1.0);
            body["seed"] = json!(100 + i);
        }
    }
    body
}

fn with(mut body: Value, key: &str, value: Value) -> Value {
    body[key] = value;
    body
}

fn reply(server: &Server, body: &Value) -> Value {
    let response = server.post_json(CHAT, body);
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()
}

/// The choice: text, token logprobs and finish reason.
fn choice(server: &Server, body: &Value) -> Value {
    reply(server, body)["choices"][0].clone()
}

/// A choice under a JSON format that ended by itself is a JSON object.
fn assert_json_when_done(i: usize, choice: &Value) {
    if i % 3 == 2 || choice["finish_reason"] != "stop" {
        return;
    }
    let text = choice["message"]["content"].as_str().unwrap_or_default();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("request {i}: {text:?} is not JSON: {e}"));
    assert!(value.is_object(), "request {i}: {text}");
    if i.is_multiple_of(3) {
        assert!(value["city"].is_string() && value["country"].is_string(), "request {i}: {text}");
    }
}

#[test]
fn test_shaped_requests_alone_equal_them_among_other_lanes() {
    let server = Server::start(&["--parallel", "16"]);
    let requests: Vec<usize> = (0..12).collect();
    let solo: Vec<Value> = requests.iter().map(|&i| choice(&server, &body(&server, i))).collect();
    for (i, c) in solo.iter().enumerate() {
        assert_json_when_done(i, c);
    }
    assert!(solo.iter().any(|c| c["finish_reason"] == "stop"), "no shaped request ended by itself: {solo:?}");
    // All at once, beside unshaped lanes of the same tasks.
    std::thread::scope(|scope| {
        let server = &server;
        let plain = |i: usize| {
            let mut b = body(server, i);
            for key in ["response_format", "logit_bias", "presence_penalty", "frequency_penalty"] {
                b.as_object_mut().unwrap().remove(key);
            }
            b
        };
        let others: Vec<_> = requests.iter().map(|&i| scope.spawn(move || choice(server, &plain(i)))).collect();
        let shaped: Vec<_> = requests.iter().map(|&i| scope.spawn(move || choice(server, &body(server, i)))).collect();
        for (i, handle) in shaped.into_iter().enumerate() {
            assert_eq!(handle.join().unwrap(), solo[i], "request {i} among others");
        }
        others.into_iter().for_each(|h| assert!(h.join().unwrap()["finish_reason"].is_string()));
    });
}

#[test]
fn test_shaped_requests_resumed_from_the_cache_equal_them_fresh() {
    let server = Server::start(&[]);
    for i in 0..6 {
        let fresh = choice(&server, &body(&server, i));
        let cached = with(body(&server, i), "cache", json!(true));
        reply(&server, &cached);
        let resumed = reply(&server, &cached);
        let served = resumed["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        assert!(served > 0, "request {i}: the second run served no prompt token from the cache");
        assert_eq!(resumed["choices"][0], fresh, "request {i} resumed");
    }
}

#[test]
fn test_shaped_requests_drafted_equal_them_plain() {
    // Untimed, drafting does not depend on how busy the machine was at start-up, so drafts are surely made.
    let server = Server::start_with_env(&["--parallel", "8", "--draft-tokens", "4"], &[("TF_DRAFT_TIMING", "0")]);
    let before = server.metrics();
    for i in 0..12 {
        let plain = choice(&server, &body(&server, i));
        let drafted = choice(&server, &with(body(&server, i), "draft", json!(true)));
        assert_eq!(drafted, plain, "request {i} drafted");
    }
    let metrics: BTreeMap<String, f64> = server.metrics();
    let count = |name: &str| metrics.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0);
    let accepted = count("tensorfold_draft_accepted_tokens_total");
    assert!(accepted > 0.0, "no drafted token was kept, so the masks' drafted rows went untested");
}
