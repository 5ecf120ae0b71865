//! `POST /v1/audio/speech` end to end on the tiny Drama checkpoint: formats, errors, interleaving, cancellation, curl.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use common::server::{Response, Server};
use common::speech::{sse_speech, SseSpeech};
use common::Rng;
use serde_json::{json, Value};

const SPEECH: &str = "/v1/audio/speech";
const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
const SAMPLE_RATE: u32 = 24000;
const WAV_HEADER_BYTES: usize = 44;
/// How long dropped requests may take to give back their lanes and pages.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);

/// tests/data/drama, or `TF_TEST_DRAMA`: a GPU's attention kernels take heads larger than its 16.
fn drama_dir() -> PathBuf {
    let committed = || Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama");
    std::env::var_os("TF_TEST_DRAMA").map_or_else(committed, PathBuf::from)
}

/// Whether the server runs on a test device, which may not fetch the default model or voice.
fn on_device() -> bool {
    std::env::var_os("TF_TEST_DEVICE").is_some()
}

/// Drama as both the text and the speech model: it starts fast and needs no download.
fn drama_server(extra: &[&str]) -> Server {
    let dir = drama_dir();
    let mut args = vec!["--speech-model", dir.to_str().expect("a UTF-8 path")];
    args.extend_from_slice(extra);
    Server::start_with_model(&dir, &args)
}

/// About a thousand characters; with this text the tiny checkpoint's audio depends on the seed.
fn long_text() -> String {
    "The rain in Spain falls mainly on the plain. ".repeat(23)[..1000].to_string()
}

fn speech_body(input: &str, voice: &str, seed: u64, format: &str) -> Value {
    json!({"model": "drama", "input": input, "voice": voice, "seed": seed, "response_format": format})
}

/// Asserts a streamed audio reply's status and headers.
fn assert_audio_reply(response: &Response, content_type: &str, what: &str) {
    assert_eq!(response.status, 200, "{what}: {}", response.text());
    assert_eq!(response.header("transfer-encoding"), Some("chunked"), "{what}: {:?}", response.headers);
    assert_eq!(response.header("content-type"), Some(content_type), "{what}: {:?}", response.headers);
    let rate = SAMPLE_RATE.to_string();
    assert_eq!(response.header("x-sample-rate"), Some(rate.as_str()), "{what}: {:?}", response.headers);
}

/// The body of a 200 speech reply.
fn speak(server: &Server, body: &Value) -> Vec<u8> {
    let response = server.post_json(SPEECH, body);
    assert_eq!(response.status, 200, "{body}: {}\n{}", response.text(), server.stderr());
    response.body
}

#[derive(Debug, PartialEq)]
struct WavHeader {
    riff: [u8; 4],
    riff_bytes: u32,
    wave: [u8; 4],
    fmt: [u8; 4],
    fmt_bytes: u32,
    format: u16,
    channels: u16,
    sample_rate: u32,
    byte_rate: u32,
    block_align: u16,
    bits_per_sample: u16,
    data: [u8; 4],
    data_bytes: u32,
}

impl WavHeader {
    fn parse(bytes: &[u8]) -> WavHeader {
        assert!(bytes.len() >= WAV_HEADER_BYTES, "{} bytes is too short for a WAV header", bytes.len());
        let tag = |at: usize| -> [u8; 4] { bytes[at..at + 4].try_into().unwrap() };
        let u32_at = |at: usize| u32::from_le_bytes(tag(at));
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        WavHeader {
            riff: tag(0),
            riff_bytes: u32_at(4),
            wave: tag(8),
            fmt: tag(12),
            fmt_bytes: u32_at(16),
            format: u16_at(20),
            channels: u16_at(22),
            sample_rate: u32_at(24),
            byte_rate: u32_at(28),
            block_align: u16_at(32),
            bits_per_sample: u16_at(34),
            data: tag(36),
            data_bytes: u32_at(40),
        }
    }

