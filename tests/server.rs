//! `tensorfold serve` end to end on the default model: the OpenAI API, its errors, exactness under load, cancellation.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::server::{Completion, Response, Server};
use common::Rng;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
const FRANCE: &str = "What is the capital of France?";
/// How long dropped requests may take to give back their lanes and pages.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);

fn chat_body(server: &Server, prompt: &str, max_tokens: usize) -> Value {
    json!({
        "model": server.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// Asserts the status and OpenAI's error envelope, and returns the error object.
fn assert_openai_error(response: &Response, status: u16, what: &str) -> Value {
    assert_eq!(response.status, status, "{what}: {}", response.text());
    let error = response.json()["error"].clone();
    let message = error["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{what}: no error.message in {}", response.text());
    assert!(error["type"].is_string(), "{what}: no error.type in {}", response.text());
    error
}

/// The sample `name`, or `name{...}` with `label` among its labels.
fn metric(metrics: &BTreeMap<String, f64>, name: &str, label: Option<&str>) -> Option<f64> {
    metrics.iter().find_map(|(key, value)| {
        let (key_name, labels) = key.split_once('{').unwrap_or((key, ""));
        let matches = key_name == name && label.is_none_or(|label| labels.contains(label));
        matches.then_some(*value)
    })
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn test_chat_answers_paris_streaming_and_not() {
    let server = Server::start(&[]);
    let body = chat_body(&server, FRANCE, 24);
    let response = server.post_json(CHAT, &body);
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    assert_eq!(json["object"], "chat.completion", "{json}");
    assert_eq!(json["choices"][0]["message"]["role"], "assistant", "{json}");
    let plain = server.complete(CHAT, &body);
    assert!(plain.text.contains("Paris"), "non-streaming answer: {:?}", plain.text);
    let usage = &plain.usage;
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap_or(0) + usage["completion_tokens"].as_u64().unwrap_or(0)),
        "usage {usage}"
    );

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({"include_usage": true});
    let streamed = server.complete(CHAT, &streaming);
    assert!(streamed.text.contains("Paris"), "streamed answer: {:?}", streamed.text);
    assert_eq!(streamed, plain, "greedy streaming and non-streaming differ");
}

#[test]
fn test_chat_stream_has_openai_sse_shape() {
    let server = Server::start(&[]);
    let mut body = chat_body(&server, FRANCE, 5);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let mut stream = server.stream(CHAT, &body);
    assert_eq!(stream.status, 200);
    let content_type = stream.header("content-type").unwrap_or_default().to_string();
    assert!(content_type.starts_with("text/event-stream"), "content-type {content_type:?}");
    let events = stream.collect_data().expect("reading the stream");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "events {events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.len() >= 3, "role, content and usage chunks expected: {events:?}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "first chunk {}", chunks[0]);
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        assert_eq!(chunk["id"], chunks[0]["id"], "one id per stream");
    }
    let finishes: Vec<&Value> = chunks.iter().filter(|c| !c["choices"][0]["finish_reason"].is_null()).collect();
    assert_eq!(finishes.len(), 1, "exactly one chunk has a finish_reason: {events:?}");
    assert_eq!(finishes[0]["choices"][0]["finish_reason"], "length", "5 tokens cannot finish the answer");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]), "the usage chunk has no choices: {usage_chunk}");
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 5, "{usage_chunk}");
    for chunk in &chunks[..chunks.len() - 1] {
        assert!(chunk["usage"].is_null(), "usage only on the last chunk: {chunk}");
    }
}

#[test]
fn test_completions_endpoint_plain_and_streaming() {
    let server = Server::start(&[]);
    let body = json!({"model": server.model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0});
    let response = server.post_json(COMPLETIONS, &body);
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    assert_eq!(json["object"], "text_completion", "{json}");
    let plain = server.complete(COMPLETIONS, &body);
    assert!(!plain.text.is_empty(), "{json}");
    assert_eq!(plain.usage["completion_tokens"], 8, "{json}");
    assert_eq!(plain.finish_reason, "length");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({"include_usage": true});
    let streamed = server.complete(COMPLETIONS, &streaming);
    assert_eq!(streamed, plain, "greedy streaming and plain completions differ");
}

