//! Five minutes of tools/soak.py's mixed traffic against the default server, voice and all: no request that should
//! succeed fails, and resident memory after the first minute grows by less than 5%.

mod common;

use common::server::Server;

#[test]
fn test_five_minutes_of_mixed_traffic_fail_nothing_and_keep_memory_flat() {
    let Some(python) = common::python_importing("json") else { return };
    let server = Server::start(&[]);
    let out = tempfile::tempdir().expect("a directory for the soak's files");
    let (pid, base_url) = (server.pid().to_string(), server.base_url());
    let out = out.path().to_str().expect("a UTF-8 path");
    let args = ["--base-url", &base_url, "--pid", &pid, "--minutes", "5", "--streams", "16", "--window-minutes", "1"];
    let args = [&args[..], &["--sample-seconds", "5", "--out", out]].concat();
    println!("{}", common::run_python_tool(&python, "tools/soak.py", &args, || server.stderr()));
}
