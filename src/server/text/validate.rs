//! Parsed requests become `ValidRequest`s here: ranges, the chat template, tokens and the context budget.

use std::sync::Arc;

use tensorfold_engine::boundary::{Output, TextDecoder, TokenWork};

use super::openai::{ChatCompletionRequest, CommonParams, CompletionRequest, Prompt, ResponseFormat};
use super::rules::{constraint, logit_rules};
use super::tools::ToolSetup;
use crate::server::error::ApiError;
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_engine::text::chat::{render_chat_with_kwargs, ChatError};
use tensorfold_engine::text::grammar::Grammars;
use tensorfold_engine::text::reasoning::ThinkStart;
use tensorfold_engine::text::tokenizer::{StreamDecoder, Tokenizer};
use tensorfold_engine::text::tool_calls::ToolFormat;

const MAX_STOP_STRINGS: usize = 4;
const MAX_CHAT_TOP_LOGPROBS: u64 = 20;
const MAX_COMPLETION_LOGPROBS: u64 = 5;
/// Most choices per prompt, and most prompts and lanes per request, so one request cannot fill the queue.
const MAX_N: u64 = 8;
const MAX_PROMPTS: usize = 16;
const MAX_CHOICES: usize = 64;

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
    /// Choices per prompt: the lanes of one prompt share its prompt tokens in the usage.
    pub n: usize,
    /// How a chat reply's text is parsed into tool calls; `None` when tools are not in play.
    pub tools: Option<ToolFormat>,
    /// Where a chat reply's reasoning starts; `None` when the template does not think.
    pub reasoning: Option<ThinkStart>,
}

pub struct Validated {
    /// One lane per choice, in choice order: prompt `p`'s choice `j` is lane `p * n + j`.
    pub lanes: Vec<TokenWork>,
    /// What each choice's text starts with: its prompt's text under `echo`, else nothing.
    pub prefixes: Vec<String>,
    pub reply: ReplyOptions,
}

/// What validation reads of the text model.
#[derive(Clone)]
pub struct TextModel {
    pub tokenizer: Arc<Tokenizer>,
    pub grammars: Grammars,
    /// Most positions one lane may use, prompt plus output.
    pub context: usize,
}

/// A prompt's tokens, and its text for `echo`.
struct PromptLane {
    ids: Vec<u32>,
    echo: Option<String>,
}

pub fn validate_chat(request: ChatCompletionRequest, model: &TextModel) -> Result<Validated, ApiError> {
    let tokenizer = &model.tokenizer;
    if request.messages.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must hold at least one message"));
    }
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| ApiError::invalid("messages", "this model has no chat template; use /v1/completions"))?;
    let tools = ToolSetup::new(&request.messages, request.tools.as_ref(), template);
    let bos = tokenizer.bos_token().unwrap_or("");
    let eos = tokenizer.eos_token().unwrap_or("");
    let kwargs = &request.template_kwargs;
    let rendered = render_chat_with_kwargs(template, &tools.messages, tools.tools.as_deref(), true, bos, eos, kwargs);
    let text = rendered.map_err(|e| match e {
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
    let max_tokens = max_tokens(request.max_completion_tokens, request.common.max_tokens);
    let prompts = vec![PromptLane { ids: prompt, echo: None }];
    let mut valid = build(request.common, prompts, "messages", max_tokens, logprobs, model)?;
    tools.constrain(&mut valid.lanes, &model.grammars)?;
    valid.reply.tools = tools.format;
    // A grammar shapes the reply from its first token, so none of it is thinking.
    let constrained = valid.lanes.iter().any(|lane| lane.constraint.is_some());
    valid.reply.reasoning = ThinkStart::for_prompt(template, &text).filter(|_| !constrained);
    Ok(valid)
}

pub fn validate_completion(request: CompletionRequest, model: &TextModel) -> Result<Validated, ApiError> {
    let tokenizer = &model.tokenizer;
    if request.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "'suffix' is not supported"));
    }
    let n = request.common.n.unwrap_or(1);
    if let Some(best_of) = request.best_of.filter(|&b| b != n) {
        let message = format!("'best_of' must equal 'n' ({n}): every choice generated is returned, got {best_of}");
        return Err(ApiError::invalid("best_of", message));
    }
    if request.echo && request.logprobs.is_some() {
        let message = "'echo' with 'logprobs' needs the prompt's log-probabilities, which this server does not \
            compute; leave one of them out";
        return Err(ApiError::invalid("echo", message));
    }
    if let Some(n) = request.logprobs.filter(|&n| n > MAX_COMPLETION_LOGPROBS) {
        let message = format!("'logprobs' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {n}");
        return Err(ApiError::invalid("logprobs", message));
    }
    let prompts = request
        .prompts
        .into_iter()
        .map(|prompt| {
            let (ids, text) = match prompt {
                Prompt::Text(text) if text.is_empty() => {
                    return Err(ApiError::invalid("prompt", "the prompt is empty"))
                }
                Prompt::Text(text) => {
                    (tokenizer.encode(&text, true).map_err(|e| ApiError::invalid("prompt", e.to_string()))?, Some(text))
                }
                Prompt::Ids(ids) if ids.is_empty() => return Err(ApiError::invalid("prompt", "the prompt is empty")),
                Prompt::Ids(ids) => {
                    let vocab = tokenizer.vocab_size();
                    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                        let message = format!("token id {bad} is outside the vocabulary of {vocab}");
                        return Err(ApiError::invalid("prompt", message));
                    }
                    (ids, None)
                }
            };
            let echo = request.echo.then(|| text.unwrap_or_else(|| tokenizer.decode(&ids)));
            Ok(PromptLane { ids, echo })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let logprobs = request.logprobs.map(|n| n as usize);
    let max_tokens = max_tokens(request.max_completion_tokens, request.common.max_tokens);
    build(request.common, prompts, "prompt", max_tokens, logprobs, model)
}

