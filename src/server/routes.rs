//! Routes and handlers: read the body, parse, validate, submit, then stream or collect the reply.

use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Extensions, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpMessage, HttpRequest, HttpResponse, ResponseError};

use super::body::BodyLimit;
use super::error::ApiError;
use super::text::openai::{ModelCard, ModelList};
use super::text::routes::{chat_completions, completions};
use super::{AppState, Backend};

/// The keys requests may present, if any: the configured value split at commas.
struct RequiredKey(Vec<String>);

impl RequiredKey {
    fn new(configured: Option<String>) -> RequiredKey {
        let keys = configured.iter().flat_map(|k| k.split(',')).map(str::trim).filter(|k| !k.is_empty());
        RequiredKey(keys.map(str::to_string).collect())
    }
}

/// Who sent a request: a digest of the key it presented, empty when no keys are configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller(pub String);

/// The state handlers read, empty until every model is loaded; the app answers 503 until it is set.
pub type Slot<B> = Arc<OnceLock<web::Data<AppState<B>>>>;

/// The whole application over a loaded `state`: auth, routes, and JSON errors for unknown routes.
pub fn app<B: Backend>(
    state: AppState<B>,
    max_body_bytes: usize,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let api_key = state.api_key.clone();
    let slot = Slot::default();
    let _ = slot.set(web::Data::new(state));
    app_over(slot, api_key, max_body_bytes)
}

/// The whole application over a `slot` that `serve` fills once the models are loaded.
pub fn app_over<B: Backend>(
    slot: Slot<B>,
    api_key: Option<String>,
    max_body_bytes: usize,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new()
        .app_data(web::Data::new(RequiredKey::new(api_key)))
        .app_data(web::Data::new(BodyLimit(max_body_bytes)))
        .app_data(web::Data::new(slot))
        .wrap(from_fn(until_loaded::<B>))
        .wrap(from_fn(require_api_key))
        .configure(configure::<B>)
        .default_service(web::to(not_found))
}

/// Hands the loaded state to the handlers; before it is set, `/health` says loading and every route is a 503.
async fn until_loaded<B: Backend>(
    mut req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let state = req.app_data::<web::Data<Slot<B>>>().and_then(|slot| slot.get().cloned());
    let Some(state) = state else {
        let response = match req.path() {
            "/health" => HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "loading"})),
            _ => ApiError::Loading.error_response(),
        };
        return Ok(req.into_response(response).map_into_right_body());
    };
    let mut data = Extensions::new();
    data.insert(state);
    req.add_data_container(Rc::new(data));
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}

/// Every route `configure` serves, as `docs/openapi.yaml` writes it, with its one method.
pub const ROUTES: &[(&str, &str)] = &[
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/models", "GET"),
    ("/v1/models/{id}", "GET"),
    ("/v1/audio/speech", "POST"),
    ("/v1/audio/voices", "GET"),
    ("/v1/embeddings", "POST"),
    ("/v1/messages", "POST"),
    ("/v1/responses", "GET"),
    ("/v1/responses", "POST"),
    ("/v1/responses/{response_id}", "GET"),
    ("/v1/responses/{response_id}", "DELETE"),
    ("/v1/responses/{response_id}/input_items", "GET"),
    ("/v1/responses/{response_id}/cancel", "POST"),
    ("/openapi.json", "GET"),
    ("/health", "GET"),
    ("/metrics", "GET"),
];

/// The routes alone; they expect `web::Data<AppState<B>>` and the body limit registered by `app`.
pub fn configure<B: Backend>(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/v1/chat/completions")
            .route(web::post().to(chat_completions::<B>))
            .default_service(web::to(only("POST"))),
    )
    .service(
        web::resource("/v1/completions").route(web::post().to(completions::<B>)).default_service(web::to(only("POST"))),
    )
    .service(web::resource("/v1/models").route(web::get().to(list_models::<B>)).default_service(web::to(only("GET"))))
    .service(
        web::resource("/v1/models/{id:.+}").route(web::get().to(get_model::<B>)).default_service(web::to(only("GET"))),
    )
    .service(
        web::resource("/v1/audio/speech")
            .route(web::post().to(super::speech::speech::<B>))
            .default_service(web::to(only("POST"))),
    )
    .service(
        web::resource("/v1/audio/voices")
            .route(web::get().to(super::speech::list_voices::<B>))
            .default_service(web::to(only("GET"))),
    )
    .service(
        web::resource("/v1/embeddings")
            .route(web::post().to(super::text::embeddings::embeddings::<B>))
            .default_service(web::to(only("POST"))),
    )
    .service(
        web::resource("/v1/messages")
            .route(web::post().to(super::messages::create::<B>))
            .default_service(web::to(only("POST"))),
    )
    .service(
        web::resource("/v1/responses")
            .route(web::post().to(super::responses::create::<B>))
            .route(web::get().to(super::responses::socket::connect::<B>))
            .default_service(web::to(only("GET, POST"))),
    )
    .service(
        web::resource("/v1/responses/{id}")
            .route(web::get().to(super::responses::retrieve::<B>))
            .route(web::delete().to(super::responses::delete::<B>))
            .default_service(web::to(only("GET, DELETE"))),
    )
    .service(
        web::resource("/v1/responses/{id}/input_items")
            .route(web::get().to(super::responses::input_items_list::<B>))
            .default_service(web::to(only("GET"))),
    )
    .service(
        web::resource("/v1/responses/{id}/cancel")
            .route(web::post().to(super::responses::cancel::<B>))
            .default_service(web::to(only("POST"))),
    )
    .service(
        web::resource("/openapi.json")
            .route(web::get().to(super::openapi::openapi))
            .default_service(web::to(only("GET"))),
    )
    .service(web::resource("/health").route(web::get().to(health::<B>)).default_service(web::to(only("GET"))))
    .service(web::resource("/metrics").route(web::get().to(metrics::<B>)).default_service(web::to(only("GET"))));
}

