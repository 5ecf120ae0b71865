//! The prefix cache end to end on the default model: a prompt resumed from cached pages gives, bit for bit, what it
//! gives fresh (`"cache": false`), at every page boundary and inside a cached partial page, greedy and seeded, among
//! other lanes, after eviction.

mod common;

use std::time::{Duration, Instant};

use common::server::Server;
use common::Rng;
use serde_json::{json, Value};

const COMPLETIONS: &str = "/v1/completions";
/// The server's default `--page-tokens`.
const PAGE: usize = 16;
/// Full pages of each target prompt, and the ids past them.
const PAGES: usize = 7;
const TAIL: usize = 9;
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);

/// A prompt of ordinary token ids whose first id is `first`, so prompts with different `first` share no page.
fn prompt(first: u32, len: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed);
    std::iter::once(first).chain((1..len).map(|_| 200 + rng.below(20_000) as u32)).collect()
}

fn body(server: &Server, ids: &[u32], seeded: bool, cache: Option<bool>, max_tokens: usize) -> Value {
    let mut body = json!({"model": server.model, "prompt": ids, "max_tokens": max_tokens, "logprobs": 2});
    if seeded {
        body["temperature"] = json!(1.0);
        body["top_p"] = json!(0.9);
        body["seed"] = json!(ids[0]);
    } else {
        body["temperature"] = json!(0);
    }
    if let Some(cache) = cache {
        body["cache"] = json!(cache);
    }
    body
}

