//! Speech replies as the tests read them.

use base64::Engine;
use serde_json::{json, Value};

use super::server::Server;

/// What an SSE speech reply carried: its deltas' audio joined, how many deltas, and the done event's usage.
pub struct SseSpeech {
    pub audio: Vec<u8>,
    pub num_deltas: usize,
    pub usage: Value,
}

/// `body` asked for as SSE at `/v1/audio/speech`: checks the content type, each delta and the done event at the end.
pub fn sse_speech(server: &Server, body: &Value) -> SseSpeech {
    let mut body = body.clone();
    body["stream_format"] = json!("sse");
    let mut stream = server.stream("/v1/audio/speech", &body);
    if stream.status != 200 {
        let status = stream.status;
        panic!("{body}: status {status}: {}", stream.rest());
    }
    let content_type = stream.header("content-type").unwrap_or_default().to_string();
    assert!(content_type.starts_with("text/event-stream"), "content-type {content_type:?}");
    let events = stream.collect_data().expect("reading the SSE stream");
    let (last, deltas) = events.split_last().unwrap_or_else(|| panic!("no events for {body}"));
    let mut audio = Vec::new();
    for data in deltas {
        let event: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("event {data:?}: {e}"));
        assert_eq!(event["type"], "speech.audio.delta", "{event}");
        let chunk = event["audio"].as_str().unwrap_or_else(|| panic!("no audio in {event}"));
        audio.extend(base64::engine::general_purpose::STANDARD.decode(chunk).expect("base64 audio"));
    }
    let done: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("last event {last:?}: {e}"));
    assert_eq!(done["type"], "speech.audio.done", "the stream ends with {done}");
    SseSpeech { audio, num_deltas: deltas.len(), usage: done["usage"].clone() }
}
