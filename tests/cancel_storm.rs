//! A thousand requests dropped at random moments (tools/cancel_storm.py) against the default server, voice and
//! all: after every five hundred, requests running and waiting, KV pages held and ledger bytes are back to before.

mod common;

use common::server::Server;

#[test]
fn test_a_thousand_dropped_requests_leave_nothing_behind() {
    let Some(python) = common::python_importing("json") else { return };
    let server = Server::start(&[]);
    let args = ["--base-url", &server.base_url(), "--count", "1000", "--check-every", "500", "--concurrency", "16"];
    println!("{}", common::run_python_tool(&python, "tools/cancel_storm.py", &args, || server.stderr()));
}
