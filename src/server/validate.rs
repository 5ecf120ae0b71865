//! Parsed requests become `ValidRequest`s here: ranges, the chat template, tokens and the context budget.

use std::sync::Arc;

use tensorfold_engine::boundary::{Output, TextDecoder, TokenWork};

use super::error::ApiError;
use super::openai::{ChatCompletionRequest, CommonParams, CompletionRequest, Prompt};
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_engine::text::chat::{render_chat, ChatError, ChatMessage};
use tensorfold_engine::text::tokenizer::{StreamDecoder, Tokenizer};

const MAX_STOP_STRINGS: usize = 4;
const MAX_CHAT_TOP_LOGPROBS: u64 = 20;
const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// Decodes one lane's ids with the model's tokenizer.
pub struct TokenizerDecoder {
    tokenizer: Arc<Tokenizer>,
    stream: StreamDecoder,
}

impl TokenizerDecoder {
    pub fn new(tokenizer: Arc<Tokenizer>) -> TokenizerDecoder {
        TokenizerDecoder { tokenizer, stream: StreamDecoder::new() }
    }
}

impl TextDecoder for TokenizerDecoder {
    fn push(&mut self, id: u32) -> String {
        self.stream.push(&self.tokenizer, id).unwrap_or_default()
    }

    fn finish(&mut self) -> String {
        self.stream.finish(&self.tokenizer).unwrap_or_default()
    }
}

/// How to shape the reply; the runtime never needs these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyOptions {
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: bool,
}

pub struct Validated {
    /// The text model's lane.
    pub request: TokenWork,
    pub reply: ReplyOptions,
}

pub fn validate_chat(
    request: ChatCompletionRequest,
    tokenizer: &Arc<Tokenizer>,
    context: usize,
) -> Result<Validated, ApiError> {
    if request.messages.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must hold at least one message"));
    }
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| ApiError::invalid("messages", "this model has no chat template; use /v1/completions"))?;
    let messages: Vec<ChatMessage> = request
        .messages
        .iter()
        .map(|m| ChatMessage { role: m.role.as_str().to_string(), content: m.content.clone() })
        .collect();
    let bos = tokenizer.bos_token().unwrap_or("");
    let eos = tokenizer.eos_token().unwrap_or("");
    let text = render_chat(template, &messages, true, bos, eos).map_err(|e| match e {
        ChatError::Render(_) => ApiError::invalid("messages", e.to_string()),
        ChatError::Syntax(_) => ApiError::Internal(e.to_string()),
    })?;
    // Templates that write the BOS token themselves must not get a second one.
    let add_bos = bos.is_empty() || !text.starts_with(bos);
    let prompt = tokenizer.encode(&text, add_bos).map_err(|e| ApiError::invalid("messages", e.to_string()))?;

    if request.top_logprobs.is_some_and(|n| n > 0) && !request.logprobs {
        return Err(ApiError::invalid("top_logprobs", "'top_logprobs' needs 'logprobs' set to true"));
    }
    let top = request.top_logprobs.unwrap_or(0);
    if top > MAX_CHAT_TOP_LOGPROBS {
        let message = format!("'top_logprobs' must be in [0, {MAX_CHAT_TOP_LOGPROBS}], got {top}");
        return Err(ApiError::invalid("top_logprobs", message));
    }
    let logprobs = request.logprobs.then_some(top as usize);
    let max_tokens = match request.max_completion_tokens {
        Some(n) => Some((n, "max_completion_tokens")),
        None => request.common.max_tokens.map(|n| (n, "max_tokens")),
    };
    build(request.common, prompt, "messages", max_tokens, logprobs, tokenizer, context)
}