/// A handler answering 405 for a route that serves only `allowed`.
fn only(allowed: &'static str) -> impl Fn(HttpRequest) -> std::future::Ready<Result<HttpResponse, ApiError>> + Clone {
    move |req: HttpRequest| {
        let (method, path) = (req.method().to_string(), req.path().to_string());
        std::future::ready(Err(ApiError::MethodNotAllowed { method, path, allowed }))
    }
}

async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound { method: req.method().to_string(), path: req.path().to_string() })
}

async fn require_api_key(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let keys = req.app_data::<web::Data<RequiredKey>>().map(|keys| keys.0.as_slice()).unwrap_or_default();
    let caller = match presented_key(req.headers()) {
        Some(given) if keys.iter().any(|key| same_key(given, key)) => Some(Caller(key_digest(given))),
        _ if keys.is_empty() => Some(Caller::default()),
        _ => None,
    };
    match caller {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.call(req).await.map(ServiceResponse::map_into_left_body)
        }
        None if req.path() == "/health" => next.call(req).await.map(ServiceResponse::map_into_left_body),
        None if req.path().starts_with("/v1/messages") => {
            let response = super::messages::AnthropicError(ApiError::Unauthorized).error_response();
            Ok(req.into_response(response).map_into_right_body())
        }
        None => {
            let response = ApiError::Unauthorized.error_response();
            Ok(req.into_response(response).map_into_right_body())
        }
    }
}

/// The key of `Authorization: Bearer KEY`, or of `x-api-key: KEY` as Anthropic's clients send it.
fn presented_key(headers: &header::HeaderMap) -> Option<&str> {
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.split_once(' '));
    match bearer {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") => Some(key.trim()),
        _ => headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim),
    }
}

/// A stored owner tag for a key: its SHA-256 in hex, so the store never holds a key.
fn key_digest(key: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares without an early exit, so response time does not reveal how much of the key matched.
fn same_key(given: &str, expected: &str) -> bool {
    let (given, expected) = (given.as_bytes(), expected.as_bytes());
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The text model first, then each speaker of `/v1/audio/speech`, each name once.
fn model_cards<B: Backend>(state: &AppState<B>) -> Vec<ModelCard> {
    let mut names: Vec<String> = Vec::new();
    for name in std::iter::once(state.model_name.clone()).chain(state.speakers.names()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let card = |id: String| {
        let context = Some(state.runtime.limits(&id).context).filter(|&n| n > 0);
        let (max_model_len, context_length) = (context, context);
        ModelCard { id, object: "model", created: state.created, owned_by: "tensorfold", max_model_len, context_length }
    };
    names.into_iter().map(card).collect()
}

async fn list_models<B: Backend>(state: web::Data<AppState<B>>) -> HttpResponse {
    HttpResponse::Ok().json(ModelList { object: "list", data: model_cards(&state) })
}

async fn get_model<B: Backend>(state: web::Data<AppState<B>>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    match model_cards(&state).into_iter().find(|card| card.id == *id) {
        Some(card) => Ok(HttpResponse::Ok().json(card)),
        None => Err(ApiError::ModelNotFound(id.into_inner())),
    }
}

async fn health<B: Backend>(state: web::Data<AppState<B>>) -> HttpResponse {
    if state.runtime.is_ready() {
        HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
    } else {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({"status": "unavailable"}))
    }
}

async fn metrics<B: Backend>(state: web::Data<AppState<B>>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.runtime.metrics_text(&state.model_name).await)
}
