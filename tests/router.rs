//! Scale-out behind an existing router: two `tensorfold serve` replicas behind `vllm-router` on loopback.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::server::{try_request, Server};
use serde_json::json;

/// Requests sent through the router while both replicas run.
const NUM_REQUESTS: usize = 40;
/// Requests sent after one replica is stopped.
const NUM_AFTER_STOP: usize = 12;
/// Clients sending at once.
const NUM_CLIENTS: usize = 4;
/// The router waits for both replicas' `/health` before it serves.
const ROUTER_START: Duration = Duration::from_secs(120);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port").port()
}

/// The router process; dropping it kills it.
struct Router {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Router {
    fn start(python: &str, replicas: &[&Server]) -> Router {
        let (port, metrics_port) = (free_port(), free_port());
        let mut child = Command::new(python)
            .args(["-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--worker-urls")
            .args(replicas.iter().map(|r| r.base_url()))
            .args(["--policy", "round_robin", "--prometheus-port", &metrics_port.to_string()])
            .args(["--worker-startup-check-interval", "1", "--log-level", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting vllm-router");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stderr, sink) = (child.stderr.take().expect("piped stderr"), Arc::clone(&log));
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let router = Router { child, addr: format!("127.0.0.1:{port}"), log };
        router.wait_serving();
        router
    }

    fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
    }

    fn wait_serving(&self) {
        let deadline = Instant::now() + ROUTER_START;
        loop {
            match try_request(&self.addr, "GET", "/v1/models", &[], None) {
                Ok(response) if response.status == 200 => return,
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
                other => panic!("the router never served /v1/models (last: {other:?}):\n{}", self.log()),
            }
        }
    }

    /// Sends `n` completions from `NUM_CLIENTS` threads; every one must succeed, and with `resend` (a replica has
    /// stopped, and the router may still pick it) one the router could not send at its second try. Returns how
    /// many were sent twice.
    fn complete_all(&self, n: usize, resend: bool) -> usize {
        let count = std::sync::atomic::AtomicUsize::new(0);
        let resent = &count;
        std::thread::scope(|scope| {
            for client in 0..NUM_CLIENTS {
                scope.spawn(move || {
                    for i in (client..n).step_by(NUM_CLIENTS) {
                        let body = json!({"prompt": format!("Count to {i}:"), "max_tokens": 4, "temperature": 0});
                        let headers = [("Content-Type", "application/json")];
                        let sent = body.to_string();
                        let send = || {
                            try_request(&self.addr, "POST", "/v1/completions", &headers, Some(sent.as_bytes()))
                                .unwrap_or_else(|e| panic!("request {i} through the router: {e}\n{}", self.log()))
                        };
                        let mut response = send();
                        if resend && response.status == 500 && response.text().contains("error sending request") {
                            eprintln!("request {i}: the router could not send it to a replica; sent again");
                            resent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            response = send();
                        }
                        assert_eq!(response.status, 200, "request {i}: {}\n{}", response.text(), self.log());
                        let json = response.json();
                        assert_eq!(json["object"], "text_completion", "request {i}: {json}");
                        assert_eq!(json["usage"]["completion_tokens"], 4, "request {i}: {json}");
                    }
                });
            }
        });
        count.into_inner()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn requests_served(server: &Server) -> f64 {
    server.metrics()["tensorfold_requests_total"]
}

#[test]
fn test_two_replicas_behind_vllm_router_share_requests_and_survive_one_stopping() {
    let Some(python) = common::python_importing("vllm_router.launch_router") else { return };
    let first = Server::start(&["--no-voice"]);
    let second = Server::start(&["--no-voice"]);
    let router = Router::start(&python, &[&first, &second]);

    let resent = router.complete_all(NUM_REQUESTS, false);
    let (served_first, served_second) = (requests_served(&first), requests_served(&second));
    assert!(
        served_first > 0.0 && served_second > 0.0,
        "one replica served nothing: {served_first} and {served_second}"
    );
    // A request the router failed to send reached no replica, or at most one once.
    let served = served_first + served_second;
    assert!(
        served >= NUM_REQUESTS as f64 && served <= (NUM_REQUESTS + resent) as f64,
        "{served} served for {NUM_REQUESTS} requests, {resent} sent twice"
    );

    drop(second);
    let resent = router.complete_all(NUM_AFTER_STOP, true);
    let after = requests_served(&first) - served_first;
    assert!(
        after >= NUM_AFTER_STOP as f64 && after <= (NUM_AFTER_STOP + resent) as f64,
        "the survivor served {after} of the last {NUM_AFTER_STOP}"
    );
}
