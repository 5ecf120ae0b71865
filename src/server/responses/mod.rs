//! OpenAI's Responses API: `/v1/responses` created plain, streamed or in the background, stored, read back,
//! continued by `previous_response_id`, listed and cancelled.

pub mod object;
pub mod request;
pub mod socket;
pub mod store;
pub mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use actix_web::http::header;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use tokio::task::AbortHandle;

use self::object::{final_status, new_id, output_items, Frame, Status};
use self::store::{Record, Store};
use super::body::{read_body, BodyLimit};
use super::error::ApiError;
use super::routes::Caller;
use super::text::openai::ChatCompletionRequest;
use super::{turn, unix_now, AppState, Backend};

/// The store, and the background responses still running (so a cancel can stop them).
pub struct Responses {
    pub store: Store,
    running: Mutex<HashMap<String, AbortHandle>>,
}

impl Responses {
    pub fn new(store: Store) -> Responses {
        Responses { store, running: Mutex::default() }
    }

    /// Takes `id` off the running list; whether it was there, so exactly one of finish and cancel writes.
    fn unlist(&self, id: &str) -> Option<AbortHandle> {
        self.running.lock().ok()?.remove(id)
    }
}

impl Default for Responses {
    fn default() -> Responses {
        Responses::new(Store::off())
    }
}

/// Writes a response once it is over: its object, its input, and the conversation it ends.
pub struct Saver {
    responses: Arc<Responses>,
    owner: String,
    record: Option<Record>,
}

impl Saver {
    fn new(responses: &Arc<Responses>, owner: &str, frame: &Frame, history: Vec<Value>) -> Saver {
        let on = responses.store.is_on() && frame.params.store;
        let record = on.then(|| Record {
            id: frame.id.clone(),
            created_at: frame.created_at,
            response: Value::Null,
            input_items: input_items(&frame.params.input),
            history,
        });
        Saver { responses: Arc::clone(responses), owner: owner.to_string(), record }
    }

    /// Stores `object`, its output appended to the history; a store that fails is logged, the reply still goes out.
    pub async fn save(&self, object: Value) {
        let Some(mut record) = self.record.clone() else { return };
        if Status::from_object(&object).is_some_and(Status::is_final) {
            record.history.extend(object["output"].as_array().cloned().unwrap_or_default());
        }
        record.response = object;
        let (responses, owner) = (Arc::clone(&self.responses), self.owner.clone());
        let written = web::block(move || responses.store.put(&owner, &record, unix_now())).await;
        if let Err(e) = written.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
            tracing::warn!(error = %e, "a response was not stored");
        }
    }
}

/// Each input item as `input_items` lists it: with an id, and a message's text as `input_text` parts.
fn input_items(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .map(|item| {
            let mut item = item.clone();
            if item.get("type").is_none() && item.get("role").is_some() {
                item["type"] = json!("message");
            }
            if item["type"] == "message" {
                if let Some(text) = item["content"].as_str() {
                    let kind = if item["role"] == "assistant" { "output_text" } else { "input_text" };
                    item["content"] = json!([{"type": kind, "text": text}]);
                }
                item["status"] = item.get("status").cloned().unwrap_or(json!("completed"));
            }
            if item.get("id").is_none_or(Value::is_null) {
                let prefix = if item["type"] == "message" { "msg" } else { "item" };
                item["id"] = json!(new_id(prefix));
            }
            item
        })
        .collect()
}

pub(in crate::server) fn caller(req: &HttpRequest) -> String {
    req.extensions().get::<Caller>().map(|c| c.0.clone()).unwrap_or_default()
}

fn not_found(id: &str, param: &'static str) -> ApiError {
    ApiError::ObjectNotFound { what: "stored response", id: id.to_string(), param }
}

/// Reads `id` off the store without blocking the worker.
async fn stored<B: Backend>(state: &AppState<B>, owner: String, id: String) -> Result<Option<Record>, ApiError> {
    let responses = Arc::clone(&state.responses);
    web::block(move || responses.store.get(&owner, &id)).await.map_err(|e| ApiError::Internal(e.to_string()))?
}

/// A request ready to run: its frame, how it is saved, its chat request and the conversation it continues.
pub struct Prepared {
    pub frame: Frame,
    pub saver: Saver,
    pub chat: ChatCompletionRequest,
    /// Every item of the conversation up to this response's output.
    pub history: Vec<Value>,
}

/// A response a WebSocket connection keeps for its next turn, stored or not.
pub struct Kept {
    pub id: String,
    /// The conversation through its output.
    pub history: Vec<Value>,
}

/// Parses `body` and gathers the conversation it continues: from `kept` when it names that, else from the store.
pub async fn prepare<B: Backend>(
    state: &AppState<B>,
    owner: &str,
    body: &[u8],
    kept: Option<&Kept>,
) -> Result<Prepared, ApiError> {
    let (params, chat) = request::parse(body)?;
    let mut history = Vec::new();
    match (params.previous_response_id.clone(), kept) {
        (Some(previous), Some(kept)) if kept.id == previous => history.clone_from(&kept.history),
        (Some(previous), _) => {
            let record = stored(state, owner.to_string(), previous.clone()).await?;
            let record = record.ok_or_else(|| not_found(&previous, "previous_response_id"))?;
            if !Status::from_object(&record.response).is_some_and(Status::is_final) {
                let message = format!("response '{previous}' is still running; continue it once it is over");
                return Err(ApiError::invalid("previous_response_id", message));
            }
            history = record.history;
        }
        (None, _) => {}
    }
    history.extend(params.input.iter().cloned());
    let chat = request::chat_request(params.instructions.as_deref(), &history, chat)?;
    let frame = Frame { id: new_id("resp"), created_at: unix_now(), model: state.model_name.clone(), params };
    let saver = Saver::new(&state.responses, owner, &frame, history.clone());
    Ok(Prepared { frame, saver, chat, history })
}

