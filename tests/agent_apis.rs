//! The APIs agents speak, end to end: `/v1/responses` through the official `openai` package, a continuation equal
//! to its whole history sent fresh, stored responses that outlive a restart and stay with their key; and
//! `/v1/messages` through the official `anthropic` package.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::server::{request, Response, Server};
use serde_json::{json, Value};

fn call(server: &Server, method: &str, path: &str, key: Option<&str>, body: Option<&Value>) -> Response {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(auth.as_deref().map(|a| ("authorization", a)));
    let body = body.map(Value::to_string);
    request(&server.addr, method, path, &headers, body.as_deref().map(str::as_bytes))
}

fn create(server: &Server, body: &Value) -> Value {
    let response = call(server, "POST", "/v1/responses", None, Some(body));
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()
}

#[test]
fn test_official_openai_client_runs_every_responses_call() {
    let Some(python) = common::python_importing("openai, pydantic") else { return };
    let store = tempfile::tempdir().expect("a directory");
    let path = store.path().join("responses.sqlite3");
    let server = Server::start_with_env(&[], &[("TF_RESPONSES_STORE", path.to_str().expect("UTF-8"))]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/responses_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", server.base_url())])
        .output()
        .expect("running tests/responses_client.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "responses_client.py: {}\n{stdout}\n{stderr}\n{}", output.status, server.stderr());
    for case in ["create", "stream", "parse", "function_calls", "background", "websocket", "stored"] {
        assert!(stdout.contains(&format!("ok   {case}")), "the script ran no {case} case:\n{stdout}");
    }
}

#[test]
fn test_an_openai_agents_sdk_agent_runs_a_tool_through_its_default_responses_model() {
    let Some(python) = common::python_importing("agents, openai") else { return };
    let server = Server::start(&["--no-voice"]);
    let args = ["--base-url", &format!("{}/v1", server.base_url())];
    let last = common::run_python_tool(&python, "tests/agents_sdk.py", &args, || server.stderr());
    assert!(last.starts_with("ok   agent_tool"), "{last}");
}

#[test]
fn test_a_continuation_equals_its_whole_history_sent_fresh() {
    let store = tempfile::tempdir().expect("a directory");
    let path = store.path().join("responses.sqlite3");
    let server = Server::start_with_env(&[], &[("TF_RESPONSES_STORE", path.to_str().expect("UTF-8"))]);
    let sampling = json!({"temperature": 0.9, "seed": 11, "max_output_tokens": 24});
    let with = |mut body: Value| {
        for (k, v) in sampling.as_object().expect("an object") {
            body[k] = v.clone();
        }
        body
    };
    let first_input = "My name is Ada and I keep bees. Say hello.";
    let first = create(&server, &with(json!({"input": first_input})));
    let question = "What do I keep, and what is my name?";
    let resumed = create(&server, &with(json!({"input": question, "previous_response_id": first["id"]})));
    let mut history = vec![json!({"role": "user", "content": first_input})];
    history.extend(first["output"].as_array().expect("output items").iter().cloned());
    history.push(json!({"role": "user", "content": question}));
    let fresh = create(&server, &with(json!({"input": history, "cache": false, "store": false})));
    assert!(resumed["usage"]["input_tokens_details"]["cached_tokens"].as_u64() > Some(0), "{resumed}");
    assert_eq!(fresh["usage"]["input_tokens_details"]["cached_tokens"], 0, "{fresh}");
    assert_eq!(resumed["usage"]["input_tokens"], fresh["usage"]["input_tokens"], "the same prompt");
    assert!(!resumed["output_text"].as_str().unwrap_or_default().is_empty(), "{resumed}");
    assert_eq!(resumed["output_text"], fresh["output_text"], "resumed = fresh, token for token");
}

#[test]
fn test_stored_responses_outlive_a_restart_and_stay_with_their_key() {
    let store = tempfile::tempdir().expect("a directory");
    let path = store.path().join("responses.sqlite3");
    let env = [("TF_RESPONSES_STORE", path.to_str().expect("UTF-8"))];
    let flags = ["--api-key", "alpha,beta", "--no-voice"];
    let server = Server::start_with_env(&flags, &env);
    let body = json!({"input": "Count to three.", "max_output_tokens": 8, "temperature": 0});
    let made = call(&server, "POST", "/v1/responses", Some("alpha"), Some(&body));
    assert_eq!(made.status, 200, "{}", made.text());
    let made = made.json();
    let at = format!("/v1/responses/{}", made["id"].as_str().expect("an id"));
    let other = call(&server, "GET", &at, Some("beta"), None);
    assert_eq!(other.status, 404, "another key must not read it: {}", other.text());
    assert_eq!(other.json()["error"]["param"], "response_id");
    assert_eq!(call(&server, "DELETE", &at, Some("beta"), None).status, 404, "nor delete it");
    let continued = json!({"input": "Again.", "previous_response_id": made["id"], "max_output_tokens": 4});
    assert_eq!(call(&server, "POST", "/v1/responses", Some("beta"), Some(&continued)).status, 404, "nor continue it");
    drop(server);
    let server = Server::start_with_env(&flags, &env);
    let again = call(&server, "GET", &at, Some("alpha"), None);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json(), made, "the stored response after a restart");
    let items = call(&server, "GET", &format!("{at}/input_items?order=asc"), Some("alpha"), None).json();
    assert_eq!(items["data"][0]["content"][0]["text"], "Count to three.", "{items}");
}

#[test]
fn test_official_anthropic_client_runs_messages_with_tools_and_streams() {
    let Some(python) = common::python_importing("anthropic") else { return };
    let server = Server::start(&["--api-key", "gamma", "--no-voice"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/messages_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &server.base_url(), "--api-key", "gamma"])
        .output()
        .expect("running tests/messages_client.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "messages_client.py: {}\n{stdout}\n{stderr}\n{}", output.status, server.stderr());
    for case in ["create", "stop_sequences", "stream", "tools", "errors"] {
        assert!(stdout.contains(&format!("ok   {case}")), "the script ran no {case} case:\n{stdout}");
    }
    let refused = call(&server, "POST", "/v1/messages", Some("wrong"), Some(&json!({"max_tokens": 1})));
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"]["type"], "authentication_error", "Anthropic's shape on its route");
}

#[test]
fn test_a_dropped_stream_frees_its_lane_at_once_on_both_routes() {
    let server = Server::start(&["--no-voice"]);
    let bodies = [
        (
            "/v1/responses",
            json!({"input": "Write a very long story.", "max_output_tokens": 3000, "stream": true,
            "store": false, "temperature": 1.0}),
        ),
        (
            "/v1/messages",
            json!({"messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 3000, "stream": true, "temperature": 1.0}),
        ),
    ];
    for (path, body) in bodies {
        let mut stream = server.stream(path, &body);
        for _ in 0..6 {
            assert!(stream.next_data().expect("reading the stream").is_some(), "{path}: the stream ended early");
        }
        assert_eq!(server.metrics().get("tensorfold_requests_running"), Some(&1.0), "{path}: one lane running");
        drop(stream);
        let deadline = Instant::now() + Duration::from_secs(2);
        while server.metrics().get("tensorfold_requests_running") != Some(&0.0) {
            assert!(Instant::now() < deadline, "{path}: the lane outlived its client");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
