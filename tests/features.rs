//! OpenAI generation parameters end to end on the default model: `n`, list prompts, logit bias, penalties,
//! `echo`, `max_completion_tokens`, streamed log-probabilities and `response_format`.

mod common;

use std::collections::BTreeMap;

use common::server::Server;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
const FRANCE: &str = "What is the capital of France?";
const REPEAT: &str = "one two one two one two one two one two one two";

/// A 200's JSON body.
fn post(server: &Server, path: &str, body: &Value) -> Value {
    let response = server.post_json(path, body);
    assert_eq!(response.status, 200, "POST {path} {body}: {}", response.text());
    response.json()
}

/// A 400's `error.param` and `error.message`.
fn rejected(server: &Server, path: &str, body: &Value) -> (String, String) {
    let response = server.post_json(path, body);
    assert_eq!(response.status, 400, "POST {path} {body}: {}", response.text());
    let error = response.json()["error"].clone();
    (error["param"].as_str().unwrap_or_default().to_string(), error["message"].as_str().unwrap_or_default().into())
}

/// A streamed reply, taken apart by choice.
#[derive(Debug, Default)]
struct Streamed {
    /// Each choice's text, in the order its chunks came.
    texts: BTreeMap<u64, String>,
    /// Each choice's text chunks, for `echo`.
    chunks: BTreeMap<u64, Vec<String>>,
    finishes: BTreeMap<u64, usize>,
    /// The choice index of every chunk that carried text, in arrival order.
    order: Vec<u64>,
    /// Every chunk's `choices[0].logprobs` that was not null.
    logprobs: Vec<Value>,
    usages: Vec<Value>,
}

fn stream(server: &Server, path: &str, body: &Value) -> Streamed {
    let mut events = server.stream(path, body);
    let status = events.status;
    assert_eq!(status, 200, "POST {path} {body}: {}", events.rest());
    let data = events.collect_data().expect("reading the stream");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let mut out = Streamed::default();
    for data in &data[..data.len() - 1] {
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("chunk {data:?}: {e}"));
        assert!(chunk.get("error").is_none(), "{chunk}");
        if chunk["usage"].is_object() {
            out.usages.push(chunk["usage"].clone());
        }
        for choice in chunk["choices"].as_array().expect("choices") {
            let index = choice["index"].as_u64().expect("an index");
            let text = choice["delta"]["content"].as_str().or(choice["text"].as_str()).unwrap_or_default();
            if !text.is_empty() {
                out.texts.entry(index).or_default().push_str(text);
                out.chunks.entry(index).or_default().push(text.to_string());
                out.order.push(index);
            }
            if choice["finish_reason"].is_string() {
                *out.finishes.entry(index).or_default() += 1;
            }
            if !choice["logprobs"].is_null() {
                out.logprobs.push(choice["logprobs"].clone());
            }
        }
    }
    out
}

fn chat(server: &Server, extra: Value) -> Value {
    let mut body = json!({"model": server.model, "messages": [{"role": "user", "content": FRANCE}], "max_tokens": 12});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    body
}

fn completion(server: &Server, prompt: Value, extra: Value) -> Value {
    let mut body = json!({"model": server.model, "prompt": prompt, "max_tokens": 8, "temperature": 0});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    body
}

fn texts(reply: &Value, field: &str) -> Vec<String> {
    let choices = reply["choices"].as_array().expect("choices");
    let indexes: Vec<u64> = choices.iter().map(|c| c["index"].as_u64().expect("an index")).collect();
    assert_eq!(indexes, (0..choices.len() as u64).collect::<Vec<_>>(), "choices in index order: {reply}");
    choices
        .iter()
        .map(|c| c.pointer(field).and_then(Value::as_str).unwrap_or_else(|| panic!("{field} in {c}")).to_string())
        .collect()
}