pub(in crate::server) async fn create<B: Backend>(
    state: web::Data<AppState<B>>,
    limit: web::Data<BodyLimit>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, limit.0).await?;
    let Prepared { frame, saver, chat, .. } = prepare(&state, &caller(&req), &body, None).await?;
    let (background, stream) = (frame.params.background, frame.params.stream);
    let turn = turn::start(&state, chat, true).await?;
    if background {
        return Ok(HttpResponse::Ok().json(in_background(&state, turn, frame, saver).await));
    }
    if stream {
        let writer = stream::EventWriter::new(frame, stream::Framing::Sse);
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .insert_header(("X-Accel-Buffering", "no"))
            .streaming(stream::events(turn, writer, saver)));
    }
    let (parts, end) = turn.collect().await?;
    let object = frame.object(final_status(&end), output_items(&parts), Some(end.usage), None);
    saver.save(object.clone()).await;
    Ok(HttpResponse::Ok().json(object))
}

/// Stores the response as queued, runs it on this worker, and answers at once.
async fn in_background<B: Backend>(state: &AppState<B>, turn: turn::Turn, frame: Frame, saver: Saver) -> Value {
    let queued = frame.object(Status::Queued, Vec::new(), None, None);
    saver.save(queued.clone()).await;
    let (responses, id) = (Arc::clone(&state.responses), frame.id.clone());
    let task = actix_web::rt::spawn(async move {
        let object = match turn.collect().await {
            Ok((parts, end)) => frame.object(final_status(&end), output_items(&parts), Some(end.usage), None),
            Err(error) => frame.object(Status::Failed, Vec::new(), None, Some(&error)),
        };
        if responses.unlist(&frame.id).is_some() {
            saver.save(object).await;
        }
    });
    if let Ok(mut running) = state.responses.running.lock() {
        running.insert(id, task.abort_handle());
    }
    queued
}

pub(in crate::server) async fn retrieve<B: Backend>(
    state: web::Data<AppState<B>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let record = stored(&state, caller(&req), id.clone()).await?.ok_or_else(|| not_found(&id, "response_id"))?;
    Ok(HttpResponse::Ok().json(record.response))
}

pub(in crate::server) async fn delete<B: Backend>(
    state: web::Data<AppState<B>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let (responses, owner, key) = (Arc::clone(&state.responses), caller(&req), id.clone());
    let removed = web::block(move || responses.store.delete(&owner, &key))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    if !removed {
        return Err(not_found(&id, "response_id"));
    }
    if let Some(task) = state.responses.unlist(&id) {
        task.abort();
    }
    Ok(HttpResponse::Ok().json(json!({"id": *id, "object": "response.deleted", "deleted": true})))
}

/// `limit`, `order` and `after` from the query string; the last of a repeated key wins.
struct ListQuery {
    limit: Option<usize>,
    order: Option<String>,
    after: Option<String>,
}

impl ListQuery {
    fn parse(query: &str) -> Result<ListQuery, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
            .map_err(|e| ApiError::invalid_body(format!("the query string does not parse: {e}")))?;
        let last = |key: &str| pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let limit = match last("limit") {
            None => None,
            Some(text) => Some(text.parse().map_err(|_| {
                ApiError::invalid("limit", format!("'limit' must be an integer in [1, 100], got '{text}'"))
            })?),
        };
        Ok(ListQuery { limit, order: last("order"), after: last("after") })
    }
}

pub(in crate::server) async fn input_items_list<B: Backend>(
    state: web::Data<AppState<B>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(req.query_string())?;
    let record = stored(&state, caller(&req), id.clone()).await?.ok_or_else(|| not_found(&id, "response_id"))?;
    let mut items = record.input_items;
    match query.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => return Err(ApiError::invalid("order", format!("'order' must be asc or desc, got '{other}'"))),
    }
    if let Some(after) = &query.after {
        let at = items.iter().position(|item| item["id"] == **after);
        items = at.map_or_else(Vec::new, |at| items.split_off(at + 1));
    }
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("'limit' must be in [1, 100], got {limit}")));
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let (first, last) = (items.first().map(|i| i["id"].clone()), items.last().map(|i| i["id"].clone()));
    Ok(HttpResponse::Ok()
        .json(json!({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": has_more})))
}

pub(in crate::server) async fn cancel<B: Backend>(
    state: web::Data<AppState<B>>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let owner = caller(&req);
    let record = stored(&state, owner.clone(), id.clone()).await?.ok_or_else(|| not_found(&id, "response_id"))?;
    if record.response["background"] != true {
        return Err(ApiError::invalid("response_id", "only responses made with 'background': true can be cancelled"));
    }
    let Some(task) = state.responses.unlist(&id) else {
        return Ok(HttpResponse::Ok().json(record.response));
    };
    task.abort();
    let mut object = record.response.clone();
    object["status"] = json!(Status::Cancelled.as_str());
    let saver = Saver {
        responses: Arc::clone(&state.responses),
        owner,
        record: Some(Record { response: Value::Null, ..record }),
    };
    saver.save(object.clone()).await;
    Ok(HttpResponse::Ok().json(object))
}

impl Status {
    /// The status an object reports.
    pub fn from_object(object: &Value) -> Option<Status> {
        let all = [
            Status::Queued,
            Status::InProgress,
            Status::Completed,
            Status::Incomplete,
            Status::Failed,
            Status::Cancelled,
        ];
        all.into_iter().find(|s| object["status"] == s.as_str())
    }
}
