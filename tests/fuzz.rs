//! schemathesis against the default server from its own /openapi.json (tools/fuzz.py): at least 2,000 generated
//! cases with no 5xx, every reply within its deadline and true to the document, and the server alive after.

mod common;

use common::server::Server;

/// Examples per route and phase; with the document's ten routes this generates about 2,000 cases or more.
const EXAMPLES: &str = "120";

#[test]
fn test_schemathesis_finds_no_failure_in_two_thousand_cases() {
    let Some(python) = common::python_importing("schemathesis") else { return };
    // A short context keeps each generated request's output short, so the run stays within minutes.
    let server = Server::start(&["--context", "128"]);
    let args = ["--base-url", &server.base_url(), "--examples", EXAMPLES, "--seed", "1", "--min-cases", "2000"];
    println!("{}", common::run_python_tool(&python, "tools/fuzz.py", &args, || server.stderr()));
}
