//! The body of a speech reply: each window's samples through the format's encoder, as chunked bytes or base64 in SSE.

use base64::Engine as _;
use bytes::Bytes;
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tensorfold_actors::request_types::{Event, Usage};
use tensorfold_audio::encode::Encoder;
use tokio::sync::mpsc;

use crate::server::error::{ApiError, ErrorDetail};

/// What a speech request's events turn into next.
enum Step {
    /// Encoded bytes to send (never empty).
    Audio(Vec<u8>),
    /// The last bytes (may be empty) and the usage.
    Done(Vec<u8>, Usage),
    Failed(ApiError),
}

/// Waits for the next event that gives bytes, the end, or a failure.
async fn next_step(events: &mut mpsc::Receiver<Event>, encoder: &mut Encoder) -> Step {
    loop {
        match events.recv().await {
            Some(Event::Audio { pcm }) => match encoder.push(&pcm) {
                Ok(bytes) if bytes.is_empty() => continue,
                Ok(bytes) => return Step::Audio(bytes),
                Err(e) => return Step::Failed(ApiError::Internal(e.to_string())),
            },
            Some(Event::Token { .. } | Event::Embedding { .. }) => continue,
            Some(Event::Done { usage, .. }) => {
                return match encoder.finish() {
                    Ok(bytes) => Step::Done(bytes, usage),
                    Err(e) => Step::Failed(ApiError::Internal(e.to_string())),
                };
            }
            Some(Event::Error(e)) => return Step::Failed(ApiError::Engine(e)),
            None => return Step::Failed(ApiError::Internal("the speech request ended early".into())),
        }
    }
}

/// Why an audio stream ends without its last bytes: the connection is cut, so the client sees it is incomplete.
fn broken(error: ApiError) -> std::io::Error {
    std::io::Error::other(error.to_string())
}

/// The body of a chunked audio reply: the encoded bytes as each window yields them, the stream's header with the first.
pub fn audio_stream(
    events: mpsc::Receiver<Event>,
    encoder: Encoder,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + 'static {
    stream::unfold(Some((events, encoder)), |state| async move {
        let (mut events, mut encoder) = state?;
        match next_step(&mut events, &mut encoder).await {
            Step::Audio(bytes) => Some((Ok(Bytes::from(bytes)), Some((events, encoder)))),
            Step::Done(bytes, _) if bytes.is_empty() => None,
            Step::Done(bytes, _) => Some((Ok(Bytes::from(bytes)), None)),
            Step::Failed(e) => Some((Err(broken(e)), None)),
        }
    })
}

#[derive(Serialize)]
struct SpeechUsage {
    input_tokens: usize,
    output_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum SpeechEvent {
    #[serde(rename = "speech.audio.delta")]
    Delta { audio: String },
    #[serde(rename = "speech.audio.done")]
    Done { usage: SpeechUsage },
    #[serde(rename = "error")]
    Error { error: ErrorDetail },
}

fn sse_frame(event: &SpeechEvent) -> String {
    format!("data: {}\n\n", serde_json::to_string(event).unwrap_or_default())
}

fn delta(bytes: &[u8]) -> String {
    sse_frame(&SpeechEvent::Delta { audio: base64::engine::general_purpose::STANDARD.encode(bytes) })
}

/// The SSE reply: base64 deltas of the encoded bytes, then a done event with usage.
pub fn sse_stream(
    events: mpsc::Receiver<Event>,
    encoder: Encoder,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + 'static {
    stream::unfold(Some((events, encoder)), |state| async move {
        let (mut events, mut encoder) = state?;
        let (frames, next) = match next_step(&mut events, &mut encoder).await {
            Step::Audio(bytes) => (delta(&bytes), Some((events, encoder))),
            Step::Done(bytes, Usage { prompt_tokens, completion_tokens, .. }) => {
                let total_tokens = prompt_tokens + completion_tokens;
                let usage = SpeechUsage { input_tokens: prompt_tokens, output_tokens: completion_tokens, total_tokens };
                let last = if bytes.is_empty() { String::new() } else { delta(&bytes) };
                (last + &sse_frame(&SpeechEvent::Done { usage }), None)
            }
            Step::Failed(e) => (sse_frame(&SpeechEvent::Error { error: e.body().error }), None),
        };
        Some((Ok(Bytes::from(frames)), next))
    })
}
