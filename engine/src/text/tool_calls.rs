//! Tool calls in a model's text: the format its chat template teaches, the calls parsed out of whole or
//! streamed text, and the grammar that forces a call.
//!
//! The format is chosen from the template's text: one that writes `<tool_call>` (Qwen 2.5/3, Hermes) is
//! `Hermes`; one that writes `<|python_tag|>` or `Environment: ipython` (Llama 3.x) is `Llama3Json`. Either
//! gets the tools through its own `tools` variable when it reads one. Any other template (SmolLM2's, which
//! never reads `tools`) gets the tools described in a system message in the Hermes style, and Hermes parsing.

use serde_json::{json, Value};

use super::chat::ChatMessage;

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Llama 3.x: `{"name": .., "parameters": {..}}`, optionally after `<|python_tag|>`, several joined by `;`.
    Llama3Json,
    /// Qwen 2.5/3 and Hermes: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>` per call.
    Hermes,
}

/// How a template takes tools, and how its model writes calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolPlan {
    pub format: ToolFormat,
    /// The template renders `tools` itself; otherwise `describe_tools` puts them in a system message.
    pub template_reads_tools: bool,
}

impl ToolPlan {
    pub fn for_template(template: &str) -> ToolPlan {
        let reads_tools = mentions_word(template, "tools");
        if template.contains(HERMES_OPEN) {
            return ToolPlan { format: ToolFormat::Hermes, template_reads_tools: reads_tools };
        }
        if template.contains(PYTHON_TAG) || template.contains("Environment: ipython") {
            return ToolPlan { format: ToolFormat::Llama3Json, template_reads_tools: reads_tools };
        }
        ToolPlan { format: ToolFormat::Hermes, template_reads_tools: false }
    }
}

/// Whether `word` occurs with no identifier character on either side.
fn mentions_word(text: &str, word: &str) -> bool {
    let is_ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.match_indices(word)
        .any(|(at, _)| !is_ident(text[..at].chars().next_back()) && !is_ident(text[at + word.len()..].chars().next()))
}

/// For a template that never reads `tools`: the tools as a Hermes system prompt, calls and results as text.
pub fn describe_tools(messages: &mut Vec<ChatMessage>, tools: &[Value]) {
    let mut prompt = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with \
         function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        prompt.push('\n');
        prompt.push_str(&tool.to_string());
    }
    prompt.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    calls_as_text(messages);
    match messages.first_mut() {
        Some(first) if first.role == "system" => first.content = format!("{}\n\n{prompt}", first.content),
        _ => messages.insert(0, ChatMessage::new("system", prompt)),
    }
}

/// Earlier calls and their results written into the messages' text in the Hermes style, for a template that
/// reads neither.
pub fn calls_as_text(messages: &mut [ChatMessage]) {
    for message in messages.iter_mut() {
        if let Some(calls) = message.tool_calls.take() {
            for call in calls {
                let body = json!({"name": call.function.name, "arguments": call.function.arguments});
                let sep = if message.content.is_empty() { "" } else { "\n" };
                message.content = format!("{}{sep}{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}", message.content);
            }
        }
        if message.role == "tool" {
            let text = format!("<tool_response>\n{}\n</tool_response>", message.content);
            *message = ChatMessage::new("user", text);
        }
    }
}

/// One call as the model wrote it; `arguments` is JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What a stream of text turns into, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Call(ParsedCall),
}

/// The whole text's content (`None` when only whitespace is left) and calls.
pub fn parse(format: ToolFormat, text: &str) -> (Option<String>, Vec<ParsedCall>) {
    let mut stream = CallStream::new(format);
    let mut pieces = stream.push(text);
    pieces.extend(stream.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => content.push_str(&text),
            Piece::Call(call) => calls.push(call),
        }
    }
    let content = (!content.trim().is_empty()).then_some(content);
    (content, calls)
}

/// Separates calls from text as text arrives: text that may start a call is held back until it is one or not.
pub struct CallStream {
    format: ToolFormat,
    held: String,
    /// Inside `<tool_call>` (Hermes), or past a leading `{` or `<|python_tag|>` (Llama).
    in_call: bool,
    num_calls: usize,
    /// Llama's calls come only at the start of the reply; once text is out, the rest is text.
    text_only: bool,
}

impl CallStream {
    pub fn new(format: ToolFormat) -> CallStream {
        CallStream { format, held: String::new(), in_call: false, num_calls: 0, text_only: false }
    }

    /// Whether a call has been seen.
    pub fn has_calls(&self) -> bool {
        self.num_calls > 0
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        match self.format {
            ToolFormat::Hermes => self.hermes(&mut out, false),
            ToolFormat::Llama3Json => self.llama(&mut out, false),
        }
        out
    }

