//! The seeded goldens (tests/data/golden) as a server serves them: with a tokenizer and a chat template.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// ChatML, as the goldens' families write it.
const TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + \
    message['content'] + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}\
    {{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// The tests' data: where the build found it, or under the working directory (a copy of the repository elsewhere).
fn data_root() -> PathBuf {
    super::source_path("tests/data")
}

/// A golden's weights with the tests' 512-id tokenizer (tests/data/thinking) under a ChatML template.
pub fn served_golden(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a directory");
    let golden = data_root().join("golden").join(name);
    std::fs::copy(golden.join("model.safetensors"), dir.path().join("model.safetensors")).expect("weights");
    std::fs::copy(golden.join("config.json"), dir.path().join("config.json")).expect("config");
    with_chat_tokenizer(dir.path());
    dir
}

/// A seeded checkpoint of `arch` whose sizes the CUDA kernels take (`cuda::checkpoint`), with 512 ids, served as
/// `served_golden` serves a golden.
pub fn served_seeded(arch: &str, seed: u64) -> tempfile::TempDir {
    let dir = super::cuda::checkpoint_of(arch, seed, 512);
    with_chat_tokenizer(dir.path());
    dir
}

/// Adds the tests' 512-id tokenizer and a ChatML template to the checkpoint in `dir`, its end of turn as the end.
fn with_chat_tokenizer(dir: &Path) {
    let root = data_root();
    let read =
        |path: &Path| -> Value { serde_json::from_slice(&std::fs::read(path).expect("readable")).expect("JSON") };
    let mut config = read(&dir.join("config.json"));
    assert_eq!(config["vocab_size"], 512, "the tokenizer has 512 ids");
    // The tokenizer's <|im_end|>.
    config["eos_token_id"] = json!(498);
    // Room for the tool prompt, which the 512-id tokenizer spells out in about 450 tokens.
    config["max_position_embeddings"] = json!(1024);
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config written");
    std::fs::copy(root.join("thinking/tokenizer.json"), dir.join("tokenizer.json")).expect("tokenizer");
    let mut tokenizer_config = read(&root.join("thinking/tokenizer_config.json"));
    tokenizer_config["chat_template"] = json!(TEMPLATE);
    std::fs::write(dir.join("tokenizer_config.json"), tokenizer_config.to_string()).expect("written");
}