    /// A 16-bit mono PCM header whose sizes say "unknown length", as a stream must.
    fn streaming() -> WavHeader {
        WavHeader {
            riff: *b"RIFF",
            riff_bytes: u32::MAX,
            wave: *b"WAVE",
            fmt: *b"fmt ",
            fmt_bytes: 16,
            format: 1,
            channels: 1,
            sample_rate: SAMPLE_RATE,
            byte_rate: SAMPLE_RATE * 2,
            block_align: 2,
            bits_per_sample: 16,
            data: *b"data",
            data_bytes: u32::MAX,
        }
    }
}

/// `tensorfold speak` into a temporary WAV: its spec and its samples as 16-bit little-endian bytes.
fn speak_cli(text: &str, voice: &str, seed: u64) -> (hound::WavSpec, Vec<u8>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("speech.wav");
    let output = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .arg("speak")
        .arg("--speech-model")
        .arg(drama_dir())
        .args(["--text", text, "--voice", voice, "--seed", &seed.to_string(), "-o"])
        .arg(&path)
        .output()
        .expect("running tensorfold speak");
    assert!(output.status.success(), "tensorfold speak: {}", String::from_utf8_lossy(&output.stderr));
    let mut reader = hound::WavReader::open(&path).expect("speak writes a readable WAV");
    let spec = reader.spec();
    let samples: Vec<i16> = reader.samples::<i16>().map(|s| s.expect("a 16-bit sample")).collect();
    (spec, samples.iter().flat_map(|s| s.to_le_bytes()).collect())
}

#[test]
fn test_wav_pcm_sse_and_speak_carry_the_same_samples() {
    let server = drama_server(&[]);
    let (text, voice, seed) = ("Hello there, how are you today?", "leo", 3);
    let pcm_reply = server.post_json(SPEECH, &speech_body(text, voice, seed, "pcm"));
    assert_audio_reply(&pcm_reply, "audio/pcm", "pcm");
    let pcm = pcm_reply.body;
    assert!(!pcm.is_empty() && pcm.len().is_multiple_of(2), "{} bytes of 16-bit PCM", pcm.len());
    assert!(pcm.iter().any(|&b| b != 0), "the audio is silent");

    let wav_reply = server.post_json(SPEECH, &speech_body(text, voice, seed, "wav"));
    assert_audio_reply(&wav_reply, "audio/wav", "wav");
    assert_eq!(WavHeader::parse(&wav_reply.body), WavHeader::streaming());
    assert!(wav_reply.body[WAV_HEADER_BYTES..] == pcm[..], "WAV samples differ from PCM for the same seed");

    let SseSpeech { audio: sse_pcm, usage, .. } = sse_speech(&server, &speech_body(text, voice, seed, "pcm"));
    assert!(sse_pcm == pcm, "SSE deltas ({} bytes) differ from PCM ({} bytes)", sse_pcm.len(), pcm.len());
    let (input, output) = (usage["input_tokens"].as_u64(), usage["output_tokens"].as_u64());
    assert!(input.is_some_and(|n| n > 0) && output.is_some_and(|n| n > 0), "usage {usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(input.unwrap_or(0) + output.unwrap_or(0)), "usage {usage}");
    let sse_wav = sse_speech(&server, &speech_body(text, voice, seed, "wav")).audio;
    assert!(sse_wav == wav_reply.body, "SSE WAV deltas differ from the WAV reply");

    let (spec, cli) = speak_cli(text, voice, seed);
    assert_eq!((spec.channels, spec.sample_rate, spec.bits_per_sample), (1, SAMPLE_RATE, 16), "{spec:?}");
    assert!(cli == pcm, "speak wrote {} bytes of samples, the server sent {} different ones", cli.len(), pcm.len());
    let body = speech_body(text, voice, seed, "pcm");
    let concurrent: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3).map(|_| scope.spawn(|| speak(&server, &body))).collect();
        handles.into_iter().map(|h| h.join().expect("a speech thread panicked")).collect()
    });
    for (i, audio) in concurrent.iter().enumerate() {
        assert!(*audio == cli, "concurrent request {i} differs from tensorfold speak");
    }
}

