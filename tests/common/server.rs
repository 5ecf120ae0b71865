//! A `tensorfold serve` child process for end-to-end tests, and a small HTTP/1.1 client for it.
// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Loading the model and binding the port; a cold cache also fetches the model first.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Long enough for a request that waits behind many others on a slow debug build.
const IO_TIMEOUT: Duration = Duration::from_secs(300);
/// The server's stderr lines kept for a failure message.
const STDERR_TAIL_LINES: usize = 40;

/// A running server; dropping it kills the process.
pub struct Server {
    child: Child,
    /// `host:port` the server printed.
    pub addr: String,
    /// The id `/v1/models` lists first, for the `model` field of requests.
    pub model: String,
    stderr_tail: Arc<Mutex<Vec<String>>>,
}

/// The `tensorfold` binary the tests run: `TF_TEST_BINARY`, or the one cargo built beside them.
pub fn binary() -> std::path::PathBuf {
    std::env::var_os("TF_TEST_BINARY").map_or_else(|| env!("CARGO_BIN_EXE_tensorfold").into(), Into::into)
}

impl Server {
    /// Starts `tensorfold serve --port 0` on the default model (or `TF_TEST_MODEL`, for a GPU machine that cannot
    /// fetch it) with `extra` flags and waits until healthy.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with_env(extra, &[])
    }

    /// As `start`, with `env` set for the server.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let model: std::path::PathBuf = match std::env::var_os("TF_TEST_MODEL") {
            Some(path) => path.into(),
            None => tensorfold::settings::process_fetcher()
                .and_then(|f| f.default_model_path())
                .expect("fetching the default model"),
        };
        let mut server = Server::spawn(&model, extra, env);
        server.wait_ready();
        server
    }

    /// Starts `tensorfold serve --port 0 --model MODEL` with `extra` flags and waits until healthy; with
    /// `TF_TEST_DEVICE` set, on that device and without the default voice (a GPU machine may not fetch it).
    pub fn start_with_model(model: &Path, extra: &[&str]) -> Server {
        let mut server = Server::spawn(model, extra, &[]);
        server.wait_ready();
        server
    }

    /// As `start_with_model` with `env` set, returning once the address is printed, before `/health` says 200.
    pub fn spawn(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut device: Vec<String> = Vec::new();
        if let Ok(d) = std::env::var("TF_TEST_DEVICE") {
            device.extend(["--device".into(), d]);
            device.extend((!extra.contains(&"--no-voice")).then(|| "--no-voice".into()));
        }
        let mut child = Command::new(binary())
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1"])
            .args(if extra.contains(&"--port") { &[][..] } else { &["--port", "0"][..] })
            .args(device)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning tensorfold serve");
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, addr_rx) = mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        let tail = Arc::clone(&stderr_tail);
        // Draining stderr for the whole run keeps the child from blocking on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("listening on http://") {
                    let addr = line[at + "listening on http://".len()..].trim().trim_end_matches('/').to_string();
                    let _ = addr_tx.send(addr);
                }
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                tail.push(line);
                if tail.len() > STDERR_TAIL_LINES {
                    tail.remove(0);
                }
            }
        });
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let addr = loop {
            match addr_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(addr) => break addr,
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!("tensorfold serve exited with {status} before listening:\n{}", tail_text(&stderr_tail));
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    panic!("tensorfold serve printed no 'listening on' line:\n{}", tail_text(&stderr_tail));
                }
            }
        };
        Server { child, addr, model: String::new(), stderr_tail }
    }

    /// Waits until `/health` says 200, then reads the first model's id.
    pub fn wait_ready(&mut self) {
        self.wait_healthy(Instant::now() + STARTUP_TIMEOUT);
    }

    fn wait_healthy(&mut self, deadline: Instant) {
        loop {
            match try_request(&self.addr, "GET", "/health", &[], None) {
                Ok(response) if response.status == 200 => break,
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                other => panic!("/health never answered 200 (last: {other:?}):\n{}", self.stderr()),
            }
        }
        let models = self.get("/v1/models");
        self.model = models.json()["data"][0]["id"].as_str().map(str::to_string).unwrap_or_default();
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the process the signal `name` (`TERM`, `INT`, `KILL`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args(["-s", name, &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -s {name} failed");
    }

    /// The process's exit status once it exits, or `None` if it is still running after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => return None,
            }
        }
    }

    /// The last lines the server wrote to stderr, for failure messages.
    pub fn stderr(&self) -> String {
        tail_text(&self.stderr_tail)
    }

    pub fn get(&self, path: &str) -> Response {
        request(&self.addr, "GET", path, &[], None)
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Response {
        self.post_raw(path, body.to_string().as_bytes(), &[])
    }

    pub fn post_raw(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Response {
        let mut all = vec![("Content-Type", "application/json")];
        all.extend_from_slice(headers);
        request(&self.addr, "POST", path, &all, Some(body))
    }

    /// Sends a POST and returns the open connection without reading anything.
    pub fn send_json(&self, path: &str, body: &Value) -> TcpStream {
        send(&self.addr, "POST", path, &[("Content-Type", "application/json")], Some(body.to_string().as_bytes()))
            .expect("sending the request")
    }

    /// Sends a POST and reads the response head; the body is then read as it arrives.
    pub fn open_body(&self, path: &str, body: &Value) -> BodyStream {
        BodyStream::open(self.send_json(path, body)).expect("reading the response head")
    }

    /// Sends a POST and reads the response head; events are then read one at a time.
    pub fn stream(&self, path: &str, body: &Value) -> SseStream {
        SseStream::open(self.send_json(path, body)).expect("reading the response head")
    }

    /// Every sample of `/metrics`, keyed by name with its labels as written, e.g. `a{kind="x"}`.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let response = self.get("/metrics");
        assert_eq!(response.status, 200, "/metrics: {}", response.text());
        parse_metrics(&response.text())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail_text(tail: &Mutex<Vec<String>>) -> String {
    tail.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
}

/// Prometheus text format: `name{labels} value` per line, comments skipped.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, or a panic that shows the body.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {} body is not JSON ({e}): {}", self.status, self.text()))
    }
}