    /// Whatever is held: a call cut off where it parses anyway, else text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        match self.format {
            ToolFormat::Hermes => self.hermes(&mut out, true),
            ToolFormat::Llama3Json => self.llama(&mut out, true),
        }
        out
    }

    fn text(&mut self, out: &mut Vec<Piece>, text: String) {
        // Whitespace between and after calls is layout, not content.
        if text.is_empty() || (self.num_calls > 0 && text.trim().is_empty()) {
            return;
        }
        match out.last_mut() {
            Some(Piece::Text(last)) => last.push_str(&text),
            _ => out.push(Piece::Text(text)),
        }
    }

    fn call(&mut self, out: &mut Vec<Piece>, call: ParsedCall) {
        self.num_calls += 1;
        out.push(Piece::Call(call));
    }

    fn hermes(&mut self, out: &mut Vec<Piece>, at_end: bool) {
        loop {
            if self.in_call {
                let Some(end) = self.held.find(HERMES_CLOSE) else {
                    if at_end {
                        let rest = std::mem::take(&mut self.held);
                        self.in_call = false;
                        match call_from_json(rest.trim(), "arguments") {
                            Some(call) => self.call(out, call),
                            None => self.text(out, format!("{HERMES_OPEN}{rest}")),
                        }
                    }
                    return;
                };
                let body: String = self.held.drain(..end + HERMES_CLOSE.len()).collect();
                self.in_call = false;
                let inner = &body[..end];
                match call_from_json(inner.trim(), "arguments") {
                    Some(call) => self.call(out, call),
                    None => self.text(out, format!("{HERMES_OPEN}{body}")),
                }
                continue;
            }
            if let Some(start) = self.held.find(HERMES_OPEN) {
                let before = self.held[..start].to_string();
                self.held.drain(..start + HERMES_OPEN.len());
                self.text(out, before);
                self.in_call = true;
                continue;
            }
            let keep = if at_end { 0 } else { partial_suffix(&self.held, HERMES_OPEN) };
            let ready = self.held.len() - keep;
            let text: String = self.held.drain(..ready).collect();
            self.text(out, text);
            return;
        }
    }

    fn llama(&mut self, out: &mut Vec<Piece>, at_end: bool) {
        if self.text_only {
            let text = std::mem::take(&mut self.held);
            return self.text(out, text);
        }
        if !self.in_call {
            let start = self.held.trim_start();
            if start.starts_with('{') || start.starts_with(PYTHON_TAG) {
                self.in_call = true;
            } else if at_end || !(start.is_empty() || PYTHON_TAG.starts_with(start)) {
                self.text_only = true;
                let text = std::mem::take(&mut self.held);
                return self.text(out, text);
            } else {
                return;
            }
        }
        // Complete calls go out as they close; whatever fails to parse is text from there on.
        loop {
            let rest = self.held.trim_start();
            let rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest).trim_start();
            let rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
            if rest.is_empty() {
                if at_end {
                    self.held.clear();
                }
                return;
            }
            let offset = self.held.len() - rest.len();
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let next = values.next().map(|parsed| parsed.map(|value| (value, values.byte_offset())));
            match next {
                Some(Ok((value, used))) => match call_from_value(&value, "parameters") {
                    Some(call) => {
                        self.held.drain(..offset + used);
                        self.call(out, call);
                    }
                    None => return self.give_up(out),
                },
                Some(Err(e)) if e.is_eof() && !at_end => return,
                _ => return self.give_up(out),
            }
        }
    }

    fn give_up(&mut self, out: &mut Vec<Piece>) {
        self.text_only = true;
        self.in_call = false;
        let text = std::mem::take(&mut self.held);
        self.text(out, text);
    }
}

/// How many bytes at the end of `text` could begin `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

fn call_from_json(text: &str, arguments_key: &str) -> Option<ParsedCall> {
    call_from_value(&serde_json::from_str(text).ok()?, arguments_key)
}

/// `{"name": "..", "<arguments_key>": {..}}`; both keys are taken in either format, as models mix them.
fn call_from_value(value: &Value, arguments_key: &str) -> Option<ParsedCall> {
    let name = value.get("name")?.as_str()?.to_string();
    let other = if arguments_key == "arguments" { "parameters" } else { "arguments" };
    let arguments = match value.get(arguments_key).or_else(|| value.get(other)) {
        None => "{}".to_string(),
        Some(Value::Object(map)) => Value::Object(map.clone()).to_string(),
        // Some models write the arguments as a JSON string.
        Some(Value::String(text)) if serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()) => text.clone(),
        Some(_) => return None,
    };
    Some(ParsedCall { name, arguments })
}

/// The Lark grammar (llguidance) that forces one call, or several when `parallel`, to one of `tools`:
/// (name, parameters schema) pairs.
pub fn call_grammar(format: ToolFormat, tools: &[(String, Value)], parallel: bool) -> String {
    let key = match format {
        ToolFormat::Hermes => "arguments",
        ToolFormat::Llama3Json => "parameters",
    };
    let choices: Vec<String> = tools
        .iter()
        .map(|(name, parameters)| {
            let name = Value::String(name.clone());
            format!(
                r#"{{"type": "object", "properties": {{"name": {{"const": {name}}}, "{key}": {parameters}}}, "required": ["name", "{key}"], "additionalProperties": false}}"#
            )
        })
        .collect();
    // One space after separators and no other whitespace, so a model cannot pad a call forever.
    let options = r#""x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;
    let schema = format!(r#"{{{options}, "anyOf": [{}]}}"#, choices.join(", "));
    let (call, separator) = match format {
        ToolFormat::Hermes => (r#""<tool_call>\n" body "\n</tool_call>""#, r#""\n""#),
        ToolFormat::Llama3Json => ("body", r#""; ""#),
    };
    let start = if parallel { format!("call ({separator} call)*") } else { "call".to_string() };
    format!("start: {start}\ncall: {call}\nbody: %json {schema}\n")
}

#[cfg(test)]
#[path = "tool_calls_tests.rs"]
mod tests;
