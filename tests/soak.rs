//! Five minutes of tools/soak.py's mixed traffic against the default server, voice and all: no request that should
//! succeed fails, and resident memory after the first minute grows by less than 5%.

mod common;

use std::path::Path;
use std::process::Command;

use common::server::Server;

#[test]
fn test_five_minutes_of_mixed_traffic_fail_nothing_and_keep_memory_flat() {
    let Some(python) = common::python_importing("json") else { return };
    let server = Server::start(&[]);
    let out = tempfile::tempdir().expect("a directory for the soak's files");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/soak.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &server.base_url(), "--pid", &server.pid().to_string(), "--minutes", "5"])
        .args(["--streams", "16", "--window-minutes", "1", "--sample-seconds", "5"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("running tools/soak.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tools/soak.py exited with {}:\n{stdout}\n{}\nserver stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        server.stderr()
    );
    println!("{}", stdout.lines().last().unwrap_or_default());
}
