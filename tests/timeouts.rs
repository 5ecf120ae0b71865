//! Slow and hostile clients meet the server's limits: a request past --request-timeout ends with a request_timeout
//! error and frees its lane; a head or body sent too slowly gets 408; an idle kept-alive connection is closed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::server::Server;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn long_chat(server: &Server, stream: bool) -> Value {
    json!({
        "model": server.model,
        "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
        "max_tokens": 3000,
        "temperature": 0,
        "stream": stream,
    })
}

/// Everything the server sends on `stream` until it closes the connection or `within` passes.
fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    stream.set_read_timeout(Some(Duration::from_millis(100))).expect("a read timeout");
    let (deadline, mut got, mut buf) = (Instant::now() + within, Vec::new(), [0u8; 4096]);
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), true),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), false)
}

#[test]
fn test_a_request_past_its_deadline_ends_with_request_timeout_and_frees_its_lane() {
    let server = Server::start(&["--request-timeout", "1", "--no-voice"]);
    let started = Instant::now();
    let events = server.stream(CHAT, &long_chat(&server, true)).collect_data().expect("reading the stream");
    assert!(started.elapsed() < Duration::from_secs(20), "the stream ran {:?}", started.elapsed());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let error: Value = serde_json::from_str(&events[events.len() - 2]).expect("a JSON event before [DONE]");
    assert_eq!(error["error"]["code"], "request_timeout", "{error}");
    let whole = server.post_json(CHAT, &long_chat(&server, false));
    assert_eq!(whole.status, 504, "{}", whole.text());
    assert_eq!(whole.json()["error"]["code"], "request_timeout");
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.metrics().get("tensorfold_requests_running").copied().unwrap_or(1.0) != 0.0 {
        assert!(Instant::now() < deadline, "a timed-out request kept its lane");
        std::thread::sleep(Duration::from_millis(20));
    }
    let short = json!({"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    assert_eq!(server.post_json(CHAT, &short).status, 200);
}

#[test]
fn test_a_head_or_body_sent_too_slowly_gets_408_and_an_idle_connection_is_closed() {
    let server = Server::start(&["--header-timeout", "1", "--body-timeout", "1", "--keep-alive", "1", "--no-voice"]);
    let mut head = TcpStream::connect(&server.addr).expect("connects");
    head.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").expect("writes half a head");
    let (reply, closed) = read_until_closed(&mut head, Duration::from_secs(10));
    assert!(closed && (reply.is_empty() || reply.starts_with("HTTP/1.1 408")), "a slow head: {reply:?}");

    let mut body = TcpStream::connect(&server.addr).expect("connects");
    let start = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
    body.write_all(format!("{start}Content-Length: 100\r\n\r\n{{\"model\":").as_bytes()).expect("writes a head");
    let (reply, _) = read_until_closed(&mut body, Duration::from_secs(10));
    assert!(reply.starts_with("HTTP/1.1 408"), "a slow body: {reply:?}");
    assert!(reply.contains(r#""code":"request_timeout""#), "{reply}");

    let mut idle = TcpStream::connect(&server.addr).expect("connects");
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").expect("writes a request");
    let (reply, closed) = read_until_closed(&mut idle, Duration::from_secs(10));
    assert!(reply.starts_with("HTTP/1.1 200") && closed, "an idle kept-alive connection: {reply:?} closed {closed}");
}

#[test]
fn test_a_connection_opened_ahead_and_left_unused_for_seconds_still_serves_its_first_request() {
    // Routers' pools (hyper's among them) open connections ahead and may leave one unused for a while.
    let server = Server::start(&["--no-voice"]);
    let mut early = TcpStream::connect(&server.addr).expect("connects");
    std::thread::sleep(Duration::from_secs(7));
    early.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").expect("writes a request");
    let (reply, _) = read_until_closed(&mut early, Duration::from_secs(2));
    assert!(reply.starts_with("HTTP/1.1 200"), "the first request on a connection idle 7 s: {reply:?}");
}