/// `max_completion_tokens` wins over the older `max_tokens`, each named in its own errors.
fn max_tokens(completion: Option<u64>, legacy: Option<u64>) -> Option<(u64, &'static str)> {
    match completion {
        Some(n) => Some((n, "max_completion_tokens")),
        None => legacy.map(|n| (n, "max_tokens")),
    }
}

/// The checks both endpoints share, then one lane per choice.
fn build(
    common: CommonParams,
    prompts: Vec<PromptLane>,
    prompt_param: &str,
    max_tokens: Option<(u64, &str)>,
    logprobs: Option<usize>,
    model: &TextModel,
) -> Result<Validated, ApiError> {
    if common.stream_options.is_some() && !common.stream {
        return Err(ApiError::invalid("stream_options", "'stream_options' is only allowed when 'stream' is true"));
    }
    let n = match common.n.unwrap_or(1) {
        n @ 1..=MAX_N => n as usize,
        n => return Err(ApiError::invalid("n", format!("'n' must be in [1, {MAX_N}], got {n}"))),
    };
    if prompts.len() > MAX_PROMPTS || prompts.len() * n > MAX_CHOICES {
        let message = format!(
            "at most {MAX_PROMPTS} prompts and {MAX_CHOICES} choices (prompts times n) per request, got {} prompts \
             with n = {n}",
            prompts.len()
        );
        return Err(ApiError::invalid(prompt_param, message));
    }
    let budgets = prompts
        .iter()
        .map(|p| budget(p.ids.len(), max_tokens, model.context, prompt_param))
        .collect::<Result<Vec<_>, _>>()?;
    let sampling = sampling(&common)?;
    if common.stop.len() > MAX_STOP_STRINGS {
        let message = format!("at most {MAX_STOP_STRINGS} stop strings are allowed, got {}", common.stop.len());
        return Err(ApiError::invalid("stop", message));
    }
    let vocab = model.tokenizer.vocab_size();
    let rules = logit_rules(common.presence_penalty, common.frequency_penalty, common.logit_bias.as_ref(), vocab)?;
    let grammar = common.response_format.as_ref().and_then(ResponseFormat::spec);
    let stop_strings: Vec<String> = common.stop.into_iter().filter(|s| !s.is_empty()).collect();
    let include_usage = common.stream_options.is_some_and(|o| o.include_usage);
    let reply = ReplyOptions {
        stream: common.stream,
        include_usage,
        logprobs: logprobs.is_some(),
        n,
        tools: None,
        reasoning: None,
    };
    let (mut lanes, mut prefixes) = (Vec::with_capacity(prompts.len() * n), Vec::with_capacity(prompts.len() * n));
    for (prompt, max_tokens) in prompts.into_iter().zip(budgets) {
        for _ in 0..n {
            let index = lanes.len() as u64;
            let constraint = grammar.as_ref().map(|spec| constraint(&model.grammars, spec)).transpose()?;
            lanes.push(TokenWork {
                prompt: prompt.ids.clone(),
                max_tokens,
                // Choice i draws as a request of its own with seed + i would.
                sampling: SamplingParams { seed: sampling.seed.wrapping_add(index), ..sampling.clone() },
                stop_ids: model.tokenizer.eos_ids().to_vec(),
                stop_strings: stop_strings.clone(),
                logprobs,
                cache: common.cache.unwrap_or(true),
                keep_reply: false,
                draft: common.draft.unwrap_or(true),
                rules: rules.clone(),
                constraint,
                output: Output::Text(Box::new(TokenizerDecoder::new(Arc::clone(&model.tokenizer)))),
            });
            prefixes.push(prompt.echo.clone().unwrap_or_default());
        }
    }
    Ok(Validated { lanes, prefixes, reply })
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
        None => Ok(crate::server::random_u64()),
        Some(n) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|v| v as u64))
            .ok_or_else(|| ApiError::invalid("seed", format!("'seed' must be an integer, got {n}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::test_support::tokenizer;

    const CONTEXT: usize = 32;

    fn chat(body: serde_json::Value) -> Result<Validated, ApiError> {
        let request = ChatCompletionRequest::from_json(body.to_string().as_bytes())?;
        validate_chat(request, &model())
    }

    fn completion(body: serde_json::Value) -> Result<Validated, ApiError> {
        let request = CompletionRequest::from_json(body.to_string().as_bytes())?;
        validate_completion(request, &model())
    }

    fn model() -> TextModel {
        TextModel { tokenizer: tokenizer(), grammars: Grammars::new(tokenizer()), context: CONTEXT }
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
        assert_eq!(valid.lanes[0].prompt, expected);
        assert_eq!(valid.lanes[0].max_tokens, CONTEXT - expected.len());
        assert_eq!(valid.lanes[0].stop_ids, tok.eos_ids());
        assert_eq!(valid.lanes[0].logprobs, None);
        let expected =
            ReplyOptions { stream: false, include_usage: false, logprobs: false, n: 1, tools: None, reasoning: None };
        assert_eq!(valid.reply, expected);
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
        let s = &valid.lanes[0].sampling;
        assert_eq!((s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty), (0.5, 0.9, 7, 0.1, 1.1));
        assert_eq!(s.seed, u64::MAX);
        assert_eq!(valid.lanes[0].stop_strings, ["a"]);
        assert_eq!(valid.lanes[0].max_tokens, 5);
        assert_eq!(valid.lanes[0].logprobs, Some(3));
        let expected =
            ReplyOptions { stream: true, include_usage: true, logprobs: true, n: 1, tools: None, reasoning: None };
        assert_eq!(valid.reply, expected);
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
            (serde_json::json!({"n": 0}), "n"),
            (serde_json::json!({"n": 9}), "n"),
            (serde_json::json!({"n": -1}), "n"),
            (serde_json::json!({"presence_penalty": 2.5}), "presence_penalty"),
            (serde_json::json!({"frequency_penalty": -3}), "frequency_penalty"),
            (serde_json::json!({"logit_bias": {"1": 500}}), "logit_bias"),
            (serde_json::json!({"logit_bias": {"99999": 5}}), "logit_bias"),
            (serde_json::json!({"logit_bias": [1]}), "logit_bias"),
            (serde_json::json!({"response_format": {"type": "yaml"}}), "response_format"),
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
        let num_prompt = chat(hello()).expect("valid").lanes[0].prompt.len();
        let (param, message) = rejected(chat(with(hello(), serde_json::json!({"max_tokens": 1000}))));
        assert_eq!(param, "max_tokens");
        assert_eq!(
            message,
            format!("the prompt has {num_prompt} tokens; with max_tokens 1000 it exceeds the context of {CONTEXT}")
        );
        let exact = with(hello(), serde_json::json!({"max_tokens": CONTEXT - num_prompt}));
        assert_eq!(chat(exact).expect("fits exactly").lanes[0].max_tokens, CONTEXT - num_prompt);
        let long = vec!["hello"; CONTEXT].join(" ");
        let (param, message) = rejected(completion(serde_json::json!({"prompt": long})));
        assert_eq!(param, "prompt");
        assert!(message.contains(&format!("context of {CONTEXT}")), "{message}");
    }

    #[test]
    fn test_completion_prompts() {
        let valid = completion(serde_json::json!({"prompt": "hello", "logprobs": 2})).expect("valid");
        assert_eq!(valid.lanes[0].prompt, tokenizer().encode("hello", true).expect("encodes"));
        assert_eq!(valid.lanes[0].logprobs, Some(2));
        let ids = completion(serde_json::json!({"prompt": [3, 4]})).expect("ids");
        assert_eq!(ids.lanes[0].prompt, [3, 4]);
        assert_eq!(rejected(completion(serde_json::json!({"prompt": ""}))).0, "prompt");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": [99999]}))).0, "prompt");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": "x", "logprobs": 6}))).0, "logprobs");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": "x", "best_of": 2}))).0, "best_of");
        assert_eq!(rejected(completion(serde_json::json!({"prompt": "x", "n": 2, "best_of": 3}))).0, "best_of");
        let (param, message) = rejected(completion(serde_json::json!({"prompt": "x", "echo": true, "logprobs": 0})));
        assert_eq!(param, "echo");
        assert!(message.contains("prompt's log-probabilities"), "{message}");
        let valid = completion(serde_json::json!({"prompt": "x", "max_completion_tokens": 3, "max_tokens": 9}));
        assert_eq!(valid.expect("valid").lanes[0].max_tokens, 3);
        let over = serde_json::json!({"prompt": "x", "max_completion_tokens": 100});
        assert_eq!(rejected(completion(over)).0, "max_completion_tokens");
    }

    #[test]
    fn test_choices_are_lanes_with_consecutive_seeds() {
        let body = with(hello(), serde_json::json!({"n": 3, "seed": -2, "best_of": 3}));
        let valid = chat(body).expect("valid");
        let seeds: Vec<u64> = valid.lanes.iter().map(|lane| lane.sampling.seed).collect();
        assert_eq!(seeds, [u64::MAX - 1, u64::MAX, 0]);
        assert!(valid.lanes.iter().all(|lane| lane.prompt == valid.lanes[0].prompt));
        assert_eq!(valid.reply.n, 3);
        assert_eq!(valid.prefixes, ["", "", ""]);
    }

    #[test]
    fn test_list_prompts_fan_out_prompt_major() {
        let body = serde_json::json!({"prompt": ["hello", [4, 4]], "n": 2, "seed": 10, "echo": true});
        let valid = completion(body).expect("valid");
        let prompts: Vec<&[u32]> = valid.lanes.iter().map(|lane| lane.prompt.as_slice()).collect();
        let hello = tokenizer().encode("hello", true).expect("encodes");
        assert_eq!(prompts, [&hello[..], &hello[..], &[4, 4], &[4, 4]]);
        let seeds: Vec<u64> = valid.lanes.iter().map(|lane| lane.sampling.seed).collect();
        assert_eq!(seeds, [10, 11, 12, 13]);
        assert_eq!(valid.prefixes, ["hello", "hello", "world world", "world world"]);
        let many = serde_json::json!({"prompt": vec!["hello"; 17]});
        assert_eq!(rejected(completion(many)).0, "prompt");
        let wide = serde_json::json!({"prompt": vec!["hello"; 9], "n": 8});
        assert_eq!(rejected(completion(wide)).0, "prompt");
        assert_eq!(completion(serde_json::json!({"prompt": vec!["hello"; 8], "n": 8})).expect("64").lanes.len(), 64);
        assert_eq!(rejected(completion(serde_json::json!({"prompt": ["hello", ""]}))).0, "prompt");
    }

    #[test]
    fn test_rules_reach_every_lane() {
        let body = with(
            hello(),
            serde_json::json!({"n": 2, "presence_penalty": 0.5, "frequency_penalty": -1,
                "logit_bias": {"4": 100, "3": -100}}),
        );
        let valid = chat(body).expect("valid");
        for lane in &valid.lanes {
            assert_eq!(lane.rules.bias, [(3, -100.0), (4, 100.0)]);
            assert_eq!((lane.rules.presence, lane.rules.frequency), (0.5, -1.0));
            assert!(lane.constraint.is_none());
        }
        let text = with(hello(), serde_json::json!({"response_format": {"type": "text"}}));
        assert!(chat(text).expect("valid").lanes[0].constraint.is_none());
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