pub fn validate_completion(
    request: CompletionRequest,
    tokenizer: &Arc<Tokenizer>,
    context: usize,
) -> Result<Validated, ApiError> {
    if request.echo {
        return Err(ApiError::invalid("echo", "'echo' is not supported"));
    }
    if request.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "'suffix' is not supported"));
    }
    if request.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("best_of", "only 'best_of' = 1 is supported"));
    }
    let prompt = match request.prompt {
        Prompt::Text(text) if text.is_empty() => return Err(ApiError::invalid("prompt", "the prompt is empty")),
        Prompt::Text(text) => tokenizer.encode(&text, true).map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        Prompt::Ids(ids) if ids.is_empty() => return Err(ApiError::invalid("prompt", "the prompt is empty")),
        Prompt::Ids(ids) => {
            let vocab = tokenizer.vocab_size();
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                let message = format!("token id {bad} is outside the vocabulary of {vocab}");
                return Err(ApiError::invalid("prompt", message));
            }
            ids
        }
    };
    if let Some(n) = request.logprobs.filter(|&n| n > MAX_COMPLETION_LOGPROBS) {
        let message = format!("'logprobs' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {n}");
        return Err(ApiError::invalid("logprobs", message));
    }
    let logprobs = request.logprobs.map(|n| n as usize);
    let max_tokens = request.common.max_tokens.map(|n| (n, "max_tokens"));
    build(request.common, prompt, "prompt", max_tokens, logprobs, tokenizer, context)
}

/// The checks both endpoints share, then the `ValidRequest` itself.
fn build(
    common: CommonParams,
    prompt: Vec<u32>,
    prompt_param: &str,
    max_tokens: Option<(u64, &str)>,
    logprobs: Option<usize>,
    tokenizer: &Arc<Tokenizer>,
    context: usize,
) -> Result<Validated, ApiError> {
    reject_unsupported(&common)?;
    let max_tokens = budget(prompt.len(), max_tokens, context, prompt_param)?;
    let sampling = sampling(&common)?;
    if common.stop.len() > MAX_STOP_STRINGS {
        let message = format!("at most {MAX_STOP_STRINGS} stop strings are allowed, got {}", common.stop.len());
        return Err(ApiError::invalid("stop", message));
    }
    let stop_strings = common.stop.into_iter().filter(|s| !s.is_empty()).collect();
    let include_usage = common.stream_options.is_some_and(|o| o.include_usage);
    let reply = ReplyOptions { stream: common.stream, include_usage, logprobs: logprobs.is_some() };
    let request = TokenWork {
        prompt,
        max_tokens,
        sampling,
        stop_ids: tokenizer.eos_ids().to_vec(),
        stop_strings,
        logprobs,
        cache: common.cache.unwrap_or(true),
        draft: common.draft.unwrap_or(true),
        rules: Default::default(),
        constraint: None,
        output: Output::Text(Box::new(TokenizerDecoder::new(Arc::clone(tokenizer)))),
    };
    Ok(Validated { request, reply })
}

fn reject_unsupported(common: &CommonParams) -> Result<(), ApiError> {
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("n", "only 'n' = 1 is supported"));
    }
    for (param, value) in
        [("presence_penalty", common.presence_penalty), ("frequency_penalty", common.frequency_penalty)]
    {
        if value.is_some_and(|v| v != 0.0) {
            return Err(ApiError::invalid(param, format!("'{param}' is not supported; send 0 or leave it out")));
        }
    }
    if common.logit_bias.as_ref().is_some_and(|bias| !bias.is_empty()) {
        return Err(ApiError::invalid("logit_bias", "'logit_bias' is not supported"));
    }
    if common.stream_options.is_some() && !common.stream {
        return Err(ApiError::invalid("stream_options", "'stream_options' is only allowed when 'stream' is true"));
    }
    Ok(())
}

/// How many tokens to generate: the request's number if it fits, else the rest of the context.
fn budget(
    num_prompt: usize,
    requested: Option<(u64, &str)>,
    context: usize,
    prompt_param: &str,
) -> Result<usize, ApiError> {
    if num_prompt >= context {
        let message =
            format!("the prompt has {num_prompt} tokens, which leaves no room to generate in the context of {context}");
        return Err(ApiError::context_exceeded(prompt_param, message));
    }
    let room = context - num_prompt;
    match requested {
        None => Ok(room),
        Some((0, param)) => Err(ApiError::invalid(param, format!("'{param}' must be at least 1"))),
        Some((n, param)) if n > room as u64 => {
            let message =
                format!("the prompt has {num_prompt} tokens; with {param} {n} it exceeds the context of {context}");
            Err(ApiError::context_exceeded(param, message))
        }
        Some((n, _)) => Ok(n as usize),
    }
}

