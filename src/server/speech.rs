//! `POST /v1/audio/speech`: OpenAI's speech body in, PCM or WAV over chunked HTTP (or base64 in SSE) out.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tensorfold_actors::request_types::{Event, Usage, ValidRequest, Work};
use tensorfold_audio::pcm::{streaming_wav_header, to_i16_le};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::openai::Fields;
use super::routes::{read_body, BodyLimit};
use super::{random_u64, AppState, Backend};
use tensorfold_engine::boundary::TokenWork;
use tensorfold_engine::speech::speakers::{Speaker, MAX_INPUT_CHARS};

/// The response header that carries the sample rate of the PCM.
pub const SAMPLE_RATE_HEADER: &str = "x-sample-rate";
pub const MIN_SPEED: f64 = 0.25;
pub const MAX_SPEED: f64 = 4.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AudioFormat {
    /// Raw 16-bit little-endian mono samples.
    Pcm,
    /// A WAV header for a stream of unknown length, then the same samples.
    Wav,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFormat {
    Audio,
    Sse,
}

/// A speech request once every field is checked.
#[derive(Debug, PartialEq)]
pub struct SpeechRequest {
    pub input: String,
    pub voice: Option<String>,
    pub format: AudioFormat,
    pub stream_format: StreamFormat,
    pub speed: f64,
    pub seed: Option<u64>,
    /// `false` skips the prefix cache for a Drama voice's prompt.
    pub cache: bool,
    /// Most tokens a Drama voice's language model generates (7 a frame of audio).
    pub max_tokens: Option<usize>,
}

impl SpeechRequest {
    pub fn from_json(body: &[u8]) -> Result<SpeechRequest, ApiError> {
        let mut fields = Fields::parse(body)?;
        let _model: String = fields.take("model")?.ok_or_else(|| ApiError::invalid("model", "'model' is required"))?;
        let input: String = fields.take("input")?.ok_or_else(|| ApiError::invalid("input", "'input' is required"))?;
        let chars = input.chars().count();
        if input.trim().is_empty() {
            return Err(ApiError::invalid("input", "'input' is empty or only whitespace"));
        }
        if chars > MAX_INPUT_CHARS {
            let message = format!("'input' must hold 1 to {MAX_INPUT_CHARS} characters of text, not {chars}");
            return Err(ApiError::invalid("input", message));
        }
        let format = match fields.take::<String>("response_format")?.as_deref() {
            None | Some("pcm") => AudioFormat::Pcm,
            Some("wav") => AudioFormat::Wav,
            Some(other) => {
                let message = format!("'response_format' {other:?} is not supported; use \"pcm\" or \"wav\"");
                return Err(ApiError::invalid("response_format", message));
            }
        };
        let stream_format = match fields.take::<String>("stream_format")?.as_deref() {
            None | Some("audio") => StreamFormat::Audio,
            Some("sse") => StreamFormat::Sse,
            Some(other) => {
                let message = format!("'stream_format' {other:?} is not supported; use \"audio\" or \"sse\"");
                return Err(ApiError::invalid("stream_format", message));
            }
        };
        let speed = fields.take::<f64>("speed")?.unwrap_or(1.0);
        if !(MIN_SPEED..=MAX_SPEED).contains(&speed) {
            let message = format!("'speed' must be between {MIN_SPEED} and {MAX_SPEED}, not {speed}");
            return Err(ApiError::invalid("speed", message));
        }
        if fields.take::<String>("instructions")?.is_some_and(|i| !i.trim().is_empty()) {
            return Err(ApiError::invalid("instructions", "'instructions' is not supported by this model"));
        }
        let max_tokens: Option<usize> = fields.take("max_tokens")?;
        if max_tokens == Some(0) {
            return Err(ApiError::invalid("max_tokens", "'max_tokens' must be at least 1"));
        }
        Ok(SpeechRequest {
            max_tokens,
            input,
            voice: fields.take("voice")?,
            format,
            stream_format,
            speed,
            seed: fields.take("seed")?,
            cache: fields.take("cache")?.unwrap_or(true),
        })
    }
}

pub(super) async fn speech<B: Backend>(
    state: web::Data<AppState<B>>,
    limit: web::Data<BodyLimit>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, limit.0).await?;
    if state.speakers.is_empty() {
        let message =
            "no speech model is loaded: the server was started with --no-voice and without --speech-model DIR";
        return Err(ApiError::invalid("model", message));
    }
    let request = SpeechRequest::from_json(&body)?;
    let speakers = state.speakers.clone();
    let (speaker, voice) =
        speakers.pick(request.voice.as_deref()).map_err(|e| ApiError::invalid("voice", e.to_string()))?;
    let seed = request.seed.unwrap_or_else(random_u64);
    let rate = speaker.sample_rate();
    let work = match speaker {
        Speaker::Drama(front) => {
            if request.speed != 1.0 {
                let (speed, name) = (request.speed, voice.name());
                let message = format!("'speed' {speed} is not supported: voice {name} speaks at speed 1.0 only");
                return Err(ApiError::invalid("speed", message));
            }
            let (front, input) = (front.clone(), request.input.clone());
            let work = web::block(move || front.request(&voice, &input, seed))
                .await
                .map_err(|e| ApiError::Internal(format!("preparing the request: {e}")))?
                .map_err(|e| ApiError::invalid("input", e.to_string()))?;
            let max_tokens = request.max_tokens.map_or(work.max_tokens, |n| n.min(work.max_tokens));
            Work::Tokens(TokenWork { cache: request.cache, max_tokens, ..work })
        }
        Speaker::Voice(_) if request.max_tokens.is_some() => {
            let message = format!("'max_tokens' applies to Drama voices only, not to voice {}", voice.name());
            return Err(ApiError::invalid("max_tokens", message));
        }
        Speaker::Voice(v) => {
            let (text, input, speed) = (v.text.clone(), request.input.clone(), request.speed as f32);
            let lane = web::block(move || text.input(&input, speed, seed))
                .await
                .map_err(|e| ApiError::Internal(format!("preparing the request: {e}")))?
                .map_err(|e| ApiError::invalid("input", e))?;
            Work::Voice(lane)
        }
    };
    let events = state.runtime.submit(ValidRequest { model: speaker.model().to_string(), work }).await?;
    let mut response = HttpResponse::Ok();
    response.insert_header((SAMPLE_RATE_HEADER, rate.to_string())).insert_header((header::CACHE_CONTROL, "no-cache"));
    response.insert_header(("X-Accel-Buffering", "no"));
    Ok(match request.stream_format {
        StreamFormat::Audio => {
            let content_type = match request.format {
                AudioFormat::Pcm => "audio/pcm",
                AudioFormat::Wav => "audio/wav",
            };
            response.content_type(content_type).streaming(audio_stream(events, request.format, rate))
        }
        StreamFormat::Sse => {
            response.content_type("text/event-stream").streaming(sse_stream(events, request.format, rate))
        }
    })
}

