//! Shared set-up for the integration tests: the default model, loaded once per test binary, and helpers.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod cuda;
pub mod events;
pub mod golden;
pub mod moe;
pub mod pyenv;
pub mod server;
pub mod speech;
use std::sync::OnceLock;

use tensorfold_engine::model::LoadedModel;

/// The default SmolLM2 GGUF, fetched through the same code path as the CLI.
pub fn default_model() -> &'static LoadedModel {
    static MODEL: OnceLock<LoadedModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = tensorfold::settings::process_fetcher()
            .and_then(|f| f.default_model_path())
            .expect("fetching the default model");
        tensorfold_engine::model::load(&path, &mut |_, _| {}).expect("loading the default model")
    })
}

/// splitmix64: a seeded generator, so jitter, delays and drop points repeat from run to run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `relative` in the source tree or, where the tests run from a copy of it, under the working directory.
pub fn source_path(relative: &str) -> std::path::PathBuf {
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    match built.exists() {
        true => built,
        false => relative.into(),
    }
}

/// The client tests' Python (`pyenv::test_python`) if it can `import {modules}`; `None` (a skip) when it cannot,
/// unless `CI` is set.
pub fn python_importing(modules: &str) -> Option<String> {
    let why = match pyenv::test_python() {
        Ok(python) => {
            let probe = std::process::Command::new(&python).args(["-c", &format!("import {modules}")]).output();
            match probe {
                Ok(output) if output.status.success() => return Some(python),
                Ok(output) => String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default().to_string(),
                Err(error) => format!("{python}: {error}"),
            }
        }
        Err(why) => why,
    };
    assert!(std::env::var_os("CI").is_none(), "CI is set but no Python can import {modules}: {why}");
    println!("skipping: no Python can import {modules} ({why}); set TF_TEST_PYTHON to one that can");
    None
}

/// Runs `python` on the repository's `script` with `args`; asserts it exits 0 (printing its output and the
/// server's stderr if not) and returns its last line of stdout.
pub fn run_python_tool(python: &str, script: &str, args: &[&str], server_stderr: impl Fn() -> String) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let output = std::process::Command::new(python).arg(&path).args(args).output().expect("running the tool");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} exited with {}:\n{stdout}\n{}\nserver stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        server_stderr()
    );
    stdout.lines().last().unwrap_or_default().to_string()
}