#[test]
fn test_n_choices_equal_solo_requests_with_consecutive_seeds() {
    let server = Server::start(&[]);
    let sampled = json!({"temperature": 0.8, "seed": 1234});
    let solo: Vec<Value> =
        (0..3u64).map(|i| post(&server, CHAT, &chat(&server, json!({"temperature": 0.8, "seed": 1234 + i})))).collect();
    let solo_texts: Vec<String> = solo.iter().map(|r| texts(r, "/message/content").remove(0)).collect();
    assert!(solo_texts.iter().any(|t| *t != solo_texts[0]), "the seeds should not all agree: {solo_texts:?}");

    let mut three = chat(&server, sampled.clone());
    three["n"] = json!(3);
    let reply = post(&server, CHAT, &three);
    assert_eq!(texts(&reply, "/message/content"), solo_texts);
    let solo_completion: u64 = solo.iter().map(|r| r["usage"]["completion_tokens"].as_u64().expect("counts")).sum();
    assert_eq!(reply["usage"]["prompt_tokens"], solo[0]["usage"]["prompt_tokens"], "the prompt counts once");
    assert_eq!(reply["usage"]["completion_tokens"], solo_completion);

    three["stream"] = json!(true);
    three["stream_options"] = json!({"include_usage": true});
    let streamed = stream(&server, CHAT, &three);
    assert_eq!(streamed.texts.values().cloned().collect::<Vec<_>>(), solo_texts);
    assert_eq!(streamed.finishes, BTreeMap::from([(0, 1), (1, 1), (2, 1)]), "one finish chunk per choice");
    assert_eq!(streamed.usages.len(), 1, "the usage chunk comes once");
    assert_eq!(streamed.usages[0]["completion_tokens"], solo_completion);

    // Completions fan out the same way, and best_of equal to n is allowed.
    let body = completion(&server, json!("Once upon a time"), json!({"temperature": 0.8, "seed": 99}));
    let solos: Vec<String> = (0..2u64)
        .map(|i| {
            let mut solo = body.clone();
            solo["seed"] = json!(99 + i);
            texts(&post(&server, COMPLETIONS, &solo), "/text").remove(0)
        })
        .collect();
    let mut two = body.clone();
    two["n"] = json!(2);
    two["best_of"] = json!(2);
    assert_eq!(texts(&post(&server, COMPLETIONS, &two), "/text"), solos);
    two["stream"] = json!(true);
    assert_eq!(stream(&server, COMPLETIONS, &two).texts.into_values().collect::<Vec<_>>(), solos);

    for (extra, param) in [(json!({"n": 9}), "n"), (json!({"n": 0}), "n")] {
        assert_eq!(rejected(&server, CHAT, &chat(&server, extra)).0, param);
    }
    let mut bad = body.clone();
    bad["best_of"] = json!(3);
    assert_eq!(rejected(&server, COMPLETIONS, &bad).0, "best_of");
}

#[test]
fn test_list_prompts_echo_and_max_completion_tokens() {
    let server = Server::start(&[]);
    let prompts = ["The capital of France is", "My favourite colour is"];
    let solo: Vec<Value> =
        prompts.iter().map(|p| post(&server, COMPLETIONS, &completion(&server, json!(p), json!({})))).collect();
    let solo_texts: Vec<String> = solo.iter().map(|r| texts(r, "/text").remove(0)).collect();
    let listed = post(&server, COMPLETIONS, &completion(&server, json!(prompts), json!({"n": 2})));
    let expected: Vec<String> = solo_texts.iter().flat_map(|t| [t.clone(), t.clone()]).collect();
    assert_eq!(texts(&listed, "/text"), expected, "choice index = prompt index * n + j");
    let prompt_tokens: u64 = solo.iter().map(|r| r["usage"]["prompt_tokens"].as_u64().expect("counts")).sum();
    assert_eq!(listed["usage"]["prompt_tokens"], prompt_tokens, "each prompt counts once");

    // Token id prompts, listed: the ids of each solo prompt give the same text.
    let ids: Vec<Vec<u32>> =
        prompts.iter().map(|p| common::default_model().tokenizer.encode(p, true).expect("encodes")).collect();
    let by_ids = post(&server, COMPLETIONS, &completion(&server, json!(ids), json!({})));
    assert_eq!(texts(&by_ids, "/text"), solo_texts);
    let too_many = completion(&server, json!(vec!["hi"; 9]), json!({"n": 8}));
    assert_eq!(rejected(&server, COMPLETIONS, &too_many).0, "prompt");

    // Echo: the prompt as given, then the same completion; streamed, the prompt is each choice's first chunk.
    let echoed = post(&server, COMPLETIONS, &completion(&server, json!(prompts[0]), json!({"echo": true})));
    assert_eq!(texts(&echoed, "/text"), [format!("{}{}", prompts[0], solo_texts[0])]);
    let streamed =
        stream(&server, COMPLETIONS, &completion(&server, json!(prompts), json!({"echo": true, "stream": true})));
    for (index, prompt) in prompts.iter().enumerate() {
        assert_eq!(streamed.chunks[&(index as u64)][0], *prompt);
        assert_eq!(streamed.texts[&(index as u64)], format!("{prompt}{}", solo_texts[index]));
    }
    let by_ids = post(&server, COMPLETIONS, &completion(&server, json!(ids[0]), json!({"echo": true})));
    let decoded = common::default_model().tokenizer.decode(&ids[0]);
    assert_eq!(texts(&by_ids, "/text"), [format!("{decoded}{}", solo_texts[0])]);
    let (param, message) =
        rejected(&server, COMPLETIONS, &completion(&server, json!("x"), json!({"echo": true, "logprobs": 1})));
    assert_eq!(param, "echo");
    assert!(message.contains("log-probabilities"), "{message}");

    let capped = completion(&server, json!(prompts[0]), json!({"max_completion_tokens": 3, "max_tokens": 50}));
    let reply = post(&server, COMPLETIONS, &capped);
    assert!(reply["usage"]["completion_tokens"].as_u64().expect("counts") <= 3, "{reply}");
}

