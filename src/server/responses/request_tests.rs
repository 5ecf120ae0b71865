use serde_json::json;

use super::*;

fn parsed(body: Value) -> Result<(ResponseParams, ChatCompletionRequest), ApiError> {
    let (params, chat) = parse(body.to_string().as_bytes())?;
    let items = params.input.clone();
    let request = chat_request(params.instructions.as_deref(), &items, chat)?;
    Ok((params, request))
}

fn param_of<T: std::fmt::Debug>(result: Result<T, ApiError>) -> Option<String> {
    match result {
        Err(ApiError::InvalidRequest { param, .. }) => param,
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[test]
fn test_a_string_input_is_one_user_message_after_the_instructions() {
    let (params, chat) =
        parsed(json!({"input": "hi", "instructions": "be brief", "max_output_tokens": 9})).expect("ok");
    assert!(params.store, "stored by default, as OpenAI's");
    let roles: Vec<_> = chat.messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect();
    assert_eq!(roles, vec![("system", "be brief"), ("user", "hi")]);
    assert_eq!(chat.max_completion_tokens, Some(9));
}

#[test]
fn test_calls_join_the_assistant_message_before_them_and_outputs_are_tool_messages() {
    let input = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
        {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": "{\"city\":\"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
        {"type": "reasoning", "summary": []},
    ]);
    let (_, chat) = parsed(json!({"input": input})).expect("ok");
    assert_eq!(chat.messages.len(), 3);
    assert_eq!(chat.messages[1].content, "Checking.");
    let ids: Vec<_> = chat.messages[1].tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, vec!["call_1", "call_2"]);
    assert_eq!(chat.messages[2].tool_call_id.as_deref(), Some("call_1"));
}

#[test]
fn test_flat_tools_and_text_format_reach_the_chat_request() {
    let tools = json!([{"type": "function", "name": "f", "parameters": {"type": "object"}}]);
    let format = json!({"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true});
    let body = json!({"input": "hi", "tools": tools, "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": format}});
    let (params, chat) = parsed(body).expect("ok");
    let request = chat.tools.expect("tools");
    assert_eq!(request.tools[0]["function"]["name"], "f");
    assert!(matches!(chat.common.response_format, Some(ResponseFormat::JsonSchema(_))));
    assert_eq!(params.text_format, format);
}

#[test]
fn test_errors_name_the_responses_field() {
    assert_eq!(param_of(parsed(json!({}))).as_deref(), Some("input"));
    assert_eq!(param_of(parsed(json!({"input": 3}))).as_deref(), Some("input"));
    assert_eq!(param_of(parsed(json!({"input": [{"type": "input_image"}]}))).as_deref(), Some("input[0].type"));
    let tools = json!([{"type": "web_search"}]);
    assert_eq!(param_of(parsed(json!({"input": "hi", "tools": tools}))).as_deref(), Some("tools[0].type"));
    let bad_name = json!([{"type": "function", "name": "no spaces"}]);
    assert_eq!(param_of(parsed(json!({"input": "hi", "tools": bad_name}))).as_deref(), Some("tools[0].name"));
    let format = json!({"format": {"type": "yaml"}});
    assert_eq!(param_of(parsed(json!({"input": "hi", "text": format}))).as_deref(), Some("text.format.type"));
    assert_eq!(param_of(parsed(json!({"input": "hi", "temperature": "hot"}))).as_deref(), Some("temperature"));
    let background = json!({"input": "hi", "background": true, "store": false});
    assert_eq!(param_of(parsed(background)).as_deref(), Some("background"));
}
