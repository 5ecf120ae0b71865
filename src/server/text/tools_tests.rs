use serde_json::json;

use super::super::openai::ChatCompletionRequest;
use super::*;

fn chat(extra: Value) -> Result<ChatCompletionRequest, ApiError> {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    ChatCompletionRequest::from_json(body.to_string().as_bytes())
}

fn param_of(result: Result<ChatCompletionRequest, ApiError>) -> String {
    match result {
        Err(e @ ApiError::InvalidRequest { .. }) => e.body().error.param.unwrap_or_default(),
        other => panic!("expected a 400, got {other:?}"),
    }
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

#[test]
fn test_tools_parse_with_defaults() {
    let request = chat(json!({"tools": [weather(), {"type": "function", "function": {"name": "now"}}]})).unwrap();
    let tools = request.tools.expect("tools");
    assert_eq!(tools.choice, ToolChoice::Auto);
    assert!(tools.parallel);
    assert_eq!(tools.tools[1]["function"]["parameters"], json!({"type": "object", "properties": {}}));
    let named = json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": false});
    let tools = chat(named).unwrap().tools.expect("tools");
    assert_eq!(tools.choice, ToolChoice::Named("get_weather".into()));
    assert!(!tools.parallel);
    assert_eq!(chat(json!({"tools": [], "tool_choice": "auto"})).unwrap().tools, None);
    let legacy = chat(json!({"functions": [weather()["function"]], "function_call": {"name": "get_weather"}}));
    assert_eq!(legacy.unwrap().tools.expect("tools").choice, ToolChoice::Named("get_weather".into()));
}

#[test]
fn test_bad_tool_shapes_name_the_field() {
    let cases = [
        (json!({"tools": {}}), "tools"),
        (json!({"tools": [1]}), "tools[0]"),
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
        (json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}), "tools[0].function.name"),
        (json!({"tools": [weather(), weather()]}), "tools[1].function.name"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]}),
            "tools[0].function.description",
        ),
        (json!({"tools": [weather()], "tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": [weather()], "parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        (json!({"functions": [{"name": 3}]}), "functions[0].name"),
    ];
    for (extra, param) in cases {
        assert_eq!(param_of(chat(extra.clone())), param, "{extra}");
    }
}

#[test]
fn test_tool_messages_and_assistant_calls_parse() {
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "21 C"},
    ]);
    let request = chat(json!({"messages": messages})).unwrap();
    assert_eq!(request.messages[1].tool_calls[0].function.arguments, json!({"city": "Paris"}));
    assert_eq!(request.messages[2].role, Role::Tool);
    let rendered = chat_messages(&request.messages);
    assert_eq!(rendered[2].name.as_deref(), Some("get_weather"));
    assert_eq!(rendered[2].tool_call_id.as_deref(), Some("call_9"));
    let bad_arguments = json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "f", "arguments": "{not json"}}]}]);
    assert_eq!(param_of(chat(json!({"messages": bad_arguments}))), "messages[0].tool_calls[0].function.arguments");
    let misplaced = json!([{"role": "user", "content": "x", "tool_calls": []}]);
    assert_eq!(param_of(chat(json!({"messages": misplaced}))), "messages[0].tool_calls");
    let no_id = json!([{"role": "tool", "content": "x"}]);
    assert_eq!(param_of(chat(json!({"messages": no_id}))), "messages[0].tool_call_id");
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endfor %}";
const QWENISH: &str =
    "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}<tool_call>";

#[test]
fn test_setup_describes_tools_to_a_template_that_never_reads_them() {
    let request = chat(json!({"tools": [weather()], "tool_choice": "required"})).unwrap();
    let setup = ToolSetup::new(&request.messages, request.tools.as_ref(), CHATML);
    assert_eq!(setup.tools, None);
    assert_eq!(setup.format, Some(ToolFormat::Hermes));
    assert!(setup.messages[0].content.contains("\"name\":\"get_weather\""), "{}", setup.messages[0].content);
    let Some(GrammarSpec::Lark(grammar)) = &setup.grammar else { panic!("a forced call has a grammar") };
    assert!(grammar.contains("(\"\\n\" call)*"), "{grammar}");

    let setup = ToolSetup::new(&request.messages, request.tools.as_ref(), QWENISH);
    assert_eq!(setup.tools.as_deref(), Some(&[request.tools.as_ref().unwrap().tools[0].clone()][..]));
    assert_eq!(setup.messages.len(), 1);

    let none = chat(json!({"tools": [weather()], "tool_choice": "none"})).unwrap();
    let setup = ToolSetup::new(&none.messages, none.tools.as_ref(), QWENISH);
    assert_eq!((setup.tools, setup.format, setup.grammar), (None, None, None));
    let auto = chat(json!({"tools": [weather()]})).unwrap();
    assert_eq!(ToolSetup::new(&auto.messages, auto.tools.as_ref(), QWENISH).grammar, None);
}

#[test]
fn test_reply_message_splits_content_and_calls() {
    let text = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (message, finish) = assistant_message(Some(ToolFormat::Hermes), text.into(), "stop");
    assert_eq!(finish, "tool_calls");
    assert_eq!(message.content.as_deref(), Some("Checking."));
    let calls = message.tool_calls.expect("calls");
    assert!(calls[0].id.starts_with("call_") && calls[0].id.len() > 10);
    assert_eq!(
        (calls[0].function.name.as_str(), calls[0].function.arguments.as_str()),
        ("get_weather", r#"{"city":"Paris"}"#)
    );
    let json = serde_json::to_value(
        assistant_message(Some(ToolFormat::Hermes), "<tool_call>{\"name\": \"f\"}</tool_call>".into(), "stop").0,
    )
    .unwrap();
    assert_eq!(json["content"], Value::Null);
    assert_eq!(json["tool_calls"][0]["type"], "function");
    assert_eq!(json["tool_calls"][0]["function"]["arguments"], "{}");
    let (plain, finish) = assistant_message(Some(ToolFormat::Hermes), "just text".into(), "stop");
    assert_eq!((plain.content.as_deref(), plain.tool_calls.is_none(), finish), (Some("just text"), true, "stop"));
    let (_, cut) =
        assistant_message(Some(ToolFormat::Hermes), "<tool_call>{\"name\": \"f\"}</tool_call>".into(), "length");
    assert_eq!(cut, "length");
}

#[test]
fn test_stream_holds_back_calls_and_sends_each_whole() {
    let mut stream = ToolStream::new(ToolFormat::Hermes);
    let mut deltas: Vec<Value> = Vec::new();
    for piece in
        ["Sure. <tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"]
    {
        deltas.extend(tool_deltas(Some(&mut stream), piece.into()).iter().map(|d| serde_json::to_value(d).unwrap()));
    }
    deltas.extend(stream.finish().into_iter().map(|p| serde_json::to_value(p.into_delta()).unwrap()));
    assert_eq!(deltas.len(), 2, "{deltas:?}");
    assert_eq!(deltas[0], json!({"content": "Sure. "}));
    let call = &deltas[1]["tool_calls"][0];
    assert_eq!((call["index"].clone(), call["type"].clone()), (json!(0), json!("function")));
    assert_eq!(call["function"], json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}));
    assert!(stream.made_calls());
    assert_eq!(tool_deltas(None, "x".into()).len(), 1);
}
