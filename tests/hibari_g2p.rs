//! The hibari voice's English front end against the wheel's own Python G2P (tools/hibari_g2p_goldens.py).

use std::sync::OnceLock;
use std::time::Instant;

use serde::Deserialize;
use tensorfold_engine::speech::hibari::g2p::G2p;

#[derive(Deserialize)]
struct Goldens {
    cases: Vec<Case>,
    oov: Vec<OovCase>,
}

#[derive(Deserialize)]
struct Case {
    kind: String,
    text: String,
    phonemes: Vec<String>,
    ids: Vec<Vec<i64>>,
}

#[derive(Deserialize)]
struct OovCase {
    word: String,
    phonemes: Option<String>,
}

/// The bundled goldens, or the file HIBARI_G2P_GOLDENS names (a larger corpus from the same tool).
fn goldens() -> Goldens {
    let text = match std::env::var_os("HIBARI_G2P_GOLDENS") {
        Some(path) => std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.to_string_lossy())),
        None => include_str!("data/hibari/g2p.json").to_string(),
    };
    serde_json::from_str(&text).expect("goldens parse")
}

/// The G2P loaded once from the fetched voice; None (the test skips) where fetching fails outside CI.
fn g2p() -> Option<&'static G2p> {
    static G2P: OnceLock<Option<G2p>> = OnceLock::new();
    G2P.get_or_init(|| {
        let dir = match tensorfold::settings::process_fetcher().and_then(|f| f.hibari_dir()) {
            Ok(dir) => dir,
            Err(e) if std::env::var_os("CI").is_none() => {
                println!("skipping: the hibari voice could not be fetched: {e}");
                return None;
            }
            Err(e) => panic!("the hibari voice could not be fetched: {e}"),
        };
        let start = Instant::now();
        let g2p = G2p::load(&dir).unwrap_or_else(|e| panic!("loading the G2P: {e}"));
        println!("G2P loaded in {:.0} ms", start.elapsed().as_secs_f64() * 1e3);
        Some(g2p)
    })
    .as_ref()
}

#[test]
fn test_phonemes_and_ids_match_the_wheel() {
    let Some(g2p) = g2p() else { return };
    let goldens = goldens();
    let mut mismatches = Vec::new();
    let start = Instant::now();
    for case in &goldens.cases {
        let ours = g2p.phonemize(&case.text);
        let ids: Vec<Vec<i64>> = ours.iter().map(|p| g2p.ids(p)).collect();
        if ours != case.phonemes || ids != case.ids {
            mismatches.push(format!(
                "[{}] {:?}\n    ours:   {:?}\n    theirs: {:?}{}",
                case.kind,
                case.text,
                ours,
                case.phonemes,
                if ours == case.phonemes { "\n    (phonemes agree, ids differ)" } else { "" }
            ));
        }
    }
    let per_case = start.elapsed().as_secs_f64() * 1e3 / goldens.cases.len() as f64;
    println!("{} inputs, {:.2} ms each", goldens.cases.len(), per_case);
    assert!(
        mismatches.is_empty(),
        "{} of {} inputs differ from the wheel:\n{}",
        mismatches.len(),
        goldens.cases.len(),
        mismatches.join("\n")
    );
}

#[test]
fn test_oov_network_matches_onnxruntime() {
    let Some(g2p) = g2p() else { return };
    let goldens = goldens();
    let mut mismatches = Vec::new();
    for case in &goldens.oov {
        let ours = g2p.read_unknown(&case.word);
        if ours != case.phonemes {
            mismatches.push(format!("{:?}: ours {:?}, theirs {:?}", case.word, ours, case.phonemes));
        }
    }
    assert!(mismatches.is_empty(), "{} OOV words differ:\n{}", mismatches.len(), mismatches.join("\n"));
}

#[test]
fn test_ids_pad_and_drop_unknown_characters() {
    let Some(g2p) = g2p() else { return };
    assert_eq!(g2p.ids(""), vec![0, 0]);
    assert_eq!(g2p.ids("hə\u{1F600}"), vec![0, 50, 83, 0]);
}

#[test]
fn test_sentence_split_keeps_titles_and_initials() {
    let Some(g2p) = g2p() else { return };
    let got = g2p.split_sentences("Dr. Smith met J. K. Rowling. she smiled. \"Yes!\" Then\n\nNew one.");
    // The closing quote goes with the space after it, as in the wheel.
    assert_eq!(got, ["Dr. Smith met J. K. Rowling. she smiled.", "\"Yes!", "Then", "New one."]);
}

#[test]
fn test_load_names_the_missing_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = G2p::load(dir.path()).err().expect("an empty directory cannot load");
    let message = err.to_string();
    assert!(message.contains("missing"), "{message}");
}

#[cfg(unix)]
#[test]
fn test_load_names_the_file_with_bad_json() {
    let Some(_) = g2p() else { return };
    let source = tensorfold::settings::process_fetcher().and_then(|f| f.hibari_dir()).expect("fetched above");
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(&source).expect("voice dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("file name");
        if name != "vocab.json" {
            std::os::unix::fs::symlink(&path, dir.path().join(name)).expect("link");
        }
    }
    std::fs::write(dir.path().join("vocab.json"), "{\"a\": ").expect("write");
    let message = G2p::load(dir.path()).err().expect("broken vocab.json cannot load").to_string();
    assert!(message.contains("vocab.json") && message.contains("bad JSON"), "{message}");
}
