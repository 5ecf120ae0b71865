//! The official `openai` Python package against `tensorfold serve` (text and speech): openai_client.py must exit 0.

mod common;

use std::path::Path;
use std::process::Command;

use common::server::Server;

#[test]
fn test_official_openai_client_works() {
    let Some(python) = common::python_importing("openai, av") else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let drama = root.join("tests/data/drama");
    let server = Server::start(&["--speech-model", drama.to_str().expect("a UTF-8 path")]);
    // Started without flags, as `tensorfold serve` is: the default model and the default voice.
    let default = Server::start(&[]);
    let script = root.join("tests/openai_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", server.base_url()), "--speech"])
        .args(["--default-base-url", &format!("{}/v1", default.base_url())])
        .output()
        .expect("running tests/openai_client.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "openai_client.py exited with {}:\n{stdout}\n{stderr}\nserver stderr:\n{}",
        output.status,
        server.stderr()
    );
    assert!(stdout.contains("ok   chat_stream"), "the script ran no streaming case:\n{stdout}");
    for case in [
        "chat_n",
        "penalties_and_bias",
        "max_completion_tokens",
        "streamed_logprobs",
        "echo_and_list_prompts",
        "json_formats",
    ] {
        assert!(stdout.contains(&format!("ok   {case}")), "the script ran no {case} case:\n{stdout}");
    }
    assert!(stdout.contains("ok   speech_pcm"), "the script ran no speech case:\n{stdout}");
    assert!(stdout.contains("ok   speech_wav"), "the script ran no WAV speech case:\n{stdout}");
    assert!(stdout.contains("ok   speech_default_voice"), "the script ran no default-voice case:\n{stdout}");
    assert!(stdout.contains("ok   speech_default_mp3"), "the script ran no plain OpenAI speech call:\n{stdout}");
    assert!(stdout.contains("ok   speech_default_opus"), "the script decoded no Opus:\n{stdout}");
}
