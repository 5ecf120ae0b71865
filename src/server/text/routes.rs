//! The chat and completions handlers: read the body, parse, validate, submit, then stream or collect the reply.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use tensorfold_actors::request_types::{ValidRequest, Work};

use super::openai::{ChatCompletionRequest, CompletionRequest};
use super::reply::{collect, Collector, Kind, ReplyMeta};
use super::sse::{event_stream, ChunkWriter};
use super::validate::{validate_chat, validate_completion, Validated};
use crate::server::body::{read_body, BodyLimit};
use crate::server::error::ApiError;
use crate::server::turn::text_model;
use crate::server::{unix_now, AppState, Backend};

/// Runs validation off the worker thread: rendering and tokenizing a long prompt is CPU work.
async fn validate_off_thread(
    validate: impl FnOnce() -> Result<Validated, ApiError> + Send + 'static,
) -> Result<Validated, ApiError> {
    web::block(validate).await.map_err(|e| ApiError::Internal(format!("validating the request: {e}")))?
}

/// A chat request checked against the server's text model and validated off the worker thread.
pub(in crate::server) async fn validated_chat<B: Backend>(
    state: &AppState<B>,
    request: ChatCompletionRequest,
) -> Result<Validated, ApiError> {
    state.text_model_for(request.common.model.as_deref())?;
    let model = text_model(state);
    validate_off_thread(move || validate_chat(request, &model)).await
}

pub(in crate::server) async fn chat_completions<B: Backend>(
    state: web::Data<AppState<B>>,
    limit: web::Data<BodyLimit>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, limit.0).await?;
    let request = ChatCompletionRequest::from_json(&body)?;
    let valid = validated_chat(&state, request).await?;
    generate(&state, Kind::Chat, valid).await
}

pub(in crate::server) async fn completions<B: Backend>(
    state: web::Data<AppState<B>>,
    limit: web::Data<BodyLimit>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, limit.0).await?;
    let request = CompletionRequest::from_json(&body)?;
    state.text_model_for(request.common.model.as_deref())?;
    let model = text_model(&state);
    let valid = validate_off_thread(move || validate_completion(request, &model)).await?;
    generate(&state, Kind::Completion, valid).await
}

/// Submits every choice's lane, then streams or collects them as one reply.
async fn generate<B: Backend>(state: &AppState<B>, kind: Kind, valid: Validated) -> Result<HttpResponse, ApiError> {
    let Validated { lanes, prefixes, reply } = valid;
    let mut receivers = Vec::with_capacity(lanes.len());
    for work in lanes {
        // A refusal drops the lanes already submitted, which cancels them.
        let request = ValidRequest { model: state.model_name.clone(), work: Work::Tokens(work) };
        receivers.push(state.runtime.submit(request).await?);
    }
    let meta = ReplyMeta::new(kind, &state.model_name, unix_now());
    if reply.stream {
        let writer = ChunkWriter::new(meta, reply, state.tokenizer.clone(), prefixes);
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            // Proxies such as nginx would otherwise hold chunks back.
            .insert_header(("X-Accel-Buffering", "no"))
            .streaming(event_stream(receivers, writer)));
    }
    let lanes = receivers
        .into_iter()
        .zip(prefixes)
        .map(|(events, prefix)| (events, Collector::new(kind, reply, state.tokenizer.clone(), prefix)))
        .collect();
    let body = collect(lanes, &meta, reply.n).await?;
    Ok(HttpResponse::Ok().json(body))
}