#[test]
fn test_same_seed_repeats_and_seeds_pick_the_audio() {
    let server = drama_server(&[]);
    let text = long_text();
    let by_seed: Vec<Vec<u8>> = (0..8).map(|seed| speak(&server, &speech_body(&text, "zac", seed, "pcm"))).collect();
    for seed in [0, 3] {
        let again = speak(&server, &speech_body(&text, "zac", seed, "pcm"));
        assert!(again == by_seed[seed as usize], "seed {seed} gave different audio the second time");
    }
    let distinct: std::collections::BTreeSet<&Vec<u8>> = by_seed.iter().collect();
    assert!(distinct.len() > 1, "eight seeds gave the same audio: the seed is not used");
    let other_voice = speak(&server, &speech_body(&text, "leo", 0, "pcm"));
    assert!(other_voice != by_seed[0], "voices leo and zac gave the same audio");
}

#[test]
fn test_speech_resumed_from_the_prefix_cache_equals_it_fresh() {
    let server = drama_server(&[]);
    let body = speech_body(&long_text(), "zac", 5, "pcm");
    let mut fresh_body = body.clone();
    fresh_body["cache"] = json!(false);
    let fresh = speak(&server, &fresh_body);
    let hits = |s: &Server| s.metrics().get("tensorfold_prefix_cache_hits_total").copied().unwrap_or(0.0);
    let first = speak(&server, &body);
    let before = hits(&server);
    let resumed = speak(&server, &body);
    assert!(hits(&server) > before, "the second request did not resume from the cache");
    assert!(first == fresh && resumed == fresh, "audio resumed from the prefix cache differs from it fresh");
}

/// Asserts a 400 with OpenAI's error envelope naming `param`, whose message contains `needle`.
fn assert_invalid(response: &Response, param: Option<&str>, needle: &str, what: &str) {
    assert_eq!(response.status, 400, "{what}: {}", response.text());
    let error = &response.json()["error"];
    assert_eq!(error["type"], "invalid_request_error", "{what}: {error}");
    assert_eq!(error["param"].as_str(), param, "{what}: {error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{what}: message {message:?} lacks {needle:?}");
}

#[test]
fn test_bad_speech_requests_are_openai_400s_naming_the_field() {
    let server = drama_server(&[]);
    let mut at_limit = "the".to_string();
    while at_limit.len() < 4096 {
        at_limit.push_str(" the");
    }
    at_limit.truncate(4096);
    let over_limit = format!("{at_limit}e");
    assert_eq!((at_limit.chars().count(), over_limit.chars().count()), (4096, 4097));

    let ok = |extra: Value| {
        let mut body = json!({"model": "drama", "input": "Hello there", "voice": "tara"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let cases = [
        (ok(json!({"input": ""})), "input", "empty"),
        (ok(json!({"input": " \n\t "})), "input", "whitespace"),
        (ok(json!({"input": over_limit})), "input", "4097"),
        (ok(json!({"voice": "nobody"})), "voice", "tara"),
        (ok(json!({"response_format": "ogg"})), "response_format", "\"mp3\", \"opus\""),
        (ok(json!({"speed": 0.1})), "speed", "0.1"),
        (ok(json!({"speed": 5})), "speed", "5"),
        (ok(json!({"speed": 2.0})), "speed", "1.0"),
        (ok(json!({"stream_format": "chunks"})), "stream_format", "chunks"),
        (ok(json!({"max_tokens": 0})), "max_tokens", "at least 1"),
        (json!({"input": "Hello there", "voice": "tara"}), "model", "model"),
    ];
    for (body, param, needle) in &cases {
        assert_invalid(&server.post_json(SPEECH, body), Some(param), needle, &body.to_string());
    }
    assert_invalid(&server.post_raw(SPEECH, b"{not json", &[]), None, "JSON", "a non-JSON body");

    let accepted = server.post_json(SPEECH, &ok(json!({"input": at_limit, "seed": 0})));
    assert_audio_reply(&accepted, "audio/mpeg", "4096 characters");
    assert!(!accepted.body.is_empty(), "4096 characters gave no audio");
    let at_speed_one = server.post_json(SPEECH, &ok(json!({"speed": 1.0, "seed": 0})));
    assert_audio_reply(&at_speed_one, "audio/mpeg", "speed 1.0");

    let get = server.get(SPEECH);
    assert_eq!(get.status, 405, "GET {SPEECH}: {}", get.text());
    assert_eq!(get.header("allow"), Some("POST"), "{:?}", get.headers);
}

#[test]
fn test_max_tokens_caps_a_drama_requests_audio_at_whole_frames() {
    let server = drama_server(&[]);
    let body = speech_body(&long_text(), "tara", 3, "pcm");
    let full = speak(&server, &body).len();
    let frame_bytes = 2048 * 2;
    for (max_tokens, frames) in [(14, 2), (20, 2), (7, 1)] {
        let mut capped = body.clone();
        capped["max_tokens"] = json!(max_tokens);
        let got = speak(&server, &capped).len();
        assert_eq!(got, frames * frame_bytes, "max_tokens {max_tokens}: {got} bytes, {full} uncapped");
    }
    assert!(full > 2 * frame_bytes, "the uncapped request gave {full} bytes");
}

#[test]
fn test_speech_without_a_speech_model_is_400_naming_the_flag() {
    let server = Server::start_with_model(&drama_dir(), &["--no-voice"]);
    let response = server.post_json(SPEECH, &speech_body("Hello there", "tara", 0, "pcm"));
    assert_invalid(&response, Some("model"), "--speech-model", "no --speech-model");
}

/// Text and finish reason joined from a chat or completion stream's events.
fn chat_from_events(events: &[String]) -> (String, String) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "the chat stream did not end with [DONE]");
    let (mut text, mut finish) = (String::new(), String::new());
    for data in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("chunk {data:?}: {e}"));
        let choice = &chunk["choices"][0];
        let piece = choice["delta"]["content"].as_str().or(choice["text"].as_str());
        text.push_str(piece.unwrap_or_default());
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_string();
        }
    }
    (text, finish)
}

