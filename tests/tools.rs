//! OpenAI tool calling end to end: forced calls parse and match their schema, streamed and not, on the default
//! model (whose template never reads tools) and on seeded checkpoints with Llama 3 and Qwen tool templates.

mod common;

use std::path::Path;

use common::server::Server;
use serde_json::{json, Value};

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false}}})
}

fn clock() -> Value {
    json!({"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
            "additionalProperties": false}}})
}

/// The arguments match the tool's schema as `weather` and `clock` write it.
fn assert_arguments_match(name: &str, arguments: &str) {
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("arguments {arguments:?}: {e}"));
    let object = args.as_object().unwrap_or_else(|| panic!("arguments {arguments} are not an object"));
    match name {
        "get_weather" => {
            assert!(["Paris", "Tokyo", "Lima"].contains(&args["city"].as_str().unwrap_or_default()), "{arguments}");
            assert!(args["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)), "{arguments}");
            assert_eq!(object.len(), 2, "{arguments}");
        }
        "get_time" => {
            assert!(args["utc"].is_boolean(), "{arguments}");
            assert_eq!(object.len(), 1, "{arguments}");
        }
        other => panic!("a call to an unknown function {other}"),
    }
}

fn ask(model: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "max_tokens": 120, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
        "tools": [weather(), clock()]});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    body
}

/// The calls of a non-streamed reply, checked: (name, arguments) each.
fn calls_of(reply: &Value) -> Vec<(String, String)> {
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("no tool_calls in {reply}"));
    calls
        .iter()
        .map(|call| {
            assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
            assert_eq!(call["type"], "function", "{call}");
            let name = call["function"]["name"].as_str().expect("a name").to_string();
            let arguments = call["function"]["arguments"].as_str().expect("arguments as a JSON string").to_string();
            assert_arguments_match(&name, &arguments);
            (name, arguments)
        })
        .collect()
}

/// A streamed reply's calls assembled from `delta.tool_calls` by index, and its finish reason.
fn streamed_calls(server: &Server, body: &Value) -> (Vec<(String, String)>, String) {
    let mut stream = server.stream("/v1/chat/completions", body);
    let status = stream.status;
    assert_eq!(status, 200, "{}", stream.rest());
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut finish = String::new();
    for data in stream.collect_data().expect("the stream reads") {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).expect("a JSON chunk");
        let Some(choice) = chunk["choices"].get(0) else { continue };
        for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().expect("an index") as usize;
            if index == calls.len() {
                assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
                calls.push((call["function"]["name"].as_str().expect("the name comes first").into(), String::new()));
            }
            calls[index].1 += call["function"]["arguments"].as_str().unwrap_or_default();
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_string();
        }
    }
    for (name, arguments) in &calls {
        assert_arguments_match(name, arguments);
    }
    (calls, finish)
}

#[test]
fn test_required_and_named_calls_parse_and_match_their_schema() {
    let server = Server::start(&[]);
    let required = ask(&server.model, json!({"tool_choice": "required", "parallel_tool_calls": false}));
    let response = server.post_json("/v1/chat/completions", &required);
    assert_eq!(response.status, 200, "{}", response.text());
    let reply = response.json();
    assert_eq!(calls_of(&reply).len(), 1, "{reply}");

    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}});
    let reply = server.post_json("/v1/chat/completions", &ask(&server.model, named.clone())).json();
    let calls = calls_of(&reply);
    assert_eq!(calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["get_time"], "{reply}");

    let mut streamed = ask(&server.model, named);
    streamed["stream"] = json!(true);
    let (calls, finish) = streamed_calls(&server, &streamed);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "get_time");
    assert_eq!(finish, "tool_calls");

    let mut parallel = ask(&server.model, json!({"tool_choice": "required", "stream": true}));
    parallel["max_tokens"] = json!(200);
    let (calls, _) = streamed_calls(&server, &parallel);
    assert!(!calls.is_empty());
}

#[test]
fn test_tool_results_round_trip_and_bad_shapes_are_400s() {
    let server = Server::start(&[]);
    let arguments = "{\"city\": \"Paris\", \"days\": 3}";
    let messages = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21, \"sky\": \"clear\"}"},
    ]);
    let body = json!({"model": server.model, "messages": messages, "tools": [weather()], "max_tokens": 16});
    let response = server.post_json("/v1/chat/completions", &body);
    assert_eq!(response.status, 200, "{}", response.text());
    let message = &response.json()["choices"][0]["message"];
    assert!(message["content"].is_string() || message["tool_calls"].is_array(), "{message}");

    let cases = [
        (json!({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}), "tools[0].function.name"),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tools": [weather()], "tool_choice": "always"}), "tool_choice"),
    ];
    for (extra, param) in cases {
        let response = server.post_json("/v1/chat/completions", &ask(&server.model, extra.clone()));
        assert_eq!(response.status, 400, "{extra}: {}", response.text());
        assert_eq!(response.json()["error"]["param"], param, "{extra}");
    }
}

/// A byte-level tokenizer padded with reserved specials to the seeded checkpoints' vocabulary, with `template`.
fn write_tokenizer(dir: &Path, specials: &[&str], bos: &str, eos: &str, template: &str) {
    let mut vocab = serde_json::Map::new();
    for (id, c) in byte_level_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), id.into());
    }
    let mut added = Vec::new();
    let names = specials.iter().map(|s| s.to_string()).chain((0..).map(|i| format!("<|reserved_{i}|>")));
    for (id, name) in (vocab.len()..common::cuda::VOCAB).zip(names) {
        added.push(json!({"id": id, "content": name, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": true}));
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null, "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
            "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []},
    });
    let config = json!({"bos_token": bos, "eos_token": eos, "add_bos_token": false, "chat_template": template});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("writes tokenizer.json");
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("writes tokenizer_config.json");
}

/// GPT-2's printable stand-ins for the 256 bytes, in byte order.
fn byte_level_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("a char")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("a char")
            }
        })
        .collect()
}

const LLAMA3_TEMPLATE: &str = r#"{{- bos_token }}{%- if tools is not none %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Respond with a JSON for a function call: {"name": function name, "parameters": dictionary of argument name and its value}.
{%- for t in tools %}
{{ t | tojson(indent=4) }}
{%- endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;

const QWEN_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{- "\n" }}{{- tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

#[test]
fn test_seeded_llama3_and_qwen_templates_force_parsable_calls() {
    let families = [
        ("llama", LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]),
        ("qwen2", QWEN_TEMPLATE, ["<|endoftext|>", "<|im_end|>", "<|im_start|>", "<|python_tag|>"]),
    ];
    for (arch, template, specials) in families {
        let dir = common::cuda::checkpoint(arch, 7);
        write_tokenizer(dir.path(), &specials, specials[0], specials[1], template);
        let server = Server::start_with_model(dir.path(), &["--no-voice"]);
        let body =
            ask(&server.model, json!({"tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 160}));
        let response = server.post_json("/v1/chat/completions", &body);
        assert_eq!(response.status, 200, "{arch}: {}\n{}", response.text(), server.stderr());
        let reply = response.json();
        assert_eq!(calls_of(&reply).len(), 1, "{arch}: {reply}");
    }
}
