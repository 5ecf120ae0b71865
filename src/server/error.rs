//! The HTTP layer's one error enum, and the one place it becomes a status and an OpenAI error body.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use tensorfold_actors::request_types::{EngineError, SubmitError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something we do not serve; `param` names the field.
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<String>, code: Option<&'static str> },
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request body did not arrive within {after:?}")]
    BodyTimeout { after: std::time::Duration },
    #[error("missing or incorrect API key; send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'")]
    Unauthorized,
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("the model '{0}' does not exist")]
    ModelNotFound(String),
    /// A stored object the caller cannot see: never made, deleted, expired or another key's.
    #[error("no {what} with id '{id}'")]
    ObjectNotFound { what: &'static str, id: String, param: &'static str },
    #[error("{method} is not allowed on {path}; allowed: {allowed}")]
    MethodNotAllowed { method: String, path: String, allowed: &'static str },
    #[error(transparent)]
    Submit(#[from] SubmitError),
    #[error("{0}")]
    Unavailable(String),
    #[error("the server is still loading its models; retry shortly")]
    Loading,
    /// The engine failed the request's lane after it was admitted.
    #[error(transparent)]
    Engine(EngineError),
    #[error("{0}")]
    Internal(String),
}

/// OpenAI's error envelope: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Serialize, PartialEq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming the offending field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest { message: message.into(), param: Some(param.into()), code: None }
    }

    /// A 400 about the request as a whole (malformed JSON, not an object).
    pub fn invalid_body(message: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest { message: message.into(), param: None, code: None }
    }

    /// A 400 with its field named as another API names it: each (from, to) replaced in the message and in the
    /// param read as `'param'`, so a quoted name maps whole.
    pub fn renamed(self, names: &[(&str, &str)]) -> ApiError {
        let ApiError::InvalidRequest { message, param, code } = self else { return self };
        let rename = |text: String| names.iter().fold(text, |text, (from, to)| text.replace(from, to));
        let param = param.map(|p| rename(format!("'{p}'")).trim_matches('\'').to_string());
        ApiError::InvalidRequest { message: rename(message), param, code }
    }

    /// The prompt or prompt plus max_tokens does not fit the model's context.
    pub fn context_exceeded(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
            code: Some("context_length_exceeded"),
        }
    }

    /// OpenAI's error `type` and `code` for this error.
    fn kind_and_code(&self) -> (&'static str, Option<&'static str>) {
        match self {
            ApiError::InvalidRequest { code, .. } => ("invalid_request_error", *code),
            ApiError::BodyTooLarge { .. } => ("invalid_request_error", Some("request_too_large")),
            ApiError::BodyTimeout { .. } => ("invalid_request_error", Some("request_timeout")),
            ApiError::Unauthorized => ("invalid_request_error", Some("invalid_api_key")),
            ApiError::NotFound { .. } => ("invalid_request_error", Some("unknown_url")),
            ApiError::ModelNotFound(_) => ("invalid_request_error", Some("model_not_found")),
            ApiError::ObjectNotFound { .. } => ("invalid_request_error", Some("not_found")),
            ApiError::MethodNotAllowed { .. } => ("invalid_request_error", Some("method_not_allowed")),
            ApiError::Submit(SubmitError::QueueFull(_)) => ("rate_limit_error", Some("rate_limit_exceeded")),
            ApiError::Submit(SubmitError::TooLarge { .. }) => {
                ("invalid_request_error", Some("context_length_exceeded"))
            }
            ApiError::Submit(SubmitError::WrongKind { .. } | SubmitError::Unsupported { .. }) => {
                ("invalid_request_error", Some("model_not_supported"))
            }
            ApiError::Submit(SubmitError::Closed | SubmitError::NoModel(_))
            | ApiError::Unavailable(_)
            | ApiError::Loading => ("server_error", Some("service_unavailable")),
            ApiError::Engine(e) => ("server_error", Some(e.code())),
            ApiError::Internal(_) => ("server_error", None),
        }
    }

    pub fn body(&self) -> ErrorBody {
        let (kind, code) = self.kind_and_code();
        let param = match self {
            ApiError::InvalidRequest { param, .. } => param.clone(),
            ApiError::ModelNotFound(_) => Some("model".to_string()),
            ApiError::ObjectNotFound { param, .. } => Some(param.to_string()),
            _ => None,
        };
        ErrorBody { error: ErrorDetail { message: self.to_string(), kind, param, code } }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound { .. } | ApiError::ModelNotFound(_) | ApiError::ObjectNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Submit(SubmitError::QueueFull(_)) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Submit(
                SubmitError::TooLarge { .. } | SubmitError::WrongKind { .. } | SubmitError::Unsupported { .. },
            ) => StatusCode::BAD_REQUEST,
            ApiError::Submit(SubmitError::Closed | SubmitError::NoModel(_))
            | ApiError::Unavailable(_)
            | ApiError::Loading => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Engine(EngineError::ShuttingDown | EngineError::OutOfMemory(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Engine(EngineError::TimedOut(_)) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Engine(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::Submit(SubmitError::QueueFull(_))
            | ApiError::Loading
            | ApiError::Engine(EngineError::ShuttingDown | EngineError::OutOfMemory(_)) => {
                response.insert_header((header::RETRY_AFTER, "1"));
            }
            ApiError::Unauthorized => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            ApiError::MethodNotAllowed { allowed, .. } => {
                response.insert_header((header::ALLOW, *allowed));
            }
            _ => {}
        }
        response.json(self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_and_json(error: ApiError) -> (StatusCode, serde_json::Value, actix_web::http::header::HeaderMap) {
        let response = error.error_response();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = actix_web::body::to_bytes_limited(response.into_body(), 1 << 16);
        let bytes = futures_util::FutureExt::now_or_never(bytes).expect("a JSON body is ready at once");
        let json = serde_json::from_slice(&bytes.expect("within limit").expect("body")).expect("valid JSON");
        (status, json, headers)
    }

    #[test]
    fn test_error_body_has_openai_shape() {
        let (status, json, _) = status_and_json(ApiError::invalid("temperature", "temperature must be in [0, 2]"));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            json,
            serde_json::json!({"error": {
                "message": "temperature must be in [0, 2]",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": null,
            }})
        );
    }

    #[test]
    fn test_queue_full_is_429_with_retry_after() {
        let (status, json, headers) = status_and_json(SubmitError::QueueFull(8).into());
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
        assert_eq!(json["error"]["type"], "rate_limit_error");
        assert_eq!(json["error"]["message"], "too many waiting requests (8); retry later");
    }

    #[test]
    fn test_submit_errors_map_to_statuses() {
        let too_large: ApiError = SubmitError::TooLarge { needed: 9, total: 4 }.into();
        assert_eq!(too_large.status_code(), StatusCode::BAD_REQUEST);
        assert_eq!(too_large.body().error.code, Some("context_length_exceeded"));
        let unsupported: ApiError = SubmitError::Unsupported { model: "m".into(), what: "embeddings" }.into();
        assert_eq!(unsupported.status_code(), StatusCode::BAD_REQUEST);
        assert_eq!(unsupported.body().error.code, Some("model_not_supported"));
        let closed: ApiError = SubmitError::Closed.into();
        assert_eq!(closed.status_code(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(closed.body().error.kind, "server_error");
    }

    #[test]
    fn test_framework_errors_have_json_bodies() {
        let (status, json, _) = status_and_json(ApiError::BodyTooLarge { limit: 10 });
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(json["error"]["code"], "request_too_large");
        let (status, json, headers) = status_and_json(ApiError::Unauthorized);
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(json["error"]["code"], "invalid_api_key");
        assert!(headers.contains_key(header::WWW_AUTHENTICATE));
        let not_allowed =
            ApiError::MethodNotAllowed { method: "GET".into(), path: "/v1/completions".into(), allowed: "POST" };
        let (status, _, headers) = status_and_json(not_allowed);
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(headers.get(header::ALLOW).and_then(|v| v.to_str().ok()), Some("POST"));
    }

    #[test]
    fn test_a_round_out_of_memory_is_503_with_retry_after() {
        let refused = EngineError::OutOfMemory("the cap refused 64 bytes of activations".into());
        let (status, json, headers) = status_and_json(ApiError::Engine(refused));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers.get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("1"));
        assert_eq!(json["error"]["code"], "out_of_memory");
        assert_eq!(json["error"]["message"], "out of memory: the cap refused 64 bytes of activations");
    }
}