#[test]
fn test_speech_is_identical_alone_and_among_chats_and_other_speech() {
    // A test device may not fetch the default model: there the text lanes are completions on the Drama model itself.
    let on_device = on_device();
    let drama = drama_dir();
    let server = match on_device {
        true => drama_server(&[]),
        false => Server::start(&["--speech-model", drama.to_str().expect("a UTF-8 path")]),
    };
    let route = if on_device { COMPLETIONS } else { CHAT };
    let text = long_text();
    let speeches = [
        speech_body(&text, "zac", 3, "pcm"),
        speech_body(&text, "zac", 7, "wav"),
        speech_body("Hello there, how are you today?", "leo", 0, "pcm"),
        speech_body(&text, "zac", 3, "pcm"),
    ];
    let chats: Vec<Value> = ["Tell me a story about a fox.", "Describe the sea.", "Why is the sky blue?"]
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let mut body =
                json!({"model": server.model, "max_tokens": 120, "temperature": 0.9, "seed": 11 + i, "stream": true});
            match on_device {
                true => body["prompt"] = json!(prompt),
                false => body["messages"] = json!([{"role": "user", "content": prompt}]),
            }
            body
        })
        .collect();
    let solo_speech: Vec<Vec<u8>> = speeches.iter().map(|body| speak(&server, body)).collect();
    let solo_chats: Vec<(String, String)> = chats
        .iter()
        .map(|body| chat_from_events(&server.stream(route, body).collect_data().expect("reading a chat")))
        .collect();

    // Every chat is decoding before the first speech request is sent.
    let barrier = Barrier::new(chats.len() + speeches.len());
    let (together_speech, together_chats) = std::thread::scope(|scope| {
        let chat_handles: Vec<_> = chats
            .iter()
            .map(|body| {
                let (server, barrier) = (&server, &barrier);
                scope.spawn(move || {
                    let mut stream = server.stream(route, body);
                    let mut events = vec![stream.next_data().expect("a first chunk").expect("a first event")];
                    barrier.wait();
                    events.extend(stream.collect_data().expect("reading a chat"));
                    (chat_from_events(&events), Instant::now())
                })
            })
            .collect();
        let speech_handles: Vec<_> = speeches
            .iter()
            .map(|body| {
                let (server, barrier) = (&server, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let sent = Instant::now();
                    let audio = speak(server, body);
                    (audio, sent)
                })
            })
            .collect();
        let speech: Vec<(Vec<u8>, Instant)> =
            speech_handles.into_iter().map(|h| h.join().expect("a speech thread panicked")).collect();
        let chats: Vec<((String, String), Instant)> =
            chat_handles.into_iter().map(|h| h.join().expect("a chat thread panicked")).collect();
        (speech, chats)
    });
    let first_speech_sent = together_speech.iter().map(|(_, at)| *at).min().expect("speech requests");
    let last_chat_done = together_chats.iter().map(|(_, at)| *at).max().expect("chats");
    assert!(first_speech_sent < last_chat_done, "no speech request was sent while a chat was streaming");
    for (i, ((audio, _), solo)) in together_speech.iter().zip(&solo_speech).enumerate() {
        assert!(audio == solo, "speech {i} ({}) differs among chats from alone", speeches[i]);
    }
    for (i, ((chat, _), solo)) in together_chats.iter().zip(&solo_chats).enumerate() {
        assert_eq!(chat, solo, "chat {i} differs among speech from alone");
    }
}

