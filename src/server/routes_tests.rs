//! The handlers over HTTP with a scripted backend standing in for the runtime.

use std::future::Future;
use std::sync::{Arc, Mutex};

use actix_web::body::MessageBody;
use actix_web::http::{header, StatusCode};
use actix_web::test;
use tensorfold_actors::request_types::{Event, FinishReason, SubmitError, Usage, ValidRequest, Work};
use tensorfold_actors::runtime::Limits;
use tokio::sync::mpsc;

use super::routes::app;
use super::test_support::tokenizer;
use super::{AppState, Backend};

const CONTEXT: usize = 64;
const BODY_LIMIT: usize = 512;

/// What the scripted backend answers to `submit`.
#[derive(Clone, Copy)]
enum Script {
    /// Two tokens, then done.
    Reply,
    /// One token, and the channel stays open.
    Hold,
    QueueFull,
    Closed,
}

#[derive(Clone)]
struct Scripted {
    script: Script,
    ready: bool,
    /// The prompt length and max_tokens of the last submitted request.
    seen: Arc<Mutex<Option<(usize, usize)>>>,
    /// The senders of `Hold` lanes, kept to see when their receivers go away.
    held: Arc<Mutex<Vec<mpsc::Sender<Event>>>>,
}

impl Scripted {
    fn new(script: Script) -> Scripted {
        Scripted { script, ready: true, seen: Arc::default(), held: Arc::default() }
    }
}

impl Backend for Scripted {
    fn limits(&self, _: &str) -> Limits {
        Limits { context: CONTEXT, max_waiting: 4, embeds: true }
    }

    fn submit(&self, request: ValidRequest) -> impl Future<Output = Result<mpsc::Receiver<Event>, SubmitError>> {
        let this = self.clone();
        async move {
            let Work::Tokens(request) = request.work else { return Err(SubmitError::Closed) };
            *this.seen.lock().expect("not poisoned") = Some((request.prompt.len(), request.max_tokens));
            let (sender, receiver) = mpsc::channel(8);
            let token = |id: u32, text: &str| Event::Token { id, text: text.into(), logprob: None };
            match this.script {
                Script::QueueFull => return Err(SubmitError::QueueFull(4)),
                Script::Closed => return Err(SubmitError::Closed),
                Script::Reply => {
                    let usage = Usage { prompt_tokens: request.prompt.len(), completion_tokens: 2, cached_tokens: 0 };
                    for event in [
                        token(3, "hello"),
                        token(4, " world"),
                        Event::Done { finish: FinishReason::Stop, usage, stop_sequence: None },
                    ] {
                        sender.try_send(event).expect("room in the channel");
                    }
                }
                Script::Hold => {
                    sender.try_send(token(3, "hello")).expect("room in the channel");
                    this.held.lock().expect("not poisoned").push(sender);
                }
            }
            Ok(receiver)
        }
    }

    fn is_ready(&self) -> bool {
        self.ready
    }

    fn metrics_text(&self, _model_name: &str) -> impl Future<Output = String> {
        std::future::ready("tensorfold_requests_total 3\n".to_string())
    }
}

fn state(backend: Scripted, api_key: Option<&str>) -> AppState<Scripted> {
    AppState::new(backend, tokenizer(), "tiny".to_string(), api_key.map(str::to_string))
}

fn chat_body(stream: bool) -> serde_json::Value {
    serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}], "stream": stream})
}