#[test]
fn test_models_health_and_metrics() {
    let server = Server::start(&[]);
    let models = server.get("/v1/models");
    assert_eq!(models.status, 200, "{}", models.text());
    let json = models.json();
    assert_eq!(json["object"], "list", "{json}");
    assert_eq!(json["data"][0]["object"], "model", "{json}");
    assert!(!server.model.is_empty(), "no model id in {json}");
    assert_eq!(server.get("/health").status, 200);

    server.complete(CHAT, &chat_body(&server, "Say hi.", 4));
    let response = server.get("/metrics");
    assert_eq!(response.status, 200);
    assert!(response.header("content-type").unwrap_or_default().starts_with("text/plain"), "{:?}", response.headers);
    let metrics = server.metrics();
    for name in [
        "tensorfold_requests_running",
        "tensorfold_requests_waiting",
        "tensorfold_kv_pages_used",
        "tensorfold_kv_pages_total",
        "tensorfold_generated_tokens_total",
    ] {
        assert!(metric(&metrics, name, None).is_some(), "{name} missing from {metrics:?}");
    }
    assert!(metric(&metrics, "tensorfold_ledger_bytes", Some("kind=\"kv_cache\"")).is_some(), "{metrics:?}");
    let generated = metric(&metrics, "tensorfold_generated_tokens_total", None).unwrap_or(0.0);
    assert!(generated >= 1.0, "a finished request generated {generated} tokens");
    assert!(metric(&metrics, "tensorfold_kv_pages_total", None).unwrap_or(0.0) > 0.0, "{metrics:?}");
}

#[test]
fn test_invalid_requests_get_openai_errors() {
    let server = Server::start(&["--context", "256"]);
    let malformed = server.post_raw(CHAT, br#"{"model": "m", "messages": ["#, &[]);
    let error = assert_openai_error(&malformed, 400, "malformed JSON");
    assert_eq!(error["type"], "invalid_request_error");

    let model = server.model.clone();
    let wrong_types = [
        json!({"model": model, "messages": "hello"}),
        json!({"model": model, "messages": [{"role": "user", "content": 5}]}),
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}),
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
        json!([1, 2, 3]),
    ];
    for body in &wrong_types {
        assert_openai_error(&server.post_json(CHAT, body), 400, &format!("wrong types {body}"));
    }
    let empty = server.post_json(CHAT, &json!({"model": model, "messages": []}));
    let error = assert_openai_error(&empty, 400, "empty messages");
    let names_field = error["param"] == "messages" || error["message"].as_str().unwrap_or("").contains("messages");
    assert!(names_field, "the error does not name `messages`: {error}");

    let mut nine = chat_body(&server, "hi", 4);
    nine["n"] = json!(9);
    let error = assert_openai_error(&server.post_json(CHAT, &nine), 400, "n: 9");
    assert_eq!(error["param"], "n", "{error}");

    assert_openai_error(&server.get("/v1/nope"), 404, "unknown GET route");
    assert_openai_error(&server.post_json("/v1/nope", &json!({})), 404, "unknown POST route");
}

#[test]
fn test_prompt_plus_max_tokens_past_context_is_400_naming_the_numbers() {
    let server = Server::start(&["--context", "256"]);
    let fits = server.complete(CHAT, &chat_body(&server, FRANCE, 1));
    let prompt_tokens = fits.usage["prompt_tokens"].as_u64().expect("usage.prompt_tokens");
    let max_tokens = 300;
    let response = server.post_json(CHAT, &chat_body(&server, FRANCE, max_tokens));
    let error = assert_openai_error(&response, 400, "max_tokens past the context");
    let message = error["message"].as_str().unwrap_or_default();
    let total = (prompt_tokens + max_tokens as u64).to_string();
    assert!(message.contains("256"), "the message does not name the context of 256: {message}");
    let names_request = message.contains(&total)
        || (message.contains(&prompt_tokens.to_string()) && message.contains(&max_tokens.to_string()));
    assert!(names_request, "the message names neither {total} nor {prompt_tokens} and {max_tokens}: {message}");

    let long_prompt = "one two three four five six seven eight nine ten ".repeat(40);
    let body = json!({"model": server.model, "prompt": long_prompt, "max_tokens": 4});
    assert_openai_error(&server.post_json(COMPLETIONS, &body), 400, "a prompt past the context");
    assert_eq!(server.complete(CHAT, &chat_body(&server, FRANCE, 2)).usage["completion_tokens"], 2);
}

