//! `POST /v1/embeddings`: OpenAI's embeddings body in; each input prefilled as its own lane of the text model, its
//! final hidden states mean-pooled and L2-normalized, out as floats or base64 little-endian f32 bytes.

use actix_web::{web, HttpRequest, HttpResponse};
use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;
use tensorfold_actors::request_types::{EmbedWork, Event, ValidRequest, Work};

use super::openai::Fields;
use crate::server::body::{read_body, BodyLimit};
use crate::server::error::ApiError;
use crate::server::{AppState, Backend};
use tensorfold_engine::text::tokenizer::Tokenizer;

/// Most inputs one request may embed.
pub const MAX_INPUTS: usize = 64;

/// One input as given: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum EmbeddingInput {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodingFormat {
    Float,
    /// The vector's little-endian f32 bytes, base64-encoded, as OpenAI sends them.
    Base64,
}

/// An embeddings request once every field is checked.
#[derive(Debug, PartialEq)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub inputs: Vec<EmbeddingInput>,
    pub format: EncodingFormat,
    /// Must equal the model's hidden size: vectors are not truncated.
    pub dimensions: Option<usize>,
    /// Whether each input's pages are kept in the prefix cache for later prompts.
    pub cache: bool,
}

impl EmbeddingRequest {
    pub fn from_json(body: &[u8]) -> Result<EmbeddingRequest, ApiError> {
        let mut fields = Fields::parse(body)?;
        let model = fields.take("model")?;
        let inputs = parse_inputs(fields.required("input")?)?;
        let format = match fields.take::<String>("encoding_format")?.as_deref() {
            None | Some("float") => EncodingFormat::Float,
            Some("base64") => EncodingFormat::Base64,
            Some(other) => {
                let message = format!("'encoding_format' {other:?} is not supported; use \"float\" or \"base64\"");
                return Err(ApiError::invalid("encoding_format", message));
            }
        };
        let dimensions: Option<usize> = fields.take("dimensions")?;
        if dimensions == Some(0) {
            return Err(ApiError::invalid("dimensions", "'dimensions' must be at least 1"));
        }
        let cache = fields.take("cache")?.unwrap_or(false);
        Ok(EmbeddingRequest { model, inputs, format, dimensions, cache })
    }
}

/// A string, a list of strings, a list of token ids, or a list of token id lists; 1 to `MAX_INPUTS` inputs, none
/// empty.
fn parse_inputs(value: Value) -> Result<Vec<EmbeddingInput>, ApiError> {
    let wrong = || {
        ApiError::invalid(
            "input",
            "'input' must be a string, a list of strings, token ids, or a list of token id lists",
        )
    };
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items.iter().map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(wrong)).collect()
    };
    let inputs = match value {
        Value::String(text) => vec![EmbeddingInput::Text(text)],
        Value::Array(items) => match items.first() {
            None => return Err(ApiError::invalid("input", "'input' is empty")),
            Some(Value::String(_) | Value::Array(_)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(text) => Ok(EmbeddingInput::Text(text)),
                    Value::Array(inner) => ids(&inner).map(EmbeddingInput::Ids),
                    _ => Err(wrong()),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => vec![EmbeddingInput::Ids(ids(&items)?)],
        },
        _ => return Err(wrong()),
    };
    if inputs.len() > MAX_INPUTS {
        let message = format!("'input' holds {} inputs; at most {MAX_INPUTS} are embedded at once", inputs.len());
        return Err(ApiError::invalid("input", message));
    }
    let empty = |i: &EmbeddingInput| match i {
        EmbeddingInput::Text(text) => text.is_empty(),
        EmbeddingInput::Ids(ids) => ids.is_empty(),
    };
    if let Some(at) = inputs.iter().position(empty) {
        return Err(ApiError::invalid("input", format!("input {at} is empty")));
    }
    Ok(inputs)
}

