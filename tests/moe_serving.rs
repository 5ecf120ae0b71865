//! Mixtures of experts through the server: the seeded Qwen3-MoE, Mixtral and Qwen3-Next (hybrid linear attention)
//! goldens serve chat, streaming, tools and JSON schemas, and a request gives the same bits alone and among others,
//! resumed and fresh, drafted and plain. With TF_TEST_DEVICE=cuda, on the GPU, seeded checkpoints of the same
//! families stand in for the goldens, whose sizes the CUDA kernels do not take.

mod common;

use common::golden::{served_golden, served_seeded};
use common::server::Server;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn chat(server: &Server, body: &Value) -> Value {
    let response = server.post_json(CHAT, body);
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()
}

/// Request `i`: a prompt of its own, greedy or seeded and hot, with log-probabilities to compare bits.
fn body(i: usize) -> Value {
    let words = ["river stone", "north wind", "harbor lamp", "song of the sea", "map and light", "seven bees"];
    let mut body = json!({
        "messages": [{"role": "user", "content": format!("Tell me about the {}, please.", words[i % words.len()])}],
        "max_tokens": 24 + 3 * i,
        "logprobs": true,
        "top_logprobs": 2,
    });
    body["temperature"] = if i.is_multiple_of(2) { json!(0) } else { json!(1.2) };
    body["seed"] = json!(100 + i);
    if i == 4 {
        // Three favoured tokens in the model's own order: text that repeats, so its lane drafts, kept or refused.
        body["logit_bias"] = json!({"100": 30, "101": 30, "102": 30});
    }
    body
}

/// What must be equal: text, token log-probabilities and finish reason.
fn bits(reply: &Value) -> Value {
    let choice = &reply["choices"][0];
    json!([choice["message"]["content"], choice["logprobs"], choice["finish_reason"]])
}

/// Runs `test` on a server of each family: the goldens, or with `TF_TEST_DEVICE` set, seeded checkpoints whose sizes
/// the CUDA kernels take (the hybrid with its MTP head).
fn each_golden(test: impl Fn(&str, &Server)) {
    let device = std::env::var_os("TF_TEST_DEVICE").is_some();
    let names: &[&str] = match device {
        true => &["qwen3_moe", "mixtral", "qwen3_next_mtp"],
        false => &["tiny-qwen3-moe", "tiny-mixtral", "tiny-qwen3-next"],
    };
    for &name in names {
        let model = if device { served_seeded(name, 40) } else { served_golden(name) };
        // Drafting that does not depend on start-up timings, so drafts are made on any machine.
        let env = [("TF_DRAFT_TIMING", "0")];
        let mut server = Server::spawn(model.path(), &["--no-voice", "--parallel", "8"], &env);
        server.wait_ready();
        test(name, &server);
    }
}

#[test]
fn test_moe_models_serve_chat_streams_tools_and_json_schemas() {
    each_golden(|name, server| {
        let reply = chat(server, &body(0));
        assert!(reply["usage"]["completion_tokens"].as_u64() > Some(0), "{name}: {reply}");
        let mut streamed = server.stream(
            CHAT,
            &json!({"messages": body(0)["messages"], "max_tokens": 24,
            "temperature": 0, "stream": true}),
        );
        let mut text = String::new();
        while let Some(data) = streamed.next_data().expect("reading the stream") {
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(&data).expect("a JSON chunk");
            text += chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default();
        }
        assert_eq!(text, reply["choices"][0]["message"]["content"].as_str().expect("text"), "{name}: streamed");

        let parameters = json!({"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}},
            "required": ["city"], "additionalProperties": false});
        let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": parameters}}]);
        let forced = json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 120, "temperature": 0});
        let called = chat(server, &forced);
        let call = &called["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "weather", "{name}: {called}");
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("JSON");
        assert!(["Oslo", "Lima"].contains(&arguments["city"].as_str().unwrap_or_default()), "{name}: {arguments}");

        let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["n"], "additionalProperties": false});
        let format = json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}});
        let shaped = chat(
            server,
            &json!({"messages": [{"role": "user", "content": "A digit?"}],
            "response_format": format, "max_tokens": 40, "temperature": 0}),
        );
        let content = shaped["choices"][0]["message"]["content"].as_str().expect("content");
        let value: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{name}: {e}: {content}"));
        assert!(value["n"].as_u64().is_some_and(|n| n <= 9), "{name}: {value}");
    });
}

#[test]
fn test_moe_requests_are_the_same_alone_among_others_resumed_and_drafted() {
    each_golden(|name, server| {
        let requests: Vec<Value> = (0..6).map(body).collect();
        let alone: Vec<Value> = requests
            .iter()
            .map(|b| {
                let mut b = b.clone();
                b["cache"] = json!(false);
                b["draft"] = json!(false);
                bits(&chat(server, &b))
            })
            .collect();
        let together: Vec<Value> = std::thread::scope(|scope| {
            let handles: Vec<_> = requests.iter().map(|b| scope.spawn(move || bits(&chat(server, b)))).collect();
            handles.into_iter().map(|h| h.join().expect("a request thread")).collect()
        });
        let drafted = server.metrics().get("tensorfold_drafted_tokens_total").copied().unwrap_or(0.0);
        assert!(drafted > 0.0, "{name}: no token was drafted, so drafted = plain shows nothing");
        let by_head = server.metrics().get("tensorfold_draft_head_tokens_total").copied().unwrap_or(0.0);
        assert_eq!(by_head > 0.0, name.contains("next"), "{name}: {by_head} tokens drafted by an MTP head");
        for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
            assert_eq!(a, t, "{name}: request {i} among others (drafted, cache on) differs from alone");
        }
        for (i, request) in requests.iter().enumerate() {
            let resumed = chat(server, request);
            let cached = resumed["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
            assert!(cached > 0, "{name}: request {i} was not resumed from the cache: {resumed}");
            assert_eq!(bits(&resumed), alone[i], "{name}: request {i} resumed differs from fresh");
        }
    });
}