fn sampling(common: &CommonParams) -> Result<SamplingParams, ApiError> {
    let defaults = SamplingParams::default();
    let temperature = common.temperature.unwrap_or(defaults.temperature);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid("temperature", format!("'temperature' must be in [0, 2], got {temperature}")));
    }
    let top_k = match common.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => return Err(ApiError::invalid("top_k", format!("'top_k' must be -1, 0 or positive, got {k}"))),
    };
    let params = SamplingParams {
        temperature,
        top_k,
        top_p: common.top_p.unwrap_or(defaults.top_p),
        min_p: common.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: common.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        seed: seed(common.seed.as_ref())?,
    };
    // `validate` starts its message with the field's name.
    params.validate().map_err(|message| {
        let param = message.split_whitespace().next().unwrap_or("sampling").to_string();
        ApiError::invalid(param, message)
    })?;
    Ok(params)
}

/// The request's seed (negative ones wrap, as OpenAI accepts any integer), or a fresh one.
fn seed(seed: Option<&serde_json::Number>) -> Result<u64, ApiError> {
    match seed {
        None => Ok(super::random_u64()),
        Some(n) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|v| v as u64))
            .ok_or_else(|| ApiError::invalid("seed", format!("'seed' must be an integer, got {n}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::tokenizer;
    use super::*;

    const CONTEXT: usize = 32;

    fn chat(body: serde_json::Value) -> Result<Validated, ApiError> {
        let request = ChatCompletionRequest::from_json(body.to_string().as_bytes())?;
        validate_chat(request, &tokenizer(), CONTEXT)
    }

    fn completion(body: serde_json::Value) -> Result<Validated, ApiError> {
        let request = CompletionRequest::from_json(body.to_string().as_bytes())?;
        validate_completion(request, &tokenizer(), CONTEXT)
    }

    fn with(mut body: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
        for (k, v) in extra.as_object().expect("an object") {
            body[k] = v.clone();
        }
        body
    }

    fn hello() -> serde_json::Value {
        serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello world"}]})
    }

    /// The error's status is 400 and `param` names the field.
    fn rejected(result: Result<Validated, ApiError>) -> (String, String) {
        match result {
            Err(e @ ApiError::InvalidRequest { .. }) => {
                let body = e.body().error;
                (body.param.unwrap_or_default(), body.message)
            }
            Err(other) => panic!("expected a 400, got {other:?}"),
            Ok(_) => panic!("expected a 400, got a valid request"),
        }
    }

    #[test]
    fn test_chat_renders_template_and_defaults_to_rest_of_context() {
        let valid = chat(hello()).expect("valid");
        let tok = tokenizer();
        let expected = tok.encode("user : hello world assistant :", true).expect("encodes");
        assert_eq!(valid.request.prompt, expected);
        assert_eq!(valid.request.max_tokens, CONTEXT - expected.len());
        assert_eq!(valid.request.stop_ids, tok.eos_ids());
        assert_eq!(valid.request.logprobs, None);
        assert_eq!(valid.reply, ReplyOptions { stream: false, include_usage: false, logprobs: false });
    }

    #[test]
    fn test_sampling_fields_reach_the_request() {
        let body = with(
            hello(),
            serde_json::json!({"temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.1,
                "repetition_penalty": 1.1, "seed": -1, "stop": ["a", ""], "max_completion_tokens": 5,
                "max_tokens": 9, "presence_penalty": 0, "n": 1, "stream": true,
                "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3}),
        );
        let valid = chat(body).expect("valid");
        let s = &valid.request.sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty), (0.5, 0.9, 7, 0.1, 1.1));
        assert_eq!(s.seed, u64::MAX);
        assert_eq!(valid.request.stop_strings, ["a"]);
        assert_eq!(valid.request.max_tokens, 5);
        assert_eq!(valid.request.logprobs, Some(3));
        assert_eq!(valid.reply, ReplyOptions { stream: true, include_usage: true, logprobs: true });
    }

    #[test]
    fn test_each_bad_field_is_named() {
        let cases = [
            (serde_json::json!({"temperature": 2.5}), "temperature"),
            (serde_json::json!({"temperature": -0.1}), "temperature"),
            (serde_json::json!({"top_p": 0}), "top_p"),
            (serde_json::json!({"top_k": -2}), "top_k"),
            (serde_json::json!({"min_p": 1.5}), "min_p"),
            (serde_json::json!({"repetition_penalty": 0}), "repetition_penalty"),
            (serde_json::json!({"seed": 1.5}), "seed"),
            (serde_json::json!({"n": 2}), "n"),
            (serde_json::json!({"presence_penalty": 0.5}), "presence_penalty"),
            (serde_json::json!({"frequency_penalty": -1}), "frequency_penalty"),
            (serde_json::json!({"logit_bias": {"1": 5}}), "logit_bias"),
            (serde_json::json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (serde_json::json!({"max_tokens": 0}), "max_tokens"),
            (serde_json::json!({"max_completion_tokens": 0}), "max_completion_tokens"),
            (serde_json::json!({"stream_options": {"include_usage": true}}), "stream_options"),
            (serde_json::json!({"top_logprobs": 2}), "top_logprobs"),
            (serde_json::json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
            (serde_json::json!({"messages": []}), "messages"),
        ];
        for (extra, param) in cases {
            let (got, message) = rejected(chat(with(hello(), extra.clone())));
            assert_eq!(got, param, "{extra} gave {message}");
        }
    }

    #[test]
    fn test_context_overflow_names_the_numbers() {
        let num_prompt = chat(hello()).expect("valid").request.prompt.len();
        let (param, message) = rejected(chat(with(hello(), serde_json::json!({"max_tokens": 1000}))));
        assert_eq!(param, "max_tokens");
        assert_eq!(
            message,
            format!("the prompt has {num_prompt} tokens; with max_tokens 1000 it exceeds the context of {CONTEXT}")
        );
        let exact = with(hello(), serde_json::json!({"max_tokens": CONTEXT - num_prompt}));
        assert_eq!(chat(exact).expect("fits exactly").request.max_tokens, CONTEXT - num_prompt);
        let long = vec!["hello"; CONTEXT].join(" ");
        let (param, message) = rejected(completion(serde_json::json!({"prompt": long})));
        assert_eq!(param, "prompt");
        assert!(message.contains(&format!("context of {CONTEXT}")), "{message}");
    }

    #[test]
    fn test_completion_prompts() {
        let valid = completion(serde_json::json!({"prompt": "hello", "logprobs": 2})).expect("valid");
        assert_eq!(valid.request.prompt, tokenizer().encode("hello", true).expect("encodes"));
        assert_eq!(valid.request.logprobs, Some(2));
        let ids = completion(serde_json::json!({"prompt": [3, 4]})).expect("ids");
        assert_eq!(ids.request.prompt, [3, 4]);
        assert_eq!(rejected(completion(serde_json::json!({"prompt": ""}))).0, "prompt");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": [99999]}))).0, "prompt");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": "x", "logprobs": 6}))).0, "logprobs");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": "x", "echo": true}))).0, "echo");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": "x", "best_of": 2}))).0, "best_of");
    }

    #[test]
    fn test_template_raising_is_a_400_on_messages() {
        let body = serde_json::json!({"messages": [{"role": "assistant", "content": "first"}]});
        let (param, message) = rejected(chat(body));
        assert_eq!(param, "messages");
        assert!(message.contains("must start with"), "{message}");
    }

    #[test]
    fn test_decoder_streams_text() {
        let tok = tokenizer();
        let ids = tok.encode("hello world", false).expect("encodes");
        let mut decoder = TokenizerDecoder::new(tok);
        let text: String = ids.iter().map(|&id| decoder.push(id)).collect::<String>() + &decoder.finish();
        assert_eq!(text, "hello world");
    }
}