/// Pages used, lanes running, requests waiting and all bytes held.
fn gauges(metrics: &BTreeMap<String, f64>) -> [Option<f64>; 4] {
    [
        "tensorfold_kv_pages_used",
        "tensorfold_requests_running",
        "tensorfold_requests_waiting",
        "tensorfold_ledger_total_bytes",
    ]
    .map(|name| metrics.get(name).copied())
}

#[test]
fn test_dropped_speech_streams_release_everything() {
    let server = drama_server(&["--parallel", "4", "--max-waiting", "200"]);
    let text = long_text();
    let reference_body = speech_body(&text, "zac", 3, "wav");
    let reference = speak(&server, &reference_body);
    let story = json!({"model": "drama", "prompt": "Once upon a time", "max_tokens": 1500, "seed": 5, "stream": true});
    let baseline = gauges(&server.metrics());
    assert!(baseline.iter().all(Option::is_some), "missing gauges in {baseline:?}");
    assert_eq!(&baseline[..3], &[Some(0.0); 3], "the server is busy before the stress");

    let formats = [("pcm", "audio"), ("wav", "audio"), ("pcm", "sse")];
    let mut rng = Rng(0x5eec);
    // A drop point of `None` closes the connection right after sending, before any byte of the reply.
    let plans: Vec<(Duration, usize, Option<u64>)> = (0..48)
        .map(|_| {
            let delay = Duration::from_millis(rng.below(400));
            let drop_after = match rng.below(6) {
                0 => None,
                1 => Some(0),
                _ => Some(1 + rng.below(reference.len() as u64)),
            };
            (delay, rng.below(8) as usize, drop_after)
        })
        .collect();
    let clients_done = AtomicBool::new(false);
    let (cut_short, most_pages_used) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut most = 0f64;
            while !clients_done.load(Ordering::Relaxed) {
                most = most.max(server.metrics().get("tensorfold_kv_pages_used").copied().unwrap_or(0.0));
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        });
        let handles: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(i, &(delay, kind, drop_after))| {
                let (server, text, story) = (&server, &text, &story);
                scope.spawn(move || {
                    std::thread::sleep(delay);
                    let (path, body) = match kind {
                        0 => (COMPLETIONS, story.clone()),
                        _ => {
                            let (format, stream_format) = formats[kind % formats.len()];
                            let mut body = speech_body(text, "zac", i as u64, format);
                            body["stream_format"] = json!(stream_format);
                            (SPEECH, body)
                        }
                    };
                    let Some(drop_after) = drop_after else {
                        // Dropped while the request is parsed, queued or in prefill.
                        drop(server.send_json(path, &body));
                        return true;
                    };
                    let stream = server.open_body(path, &body);
                    assert_eq!(stream.status, 200, "request {i} to {path}");
                    let mut read = Vec::new();
                    let _ = stream.take(drop_after).read_to_end(&mut read);
                    read.len() as u64 == drop_after
                })
            })
            .collect();
        let cut_short = handles.into_iter().map(|h| h.join().expect("a client thread panicked")).filter(|&c| c).count();
        clients_done.store(true, Ordering::Relaxed);
        (cut_short, sampler.join().expect("the metrics sampler panicked"))
    });
    assert!(cut_short >= plans.len() / 2, "only {cut_short} of {} streams were cut short", plans.len());
    assert!(most_pages_used > 0.0, "no KV page was ever in use during the stress");

    let deadline = Instant::now() + RELEASE_TIMEOUT;
    let mut last = gauges(&server.metrics());
    let released = [Some(0.0), Some(0.0), Some(0.0), baseline[3]];
    while last != released {
        assert!(
            Instant::now() < deadline,
            "after {RELEASE_TIMEOUT:?} [pages used, running, waiting, ledger total] = {last:?}, want {released:?}\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
        last = gauges(&server.metrics());
    }
    assert!(speak(&server, &reference_body) == reference, "speech after the drops differs from before");
}

