//! Reading a request body: refused with a 413 past the limit, with a 408 past the time it may take.

use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpRequest};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

use super::error::ApiError;

/// Request bodies larger than this get a 413.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimit(pub usize);

/// Most time a request body may take to arrive before it gets a 408; without one registered, `BODY_TIMEOUT`.
#[derive(Clone, Copy, Debug)]
pub struct BodyTimeout(pub Duration);

pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// The body, refused with a 413 as soon as it is known to pass the limit.
pub async fn read_body(req: &HttpRequest, mut payload: web::Payload, limit: usize) -> Result<Bytes, ApiError> {
    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let after = req.app_data::<web::Data<BodyTimeout>>().map_or(BODY_TIMEOUT, |t| t.0);
    let read = async {
        let mut body = BytesMut::with_capacity(declared.unwrap_or(0));
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid_body(format!("reading the request body: {e}")))?;
            if body.len() + chunk.len() > limit {
                return Err(ApiError::BodyTooLarge { limit });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    };
    actix_web::rt::time::timeout(after, read).await.map_err(|_| ApiError::BodyTimeout { after })?
}
