//! `POST /v1/audio/speech`: OpenAI's speech body in, audio in the asked format over chunked HTTP (or base64 in SSE)
//! out; `GET /v1/audio/voices`: each speech model's voices and the OpenAI names that stand for them.

mod stream;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use tensorfold_actors::request_types::{ValidRequest, Work};
pub use tensorfold_audio::encode::AudioFormat;
use tensorfold_audio::encode::Encoder;

use super::body::{read_body, BodyLimit};
use super::error::ApiError;
use super::text::openai::Fields;
use super::{random_u64, AppState, Backend};
pub use stream::{audio_stream, sse_stream};
use tensorfold_engine::boundary::TokenWork;
use tensorfold_engine::speech::speakers::{Speaker, MAX_INPUT_CHARS};

/// The response header that carries the sample rate of the audio.
pub const SAMPLE_RATE_HEADER: &str = "x-sample-rate";
/// The response header present, `true`, when the request's `instructions` were not used.
pub const INSTRUCTIONS_IGNORED_HEADER: &str = "x-instructions-ignored";
pub const MIN_SPEED: f64 = 0.25;
pub const MAX_SPEED: f64 = 4.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFormat {
    Audio,
    Sse,
}

/// A speech request once every field is checked.
#[derive(Debug, PartialEq)]
pub struct SpeechRequest {
    pub model: String,
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
    /// Whether the request gave instructions, which no model served here can follow.
    pub instructions: bool,
}

impl SpeechRequest {
    pub fn from_json(body: &[u8]) -> Result<SpeechRequest, ApiError> {
        let mut fields = Fields::parse(body)?;
        let model: String = fields.required_as("model")?;
        let input: String = fields.required_as("input")?;
        let chars = input.chars().count();
        if input.trim().is_empty() {
            return Err(ApiError::invalid("input", "'input' is empty or only whitespace"));
        }
        if chars > MAX_INPUT_CHARS {
            let message = format!("'input' must hold 1 to {MAX_INPUT_CHARS} characters of text, not {chars}");
            return Err(ApiError::invalid("input", message));
        }
        let format = match fields.take::<String>("response_format")?.as_deref() {
            None => AudioFormat::Mp3,
            Some(name) => AudioFormat::parse(name).ok_or_else(|| {
                let accepted: Vec<String> = AudioFormat::ALL.iter().map(|f| format!("{:?}", f.name())).collect();
                let message =
                    format!("'response_format' {name:?} is not supported; use one of {}", accepted.join(", "));
                ApiError::invalid("response_format", message)
            })?,
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
        let instructions = fields.take::<String>("instructions")?.is_some_and(|i| !i.trim().is_empty());
        let max_tokens: Option<usize> = fields.take("max_tokens")?;
        if max_tokens == Some(0) {
            return Err(ApiError::invalid("max_tokens", "'max_tokens' must be at least 1"));
        }
        Ok(SpeechRequest {
            model,
            instructions,
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
    let (speaker, voice) = speakers
        .pick(request.voice.as_deref(), &request.model)
        .map_err(|e| ApiError::invalid("voice", e.to_string()))?;
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
    let encoder = Encoder::new(request.format, rate).map_err(|e| ApiError::Internal(e.to_string()))?;
    let events = state.runtime.submit(ValidRequest { model: speaker.model().to_string(), work }).await?;
    let mut response = HttpResponse::Ok();
    response.insert_header((SAMPLE_RATE_HEADER, rate.to_string())).insert_header((header::CACHE_CONTROL, "no-cache"));
    response.insert_header(("X-Accel-Buffering", "no"));
    if request.instructions {
        response.insert_header((INSTRUCTIONS_IGNORED_HEADER, "true"));
    }
    Ok(match request.stream_format {
        StreamFormat::Audio => {
            response.content_type(request.format.content_type()).streaming(audio_stream(events, encoder))
        }
        StreamFormat::Sse => response.content_type("text/event-stream").streaming(sse_stream(events, encoder)),
    })
}

#[derive(Serialize)]
struct VoiceCard {
    voice: String,
    /// OpenAI's voice names that give this voice when the request's `model` names this speaker (or it is the first).
    aliases: Vec<&'static str>,
}

#[derive(Serialize)]
struct SpeakerCard {
    model: String,
    /// Whether a request whose `model` names no speaker (`tts-1`) resolves its default voice and aliases here.
    default: bool,
    default_voice: String,
    voices: Vec<VoiceCard>,
}

#[derive(Serialize)]
struct VoiceList {
    object: &'static str,
    data: Vec<SpeakerCard>,
}

pub(super) async fn list_voices<B: Backend>(state: web::Data<AppState<B>>) -> HttpResponse {
    let card = |(i, speaker): (usize, &Speaker)| {
        let voices = speaker.voices();
        let names = voices.names().iter();
        SpeakerCard {
            model: speaker.name().to_string(),
            default: i == 0,
            default_voice: voices.default_voice().name().to_string(),
            voices: names.map(|v| VoiceCard { voice: v.clone(), aliases: voices.aliases_of(v) }).collect(),
        }
    };
    HttpResponse::Ok().json(VoiceList { object: "list", data: state.speakers.iter().enumerate().map(card).collect() })
}
