//! The official `openai` Python package against `tensorfold serve` (text and speech): openai_client.py must exit 0.

mod common;

use std::path::Path;
use std::process::Command;

use common::server::Server;

/// `TF_TEST_PYTHON`, else `python3`; `None` (a skip) when it cannot import openai and av, unless `CI` is set.
fn python_with_openai() -> Option<String> {
    let python = std::env::var("TF_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let probe = Command::new(&python).args(["-c", "import openai, av"]).output();
    let why = match probe {
        Ok(output) if output.status.success() => return Some(python),
        Ok(output) => String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default().to_string(),
        Err(error) => error.to_string(),
    };
    assert!(std::env::var_os("CI").is_none(), "CI is set but {python} cannot import openai: {why}");
    println!("skipping: {python} cannot import openai and av ({why}); set TF_TEST_PYTHON to a Python that can");
    None
}

#[test]
fn test_official_openai_client_works() {
    let Some(python) = python_with_openai() else { return };
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
    assert!(stdout.contains("ok   speech_pcm"), "the script ran no speech case:\n{stdout}");
    assert!(stdout.contains("ok   speech_wav"), "the script ran no WAV speech case:\n{stdout}");
    assert!(stdout.contains("ok   speech_default_voice"), "the script ran no default-voice case:\n{stdout}");
    assert!(stdout.contains("ok   speech_default_mp3"), "the script ran no plain OpenAI speech call:\n{stdout}");
}