/// One request on a fresh connection, read to the end.
pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Response {
    try_request(addr, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

pub fn try_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<Response> {
    let stream = send(addr, method, path, headers, body)?;
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader)?;
    let mut body = Vec::new();
    BodyReader::new(reader, &headers).read_to_end(&mut body)?;
    Ok(Response { status, headers, body })
}

/// Connects and writes one request with `Connection: close`.
pub fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    stream.write_all(&bytes)?;
    Ok(stream)
}

fn read_head(reader: &mut impl BufRead) -> io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    Ok((status, headers))
}

/// A response body as `Read`: chunked transfer decoded as it arrives, or a fixed length, or to EOF.
pub struct BodyReader<R> {
    inner: R,
    framing: Framing,
}

enum Framing {
    /// Bytes left in the current chunk; 0 means the next size line comes first.
    Chunked {
        left: u64,
    },
    Length {
        left: u64,
    },
    UntilEof,
    Done,
}

impl<R: BufRead> BodyReader<R> {
    fn new(inner: R, headers: &[(String, String)]) -> BodyReader<R> {
        let find = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.to_ascii_lowercase());
        let framing = if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            Framing::Chunked { left: 0 }
        } else {
            match find("content-length").and_then(|v| v.parse().ok()) {
                Some(left) => Framing::Length { left },
                None => Framing::UntilEof,
            }
        };
        BodyReader { inner, framing }
    }

    fn next_chunk_size(&mut self) -> io::Result<u64> {
        let mut line = String::new();
        // Skips the CRLF that ends the previous chunk's data.
        while line.trim().is_empty() {
            line.clear();
            if self.inner.read_line(&mut line)? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside a chunked body"));
            }
        }
        let size = line.trim().split(';').next().unwrap_or_default();
        u64::from_str_radix(size, 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {line:?}")))
    }
}

impl<R: BufRead> Read for BodyReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if let Framing::Chunked { left: 0 } = self.framing {
            let size = self.next_chunk_size()?;
            self.framing = if size == 0 { Framing::Done } else { Framing::Chunked { left: size } };
        }
        let limit = match self.framing {
            Framing::Done | Framing::Length { left: 0 } => return Ok(0),
            Framing::Chunked { left } | Framing::Length { left } => usize::try_from(left).unwrap_or(usize::MAX),
            Framing::UntilEof => usize::MAX,
        };
        let want = buf.len().min(limit);
        let n = self.inner.read(&mut buf[..want])?;
        match &mut self.framing {
            Framing::Chunked { .. } | Framing::Length { .. } if n == 0 => {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed inside the body"))
            }
            Framing::Chunked { left } | Framing::Length { left } => {
                *left -= n as u64;
                Ok(n)
            }
            _ => Ok(n),
        }
    }
}