/// The reply's choice (text, token logprobs, finish reason) and how many prompt tokens the cache served.
fn complete(server: &Server, body: &Value) -> (Value, u64) {
    let response = server.post_json(COMPLETIONS, body);
    assert_eq!(response.status, 200, "{}", response.text());
    let json = response.json();
    let cached = json["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("usage.cached_tokens");
    (json["choices"][0].clone(), cached)
}

fn gauge(server: &Server, name: &str) -> f64 {
    server.metrics().get(name).copied().unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// A counter's value, 0 before anything counted.
fn counter(server: &Server, name: &str) -> f64 {
    server.metrics().get(name).copied().unwrap_or(0.0)
}

#[test]
fn test_a_prompt_resumed_from_cached_pages_equals_it_fresh_at_every_page_boundary() {
    let server = Server::start(&["--parallel", "8"]);
    let mut targets = Vec::new();
    for k in 1..=PAGES {
        for seeded in [false, true] {
            let ids = prompt(300 + 2 * k as u32 + seeded as u32, PAGES * PAGE + TAIL, k as u64);
            let (fresh, cached) = complete(&server, &body(&server, &ids, seeded, Some(false), 24));
            assert_eq!(cached, 0, "\"cache\": false");
            // A shorter prompt caches the target's first k pages and 5 ids past them, and only those.
            let (_, cached) = complete(&server, &body(&server, &ids[..k * PAGE + 5], seeded, None, 1));
            assert_eq!(cached, 0, "nothing of this prompt was cached yet");
            let (resumed, cached) = complete(&server, &body(&server, &ids, seeded, None, 24));
            assert_eq!(cached, (k * PAGE + 5) as u64, "the target resumes 5 ids after its first {k} pages");
            assert_eq!(resumed, fresh, "resumed after {k} pages, seeded {seeded}");
            targets.push((ids, seeded, fresh));
        }
    }
    // Every target is cached whole now: all of them at once, with uncached lanes beside them in the same rounds.
    let others: Vec<Value> = (0..8)
        .map(|i| body(&server, &prompt(9000 + i, 40 + 13 * i as usize, i as u64), i % 2 == 1, None, 30))
        .collect();
    std::thread::scope(|scope| {
        let server = &server;
        for other in &others {
            scope.spawn(move || complete(server, other));
        }
        let handles: Vec<_> = targets
            .iter()
            .map(|(ids, seeded, _)| scope.spawn(move || complete(server, &body(server, ids, *seeded, None, 24))))
            .collect();
        for (handle, (ids, seeded, fresh)) in handles.into_iter().zip(&targets) {
            let (resumed, cached) = handle.join().expect("a request thread panicked");
            assert_eq!(cached, (PAGES * PAGE + TAIL - 1) as u64, "all but the last id");
            assert_eq!(&resumed, fresh, "among other lanes: {} ids, seeded {seeded}", ids.len());
        }
    });
    let metrics = server.metrics();
    let hits = metrics.get("tensorfold_prefix_cache_hits_total").copied().unwrap_or(0.0);
    assert!(hits >= (PAGES * PAGE * targets.len()) as f64, "prefix cache hits {hits}");
}

#[test]
fn test_a_prompt_evicted_from_the_cache_and_cached_again_still_equals_it_fresh() {
    // Room for five pages: each target's own pages, the last one partial, push the others out.
    let server = Server::start(&["--prefix-cache-tokens", "80"]);
    let targets: Vec<Vec<u32>> = (0..3).map(|i| prompt(700 + i, 4 * PAGE + TAIL, 50 + i as u64)).collect();
    let fresh: Vec<Value> =
        targets.iter().map(|ids| complete(&server, &body(&server, ids, true, Some(false), 20)).0).collect();
    for round in 0..2 {
        for (ids, fresh) in targets.iter().zip(&fresh) {
            let (first, cached) = complete(&server, &body(&server, ids, true, None, 20));
            assert_eq!(cached, 0, "round {round}: the previous target evicted this one");
            let (again, cached) = complete(&server, &body(&server, ids, true, None, 20));
            assert_eq!(cached, (4 * PAGE + TAIL - 1) as u64, "round {round}: cached again");
            assert_eq!((&first, &again), (fresh, fresh), "round {round}");
            assert!(gauge(&server, "tensorfold_kv_pages_cached") <= 5.0);
        }
    }
}

#[test]
fn test_cancelled_requests_sharing_prefixes_return_every_page() {
    let server = Server::start(&["--max-waiting", "200"]);
    let shared = prompt(800, 3 * PAGE + 2, 1);
    let reference_body = body(&server, &shared, false, Some(false), 12);
    let reference = complete(&server, &reference_body).0;
    let mut rng = Rng(0xbeef);
    let plans: Vec<(Duration, u64, Vec<u32>)> = (0..60)
        .map(|i| {
            let mut ids = shared[..(1 + rng.below(3) as usize) * PAGE].to_vec();
            ids.extend(prompt(900 + i, 1 + rng.below(20) as usize, i as u64));
            // Some repeat the shared prompt whole, so they take its cached partial page one at a time.
            if i % 6 == 0 {
                ids = shared.clone();
            }
            (Duration::from_millis(rng.below(600)), rng.below(5), ids)
        })
        .collect();
    std::thread::scope(|scope| {
        for (delay, drop_point, ids) in &plans {
            let server = &server;
            scope.spawn(move || {
                std::thread::sleep(*delay);
                let mut body = body(server, ids, *drop_point % 2 == 1, None, 120);
                body["stream"] = json!(true);
                match drop_point {
                    0 => drop(server.send_json(COMPLETIONS, &body)),
                    events => {
                        let mut stream = server.stream(COMPLETIONS, &body);
                        for _ in 0..*events * 3 {
                            let _ = stream.next_data();
                        }
                    }
                }
            });
        }
    });
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    while gauge(&server, "tensorfold_kv_pages_used") != 0.0 || gauge(&server, "tensorfold_requests_running") != 0.0 {
        assert!(Instant::now() < deadline, "pages still held after the storm:\n{}", server.stderr());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (cached, total) = (gauge(&server, "tensorfold_kv_pages_cached"), gauge(&server, "tensorfold_kv_pages_total"));
    assert!(cached > 0.0 && cached <= total, "{cached} cached pages of {total}");
    let (resumed, hit) = complete(&server, &body(&server, &shared, false, None, 12));
    assert!(hit > 0, "the shared prefix stayed cached");
    assert_eq!(resumed, reference, "the shared prompt after the storm");
}

#[test]
fn test_a_repeated_prompt_prefills_only_its_last_token_and_equals_it_fresh() {
    let server = Server::start(&[]);
    for len in [9, PAGE, 25, 2 * PAGE, 2 * PAGE + 1] {
        for seeded in [false, true] {
            let ids = prompt(1000 + 2 * len as u32 + seeded as u32, len, len as u64);
            let (fresh, cached) = complete(&server, &body(&server, &ids, seeded, Some(false), 16));
            assert_eq!(cached, 0, "\"cache\": false");
            for round in 0..3 {
                let hits = counter(&server, "tensorfold_prefix_cache_hits_total");
                let (again, cached) = complete(&server, &body(&server, &ids, seeded, None, 16));
                let expected = if round == 0 { 0 } else { len - 1 };
                assert_eq!(cached, expected as u64, "{len} ids, round {round}: all but the last from the cache");
                assert_eq!(counter(&server, "tensorfold_prefix_cache_hits_total") - hits, expected as f64);
                assert_eq!(again, fresh, "{len} ids, seeded {seeded}, round {round}");
            }
        }
    }
}

#[test]
fn test_prompts_that_share_a_cached_partial_page_each_equal_themselves_fresh() {
    let server = Server::start(&["--parallel", "8"]);
    let a = prompt(1100, PAGE + TAIL, 3);
    // b shares a's first page and 4 ids of its partial page, then writes its own ids over the rest of that page.
    let b = [&a[..PAGE + 4], &prompt(1101, 14, 4)[..]].concat();
    // c is a and more: it extends a's partial page.
    let c = [&a[..], &prompt(1102, 10, 5)[..]].concat();
    let prompts = [&a, &b, &c];
    let fresh: Vec<Vec<Value>> = [false, true]
        .iter()
        .map(|&seeded| {
            prompts.iter().map(|ids| complete(&server, &body(&server, ids, seeded, Some(false), 16)).0).collect()
        })
        .collect();
    // One after another: b takes a's partial page and fills it with its own ids, so a computes its tail again,
    // caches it in a new page, and c extends that one.
    let steps = [(0, 0), (1, PAGE + 4), (0, PAGE), (2, PAGE + TAIL), (0, PAGE), (0, PAGE + TAIL - 1)];
    for (i, &(which, expected)) in steps.iter().enumerate() {
        let seeded = i % 2 == 1;
        let (out, cached) = complete(&server, &body(&server, prompts[which], seeded, None, 16));
        assert_eq!(cached, expected as u64, "step {i}");
        assert_eq!(out, fresh[seeded as usize][which], "step {i}: prompt {which}, seeded {seeded}");
    }
    // All at once: leases that find the partial page taken compute its ids into pages of their own.
    std::thread::scope(|scope| {
        let server = &server;
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let (which, seeded) = (i % 3, i % 2 == 1);
                let body = body(server, prompts[which], seeded, None, 16);
                (which, seeded, scope.spawn(move || complete(server, &body).0))
            })
            .collect();
        for (which, seeded, handle) in handles {
            let out = handle.join().expect("a request thread panicked");
            assert_eq!(out, fresh[seeded as usize][which], "among others: prompt {which}, seeded {seeded}");
        }
    });
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    while gauge(&server, "tensorfold_kv_pages_used") != 0.0 {
        assert!(Instant::now() < deadline, "pages still held:\n{}", server.stderr());
        std::thread::sleep(Duration::from_millis(200));
    }
}
