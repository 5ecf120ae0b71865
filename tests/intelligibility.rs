//! pocketsphinx (a recognizer we did not write) understands `tensorfold speak`; reversed speech and noise do not.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Word error rate a clear voice must stay within; the controls must exceed it.
const MAX_WER: f64 = 0.25;

/// Sentences in the noise control: decoding noise is the slowest recognition, and a few prove the point.
const NUM_NOISE_SENTENCES: usize = 4;

/// Texts whose words are unambiguous to the recognizer's dictionary: statements, questions, a number, names.
const SENTENCES: [&str; 12] = [
    "The weather is lovely this morning.",
    "Where did you put the car keys?",
    "She bought twenty one apples at the market.",
    "My name is Sarah and I live in London.",
    "Please turn off the lights before you leave.",
    "John and Mary went to the park on Sunday.",
    "How much does this coffee cost?",
    "The children are playing in the garden.",
    "I would like a glass of water, please.",
    "The train to Boston leaves at seven thirty.",
    "We need to finish the report by Friday.",
    "Can you help me find the station?",
];

/// Speaks each sentence with its own fixed seed into `dir`; returns the WAV paths in order.
fn speak_all(dir: &Path) -> Vec<PathBuf> {
    SENTENCES
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let wav = dir.join(format!("sentence_{index:02}.wav"));
            let output = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
                .args(["speak", "--text", text, "--seed", &index.to_string(), "-o"])
                .arg(&wav)
                .output()
                .expect("running tensorfold speak");
            assert!(
                output.status.success(),
                "tensorfold speak failed for {text:?}:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            wav
        })
        .collect()
}

/// Starts tests/asr_wer.py over the WAVs with `control` (none, `--reverse` or `--noise`).
fn start_asr(python: &str, wavs: &[PathBuf], control: Option<&str>) -> Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/asr_wer.py");
    let mut command = Command::new(python);
    command.arg(&script).args(control).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (wav, text) in wavs.iter().zip(SENTENCES) {
        command.arg(wav).arg(text);
    }
    command.spawn().expect("starting tests/asr_wer.py")
}

/// Waits for asr_wer.py over `num_sentences`; returns the total WER and the script's output for failure messages.
fn word_error_rate(asr: Child, num_sentences: usize) -> (f64, String) {
    let output = asr.wait_with_output().expect("running tests/asr_wer.py");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "asr_wer.py exited with {}:\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("asr_wer.py printed no summary line:\n{stdout}"));
    assert_eq!(summary["sentences"].as_u64(), Some(num_sentences as u64), "{stdout}");
    let wer = summary["wer"].as_f64().unwrap_or_else(|| panic!("no wer in the summary:\n{stdout}"));
    (wer, stdout)
}

#[test]
fn test_default_voice_is_intelligible_to_pocketsphinx() {
    let Some(python) = common::python_importing("pocketsphinx") else { return };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let wavs = speak_all(dir.path());

    // The three recognitions are independent processes, so they share the machine's cores.
    let voice = start_asr(&python, &wavs, None);
    let controls = [("--reverse", &wavs[..]), ("--noise", &wavs[..NUM_NOISE_SENTENCES])]
        .map(|(control, wavs)| (control, wavs.len(), start_asr(&python, wavs, Some(control))));
    let (wer, report) = word_error_rate(voice, wavs.len());
    println!("voice: WER {:.1}%\n{report}", wer * 100.0);
    assert!(wer <= MAX_WER, "the voice's WER {:.1}% is above {:.0}%:\n{report}", wer * 100.0, MAX_WER * 100.0);

    // The gate must be able to fail: the same audio backwards, or noise as long and as loud, cannot pass it.
    for (control, num_sentences, asr) in controls {
        let (wer, report) = word_error_rate(asr, num_sentences);
        println!("{control}: WER {:.1}%\n{report}", wer * 100.0);
        assert!(wer > MAX_WER, "{control} passed the gate with WER {:.1}%:\n{report}", wer * 100.0);
    }
}