#[test]
fn test_api_key_guards_the_api_but_not_health() {
    let key = "test-key-123";
    let server = Server::start(&["--api-key", key]);
    let body = chat_body(&server, "Say hi.", 4).to_string();
    let without = server.post_raw(CHAT, body.as_bytes(), &[]);
    assert_openai_error(&without, 401, "no key");
    let wrong = server.post_raw(CHAT, body.as_bytes(), &[("Authorization", "Bearer wrong-key")]);
    assert_openai_error(&wrong, 401, "wrong key");
    let bearer = format!("Bearer {key}");
    let with = server.post_raw(CHAT, body.as_bytes(), &[("Authorization", &bearer)]);
    assert_eq!(with.status, 200, "{}", with.text());
    assert!(with.json()["choices"][0]["message"]["content"].is_string(), "{}", with.text());
    assert_openai_error(&server.get("/v1/models"), 401, "models without a key");
    assert_eq!(server.get("/health").status, 200, "/health must stay open");
}

/// The measured requests of the exactness test: greedy and seeded, chat and text, streamed and not.
fn exactness_requests(model: &str) -> Vec<(&'static str, Value)> {
    const PROMPTS: [&str; 16] = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three primary colors.",
        "Explain photosynthesis in one sentence.",
        "Once upon a time, in a small village,",
        "What is 12 times 7?",
        "Give me a name for a pet turtle.",
        "Describe the smell of rain.",
        "The three laws of motion are",
        "Translate 'good morning' into Spanish.",
        "Why is the sky blue?",
        "Write the first line of a mystery novel.",
        "def fibonacci(n):",
        "Name a planet with rings.",
        "What do bees make?",
        "Suggest a title for a cookbook.",
    ];
    PROMPTS
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let max_tokens = 16 + (i * 13) % 49;
            let stream = i % 4 >= 2;
            // Chat for a third of them: its template makes every prompt longer to prefill.
            let chat = i % 3 == 0;
            let mut body = if chat {
                json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
            } else {
                json!({"model": model, "prompt": prompt})
            };
            body["max_tokens"] = json!(max_tokens);
            if i % 2 == 0 {
                body["temperature"] = json!(0);
            } else {
                body["temperature"] = json!(1.0);
                body["top_p"] = json!(0.9);
                body["seed"] = json!(1000 + i);
            }
            if stream {
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
            }
            (if chat { CHAT } else { COMPLETIONS }, body)
        })
        .collect()
}

/// Background requests of other prompt and output lengths; two of them are dropped mid-stream.
fn noise_requests(model: &str) -> Vec<(Value, Option<usize>)> {
    (0..8)
        .map(|i| {
            let prompt = format!("Tell me about the number {i}. ").repeat(1 + (i * 5) % 32);
            let body = json!({
                "model": model,
                "prompt": prompt,
                "max_tokens": 8 + i * 5,
                "temperature": 0.7,
                "seed": i,
                "stream": true,
            });
            (body, (i % 4 == 1).then_some(2 + i))
        })
        .collect()
}