/// Each input's token ids: text tokenized as a completion prompt is, ids checked against the vocabulary, each within
/// the model's context.
fn tokenize(inputs: Vec<EmbeddingInput>, tokenizer: &Tokenizer, context: usize) -> Result<Vec<Vec<u32>>, ApiError> {
    let vocab = tokenizer.vocab_size();
    let lane = |(at, input): (usize, EmbeddingInput)| {
        let ids = match input {
            EmbeddingInput::Text(text) => {
                tokenizer.encode(&text, true).map_err(|e| ApiError::invalid("input", format!("input {at}: {e}")))?
            }
            EmbeddingInput::Ids(ids) => ids,
        };
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            let message = format!("input {at}: token id {bad} is outside the vocabulary of {vocab}");
            return Err(ApiError::invalid("input", message));
        }
        if ids.is_empty() || ids.len() > context {
            let message = format!("input {at} has {} tokens; the model's context is {context}", ids.len());
            return Err(ApiError::context_exceeded("input", message));
        }
        Ok(ids)
    };
    inputs.into_iter().enumerate().map(lane).collect()
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct EmbeddingData {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
struct EmbeddingUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct EmbeddingList {
    object: &'static str,
    data: Vec<EmbeddingData>,
    model: String,
    usage: EmbeddingUsage,
}

/// The vector as the request asked for it.
fn encode(vector: Vec<f32>, format: EncodingFormat) -> Vector {
    match format {
        EncodingFormat::Float => Vector::Float(vector),
        EncodingFormat::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
            Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

pub(in crate::server) async fn embeddings<B: Backend>(
    state: web::Data<AppState<B>>,
    limit: web::Data<BodyLimit>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, limit.0).await?;
    let request = EmbeddingRequest::from_json(&body)?;
    state.text_model_for(request.model.as_deref())?;
    let (tokenizer, context) = (state.tokenizer.clone(), state.runtime.limits(&state.model_name).context);
    let inputs = request.inputs;
    let prompts = web::block(move || tokenize(inputs, &tokenizer, context))
        .await
        .map_err(|e| ApiError::Internal(format!("validating the request: {e}")))??;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    // Every lane is queued before any is awaited, so the inputs share rounds.
    let submits = prompts.into_iter().map(|prompt| {
        let work = Work::Embed(EmbedWork { prompt, cache: request.cache });
        state.runtime.submit(ValidRequest { model: state.model_name.clone(), work })
    });
    let receivers = futures_util::future::join_all(submits).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut data = Vec::with_capacity(receivers.len());
    for (index, mut events) in receivers.into_iter().enumerate() {
        let vector = match events.recv().await {
            Some(Event::Embedding { vector, .. }) => vector,
            Some(Event::Error(e)) => return Err(ApiError::Engine(e)),
            Some(_) => return Err(ApiError::Internal("tokens or audio on an embedding request".into())),
            None => return Err(ApiError::Internal("the embedding request ended early".into())),
        };
        if let Some(n) = request.dimensions.filter(|&n| n != vector.len()) {
            let message = format!("'dimensions' {n} is not supported: this model's embeddings have {}", vector.len());
            return Err(ApiError::invalid("dimensions", message));
        }
        data.push(EmbeddingData { object: "embedding", index, embedding: encode(vector, request.format) });
    }
    let usage = EmbeddingUsage { prompt_tokens, total_tokens: prompt_tokens };
    Ok(HttpResponse::Ok().json(EmbeddingList { object: "list", data, model: state.model_name.clone(), usage }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: serde_json::Value) -> Result<EmbeddingRequest, ApiError> {
        EmbeddingRequest::from_json(body.to_string().as_bytes())
    }

    fn param(result: Result<EmbeddingRequest, ApiError>) -> Option<String> {
        result.err().and_then(|e| e.body().error.param)
    }

    #[test]
    fn test_input_takes_every_openai_shape() {
        let inputs =
            |input: serde_json::Value| parse(serde_json::json!({"model": "m", "input": input})).unwrap().inputs;
        let text = |t: &str| EmbeddingInput::Text(t.into());
        assert_eq!(inputs("a".into()), vec![text("a")]);
        assert_eq!(inputs(serde_json::json!(["a", "b"])), vec![text("a"), text("b")]);
        assert_eq!(inputs(serde_json::json!([1, 2])), vec![EmbeddingInput::Ids(vec![1, 2])]);
        let lists = inputs(serde_json::json!([[1], [2, 3]]));
        assert_eq!(lists, vec![EmbeddingInput::Ids(vec![1]), EmbeddingInput::Ids(vec![2, 3])]);
    }

    #[test]
    fn test_bad_fields_are_400s_naming_the_field() {
        let body = |extra: serde_json::Value| {
            let mut b = serde_json::json!({"model": "m", "input": "a"});
            b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            b
        };
        for input in [serde_json::json!(""), serde_json::json!([]), serde_json::json!([""]), serde_json::json!([[]])] {
            assert_eq!(param(parse(body(serde_json::json!({"input": input})))).as_deref(), Some("input"));
        }
        let many = vec!["a"; MAX_INPUTS + 1];
        assert_eq!(param(parse(body(serde_json::json!({"input": many})))).as_deref(), Some("input"));
        assert_eq!(param(parse(body(serde_json::json!({"input": [1.5]})))).as_deref(), Some("input"));
        assert_eq!(param(parse(body(serde_json::json!({"input": 7})))).as_deref(), Some("input"));
        let format = body(serde_json::json!({"encoding_format": "int8"}));
        assert_eq!(param(parse(format)).as_deref(), Some("encoding_format"));
        assert_eq!(param(parse(body(serde_json::json!({"dimensions": 0})))).as_deref(), Some("dimensions"));
        assert!(parse(serde_json::json!({"input": "a"})).is_ok(), "no model stands for the text model");
        assert_eq!(param(parse(serde_json::json!({"model": "m"}))).as_deref(), Some("input"));
    }

    #[test]
    fn test_base64_is_the_little_endian_f32_bytes() {
        let Vector::Base64(text) = encode(vec![1.0, -0.5], EncodingFormat::Base64) else { panic!("base64") };
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
        assert_eq!(bytes, [1f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat());
    }

    #[test]
    fn test_inputs_past_the_context_or_vocabulary_are_400s() {
        let tok = crate::server::test_support::tokenizer();
        let long = tokenize(vec![EmbeddingInput::Ids(vec![3; 5])], &tok, 4).unwrap_err();
        assert_eq!(long.body().error.code, Some("context_length_exceeded"));
        let outside = tokenize(vec![EmbeddingInput::Ids(vec![99])], &tok, 4).unwrap_err();
        assert_eq!(outside.body().error.param.as_deref(), Some("input"));
        assert_eq!(tokenize(vec![EmbeddingInput::Ids(vec![3, 4])], &tok, 4).unwrap(), vec![vec![3, 4]]);
    }
}
