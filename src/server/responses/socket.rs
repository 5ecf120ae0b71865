//! WebSocket mode: `GET /v1/responses` upgraded, then `response.create` messages answered in turn on one
//! connection with the streamed events, each turn able to continue the last one (stored or not) from the
//! prefix cache.

use actix_web::{web, HttpRequest, HttpResponse};
use actix_ws::{Message, MessageStream, Session};
use serde_json::{json, Value};

use super::stream::{next_text, EventWriter, Framing};
use super::{caller, prepare, Kept};
use crate::server::body::BodyLimit;
use crate::server::error::ApiError;
use crate::server::{turn, AppState, Backend};

pub(in crate::server) async fn connect<B: Backend>(
    state: web::Data<AppState<B>>,
    limit: web::Data<BodyLimit>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (response, session, messages) = actix_ws::handle(&req, body).map_err(|e| {
        ApiError::invalid_body(format!("GET /v1/responses opens the WebSocket mode; the upgrade failed: {e}"))
    })?;
    let messages = messages.max_frame_size(limit.0);
    actix_web::rt::spawn(serve(state, caller(&req), session, messages));
    Ok(response)
}

/// Answers each `response.create` in turn until the client closes or goes away.
async fn serve<B: Backend>(
    state: web::Data<AppState<B>>,
    owner: String,
    mut session: Session,
    mut messages: MessageStream,
) {
    let mut kept: Option<Kept> = None;
    while let Some(Ok(message)) = messages.recv().await {
        let text = match message {
            Message::Text(text) => text,
            Message::Ping(bytes) => {
                if session.pong(&bytes).await.is_err() {
                    return;
                }
                continue;
            }
            Message::Close(_) => break,
            _ => continue,
        };
        match turn_of(&state, &owner, text.as_bytes(), kept.as_ref(), &mut session).await {
            Ok(Some(next)) => kept = Some(next),
            Ok(None) => {}
            Err(Gone) => return,
        }
    }
    let _ = session.close(None).await;
}

/// The client went away while a turn was being sent.
struct Gone;

/// Runs one client event; the response to keep for the next turn, if one completed.
async fn turn_of<B: Backend>(
    state: &AppState<B>,
    owner: &str,
    event: &[u8],
    kept: Option<&Kept>,
    session: &mut Session,
) -> Result<Option<Kept>, Gone> {
    let body = match create_body(event) {
        Ok(body) => body,
        Err(error) => return send(session, &error_event(&error)).await.map(|()| None),
    };
    let started = async {
        let prepared = prepare(state, owner, &body, kept).await?;
        let turn = turn::start(state, prepared.chat, true).await?;
        Ok::<_, ApiError>((turn, prepared.frame, prepared.saver, prepared.history))
    };
    let (mut turn, frame, saver, mut history) = match started.await {
        Ok(started) => started,
        Err(error) => return send(session, &error_event(&error)).await.map(|()| None),
    };
    let id = frame.id.clone();
    let mut writer = EventWriter::new(frame, Framing::Lines);
    send(session, &writer.opening()).await?;
    loop {
        let (text, last) = next_text(&mut turn, &mut writer).await;
        // Sending fails once the client is gone; the turn is dropped with the error, which cancels its lane.
        send(session, &text).await?;
        if let Some(object) = last {
            history.extend(object["output"].as_array().cloned().unwrap_or_default());
            saver.save(object).await;
            return Ok(Some(Kept { id, history }));
        }
    }
}

/// The `response.create` event's fields as a `POST /v1/responses` body, streamed as the socket always is.
fn create_body(event: &[u8]) -> Result<Vec<u8>, ApiError> {
    let mut event: Value = serde_json::from_slice(event)
        .map_err(|e| ApiError::invalid_body(format!("a WebSocket message must be a JSON event: {e}")))?;
    match event.get("type").and_then(Value::as_str) {
        Some("response.create") => {}
        other => {
            let message = format!("event type '{}' is not supported; send response.create", other.unwrap_or("missing"));
            return Err(ApiError::invalid("type", message));
        }
    }
    let Some(fields) = event.as_object_mut() else { return Err(ApiError::invalid_body("an event must be an object")) };
    fields.remove("type");
    // Some clients nest the request under `response`, as the Realtime API does.
    if let Some(Value::Object(inner)) = fields.remove("response") {
        fields.extend(inner);
    }
    if fields.get("background") == Some(&Value::Bool(true)) {
        return Err(ApiError::invalid("background", "'background' is not supported over the WebSocket"));
    }
    fields.insert("stream".into(), Value::Bool(true));
    Ok(Value::Object(std::mem::take(fields)).to_string().into_bytes())
}

/// An `error` event carrying the OpenAI error body and its status.
fn error_event(error: &ApiError) -> String {
    use actix_web::ResponseError;
    let body = error.body();
    format!("{}\n", json!({"type": "error", "status": error.status_code().as_u16(), "error": body.error}))
}

/// Sends each line of `text` as one message.
async fn send(session: &mut Session, text: &str) -> Result<(), Gone> {
    for line in text.lines().filter(|l| !l.is_empty()) {
        session.text(line.to_string()).await.map_err(|_| Gone)?;
    }
    Ok(())
}