/// Status, headers and body text of one request against a fresh app.
async fn call(
    backend: Scripted,
    api_key: Option<&str>,
    req: test::TestRequest,
) -> (StatusCode, header::HeaderMap, String) {
    let service = test::init_service(app(state(backend, api_key), BODY_LIMIT)).await;
    let response = test::call_service(&service, req.to_request()).await;
    let (status, headers) = (response.status(), response.headers().clone());
    let body = test::read_body(response).await;
    (status, headers, String::from_utf8(body.to_vec()).expect("utf-8"))
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[actix_web::test]
async fn test_chat_non_stream_reply() {
    let backend = Scripted::new(Script::Reply);
    let req = test::TestRequest::post().uri("/v1/chat/completions").set_json(chat_body(false));
    let (status, _, body) = call(backend.clone(), None, req).await;
    assert_eq!(status, StatusCode::OK);
    let body = json(&body);
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")), "{body}");
    assert_eq!(body["model"], "tiny");
    assert_eq!(body["choices"][0]["message"]["content"], "hello world");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let (num_prompt, max_tokens) = backend.seen.lock().expect("not poisoned").expect("submitted");
    assert_eq!(body["usage"]["prompt_tokens"], num_prompt);
    assert_eq!(max_tokens, CONTEXT - num_prompt, "the default is the rest of the context");
}

#[actix_web::test]
async fn test_chat_stream_reply() {
    let req = test::TestRequest::post().uri("/v1/chat/completions").set_json(chat_body(true));
    let (status, headers, body) = call(Scripted::new(Script::Reply), None, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()), Some("text/event-stream"));
    let events: Vec<&str> = body.split_terminator("\n\n").collect();
    assert_eq!(events.len(), 5, "{body}");
    assert!(events[0].contains(r#""delta":{"role":"assistant","content":""}"#), "{body}");
    assert!(events[3].contains(r#""finish_reason":"stop""#), "{body}");
    assert_eq!(events[4], "data: [DONE]");
}

#[actix_web::test]
async fn test_completion_reply_and_stream() {
    let req = test::TestRequest::post().uri("/v1/completions").set_json(serde_json::json!({"prompt": "hello"}));
    let (status, _, body) = call(Scripted::new(Script::Reply), None, req).await;
    assert_eq!(status, StatusCode::OK);
    let body = json(&body);
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")), "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], "hello world");
    let streamed = serde_json::json!({"prompt": "hello", "stream": true, "stream_options": {"include_usage": true}});
    let req = test::TestRequest::post().uri("/v1/completions").set_json(streamed);
    let (_, _, body) = call(Scripted::new(Script::Reply), None, req).await;
    let events: Vec<&str> = body.split_terminator("\n\n").collect();
    assert_eq!(events.len(), 5, "{body}");
    assert!(events[3].contains(r#""choices":[]"#) && events[3].contains(r#""total_tokens""#), "{body}");
}

#[actix_web::test]
async fn test_bad_requests_are_openai_400s() {
    let malformed = test::TestRequest::post().uri("/v1/chat/completions").set_payload("{not json");
    let (status, _, body) = call(Scripted::new(Script::Reply), None, malformed).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&body)["error"]["type"], "invalid_request_error");
    assert_eq!(json(&body)["error"]["param"], serde_json::Value::Null);
    let two = serde_json::json!({"messages": [{"role": "user", "content": "hello"}], "n": 9});
    let req = test::TestRequest::post().uri("/v1/chat/completions").set_json(two);
    let (status, _, body) = call(Scripted::new(Script::Reply), None, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json(&body)["error"]["param"], "n");
}

#[actix_web::test]
async fn test_body_over_limit_is_413() {
    let long = "hello ".repeat(BODY_LIMIT);
    let req = test::TestRequest::post().uri("/v1/completions").set_json(serde_json::json!({"prompt": long}));
    let (status, _, body) = call(Scripted::new(Script::Reply), None, req).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json(&body)["error"]["code"], "request_too_large");
}

#[actix_web::test]
async fn test_submit_refusals() {
    let req = || test::TestRequest::post().uri("/v1/chat/completions").set_json(chat_body(true));
    let (status, headers, body) = call(Scripted::new(Script::QueueFull), None, req()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
    assert_eq!(json(&body)["error"]["code"], "rate_limit_exceeded");
    let (status, _, _) = call(Scripted::new(Script::Closed), None, req()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[actix_web::test]
async fn test_unknown_routes_and_methods_are_json() {
    let (status, _, body) = call(Scripted::new(Script::Reply), None, test::TestRequest::get().uri("/v2/nothing")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json(&body)["error"]["message"], "no route for GET /v2/nothing");
    let req = test::TestRequest::get().uri("/v1/chat/completions");
    let (status, headers, body) = call(Scripted::new(Script::Reply), None, req).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers.get(header::ALLOW).and_then(|v| v.to_str().ok()), Some("POST"));
    assert_eq!(json(&body)["error"]["code"], "method_not_allowed");
}

#[actix_web::test]
async fn test_models_health_and_metrics() {
    let (status, _, body) = call(Scripted::new(Script::Reply), None, test::TestRequest::get().uri("/v1/models")).await;
    assert_eq!(status, StatusCode::OK);
    let body = json(&body);
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "tiny");
    assert_eq!(body["data"][0]["object"], "model");
    assert_eq!(body["data"][0]["max_model_len"], CONTEXT);
    assert_eq!(body["data"][0]["context_length"], CONTEXT);
    let req = test::TestRequest::get().uri("/v1/models/other");
    assert_eq!(call(Scripted::new(Script::Reply), None, req).await.0, StatusCode::NOT_FOUND);

    let (status, _, body) = call(Scripted::new(Script::Reply), None, test::TestRequest::get().uri("/health")).await;
    assert_eq!((status, json(&body)), (StatusCode::OK, serde_json::json!({"status": "ok"})));
    let loading = Scripted { ready: false, ..Scripted::new(Script::Reply) };
    assert_eq!(call(loading, None, test::TestRequest::get().uri("/health")).await.0, StatusCode::SERVICE_UNAVAILABLE);

    let (status, headers, body) =
        call(Scripted::new(Script::Reply), None, test::TestRequest::get().uri("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    assert_eq!(body, "tensorfold_requests_total 3\n");
}

#[actix_web::test]
async fn test_api_key_guards_all_but_health() {
    let key = Some("sekrit");
    let models = || test::TestRequest::get().uri("/v1/models");
    let (status, headers, body) = call(Scripted::new(Script::Reply), key, models()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(json(&body)["error"]["code"], "invalid_api_key");
    assert!(headers.contains_key(header::WWW_AUTHENTICATE));
    let wrong = models().insert_header((header::AUTHORIZATION, "Bearer sekrib"));
    assert_eq!(call(Scripted::new(Script::Reply), key, wrong).await.0, StatusCode::UNAUTHORIZED);
    let right = models().insert_header((header::AUTHORIZATION, "bearer sekrit"));
    assert_eq!(call(Scripted::new(Script::Reply), key, right).await.0, StatusCode::OK);
    let chat = test::TestRequest::post().uri("/v1/chat/completions").set_json(chat_body(false));
    assert_eq!(call(Scripted::new(Script::Reply), key, chat).await.0, StatusCode::UNAUTHORIZED);
    let health = test::TestRequest::get().uri("/health");
    assert_eq!(call(Scripted::new(Script::Reply), key, health).await.0, StatusCode::OK);
}

#[actix_web::test]
async fn test_any_configured_key_works_as_bearer_or_x_api_key() {
    let keys = Some("first, second");
    let models = || test::TestRequest::get().uri("/v1/models");
    for (name, value) in [("x-api-key", "second"), ("authorization", "Bearer first"), ("x-api-key", "first")] {
        let req = models().insert_header((name, value));
        assert_eq!(call(Scripted::new(Script::Reply), keys, req).await.0, StatusCode::OK, "{name}: {value}");
    }
    for (name, value) in [("x-api-key", "first, second"), ("x-api-key", ""), ("authorization", "Bearer ")] {
        let req = models().insert_header((name, value));
        assert_eq!(call(Scripted::new(Script::Reply), keys, req).await.0, StatusCode::UNAUTHORIZED, "{value}");
    }
}

#[actix_web::test]
async fn test_dropped_stream_cancels_the_request() {
    let backend = Scripted::new(Script::Hold);
    let service = test::init_service(app(state(backend.clone(), None), BODY_LIMIT)).await;
    let req = test::TestRequest::post().uri("/v1/chat/completions").set_json(chat_body(true)).to_request();
    let response = test::call_service(&service, req).await;
    let mut body = Box::pin(response.into_body());
    let first = std::future::poll_fn(|cx| body.as_mut().poll_next(cx)).await;
    assert!(first.is_some_and(|chunk| chunk.is_ok()), "the opening chunk");
    let sender = backend.held.lock().expect("not poisoned").pop().expect("the request was submitted");
    assert!(!sender.is_closed());
    drop(body);
    assert!(sender.is_closed(), "a client gone must cancel the request");
}

#[actix_web::test]
async fn test_dropped_stream_cancels_every_choice() {
    let backend = Scripted::new(Script::Hold);
    let service = test::init_service(app(state(backend.clone(), None), BODY_LIMIT)).await;
    let mut body = chat_body(true);
    body["n"] = serde_json::json!(3);
    let response =
        test::call_service(&service, test::TestRequest::post().uri("/v1/chat/completions").set_json(body).to_request())
            .await;
    let mut body = Box::pin(response.into_body());
    let first = std::future::poll_fn(|cx| body.as_mut().poll_next(cx)).await;
    assert!(first.is_some_and(|chunk| chunk.is_ok()), "the opening chunks");
    let senders = std::mem::take(&mut *backend.held.lock().expect("not poisoned"));
    assert_eq!(senders.len(), 3, "one lane per choice");
    assert!(senders.iter().all(|s| !s.is_closed()));
    drop(body);
    assert!(senders.iter().all(|s| s.is_closed()), "a client gone must cancel every choice");
}

#[actix_web::test]
async fn test_choices_merge_into_one_reply() {
    let mut body = serde_json::json!({"prompt": ["hello", "world"], "n": 2, "echo": true});
    let req = test::TestRequest::post().uri("/v1/completions").set_json(&body);
    let (status, _, reply) = call(Scripted::new(Script::Reply), None, req).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let reply = json(&reply);
    let texts: Vec<&str> =
        reply["choices"].as_array().expect("choices").iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["hellohello world", "hellohello world", "worldhello world", "worldhello world"]);
    let indexes: Vec<u64> = reply["choices"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, [0, 1, 2, 3]);
    let num_prompt = tokenizer().encode("hello", true).expect("encodes").len();
    assert_eq!(reply["usage"]["prompt_tokens"], 2 * num_prompt, "each prompt counted once");
    assert_eq!(reply["usage"]["completion_tokens"], 8);

    body["stream"] = serde_json::json!(true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let req = test::TestRequest::post().uri("/v1/completions").set_json(&body);
    let (_, _, events) = call(Scripted::new(Script::Reply), None, req).await;
    let chunks: Vec<serde_json::Value> = events
        .split_terminator("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").and_then(|d| serde_json::from_str(d).ok()))
        .collect();
    let mut texts = [String::new(), String::new(), String::new(), String::new()];
    let mut finishes = [0; 4];
    for chunk in chunks.iter().filter(|c| c["choices"][0].is_object()) {
        let index = chunk["choices"][0]["index"].as_u64().expect("an index") as usize;
        texts[index] += chunk["choices"][0]["text"].as_str().unwrap_or_default();
        finishes[index] += usize::from(chunk["choices"][0]["finish_reason"].is_string());
    }
    assert_eq!(texts, ["hellohello world", "hellohello world", "worldhello world", "worldhello world"]);
    assert_eq!(finishes, [1; 4]);
    let usages: Vec<&serde_json::Value> = chunks.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usages.len(), 1, "{events}");
    assert_eq!(usages[0]["usage"]["completion_tokens"], 8);
    assert!(events.ends_with("data: [DONE]\n\n"));
}

#[actix_web::test]
async fn test_routes_answer_503_until_the_slot_is_filled_then_serve() {
    let slot = super::Slot::<Scripted>::default();
    let service = test::init_service(super::app_over(slot.clone(), None, BODY_LIMIT)).await;
    let response = test::call_service(&service, test::TestRequest::get().uri("/health").to_request()).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        json(std::str::from_utf8(&test::read_body(response).await).unwrap()),
        serde_json::json!({"status": "loading"})
    );
    let req = test::TestRequest::post().uri("/v1/chat/completions").set_json(chat_body(false));
    let response = test::call_service(&service, req.to_request()).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
    let body = json(std::str::from_utf8(&test::read_body(response).await).unwrap());
    assert_eq!(body["error"]["code"], "service_unavailable");

    // The same service, without a restart, serves once the state is handed over.
    assert!(slot.set(actix_web::web::Data::new(state(Scripted::new(Script::Reply), None))).is_ok());
    let response = test::call_service(&service, test::TestRequest::get().uri("/health").to_request()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let req = test::TestRequest::post().uri("/v1/chat/completions").set_json(chat_body(false));
    assert_eq!(test::call_service(&service, req.to_request()).await.status(), StatusCode::OK);
}

#[actix_web::test]
async fn test_every_route_in_the_document_answers_its_method_and_405s_another() {
    for (path, method) in super::routes::ROUTES {
        let uri = path.replace("{id}", "tiny").replace("{response_id}", "resp_1");
        let allowed: Vec<&str> = super::routes::ROUTES.iter().filter(|(p, _)| p == path).map(|(_, m)| *m).collect();
        let other = if allowed.contains(&"POST") { "PUT" } else { "POST" };
        let request = |m: &str| {
            test::TestRequest::default().method(m.parse().expect("a method")).uri(&uri).set_json(chat_body(false))
        };
        let (status, _, body) = call(Scripted::new(Script::Reply), None, request(method)).await;
        let unknown = status == StatusCode::NOT_FOUND && body.contains("unknown_url");
        let served = !unknown && status != StatusCode::METHOD_NOT_ALLOWED;
        assert!(served, "{method} {uri}: {status} {body}");
        let (status, headers, _) = call(Scripted::new(Script::Reply), None, request(other)).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{other} {uri}");
        assert_eq!(
            headers.get(header::ALLOW).and_then(|v| v.to_str().ok()),
            Some(allowed.join(", ").as_str()),
            "{uri}"
        );
    }
}
