//! Both ends as a user runs them: `tensorfold lend` in one process, `tensorfold serve` with the carveout in
//! another; the server's KV pool grows by the lent pages, it answers, and the daemon's pool is whole again after
//! the server is killed; a hybrid model keeps its recurrent state in its own memory beside lent KV pages; and
//! `tensorfold lend --device cuda` refused on a machine without a CUDA driver.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use common::golden::served_golden;
use common::server::{binary, Server};
use serde_json::json;

const MIB: f64 = (1 << 20) as f64;

/// The daemon's child process and its stderr, line by line; killed on drop.
struct Lender {
    child: Child,
    lines: Receiver<String>,
}

impl Lender {
    fn start(socket: &std::path::Path) -> Lender {
        let mut child = Command::new(binary())
            .args(["lend", "--pool-mib", "8"])
            .env("TF_CARVEOUT_SOCKET", socket)
            .env("TF_CARVEOUT_KEY", "sesame")
            .env("TF_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting tensorfold lend");
        let (tx, lines) = channel();
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(plain(&line));
            }
        });
        Lender { child, lines }
    }

    /// Waits for a line containing every one of `words`; the lines read on the way are returned on failure.
    fn wait_for(&self, words: &[&str]) -> Result<String, Vec<String>> {
        let (deadline, mut seen) = (Instant::now() + Duration::from_secs(30), Vec::new());
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if words.iter().all(|w| line.contains(w)) => return Ok(line),
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        Err(seen)
    }
}

/// A log line without its terminal colours.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => _ = chars.by_ref().find(|&c| c == 'm'),
            c => out.push(c),
        }
    }
    out
}

impl Drop for Lender {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn test_a_server_claims_kv_room_from_tensorfold_lend_and_the_pool_is_whole_after_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("lend.sock");
    let lender = Lender::start(&socket);
    lender.wait_for(&["lending", "4 slices"]).expect("the daemon says what it lends");
    // The server inherits these; the other test here gives its child every carveout variable it reads.
    for (name, value) in [("TF_CARVEOUT", "1"), ("TF_CARVEOUT_MIB", "3"), ("TF_CARVEOUT_KEY", "sesame")] {
        std::env::set_var(name, value);
    }
    std::env::set_var("TF_CARVEOUT_SOCKET", &socket);
    let server = Server::start(&["--no-voice", "--kv-pages", "32", "--parallel", "2"]);
    lender.wait_for(&["lent", "bytes=4194304", "free_slices=2"]).expect("the daemon lent two slices");
    let log = plain(&server.stderr());
    assert!(log.contains("carveout: KV pages in lent memory") && log.contains("lent_bytes=4194304"), "{log}");
    let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0});
    let reply = server.post_json("/v1/chat/completions", &body);
    assert_eq!(reply.status, 200, "{}", server.stderr());
    let metrics = server.metrics();
    assert_eq!(metrics.get("tensorfold_ledger_bytes{kind=\"lent\"}"), Some(&(4.0 * MIB)), "{metrics:?}");
    let total = metrics["tensorfold_kv_pages_total"];
    assert!(total > 32.0, "the pool has {total} pages, no more than its own 32");
    drop(server);
    let back = lender.wait_for(&["took back", "free_slices=4"]);
    assert!(back.is_ok(), "the daemon did not take its slices back: {:?}", back.err());
}

#[test]
fn test_a_hybrid_model_lends_only_its_attention_pages() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("lend.sock");
    let lender = Lender::start(&socket);
    lender.wait_for(&["lending", "4 slices"]).expect("the daemon says what it lends");
    let model = served_golden("tiny-qwen3-next");
    let socket = socket.to_string_lossy().into_owned();
    let env = [
        ("TF_CARVEOUT", "1"),
        ("TF_CARVEOUT_MIB", "3"),
        ("TF_CARVEOUT_KEY", "sesame"),
        ("TF_CARVEOUT_SOCKET", socket.as_str()),
        ("TF_LOG", "info"),
    ];
    let mut server = Server::spawn(model.path(), &["--no-voice", "--kv-pages", "32", "--parallel", "2"], &env);
    server.wait_ready();
    lender.wait_for(&["lent", "bytes=4194304"]).expect("the daemon lent two slices");
    let log = plain(&server.stderr());
    // Three linear layers, each 16 rows of 136 floats and a state of 4 heads of 16 x 16, and 16 hidden states of 64
    // for the draft head, in f32.
    let own = "own_state_bytes_per_page=42496";
    assert!(log.contains("recurrent state in own memory") && log.contains(own), "{log}");
    let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0});
    let reply = server.post_json("/v1/chat/completions", &body);
    assert_eq!(reply.status, 200, "{}", server.stderr());
    let metrics = server.metrics();
    assert_eq!(metrics.get("tensorfold_ledger_bytes{kind=\"lent\"}"), Some(&(4.0 * MIB)), "{metrics:?}");
    assert!(metrics["tensorfold_kv_pages_total"] > 32.0, "{metrics:?}");
}

#[test]
fn test_lend_on_a_gpu_without_a_driver_exits_naming_the_flag() {
    // SAFETY: this only tries to open the driver library.
    if unsafe { tensorfold_kernels::cuda::cudarc::driver::sys::is_culib_present() } {
        eprintln!("skipped: a CUDA driver is present, and the daemon would start");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("lend.sock");
    let out = Command::new(binary())
        .args(["lend", "--device", "cuda", "--pool-mib", "8"])
        .env("TF_CARVEOUT_SOCKET", &socket)
        .env("TF_CARVEOUT_KEY", "sesame")
        .env_remove("TF_CARVEOUT_KEY_FILE")
        .env("TF_LOG", "info")
        .output()
        .expect("running tensorfold lend");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the daemon started without a driver: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: --device cuda") && last.contains("no CUDA driver"), "{stderr}");
    assert!(!socket.exists(), "a socket was made before the pool was refused");
}