/// A response whose body is read as it arrives; dropping it closes the connection.
pub struct BodyStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    body: BodyReader<BufReader<TcpStream>>,
}

impl BodyStream {
    fn open(stream: TcpStream) -> io::Result<BodyStream> {
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader)?;
        let body = BodyReader::new(reader, &headers);
        Ok(BodyStream { status, headers, body })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

impl Read for BodyStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body.read(buf)
    }
}

/// A server-sent event stream read one event at a time; dropping it closes the connection.
pub struct SseStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    lines: BufReader<BodyReader<BufReader<TcpStream>>>,
}

impl SseStream {
    fn open(stream: TcpStream) -> io::Result<SseStream> {
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader)?;
        let body = BodyReader::new(reader, &headers);
        Ok(SseStream { status, headers, lines: BufReader::new(body) })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The next event's `data` (its lines joined with `\n`), or `None` at the end of the body.
    pub fn next_data(&mut self) -> io::Result<Option<String>> {
        let mut data: Option<String> = None;
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line)? == 0 {
                return Ok(data);
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if data.is_some() {
                    return Ok(data);
                }
                continue;
            }
            if let Some(value) = line.strip_prefix("data:") {
                let value = value.strip_prefix(' ').unwrap_or(value);
                match &mut data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                }
            }
        }
    }

    /// Every remaining event's data, until the body ends.
    pub fn collect_data(&mut self) -> io::Result<Vec<String>> {
        let mut all = Vec::new();
        while let Some(data) = self.next_data()? {
            all.push(data);
        }
        Ok(all)
    }

    /// The whole rest of the body as text, for a non-SSE error response.
    pub fn rest(&mut self) -> String {
        let mut text = String::new();
        let _ = self.lines.read_to_string(&mut text);
        text
    }
}

/// What one completion produced, from a JSON response or assembled from its SSE chunks.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub text: String,
    pub finish_reason: String,
    /// `usage` from the response, or from the last chunk when `stream_options.include_usage` is set, without
    /// `prompt_tokens_details`: how much of the prompt the prefix cache served is no part of the output.
    pub usage: Value,
}

impl Server {
    /// Runs a chat or text completion to the end, streaming when `body["stream"]` is true.
    pub fn complete(&self, path: &str, body: &Value) -> Completion {
        let mut completion = self.complete_with_details(path, body);
        if let Some(usage) = completion.usage.as_object_mut() {
            usage.remove("prompt_tokens_details");
        }
        completion
    }

    fn complete_with_details(&self, path: &str, body: &Value) -> Completion {
        if body["stream"] != Value::Bool(true) {
            let response = self.post_json(path, body);
            assert_eq!(response.status, 200, "POST {path} {body}: {}", response.text());
            let json = response.json();
            let choice = &json["choices"][0];
            let text = choice["message"]["content"].as_str().or(choice["text"].as_str());
            return Completion {
                text: text.unwrap_or_else(|| panic!("no text in {json}")).to_string(),
                finish_reason: choice["finish_reason"].as_str().unwrap_or_default().to_string(),
                usage: json["usage"].clone(),
            };
        }
        let mut stream = self.stream(path, body);
        if stream.status != 200 {
            let status = stream.status;
            panic!("POST {path} {body}: status {status}: {}", stream.rest());
        }
        let events = stream.collect_data().unwrap_or_else(|e| panic!("reading the stream of {body}: {e}"));
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "stream of {body} did not end with [DONE]");
        let mut completion = Completion { text: String::new(), finish_reason: String::new(), usage: Value::Null };
        for data in &events[..events.len() - 1] {
            let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("chunk {data:?}: {e}"));
            if let Some(choice) = chunk["choices"].get(0) {
                let delta = choice["delta"]["content"].as_str().or(choice["text"].as_str());
                completion.text.push_str(delta.unwrap_or_default());
                if let Some(reason) = choice["finish_reason"].as_str() {
                    completion.finish_reason = reason.to_string();
                }
            }
            if !chunk["usage"].is_null() {
                completion.usage = chunk["usage"].clone();
            }
        }
        completion
    }
}