/// Why an audio stream ends without its last bytes: the connection is cut, so the client sees it is incomplete.
fn broken(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

/// The body of a chunked audio reply: the WAV header first if asked for, then each window's samples.
pub fn audio_stream(
    events: mpsc::Receiver<Event>,
    format: AudioFormat,
    rate: u32,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + 'static {
    let header = (format == AudioFormat::Wav).then(|| Bytes::copy_from_slice(&streaming_wav_header(rate)));
    stream::unfold(Some((events, header)), |state| async move {
        let (mut events, header) = state?;
        if let Some(header) = header {
            return Some((Ok(header), Some((events, None))));
        }
        loop {
            match events.recv().await {
                Some(Event::Audio { pcm }) => return Some((Ok(Bytes::from(to_i16_le(&pcm))), Some((events, None)))),
                Some(Event::Token { .. }) => continue,
                Some(Event::Done { .. }) => return None,
                Some(Event::Error(e)) => return Some((Err(broken(e.to_string())), None)),
                None => return Some((Err(broken("the speech request ended early".into())), None)),
            }
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
    Error { error: super::error::ErrorDetail },
}

fn sse_frame(event: &SpeechEvent) -> Bytes {
    Bytes::from(format!("data: {}\n\n", serde_json::to_string(event).unwrap_or_default()))
}

/// The SSE reply: base64 deltas of the audio bytes (a WAV header first for `wav`), then a done event with usage.
pub fn sse_stream(
    events: mpsc::Receiver<Event>,
    format: AudioFormat,
    rate: u32,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + 'static {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let header = (format == AudioFormat::Wav).then(|| b64(&streaming_wav_header(rate)));
    stream::unfold(Some((events, header)), move |state| async move {
        let (mut events, header) = state?;
        if let Some(audio) = header {
            return Some((Ok(sse_frame(&SpeechEvent::Delta { audio })), Some((events, None))));
        }
        loop {
            let event = match events.recv().await {
                Some(Event::Audio { pcm }) => SpeechEvent::Delta { audio: b64(&to_i16_le(&pcm)) },
                Some(Event::Token { .. }) => continue,
                Some(Event::Done { usage: Usage { prompt_tokens, completion_tokens, .. }, .. }) => {
                    let total_tokens = prompt_tokens + completion_tokens;
                    let usage =
                        SpeechUsage { input_tokens: prompt_tokens, output_tokens: completion_tokens, total_tokens };
                    return Some((Ok(sse_frame(&SpeechEvent::Done { usage })), None));
                }
                Some(Event::Error(e)) => {
                    let error = ApiError::Engine(e).body().error;
                    return Some((Ok(sse_frame(&SpeechEvent::Error { error })), None));
                }
                None => {
                    let error = ApiError::Internal("the speech request ended early".into()).body().error;
                    return Some((Ok(sse_frame(&SpeechEvent::Error { error })), None));
                }
            };
            return Some((Ok(sse_frame(&event)), Some((events, None))));
        }
    })
}