/// Whether `curl` runs; a skip outside CI, a failure in it.
fn have_curl() -> bool {
    match Command::new("curl").arg("--version").output() {
        Ok(output) if output.status.success() => true,
        other => {
            assert!(std::env::var_os("CI").is_none(), "CI is set but curl does not run: {other:?}");
            println!("skipping: curl is not on PATH");
            false
        }
    }
}

#[test]
fn test_curl_streams_the_same_wav() {
    if !have_curl() {
        return;
    }
    let server = drama_server(&[]);
    let body = speech_body("Hello there, how are you today?", "tara", 4, "wav");
    let ours = speak(&server, &body);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (audio, head) = (dir.path().join("speech.wav"), dir.path().join("head.txt"));
    let curl = |body: &Value| {
        Command::new("curl")
            .args(["-sS", "--fail", "-H", "content-type: application/json", "--data-binary", &body.to_string(), "-o"])
            .arg(&audio)
            .arg("-D")
            .arg(&head)
            .arg(format!("{}{SPEECH}", server.base_url()))
            .output()
            .expect("running curl")
    };
    let output = curl(&body);
    assert!(output.status.success(), "curl: {}", String::from_utf8_lossy(&output.stderr));
    let from_curl = std::fs::read(&audio).expect("curl wrote the audio");
    assert!(from_curl == ours, "curl got {} bytes, our client {} different ones", from_curl.len(), ours.len());
    let head = std::fs::read_to_string(&head).expect("curl wrote the headers").to_ascii_lowercase();
    assert!(head.contains("x-sample-rate: 24000") && head.contains("transfer-encoding: chunked"), "{head}");

    let refused = curl(&speech_body("Hello there", "tara", 4, "ogg"));
    assert_eq!(refused.status.code(), Some(22), "curl --fail on a 400: {refused:?}");

    if on_device() {
        return;
    }
    // The default voice streams to curl too.
    let body = speech_body("Hello there, how are you today?", "heart", 4, "wav");
    let ours = speak(&server, &body);
    let output = curl(&body);
    assert!(output.status.success(), "curl: {}", String::from_utf8_lossy(&output.stderr));
    let from_curl = std::fs::read(&audio).expect("curl wrote the audio");
    assert!(from_curl.len() > 44 + 24_000, "{} bytes from the default voice", from_curl.len());
    assert!(
        from_curl == ours,
        "curl got {} bytes of the default voice, our client {} different ones",
        from_curl.len(),
        ours.len()
    );
}

#[test]
fn test_models_list_the_text_model_then_each_speaker() {
    let server = drama_server(&[]);
    let json = server.get("/v1/models").json();
    let ids: Vec<&str> = json["data"].as_array().expect("a list").iter().filter_map(|m| m["id"].as_str()).collect();
    // The checkpoint serves text and speech, so it is listed once.
    assert_eq!(ids, ["drama", "hibari"], "{json}");
    assert_eq!(server.model, "drama");
    assert_eq!(server.get("/v1/models/hibari").json()["id"], "hibari");
    assert_eq!(server.get("/v1/models/tts-1").status, 404);
    let without = Server::start_with_model(&drama_dir(), &["--no-voice"]);
    let json = without.get("/v1/models").json();
    assert_eq!(json["data"].as_array().map(Vec::len), Some(1), "{json}");
}
