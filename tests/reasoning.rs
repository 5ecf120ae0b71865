//! A chat template that thinks: the reply's `<think>` text comes back as reasoning on every route, the same whole
//! and streamed, and it is exactly the raw completion of the same prompt split at its first `</think>`.

mod common;

use std::path::Path;

use common::server::Server;
use serde_json::{json, Value};

/// The raw prompt the fixture's template renders for one user turn with thinking on.
const PROMPT: &str = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";
/// `</think>`'s id in tests/data/thinking, biased so the reasoning ends within a short reply.
const END_THINK: &str = "500";

/// The tiny Qwen3 golden's weights with the thinking tokenizer beside them.
fn thinking_model() -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let dir = tempfile::tempdir().expect("a directory");
    let golden = root.join("golden/tiny-qwen3");
    std::fs::copy(golden.join("model.safetensors"), dir.path().join("model.safetensors")).expect("weights");
    let mut config: Value = serde_json::from_slice(&std::fs::read(golden.join("config.json")).expect("config"))
        .expect("config.json is JSON");
    // The fixture's <|im_end|>.
    config["eos_token_id"] = json!(498);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config written");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(root.join("thinking").join(file), dir.path().join(file)).expect("tokenizer");
    }
    dir
}

/// The raw text split as the server must split it: reasoning to the first `</think>`, then the answer.
fn split(raw: &str) -> (String, String) {
    match raw.split_once("</think>") {
        Some((reasoning, answer)) => (reasoning.to_string(), answer.trim_start_matches('\n').to_string()),
        None => (raw.to_string(), String::new()),
    }
}

fn post(server: &Server, path: &str, body: &Value) -> Value {
    let response = server.post_json(path, body);
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    response.json()
}

/// Chat's streamed reasoning and content, each joined.
fn streamed_chat(server: &Server, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut stream = server.stream("/v1/chat/completions", &body);
    let (mut reasoning, mut content) = (String::new(), String::new());
    while let Some(data) = stream.next_data().expect("reading the stream") {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).expect("a JSON chunk");
        let delta = &chunk["choices"][0]["delta"];
        assert_eq!(delta["reasoning"], delta["reasoning_content"], "both names carry the same text");
        reasoning += delta["reasoning_content"].as_str().unwrap_or_default();
        content += delta["content"].as_str().unwrap_or_default();
    }
    (reasoning, content)
}

fn texts(items: &Value, kind: &str, field: &str) -> String {
    let items = items.as_array().expect("a list");
    items.iter().filter(|i| i["type"] == kind).map(|i| i[field].as_str().unwrap_or_default()).collect()
}

#[test]
fn test_reasoning_is_the_raw_reply_split_at_its_first_end_think_on_every_route() {
    let model = thinking_model();
    let server = Server::start_with_model(model.path(), &["--no-voice"]);
    let mut both_parts = 0;
    for seed in 0..6 {
        let sampling = json!({"seed": seed, "logit_bias": {END_THINK: 12}});
        let with = |mut body: Value| {
            for (k, v) in sampling.as_object().expect("an object") {
                body[k] = v.clone();
            }
            body
        };
        let raw = post(&server, "/v1/completions", &with(json!({"prompt": PROMPT, "max_tokens": 24})));
        let (reasoning, answer) = split(raw["choices"][0]["text"].as_str().expect("text"));
        both_parts += usize::from(!reasoning.is_empty() && !answer.is_empty());

        let chat_body = with(json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24}));
        let chat = post(&server, "/v1/chat/completions", &chat_body);
        let message = &chat["choices"][0]["message"];
        // An empty block gives no reasoning field at all.
        let named = |field: &str| message[field].as_str().unwrap_or_default().to_string();
        assert_eq!(named("reasoning_content"), reasoning, "seed {seed}: {chat}");
        assert_eq!(named("reasoning"), reasoning);
        assert_eq!(message["content"], answer.as_str(), "seed {seed}");
        assert_eq!(streamed_chat(&server, &chat_body), (reasoning.clone(), answer.clone()), "seed {seed}: streamed");

        let response = post(&server, "/v1/responses", &with(json!({"input": "Hi", "max_output_tokens": 24})));
        let items = &response["output"];
        let thought: String = items
            .as_array()
            .expect("items")
            .iter()
            .filter(|i| i["type"] == "reasoning")
            .map(|i| i["content"][0]["text"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(thought, reasoning, "seed {seed}: {response}");
        assert_eq!(response["output_text"], answer.as_str(), "seed {seed}");

        let message = post(&server, "/v1/messages", &chat_body);
        assert_eq!(texts(&message["content"], "thinking", "thinking"), reasoning, "seed {seed}: {message}");
        assert_eq!(texts(&message["content"], "text", "text"), answer, "seed {seed}");
    }
    assert!(both_parts > 0, "no seed gave both reasoning and an answer; the test shows nothing");
}

#[test]
fn test_enable_thinking_false_renders_an_empty_block_and_the_reply_is_all_answer() {
    let model = thinking_model();
    let server = Server::start_with_model(model.path(), &["--no-voice"]);
    let body = |kwargs: Value| {
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 1,
            "logit_bias": {"499": -100}, "chat_template_kwargs": kwargs})
    };
    let thinking = post(&server, "/v1/chat/completions", &body(json!({})));
    let plain = post(&server, "/v1/chat/completions", &body(json!({"enable_thinking": false})));
    let tokens = |reply: &Value| reply["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(tokens(&plain) > tokens(&thinking), "the empty block is part of the prompt: {plain} {thinking}");
    assert!(plain["choices"][0]["message"].get("reasoning_content").is_none(), "{plain}");
    assert!(thinking["choices"][0]["message"]["reasoning_content"].is_string(), "{thinking}");
    let messages = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 1,
        "logit_bias": {"499": -100}, "thinking": {"type": "disabled"}});
    let reply = post(&server, "/v1/messages", &messages);
    let usage = &reply["usage"];
    let prompt = usage["input_tokens"].as_u64().zip(usage["cache_read_input_tokens"].as_u64()).map(|(a, b)| a + b);
    assert_eq!(prompt, Some(tokens(&plain)), "thinking disabled is the same prompt: {reply}");
    assert_eq!(texts(&reply["content"], "thinking", "thinking"), "", "{reply}");
}

#[test]
fn test_a_reply_a_grammar_shapes_is_all_answer_even_in_an_opened_block() {
    let model = thinking_model();
    let server = Server::start_with_model(model.path(), &["--no-voice"]);
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let format = json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}});
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "seed": 2,
        "response_format": format});
    let reply = post(&server, "/v1/chat/completions", &body);
    let message = &reply["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{reply}");
    let text = message["content"].as_str().expect("content");
    if reply["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(parsed["n"].is_i64(), "{parsed}");
    } else {
        assert!(text.starts_with('{'), "the grammar's text is the answer: {text}");
    }
}
