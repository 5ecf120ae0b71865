//! The client tests' Python: `TF_TEST_PYTHON` when set, else a venv of `tests/requirements.txt` that the first test
//! needing it makes under the cache directory, keyed by the file's hash, so `cargo test` alone runs every client test.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

const REQUIREMENTS: &str = include_str!("../requirements.txt");

/// The Python to run client tools with, or why none could be made.
pub fn test_python() -> Result<String, String> {
    if let Ok(python) = std::env::var("TF_TEST_PYTHON") {
        return Ok(python);
    }
    static MADE: OnceLock<Result<String, String>> = OnceLock::new();
    MADE.get_or_init(|| provision().map(|p| p.display().to_string())).clone()
}

/// The venv's Python, made once per requirements file and reused by every later run and test binary.
fn provision() -> Result<PathBuf, String> {
    let cache = tensorfold::settings::process_fetcher().map_err(|e| format!("no cache directory: {e}"))?.cache_dir;
    let hash = Sha256::digest(REQUIREMENTS.as_bytes());
    let key: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let venv = cache.join(format!("test-venv-{key}"));
    let python = venv.join("bin").join("python");
    let done = venv.join(".complete");
    std::fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    // Test binaries may start together: the lock makes one of them install while the others wait.
    let lock = std::fs::File::create(cache.join(format!("test-venv-{key}.lock"))).map_err(|e| e.to_string())?;
    lock.lock().map_err(|e| format!("locking the test venv: {e}"))?;
    if done.exists() {
        return Ok(python);
    }
    eprintln!("making the client tests' Python environment in {} (once)", venv.display());
    let _ = std::fs::remove_dir_all(&venv);
    let base = std::env::var("TF_PYTHON").unwrap_or_else(|_| "python3".into());
    // --without-pip needs no ensurepip (Debian's python3-venv); the base Python's pip installs into the venv.
    run(Command::new(&base).args(["-m", "venv", "--without-pip"]).arg(&venv))?;
    let requirements = venv.join("requirements.txt");
    std::fs::write(&requirements, REQUIREMENTS).map_err(|e| e.to_string())?;
    let mut pip = Command::new(&base);
    pip.args(["-m", "pip", "--disable-pip-version-check", "--python"]).arg(&python);
    run(pip.args(["install", "--quiet", "-r"]).arg(&requirements))?;
    std::fs::File::create(&done).and_then(|mut f| f.write_all(REQUIREMENTS.as_bytes())).map_err(|e| e.to_string())?;
    Ok(python)
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|e| format!("{shown}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(format!("{shown} exited with {}: {}", output.status, last_lines(&stderr, 8)))
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
