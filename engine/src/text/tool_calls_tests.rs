use serde_json::json;

use super::*;
use crate::text::chat::{render_chat_with_tools, FunctionCall, ToolCall};

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall { name: name.into(), arguments: arguments.into() }
}

/// The text pushed in pieces of `size` bytes (on char boundaries), then finished.
fn streamed(format: ToolFormat, text: &str, size: usize) -> Vec<Piece> {
    let mut stream = CallStream::new(format);
    let mut pieces = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = size.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        pieces.extend(stream.push(&rest[..cut]));
        rest = &rest[cut..];
    }
    pieces.extend(stream.finish());
    // Adjacent text pieces are one text, however the stream cut them.
    let mut merged: Vec<Piece> = Vec::new();
    for piece in pieces {
        match (merged.last_mut(), piece) {
            (Some(Piece::Text(last)), Piece::Text(text)) => last.push_str(&text),
            (_, piece) => merged.push(piece),
        }
    }
    merged
}

fn every_cut(format: ToolFormat, text: &str, expected: &[Piece]) {
    for size in [1, 2, 3, 5, 7, 1000] {
        assert_eq!(streamed(format, text, size), expected, "pieces of {size}");
    }
}

#[test]
fn test_hermes_calls_parse_whole_and_streamed() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let (content, calls) = parse(ToolFormat::Hermes, text);
    assert_eq!(content.as_deref(), Some("Let me check.\n"));
    assert_eq!(calls, [call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]);
    let expected = [
        Piece::Text("Let me check.\n".into()),
        Piece::Call(call("get_weather", r#"{"city":"Paris"}"#)),
        Piece::Call(call("get_time", "{}")),
    ];
    every_cut(ToolFormat::Hermes, text, &expected);
}

#[test]
fn test_hermes_malformed_calls_stay_content() {
    let broken = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> after";
    let (content, calls) = parse(ToolFormat::Hermes, broken);
    assert!(calls.is_empty());
    assert_eq!(content.as_deref(), Some(broken));
    every_cut(ToolFormat::Hermes, broken, &[Piece::Text(broken.into())]);
    let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
    assert_eq!(parse(ToolFormat::Hermes, no_name), (Some(no_name.to_string()), vec![]));
    let almost = "a <tool_ca";
    assert_eq!(parse(ToolFormat::Hermes, almost), (Some(almost.to_string()), vec![]));
}

#[test]
fn test_hermes_unclosed_call_that_parses_is_a_call() {
    let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n";
    assert_eq!(parse(ToolFormat::Hermes, text), (None, vec![call("f", r#"{"x":1}"#)]));
}

#[test]
fn test_hermes_plain_text_streams_without_waiting() {
    let mut stream = CallStream::new(ToolFormat::Hermes);
    assert_eq!(stream.push("Hello"), [Piece::Text("Hello".into())]);
    assert_eq!(stream.push(" wor<"), [Piece::Text(" wor".into())]);
    assert_eq!(stream.push("b>"), [Piece::Text("<b>".into())]);
    assert_eq!(stream.push("<tool"), []);
    assert!(!stream.has_calls());
}

#[test]
fn test_llama_calls_parse_whole_and_streamed() {
    let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}";
    let expected =
        [Piece::Call(call("get_weather", r#"{"city":"Paris"}"#)), Piece::Call(call("get_time", r#"{"tz":"UTC"}"#))];
    every_cut(ToolFormat::Llama3Json, text, &expected);
    let bare = "{\"name\": \"f\", \"parameters\": {}}";
    assert_eq!(parse(ToolFormat::Llama3Json, bare), (None, vec![call("f", "{}")]));
}

#[test]
fn test_llama_text_and_malformed_calls_stay_content() {
    let prose = "The weather is {probably} fine.";
    every_cut(ToolFormat::Llama3Json, prose, &[Piece::Text(prose.into())]);
    let json_answer = "{\"answer\": 42}";
    assert_eq!(parse(ToolFormat::Llama3Json, json_answer), (Some(json_answer.to_string()), vec![]));
    let cut_off = "{\"name\": \"f\", \"parameters\": {\"a\": 1";
    assert_eq!(parse(ToolFormat::Llama3Json, cut_off), (Some(cut_off.to_string()), vec![]));
    let mut stream = CallStream::new(ToolFormat::Llama3Json);
    assert_eq!(stream.push("Sure"), [Piece::Text("Sure".into())]);
}

#[test]
fn test_format_follows_the_template() {
    let qwen = ToolPlan::for_template("{%- if tools %}<tools>{% for t in tools %}{% endfor %}<tool_call>");
    assert_eq!(qwen, ToolPlan { format: ToolFormat::Hermes, template_reads_tools: true });
    let llama = ToolPlan::for_template("{%- if tools is not none %}Environment: ipython{% endif %}<|python_tag|>");
    assert_eq!(llama, ToolPlan { format: ToolFormat::Llama3Json, template_reads_tools: true });
    let chatml = ToolPlan::for_template("{% for message in messages %}{{ message.content }}{% endfor %}");
    assert_eq!(chatml, ToolPlan { format: ToolFormat::Hermes, template_reads_tools: false });
    assert!(!mentions_word("my_tools toolsy", "tools"));
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

fn conversation() -> Vec<ChatMessage> {
    let mut assistant = ChatMessage::new("assistant", "");
    assistant.tool_calls = Some(vec![ToolCall {
        id: "call_1".into(),
        kind: "function".into(),
        function: FunctionCall { name: "get_weather".into(), arguments: json!({"city": "Paris"}) },
    }]);
    let mut tool = ChatMessage::new("tool", "{\"temp\": 21}");
    tool.tool_call_id = Some("call_1".into());
    vec![ChatMessage::new("user", "Weather in Paris?"), assistant, tool]
}

/// Qwen 2.5's tool template, cut to what it does with tools, calls and results.
const QWEN: &str = r#"{%- if tools %}<|im_start|>system
# Tools

<tools>
{%- for tool in tools %}
{{- "\n" }}{{- tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "user" %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == "assistant" %}<|im_start|>assistant
{%- if message.content %}{{ "\n" + message.content }}{% endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// Llama 3.1's tool template, cut to its JSON tool-calling path.
const LLAMA: &str = r#"{{- bos_token }}
{%- if tools is not none %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
{%- for t in tools %}
{{ t | tojson(indent=4) }}
{%- endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls is defined %}
{%- set tool_call = message.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>

{{- '{"name": "' + tool_call.name + '", "parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}<|eot_id|>
{%- elif message.role == "tool" or message.role == "ipython" %}<|start_header_id|>ipython<|end_header_id|>

{{- message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{- message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;

#[test]
fn test_qwen_template_renders_tools_calls_and_results() {
    let tools = [weather_tool()];
    let text = render_chat_with_tools(QWEN, &conversation(), Some(&tools[..]), true, "", "").unwrap();
    let expected = "<|im_start|>system\n# Tools\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}</tools><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(text, expected);
    assert_eq!(ToolPlan::for_template(QWEN).format, ToolFormat::Hermes);
}

#[test]
fn test_llama_template_renders_tools_calls_and_results() {
    let tools = [weather_tool()];
    let text = render_chat_with_tools(LLAMA, &conversation(), Some(&tools[..]), true, "<s>", "").unwrap();
    assert!(
        text.starts_with(
            "<s><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython{\n    \"type\": \"function\",\n"
        ),
        "{text}"
    );
    assert!(text.contains("<|start_header_id|>assistant<|end_header_id|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"), "{text}");
    assert!(text.contains("<|start_header_id|>ipython<|end_header_id|>{\"temp\": 21}<|eot_id|>"), "{text}");
    assert!(text.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"), "{text}");
    let without = render_chat_with_tools(LLAMA, &conversation()[..1], None, true, "<s>", "").unwrap();
    assert!(!without.contains("ipython"), "{without}");
    assert_eq!(ToolPlan::for_template(LLAMA).format, ToolFormat::Llama3Json);
}

#[test]
fn test_described_tools_lead_the_system_message_and_calls_become_text() {
    let mut messages = conversation();
    describe_tools(&mut messages, &[weather_tool()]);
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[0].role, "system");
    assert!(messages[0].content.contains("<tools>\n{\"type\":\"function\""), "{}", messages[0].content);
    assert!(messages[0].content.contains("<tool_call></tool_call> XML tags"));
    assert_eq!(
        messages[2].content,
        "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
    );
    assert_eq!(messages[2].tool_calls, None);
    assert_eq!(messages[3], ChatMessage::new("user", "<tool_response>\n{\"temp\": 21}\n</tool_response>"));
    let mut with_system = vec![ChatMessage::new("system", "Be brief.")];
    describe_tools(&mut with_system, &[weather_tool()]);
    assert_eq!(with_system.len(), 1);
    assert!(with_system[0].content.starts_with("Be brief.\n\n# Tools"));
}

#[test]
fn test_call_grammar_names_tools_and_embeds_their_schemas() {
    let tools = [("get_weather".to_string(), json!({"type": "object"})), ("f".to_string(), json!({}))];
    let hermes = call_grammar(ToolFormat::Hermes, &tools, true);
    assert!(hermes.starts_with("start: call (\"\\n\" call)*\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\n"));
    assert!(hermes.contains(r#"{"name": {"const": "get_weather"}, "arguments": {"type":"object"}}"#), "{hermes}");
    let llama = call_grammar(ToolFormat::Llama3Json, &tools[..1], false);
    assert!(llama.starts_with("start: call\ncall: body\nbody: %json {"), "{llama}");
    assert!(llama.contains("\"whitespace_flexible\": false"), "{llama}");
    assert!(llama.contains(r#""required": ["name", "parameters"]"#), "{llama}");
}
