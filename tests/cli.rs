//! The `tensorfold` command line end to end on the default model.

use std::process::{Command, Output};

fn tensorfold(args: &[&str]) -> Output {
    let model = tensorfold::settings::process_fetcher()
        .and_then(|f| f.default_model_path())
        .expect("fetching the default model");
    Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .arg(args[0])
        .arg("--model")
        .arg(model)
        .args(&args[1..])
        .output()
        .expect("running tensorfold")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn test_generate_chat_answers_paris() {
    let out = tensorfold(&["generate", "--chat", "--prompt", "What is the capital of France?", "--temperature", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&out).contains("Paris"), "{}", stdout(&out));
}

#[test]
fn test_seeded_generate_is_repeatable_and_stops_at_a_stop_string() {
    let args = ["generate", "--prompt", "Once upon a time", "--max-tokens", "24", "--seed", "3"];
    let (a, b) = (tensorfold(&args), tensorfold(&args));
    assert!(a.status.success() && !stdout(&a).trim().is_empty());
    assert_eq!(stdout(&a), stdout(&b));
    let first_word = stdout(&a).split_whitespace().nth(1).expect("at least two words").to_string();
    let stopped = tensorfold(&[&args[..], &["--stop", &first_word]].concat());
    assert!(!stdout(&stopped).contains(&first_word), "{} / {first_word}", stdout(&stopped));
    assert!(stdout(&a).starts_with(stdout(&stopped).trim_end_matches('\n')));
}

#[test]
fn test_bad_input_is_a_message_and_a_nonzero_exit() {
    let out = tensorfold(&["generate", "--prompt", "x", "--temperature=-1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("temperature must be >= 0"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00truncated").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(["generate", "--prompt", "x", "--model"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("broken.gguf") && stderr.contains("truncated"), "{stderr}");
}

#[test]
fn test_device_cuda_without_a_gpu_is_a_clear_error() {
    let fetcher = tensorfold::settings::process_fetcher().unwrap();
    let options = tensorfold_engine::llama::cuda::CudaOptions::default();
    if tensorfold::cuda_setup::CudaDevice::open(None, options, &fetcher).is_ok() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    let out = tensorfold(&["generate", "--prompt", "x", "--device", "cuda"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: GPU:") && stderr.contains("--device cuda"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn test_bench_decodes_after_a_given_context_and_refuses_one_past_the_model() {
    let out = tensorfold(&[
        "bench",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "4",
        "--decode-after",
        "40",
        "--repeats",
        "1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line: serde_json::Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(line["decode_after"], 40);
    assert!(line["decode_tok_s"].as_f64().is_some_and(|r| r > 0.0), "{line}");
    let out = tensorfold(&["bench", "--decode-tokens", "4", "--decode-after", "100000000", "--repeats", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--decode-after") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn test_bench_decodes_lanes_side_by_side_and_refuses_none() {
    let args = ["bench", "--prompt-tokens", "8", "--decode-tokens", "3", "--decode-after", "20", "--repeats", "1"];
    let out = tensorfold(&[&args[..], &["--lanes", "3"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line: serde_json::Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(line["lanes"], 3);
    assert!(line["decode_tok_s"].as_f64().is_some_and(|r| r > 0.0), "{line}");
    let out = tensorfold(&[&args[..], &["--lanes", "0"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--lanes") && !stderr.contains("panicked"), "{stderr}");
}

/// Runs the binary as given, with extra environment variables.
fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensorfold"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running tensorfold")
}

#[test]
fn test_settings_lists_every_setting_with_the_values_in_force() {
    let out = run_with_env(&["settings", "--parallel", "3"], &[("TF_API_KEY", "hunter2")]);
    let (text, stderr) = (stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    for row in tensorfold::settings::SETTINGS {
        assert!(text.contains(&row.name()), "{} is missing from:\n{text}", row.name());
    }
    assert!(text.contains("3 (flag)") && text.contains("set (environment)"), "{text}");
    assert!(!text.contains("hunter2"), "a secret was printed");
}

/// Arguments, environment, and the error line start-up must print.
type BadSetting = (&'static [&'static str], &'static [(&'static str, &'static str)], &'static str);

#[test]
fn test_a_bad_setting_is_refused_at_start_up_naming_it() {
    let cases: [BadSetting; 5] = [
        (&["serve", "--parallel", "0"], &[], "error: --parallel: must be between 1 and 4096, not 0"),
        (&["serve", "--port", "http"], &[], "error: --port: expected a whole number, got \"http\""),
        (&["serve"], &[("TF_MEMORY_LIMIT", "lots")], "error: TF_MEMORY_LIMIT: expected a whole number"),
        (&["generate", "--prompt", "x"], &[("TF_KERNELS", "neon")], "error: TF_KERNELS: must be one of auto, avx2"),
        (&["bench", "--device", "cuda"], &[("TF_CUDA_GRAPHS", "on")], "error: TF_CUDA_GRAPHS: must be 0 or 1"),
    ];
    for (args, env, want) in cases {
        let out = run_with_env(args, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
