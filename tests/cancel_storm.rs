//! A thousand requests dropped at random moments (tools/cancel_storm.py) against the default server, voice and
//! all: after every five hundred, requests running and waiting, KV pages held and ledger bytes are back to before.

mod common;

use std::path::Path;
use std::process::Command;

use common::server::Server;

#[test]
fn test_a_thousand_dropped_requests_leave_nothing_behind() {
    let Some(python) = common::python_importing("json") else { return };
    let server = Server::start(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/cancel_storm.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &server.base_url(), "--count", "1000", "--check-every", "500", "--concurrency", "16"])
        .output()
        .expect("running tools/cancel_storm.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tools/cancel_storm.py exited with {}:\n{stdout}\n{}\nserver stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        server.stderr()
    );
    println!("{}", stdout.lines().last().unwrap_or_default());
}