#[test]
fn test_streamed_logprobs_ride_on_each_choice() {
    let server = Server::start(&[]);
    let body = chat(&server, json!({"temperature": 0, "stream": true, "logprobs": true, "top_logprobs": 3, "n": 2}));
    let streamed = stream(&server, CHAT, &body);
    assert!(!streamed.logprobs.is_empty());
    for logprobs in &streamed.logprobs {
        let entry = &logprobs["content"][0];
        assert!(entry["logprob"].as_f64().is_some_and(|lp| lp <= 0.0), "{entry}");
        assert_eq!(entry["top_logprobs"].as_array().map(Vec::len), Some(3), "{entry}");
    }
    let body = completion(&server, json!(FRANCE), json!({"stream": true, "logprobs": 2}));
    let streamed = stream(&server, COMPLETIONS, &body);
    assert!(!streamed.logprobs.is_empty());
    for logprobs in &streamed.logprobs {
        assert_eq!(logprobs["tokens"].as_array().map(Vec::len), Some(1), "{logprobs}");
        assert_eq!(logprobs["top_logprobs"][0].as_object().map(|m| m.len()), Some(2), "{logprobs}");
    }
}

/// Greedy and sampled, on both routes: every token has its log-probability and alternatives, a greedy token is its
/// row's most likely, and asking for them changes no token (a GPU draws sampled rows cut short without them).
#[test]
fn test_logprobs_on_both_routes_greedy_and_sampled() {
    let server = Server::start(&[]);
    for sampled in [json!({"temperature": 0}), json!({"temperature": 0.8, "seed": 11})] {
        let plain = completion(&server, json!(FRANCE), sampled.clone());
        let mut asked = plain.clone();
        asked["logprobs"] = json!(2);
        let reply = post(&server, COMPLETIONS, &asked);
        let logprobs = &reply["choices"][0]["logprobs"];
        let tokens = logprobs["token_logprobs"].as_array().expect("token_logprobs");
        assert!(!tokens.is_empty(), "{reply}");
        for (i, lp) in tokens.iter().enumerate() {
            let lp = lp.as_f64().expect("a log-probability");
            let top = logprobs["top_logprobs"][i].as_object().expect("alternatives");
            assert!(lp <= 0.0 && top.len() == 2, "{reply}");
            if sampled["temperature"] == 0 {
                assert!(
                    top.values().all(|t| t.as_f64().unwrap() <= lp + 1e-6),
                    "greedy took a less likely token: {reply}"
                );
            }
        }
        assert_eq!(texts(&reply, "/text"), texts(&post(&server, COMPLETIONS, &plain), "/text"), "{sampled}");

        let plain = chat(&server, sampled.clone());
        let mut asked = plain.clone();
        (asked["logprobs"], asked["top_logprobs"]) = (json!(true), json!(2));
        let reply = post(&server, CHAT, &asked);
        let content = reply["choices"][0]["logprobs"]["content"].as_array().expect("content");
        assert!(!content.is_empty(), "{reply}");
        for entry in content {
            assert!(entry["logprob"].as_f64().is_some_and(|lp| lp <= 0.0), "{entry}");
            assert_eq!(entry["top_logprobs"].as_array().map(Vec::len), Some(2), "{entry}");
        }
        let field = "/message/content";
        assert_eq!(texts(&reply, field), texts(&post(&server, CHAT, &plain), field), "{sampled}");
    }
}

