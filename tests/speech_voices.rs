//! OpenAI's voice names on `/v1/audio/speech`, the `/v1/audio/voices` listing, and `instructions` taken and ignored.

mod common;

use std::path::{Path, PathBuf};

use common::server::Server;
use serde_json::{json, Value};

const SPEECH: &str = "/v1/audio/speech";
const VOICES: &str = "/v1/audio/voices";
const OPENAI_VOICES: [&str; 11] =
    ["alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse"];

fn drama_dir() -> PathBuf {
    let committed = || Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama");
    std::env::var_os("TF_TEST_DRAMA").map_or_else(committed, PathBuf::from)
}

fn on_device() -> bool {
    std::env::var_os("TF_TEST_DEVICE").is_some()
}

/// Drama as the text and speech model, then the default voice (left out on a test device).
fn server() -> Server {
    let dir = drama_dir();
    Server::start_with_model(&dir, &["--speech-model", dir.to_str().expect("a UTF-8 path")])
}

fn pcm(server: &Server, model: &str, voice: &str) -> Vec<u8> {
    let body = json!({"model": model, "input": "Hello there, how are you today?", "voice": voice, "seed": 3,
                      "response_format": "pcm"});
    let response = server.post_json(SPEECH, &body);
    assert_eq!(response.status, 200, "{body}: {}", response.text());
    assert!(!response.body.is_empty(), "{body}: no audio");
    response.body
}

#[test]
fn test_openai_voice_names_speak_with_the_voices_the_table_gives() {
    let server = server();
    // The Orpheus table: female names to female voices, male to male, alloy to the default.
    for (alias, voice) in [("alloy", "tara"), ("onyx", "dan"), ("echo", "zac"), ("nova", "jess"), ("fable", "leo")] {
        assert!(pcm(&server, "tts-1", alias) == pcm(&server, "tts-1", voice), "{alias} does not speak as {voice}");
    }
    assert!(pcm(&server, "tts-1", "alloy") != pcm(&server, "tts-1", "leo"), "alloy and leo gave the same audio");
    let unknown = server.post_json(SPEECH, &json!({"model": "tts-1", "input": "Hello", "voice": "nobody"}));
    assert_eq!(unknown.status, 400, "{}", unknown.text());
    let error = &unknown.json()["error"];
    assert_eq!(error["param"], "voice", "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("tara") && message.contains("alloy, ash"), "{message:?}");
    if on_device() {
        return;
    }
    // A model that names the default voice's speaker resolves the names there; its own voice name works anywhere.
    assert!(pcm(&server, "hibari", "alloy") == pcm(&server, "tts-1", "heart"), "alloy on hibari is not heart");
    assert!(pcm(&server, "hibari", "shimmer") == pcm(&server, "drama", "heart"), "shimmer on hibari is not heart");
}

#[test]
fn test_the_voice_listing_shows_each_models_voices_and_aliases() {
    let server = server();
    let listing = server.get(VOICES);
    assert_eq!(listing.status, 200, "{}", listing.text());
    let json = listing.json();
    assert_eq!(json["object"], "list", "{json}");
    let data = json["data"].as_array().expect("a list of models");
    assert_eq!(data.len(), if on_device() { 1 } else { 2 }, "{json}");
    let drama = &data[0];
    assert_eq!(
        (&drama["model"], &drama["default"], &drama["default_voice"]),
        (&json!("drama"), &json!(true), &json!("tara"))
    );
    let aliases = |card: &Value, voice: &str| -> Vec<String> {
        let voices = card["voices"].as_array().expect("voices");
        let entry = voices.iter().find(|v| v["voice"] == voice).unwrap_or_else(|| panic!("no {voice} in {card}"));
        serde_json::from_value(entry["aliases"].clone()).expect("a list of names")
    };
    assert_eq!(aliases(drama, "tara"), ["alloy"]);
    assert_eq!(aliases(drama, "leo"), ["ash", "fable"]);
    assert_eq!(aliases(drama, "zoe"), ["shimmer"]);
    let listed: usize =
        drama["voices"].as_array().unwrap().iter().map(|v| v["aliases"].as_array().unwrap().len()).sum();
    assert_eq!(listed, OPENAI_VOICES.len(), "every OpenAI name stands for one voice: {drama}");
    if !on_device() {
        let hibari = &data[1];
        assert_eq!((&hibari["model"], &hibari["default"]), (&json!("hibari"), &json!(false)), "{hibari}");
        assert_eq!(aliases(hibari, "heart"), OPENAI_VOICES);
    }
    let post = server.post_json(VOICES, &json!({}));
    assert_eq!(post.status, 405, "{}", post.text());
}

#[test]
fn test_instructions_are_taken_ignored_and_said_to_be() {
    let server = server();
    let body = |instructions: Option<&str>| {
        let mut body =
            json!({"model": "tts-1", "input": "Hello there", "voice": "tara", "seed": 5, "response_format": "pcm"});
        if let Some(text) = instructions {
            body["instructions"] = json!(text);
        }
        body
    };
    let plain = server.post_json(SPEECH, &body(None));
    let instructed = server.post_json(SPEECH, &body(Some("Speak in a cheerful and positive tone.")));
    let blank = server.post_json(SPEECH, &body(Some("  ")));
    for response in [&plain, &instructed, &blank] {
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert_eq!(instructed.header("x-instructions-ignored"), Some("true"), "{:?}", instructed.headers);
    assert_eq!(plain.header("x-instructions-ignored"), None, "{:?}", plain.headers);
    assert_eq!(blank.header("x-instructions-ignored"), None, "blank instructions are none: {:?}", blank.headers);
    assert!(instructed.body == plain.body, "instructions changed the audio");
}
