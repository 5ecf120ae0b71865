//! Shutdown: on SIGTERM or SIGINT the server stops accepting, lets a request that finishes within the drain finish,
//! ends a longer one with a final error event, and exits 0; after SIGKILL a server on the same port comes back healthy.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::{try_request, Server};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const DRAIN_SECONDS: &str = "3";

fn chat(server: &Server, max_tokens: usize) -> Value {
    json!({
        "model": server.model,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
    })
}

/// Whether a new connection to `addr` is refused (or reset) within `within`.
fn refuses_connections(addr: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if TcpStream::connect(addr).is_err() || try_request(addr, "GET", "/health", &[], None).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn drains_on(signal: &str) {
    let mut server = Server::start(&["--drain-seconds", DRAIN_SECONDS, "--no-voice"]);
    let mut short = server.stream(CHAT, &chat(&server, 4));
    let mut long = server.stream(CHAT, &chat(&server, 3000));
    let first = long.next_data().expect("reading the long stream").expect("a first event");
    assert!(first.contains("chat.completion.chunk"), "{first}");
    server.signal(signal);
    let signalled = Instant::now();
    assert!(
        refuses_connections(&server.addr, Duration::from_secs(2)),
        "{signal}: still accepting\n{}",
        server.stderr()
    );
    let short = short.collect_data().expect("reading the short stream");
    assert_eq!(short.last().map(String::as_str), Some("[DONE]"), "{short:?}");
    let finish = &short[short.len() - 2];
    assert!(finish.contains(r#""finish_reason":"length""#), "the short request did not finish: {short:?}");
    let long = long.collect_data().expect("reading the long stream");
    assert_eq!(long.last().map(String::as_str), Some("[DONE]"), "{long:?}");
    let error: Value = serde_json::from_str(&long[long.len() - 2]).expect("a JSON event before [DONE]");
    assert_eq!(error["error"]["code"], "server_shutting_down", "{error}");
    let ended = signalled.elapsed();
    assert!(ended >= Duration::from_secs(2), "the long request ended {ended:?} after {signal}, before the drain");
    let status = server.wait_exit(Duration::from_secs(15)).expect("the server exits after the drain");
    assert!(status.success(), "{signal}: exited with {status}\n{}", server.stderr());
}

#[test]
fn test_sigterm_drains_running_requests_and_exits_zero() {
    drains_on("TERM");
}

#[test]
fn test_sigint_drains_running_requests_and_exits_zero() {
    drains_on("INT");
}

#[test]
fn test_sigint_while_loading_exits_zero_at_once() {
    let model = tensorfold::settings::process_fetcher().and_then(|f| f.default_model_path()).expect("the model");
    let mut server = Server::spawn(&model, &[], &[]);
    server.signal("INT");
    let status = server.wait_exit(Duration::from_secs(10)).expect("exits within seconds of SIGINT");
    assert!(status.success(), "exited with {status}\n{}", server.stderr());
}

#[test]
fn test_a_server_killed_with_sigkill_comes_back_healthy_on_its_port() {
    let mut server = Server::start(&["--no-voice"]);
    let port = server.addr.rsplit(':').next().expect("host:port").to_string();
    let _ = server.stream(CHAT, &chat(&server, 3000)).next_data();
    server.signal("KILL");
    assert!(server.wait_exit(Duration::from_secs(10)).is_some(), "SIGKILL did not end the server");
    let again = Server::start(&["--no-voice", "--port", &port]);
    assert_eq!(again.addr, server.addr);
    let reply = again.get("/health");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = json!({"model": again.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    assert_eq!(again.complete(CHAT, &body).finish_reason, "length");
}
