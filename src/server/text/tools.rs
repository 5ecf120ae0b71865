//! OpenAI tool calling: the request's `tools` and `tool_choice`, the prompt and grammar they give a lane, and
//! the calls parsed out of its text, whole or streamed.

use serde_json::{json, Value};
use tensorfold_engine::boundary::TokenWork;
use tensorfold_engine::text::chat::{ChatMessage, FunctionCall, ToolCall};
use tensorfold_engine::text::grammar::{GrammarSpec, Grammars};
use tensorfold_engine::text::tool_calls::{
    call_grammar, calls_as_text, describe_tools, CallStream, ParsedCall, Piece, ToolFormat, ToolPlan,
};

use super::openai::{
    AssistantMessage, Delta, Fields, FunctionBody, FunctionDelta, RequestMessage, Role, ToolCallBody, ToolCallDelta,
};
use crate::server::error::ApiError;

/// OpenAI's rule for function names.
const MAX_NAME_LEN: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The request's tools, each checked, and how the model may use them.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// Each tool as `{"type": "function", "function": {"name", "description"?, "parameters"}}`, for the template.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    fn schemas(&self) -> impl Iterator<Item = (String, Value)> + '_ {
        self.tools.iter().map(|tool| {
            let function = &tool["function"];
            (function["name"].as_str().unwrap_or_default().to_string(), function["parameters"].clone())
        })
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`, or the legacy `functions` and `function_call`; `None` when
/// no tools are given.
pub(super) fn parse_tools(fields: &mut Fields) -> Result<Option<ToolRequest>, ApiError> {
    let (tools, choice) = match (fields.take_value("tools"), fields.take_value("functions")) {
        (Some(tools), _) => (parse_list(tools, "tools", true)?, fields.take_value("tool_choice")),
        (None, Some(functions)) => {
            let choice = fields.take_value("function_call").map(|c| match c {
                Value::Object(named) => json!({"type": "function", "function": named}),
                other => other,
            });
            (parse_list(functions, "functions", false)?, choice)
        }
        (None, None) => (Vec::new(), fields.take_value("tool_choice")),
    };
    let parallel = match fields.take_value("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(on)) => on,
        Some(_) => return Err(ApiError::invalid("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")),
    };
    let choice = parse_choice(choice, &tools)?;
    if tools.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(None),
            _ => Err(ApiError::invalid("tool_choice", "'tool_choice' needs 'tools' to choose from")),
        };
    }
    Ok(Some(ToolRequest { tools, choice, parallel }))
}

/// Each entry checked and normalized; `wrapped` entries are `{"type": "function", "function": {..}}`.
fn parse_list(value: Value, param: &str, wrapped: bool) -> Result<Vec<Value>, ApiError> {
    let Value::Array(items) = value else {
        return Err(ApiError::invalid(param, format!("'{param}' must be a list")));
    };
    let mut names: Vec<String> = Vec::new();
    let mut tools = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("{param}[{i}]");
        let function = if wrapped {
            let Value::Object(mut tool) = item else {
                return Err(ApiError::invalid(at.clone(), format!("{at} must be an object")));
            };
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid(format!("{at}.type"), format!("{at}.type must be 'function'")));
            }
            let function = tool.remove("function").unwrap_or(Value::Null);
            (function, format!("{at}.function"))
        } else {
            (item, at)
        };
        let (function, at) = function;
        let Value::Object(function) = function else {
            return Err(ApiError::invalid(at.clone(), format!("{at} must be an object")));
        };
        let name = match function.get("name") {
            Some(Value::String(name)) if valid_name(name) => name.clone(),
            _ => {
                let message = format!("{at}.name must be a string of letters, digits, '_' and '-', at most 64 long");
                return Err(ApiError::invalid(format!("{at}.name"), message));
            }
        };
        if names.contains(&name) {
            let message = format!("{at}.name '{name}' is given twice");
            return Err(ApiError::invalid(format!("{at}.name"), message));
        }
        let mut out = serde_json::Map::new();
        out.insert("name".into(), Value::String(name.clone()));
        match function.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => {
                out.insert("description".into(), Value::String(text.clone()));
            }
            Some(_) => {
                let message = format!("{at}.description must be a string");
                return Err(ApiError::invalid(format!("{at}.description"), message));
            }
        }
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(schema @ Value::Object(_)) => schema.clone(),
            Some(_) => {
                let message = format!("{at}.parameters must be a JSON schema object");
                return Err(ApiError::invalid(format!("{at}.parameters"), message));
            }
        };
        out.insert("parameters".into(), parameters);
        names.push(name);
        tools.push(json!({"type": "function", "function": out}));
    }
    Ok(tools)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn parse_choice(choice: Option<Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let wrong = || {
        let message = "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": \
                       {\"name\": ...}}";
        ApiError::invalid("tool_choice", message)
    };
    match choice {
        None => Ok(ToolChoice::Auto),
        Some(Value::String(word)) => match word.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            _ => Err(wrong()),
        },
        Some(Value::Object(named)) => {
            if named.get("type").and_then(Value::as_str).is_some_and(|t| t != "function") {
                return Err(wrong());
            }
            let name = named.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(wrong)?;
            if !tools.iter().any(|t| t["function"]["name"] == name) {
                let message = format!("'tool_choice' names function '{name}', which is not among 'tools'");
                return Err(ApiError::invalid("tool_choice", message));
            }
            Ok(ToolChoice::Named(name.to_string()))
        }
        Some(_) => Err(wrong()),
    }
}

/// An assistant message's `tool_calls`: `arguments` arrive as JSON text and reach the template as JSON.
pub fn parse_message_calls(at: &str, value: Value) -> Result<Vec<ToolCall>, ApiError> {
    let at = format!("{at}.tool_calls");
    let Value::Array(items) = value else {
        return Err(ApiError::invalid(at.clone(), format!("{at} must be a list")));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(j, call)| {
            let at = format!("{at}[{j}]");
            let field = |path: &str, what: &str| {
                let path = format!("{at}{path}");
                ApiError::invalid(path.clone(), format!("{path} must be {what}"))
            };
            let id = match call.get("id") {
                Some(Value::String(id)) => id.clone(),
                None | Some(Value::Null) => format!("call_{j}"),
                Some(_) => return Err(field(".id", "a string")),
            };
            let function =
                call.get("function").filter(|f| f.is_object()).ok_or_else(|| field(".function", "an object"))?;
            let name =
                function.get("name").and_then(Value::as_str).ok_or_else(|| field(".function.name", "a string"))?;
            let arguments = match function.get("arguments") {
                Some(Value::String(text)) if text.trim().is_empty() => json!({}),
                Some(Value::String(text)) => serde_json::from_str(text)
                    .map_err(|e| field(".function.arguments", &format!("a JSON text ({e})")))?,
                Some(object @ Value::Object(_)) => object.clone(),
                None | Some(Value::Null) => json!({}),
                Some(_) => return Err(field(".function.arguments", "a JSON string")),
            };
            let function = FunctionCall { name: name.to_string(), arguments };
            Ok(ToolCall { id, kind: "function".into(), function })
        })
        .collect()
}

/// A parsed request's messages as the chat template reads them; a tool result without a `name` takes its call's.
pub fn chat_messages(messages: &[RequestMessage]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    for m in messages {
        let mut message = ChatMessage::new(m.role.as_str(), m.content.clone());
        message.tool_calls = (!m.tool_calls.is_empty()).then(|| m.tool_calls.clone());
        message.tool_call_id = m.tool_call_id.clone();
        message.name = m.name.clone().or_else(|| {
            let id = m.tool_call_id.as_deref().filter(|_| m.role == Role::Tool)?;
            let mut calls = out.iter().rev().filter_map(|earlier| earlier.tool_calls.as_ref()).flatten();
            calls.find(|call| call.id == id).map(|call| call.function.name.clone())
        });
        out.push(message);
    }
    out
}

/// What tools change in a chat request: the messages and tools the template gets, the grammar, the reply format.
pub struct ToolSetup {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Vec<Value>>,
    grammar: Option<GrammarSpec>,
    /// How the reply's text is parsed into calls; `None` when it is not.
    pub format: Option<ToolFormat>,
}

impl ToolSetup {
    /// `tools` offered to a model whose chat template is `template`.
    pub fn new(messages: &[RequestMessage], tools: Option<&ToolRequest>, template: &str) -> ToolSetup {
        let mut messages = chat_messages(messages);
        let plan = ToolPlan::for_template(template);
        let has_history = messages.iter().any(|m| m.tool_calls.is_some() || m.role == "tool");
        let Some(request) = tools.filter(|t| t.choice != ToolChoice::None) else {
            if has_history && !plan.template_reads_tools {
                calls_as_text(&mut messages);
            }
            return ToolSetup { messages, tools: None, grammar: None, format: None };
        };
        let tools = if plan.template_reads_tools {
            Some(request.tools.clone())
        } else {
            describe_tools(&mut messages, &request.tools);
            None
        };
        let forced: Vec<(String, Value)> = match &request.choice {
            ToolChoice::Required => request.schemas().collect(),
            ToolChoice::Named(name) => request.schemas().filter(|(n, _)| n == name).collect(),
            ToolChoice::None | ToolChoice::Auto => Vec::new(),
        };
        let parallel = request.parallel && request.choice == ToolChoice::Required;
        let grammar = (!forced.is_empty()).then(|| GrammarSpec::Lark(call_grammar(plan.format, &forced, parallel)));
        ToolSetup { messages, tools, grammar, format: Some(plan.format) }
    }

    /// Gives each lane the forced call's grammar, when `tool_choice` forces one.
    pub fn constrain(&self, lanes: &mut [TokenWork], grammars: &Grammars) -> Result<(), ApiError> {
        let Some(spec) = &self.grammar else { return Ok(()) };
        for lane in lanes {
            if lane.constraint.is_some() {
                let message = "a 'tool_choice' that forces a call cannot be combined with a JSON 'response_format'";
                return Err(ApiError::invalid("tool_choice", message));
            }
            let constraint = grammars.compile(spec).map_err(|e| ApiError::invalid("tools", e.to_string()))?;
            lane.constraint = Some(constraint);
        }
        Ok(())
    }
}

fn call_id() -> String {
    format!("call_{:016x}{:08x}", crate::server::random_u64(), crate::server::random_u64() as u32)
}

fn body(call: ParsedCall) -> ToolCallBody {
    ToolCallBody {
        id: call_id(),
        kind: "function",
        function: FunctionBody { name: call.name, arguments: call.arguments },
    }
}

/// A whole reply's text as OpenAI's `content` (null when empty) and `tool_calls`.
pub fn reply_message(format: ToolFormat, text: &str) -> (Option<String>, Option<Vec<ToolCallBody>>) {
    let (content, calls) = tensorfold_engine::text::tool_calls::parse(format, text);
    let calls = (!calls.is_empty()).then(|| calls.into_iter().map(body).collect());
    (content, calls)
}

/// A chat choice's message and `finish_reason`; with tools in play, the calls parsed out of its text.
pub fn assistant_message(
    tools: Option<ToolFormat>,
    text: String,
    finish: &'static str,
) -> (AssistantMessage, &'static str) {
    let Some(format) = tools else {
        let message = AssistantMessage {
            role: "assistant",
            content: Some(text),
            tool_calls: None,
            reasoning_content: None,
            reasoning: None,
        };
        return (message, finish);
    };
    let (content, tool_calls) = reply_message(format, &text);
    let finish = tool_finish_reason(tool_calls.is_some(), finish);
    (AssistantMessage { role: "assistant", content, tool_calls, reasoning_content: None, reasoning: None }, finish)
}

/// A streamed chat token's deltas: its text as it is without tools, else the content and calls it completes.
pub fn tool_deltas(tools: Option<&mut ToolStream>, text: String) -> Vec<Delta> {
    match tools {
        None => vec![Delta { content: Some(text), ..Delta::default() }],
        Some(stream) => stream.push(&text).into_iter().map(StreamPart::into_delta).collect(),
    }
}

/// `finish_reason` for a reply that made calls: `tool_calls`, unless the length limit cut it.
pub fn tool_finish_reason(made_calls: bool, finish: &'static str) -> &'static str {
    if made_calls && finish != "length" {
        "tool_calls"
    } else {
        finish
    }
}

/// What one streamed choice sends next: content text, or a call.
#[derive(Debug, PartialEq)]
pub enum StreamPart {
    Content(String),
    Call(ToolCallDelta),
}

impl StreamPart {
    pub fn into_delta(self) -> Delta {
        match self {
            StreamPart::Content(text) => Delta { content: Some(text), ..Delta::default() },
            StreamPart::Call(call) => Delta { tool_calls: Some(vec![call]), ..Delta::default() },
        }
    }
}

/// One streamed choice's calls: text that may start a call is held back; each call goes out in one delta.
pub struct ToolStream {
    calls: CallStream,
    num_calls: usize,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream { calls: CallStream::new(format), num_calls: 0 }
    }

    pub fn made_calls(&self) -> bool {
        self.num_calls > 0
    }

    /// The parts a token's text completes.
    pub fn push(&mut self, text: &str) -> Vec<StreamPart> {
        let pieces = self.calls.push(text);
        self.parts(pieces)
    }

    /// Whatever was held back, at the end of generation.
    pub fn finish(&mut self) -> Vec<StreamPart> {
        let pieces = self.calls.finish();
        self.parts(pieces)
    }

    fn parts(&mut self, pieces: Vec<Piece>) -> Vec<StreamPart> {
        pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(text) => StreamPart::Content(text),
                Piece::Call(call) => {
                    let ToolCallBody { id, kind, function } = body(call);
                    let index = self.num_calls;
                    self.num_calls += 1;
                    let function = FunctionDelta { name: Some(function.name), arguments: Some(function.arguments) };
                    StreamPart::Call(ToolCallDelta { index, id: Some(id), kind: Some(kind), function })
                }
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