#[test]
fn test_logit_bias_and_penalties_steer_the_draws() {
    let server = Server::start(&[]);
    let tokenizer = &common::default_model().tokenizer;
    let forced = tokenizer.encode(" banana", false).expect("encodes")[0];
    let body = completion(&server, json!(FRANCE), json!({"logit_bias": {forced.to_string(): 100}, "logprobs": 0}));
    let reply = post(&server, COMPLETIONS, &body);
    let tokens = reply["choices"][0]["logprobs"]["tokens"].as_array().expect("tokens").clone();
    assert_eq!(tokens.len(), 8, "{reply}");
    let forced_text = tokenizer.decode(&[forced]);
    assert!(tokens.iter().all(|t| *t == json!(forced_text)), "every token is the biased one: {reply}");

    // -100 bans the token greedy decoding would pick first.
    let plain = completion(&server, json!("The capital of France is"), json!({"max_tokens": 1, "logprobs": 0}));
    let first = post(&server, COMPLETIONS, &plain)["choices"][0]["logprobs"]["tokens"][0].clone();
    let banned = tokenizer.encode(first.as_str().expect("a token"), false).expect("encodes")[0];
    let mut body = plain.clone();
    body["logit_bias"] = json!({banned.to_string(): -100});
    let other = post(&server, COMPLETIONS, &body)["choices"][0]["logprobs"]["tokens"][0].clone();
    assert_ne!(other, first, "the banned token was drawn");

    // Penalties break a greedy loop.
    let greedy = completion(&server, json!(REPEAT), json!({"max_tokens": 16}));
    let repeated = texts(&post(&server, COMPLETIONS, &greedy), "/text").remove(0);
    for penalty in ["presence_penalty", "frequency_penalty"] {
        let mut body = greedy.clone();
        body[penalty] = json!(2.0);
        let text = texts(&post(&server, COMPLETIONS, &body), "/text").remove(0);
        assert_ne!(text, repeated, "{penalty} 2 left the greedy output as it was");
    }
    for (extra, param) in [
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"logit_bias": {"1": 101}}), "logit_bias"),
        (json!({"logit_bias": {"99999999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"x": 1}}), "logit_bias"),
    ] {
        assert_eq!(rejected(&server, CHAT, &chat(&server, extra.clone())).0, param, "{extra}");
    }
}

#[test]
fn test_response_format_constrains_to_json() {
    let server = Server::start(&[]);
    let object = chat(&server, json!({"temperature": 0, "max_tokens": 48, "response_format": {"type": "json_object"}}));
    for reply in [texts(&post(&server, CHAT, &object), "/message/content").remove(0), {
        let mut streamed = object.clone();
        streamed["stream"] = json!(true);
        stream(&server, CHAT, &streamed).texts.remove(&0).unwrap_or_default()
    }] {
        let value: Value = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply:?}"));
        assert!(value.is_object(), "{reply}");
    }

    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}, "required": ["city", "population"],
        "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": true}});
    let body = chat(&server, json!({"temperature": 0, "max_tokens": 64, "response_format": format}));
    let reply = texts(&post(&server, CHAT, &body), "/message/content").remove(0);
    let value: Value = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply:?}"));
    let keys: Vec<&String> = value.as_object().expect("an object").keys().collect();
    assert_eq!(keys, ["city", "population"], "{reply}");
    assert!(value["city"].as_str().is_some_and(|c| c.chars().count() <= 12), "{reply}");
    assert!(value["population"].is_i64() || value["population"].is_u64(), "{reply}");
    let on_completions =
        completion(&server, json!("A JSON object:"), json!({"max_tokens": 64, "response_format": format}));
    let text = texts(&post(&server, COMPLETIONS, &on_completions), "/text").remove(0);
    assert!(serde_json::from_str::<Value>(&text).is_ok_and(|v| v["city"].is_string()), "{text:?}");

    let bad = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
        "properties": {"a": {"$ref": "#/$defs/missing"}}}}});
    let (param, message) = rejected(&server, CHAT, &chat(&server, json!({"response_format": bad})));
    assert_eq!(param, "response_format");
    assert!(!message.is_empty());
}