#[test]
fn test_concurrent_requests_equal_solo_requests() {
    let server = Server::start(&["--parallel", "8"]);
    let requests = exactness_requests(&server.model);
    let solo: Vec<Completion> = requests.iter().map(|(path, body)| server.complete(path, body)).collect();
    for (completion, (_, body)) in solo.iter().zip(&requests) {
        assert!(!completion.finish_reason.is_empty(), "no finish_reason for {body}");
        assert!(completion.usage["completion_tokens"].as_u64().unwrap_or(0) > 0, "no usage for {body}");
    }

    let mut rng = Rng(0x7e57);
    let delays: Vec<Duration> = (0..requests.len() + 8).map(|_| Duration::from_millis(rng.below(1500))).collect();
    let noise = noise_requests(&server.model);
    let finished = AtomicBool::new(false);
    let (together, most_running, most_waiting) = std::thread::scope(|scope| {
        let server = &server;
        let finished = &finished;
        // Samples the gauges so the test knows the requests really shared rounds and queued.
        let sampler = scope.spawn(move || {
            let (mut most_running, mut most_waiting) = (0.0f64, 0.0f64);
            while !finished.load(Ordering::Relaxed) {
                let metrics = server.metrics();
                most_running = most_running.max(metric(&metrics, "tensorfold_requests_running", None).unwrap_or(0.0));
                most_waiting = most_waiting.max(metric(&metrics, "tensorfold_requests_waiting", None).unwrap_or(0.0));
                std::thread::sleep(Duration::from_millis(100));
            }
            (most_running, most_waiting)
        });
        for ((body, drop_after), delay) in noise.iter().zip(&delays[requests.len()..]) {
            scope.spawn(move || {
                std::thread::sleep(*delay);
                match drop_after {
                    Some(events) => {
                        let mut stream = server.stream(COMPLETIONS, body);
                        for _ in 0..*events {
                            let _ = stream.next_data();
                        }
                    }
                    None => drop(server.complete(COMPLETIONS, body)),
                }
            });
        }
        let handles: Vec<_> = requests
            .iter()
            .zip(&delays)
            .map(|((path, body), delay)| {
                scope.spawn(move || {
                    std::thread::sleep(*delay);
                    server.complete(path, body)
                })
            })
            .collect();
        let together: Vec<Completion> =
            handles.into_iter().map(|handle| handle.join().expect("a request thread panicked")).collect();
        finished.store(true, Ordering::Relaxed);
        let (most_running, most_waiting) = sampler.join().expect("the metrics sampler panicked");
        (together, most_running, most_waiting)
    });
    assert!(most_running > 1.0 && most_waiting > 0.0, "running {most_running}, waiting {most_waiting}: no load");

    let mut differences = Vec::new();
    for ((alone, concurrent), (_, body)) in solo.iter().zip(&together).zip(&requests) {
        if alone != concurrent || sha256_hex(&alone.text) != sha256_hex(&concurrent.text) {
            differences.push(format!("{body}\n  solo:       {alone:?}\n  concurrent: {concurrent:?}"));
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {} requests differ:\n{}",
        differences.len(),
        requests.len(),
        differences.join("\n")
    );
}

#[test]
fn test_dropped_streams_release_everything() {
    let server = Server::start(&["--max-waiting", "200"]);
    let reference_body = chat_body(&server, "Name three colors.", 16);
    let reference = server.complete(CHAT, &reference_body);
    let before = server.metrics();
    let kv_bytes_before = metric(&before, "tensorfold_ledger_bytes", Some("kind=\"kv_cache\""))
        .unwrap_or_else(|| panic!("no kv_cache ledger in {before:?}"));

    let mut rng = Rng(0xcafe);
    let plans: Vec<(Duration, u64)> = (0..100).map(|_| (Duration::from_millis(rng.below(800)), rng.below(6))).collect();
    std::thread::scope(|scope| {
        for (i, (delay, drop_point)) in plans.iter().enumerate() {
            let server = &server;
            scope.spawn(move || {
                std::thread::sleep(*delay);
                // Mostly text completions: short prompts keep a hundred prefills cheap.
                let (path, mut body) = if i % 10 == 0 {
                    (CHAT, chat_body(server, &format!("Write a long story about dragon {i}."), 200))
                } else {
                    let prompt = format!("Dragon number {i} lived");
                    (COMPLETIONS, json!({"model": server.model, "prompt": prompt, "max_tokens": 200}))
                };
                body["stream"] = json!(true);
                match drop_point {
                    // Dropped while the request is parsed, queued or in prefill.
                    0 => drop(server.send_json(path, &body)),
                    1 => drop(server.stream(path, &body)),
                    events => {
                        let mut stream = server.stream(path, &body);
                        for _ in 0..*events {
                            let _ = stream.next_data();
                        }
                    }
                }
            });
        }
    });

    let gauges = |metrics: &BTreeMap<String, f64>| {
        [
            metric(metrics, "tensorfold_kv_pages_used", None),
            metric(metrics, "tensorfold_requests_running", None),
            metric(metrics, "tensorfold_requests_waiting", None),
            metric(metrics, "tensorfold_ledger_bytes", Some("kind=\"kv_cache\"")),
        ]
    };
    let released = [Some(0.0), Some(0.0), Some(0.0), Some(kv_bytes_before)];
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    let mut last = gauges(&server.metrics());
    while last != released {
        assert!(
            Instant::now() < deadline,
            "after {RELEASE_TIMEOUT:?} [kv_pages_used, running, waiting, kv_cache bytes] = {last:?}, want {released:?}\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(250));
        last = gauges(&server.metrics());
    }
    assert_eq!(server.complete(CHAT, &reference_body), reference, "a request after the drops differs");
}
