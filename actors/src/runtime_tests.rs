//! The runtime end to end over a fake engine: exactness across batching, cancellation, admission errors.

use std::time::Duration;

use tensorfold_kernels::sampling::SamplingParams;
use tokio::sync::mpsc::Receiver;

use crate::coordinator::Schedule;
use crate::engine::{Engine, KvLayout, KvPool, LaneStep, Logits};
use crate::request_types::{Event, FinishReason, SubmitError, TextDecoder, ValidRequest};
use crate::runtime::{Runtime, RuntimeConfig};

const VOCAB: usize = 64;

/// Logits that depend on the lane's last token and absolute position only.
struct FakeEngine;

impl Engine for FakeEngine {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4, page_tokens }
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn forward(&self, pool: &mut KvPool, lanes: &[LaneStep]) -> Vec<Vec<f32>> {
        std::thread::sleep(Duration::from_millis(1));
        lanes
            .iter()
            .map(|l| {
                for (i, t) in l.tokens.iter().enumerate() {
                    pool.write(0, l.pages, l.start_pos + i, &[*t as f32; 4], &[0.0; 4]);
                }
                let pos = l.start_pos + l.tokens.len() - 1;
                let last = *l.tokens.last().unwrap() as u64;
                match l.logits {
                    Logits::None => Vec::new(),
                    _ => (0..VOCAB as u64).map(|v| ((last * 31 + pos as u64 * 17 + v * 7) % 23) as f32 * 0.3).collect(),
                }
            })
            .collect()
    }
}

struct Ids;

impl TextDecoder for Ids {
    fn push(&mut self, id: u32) -> String {
        format!("<{id}>")
    }
    fn finish(&mut self) -> String {
        String::new()
    }
}

async fn start(parallel: usize, max_waiting: usize, kv_pages: usize) -> Runtime {
    let schedule = Schedule { round_tokens: 8, parallel, max_waiting };
    let cfg = RuntimeConfig {
        page_tokens: 4,
        kv_pages: Some(kv_pages),
        memory_limit: None,
        schedule,
        context: 256,
        weight_bytes: 0,
        activation_bytes: 0,
    };
    Runtime::start(Box::new(FakeEngine), cfg).await.unwrap()
}

fn request(i: u64) -> ValidRequest {
    let sampling = SamplingParams { temperature: if i % 2 == 0 { 0.0 } else { 1.0 }, seed: i, ..Default::default() };
    ValidRequest {
        prompt: (0..(3 + i as u32 * 5) % 29 + 1).map(|t| (t * 7 + i as u32) % VOCAB as u32).collect(),
        max_tokens: 8 + (i as usize % 5) * 3,
        sampling,
        stop_ids: vec![63],
        stop_strings: Vec::new(),
        logprobs: None,
        decoder: Box::new(Ids),
    }
}

async fn collect(mut rx: Receiver<Event>) -> (String, Option<FinishReason>) {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done { finish, .. } => return (text, Some(finish)),
            Event::Error { message } => panic!("{message}"),
        }
    }
    (text, None)
}

async fn settle(rt: &Runtime) {
    for _ in 0..200 {
        let m = rt.metrics();
        if m.requests_running() == 0 && m.requests_waiting() == 0 && m.kv_pages().0 == 0 {
            return;
        }
        actix::clock::sleep(Duration::from_millis(10)).await;
    }
    panic!("lanes or pages were not returned");
}

#[actix::test]
async fn test_concurrent_equals_solo() {
    let rt = start(4, 64, 64).await;
    let mut solo = Vec::new();
    for i in 0..12 {
        solo.push(collect(rt.submit(request(i)).await.unwrap()).await);
    }
    let receivers: Vec<_> = futures_util::future::join_all((0..12).map(|i| rt.submit(request(i)))).await;
    let together = futures_util::future::join_all(receivers.into_iter().map(|r| collect(r.unwrap()))).await;
    assert_eq!(solo, together);
    assert!(solo.iter().all(|(t, f)| !t.is_empty() && f.is_some()));
    settle(&rt).await;
}

#[actix::test]
async fn test_dropped_receivers_return_lanes_and_pages() {
    let rt = start(3, 64, 1024).await;
    for i in 0..10 {
        let mut rx = rt.submit(ValidRequest { max_tokens: 200, stop_ids: Vec::new(), ..request(i) }).await.unwrap();
        if i % 2 == 0 {
            for _ in 0..3 {
                rx.recv().await.unwrap();
            }
        }
        drop(rx);
    }
    settle(&rt).await;
    let generated = rt.metrics().generated_tokens_total();
    assert!(generated < 200, "cancelled lanes kept decoding: {generated} tokens");
    let (text, finish) = collect(rt.submit(request(1)).await.unwrap()).await;
    assert!(!text.is_empty() && finish.is_some());
}

#[actix::test]
async fn test_full_queue_and_oversized_requests_are_refused() {
    let rt = start(1, 1, 16).await;
    let too_big = ValidRequest { max_tokens: 100, ..request(0) };
    assert!(matches!(rt.submit(too_big).await, Err(SubmitError::TooLarge { .. })));
    let _a = rt.submit(request(2)).await.unwrap();
    let _b = rt.submit(request(4)).await.unwrap();
    let mut refused = false;
    for i in 0..4 {
        refused |= matches!(rt.submit(request(6 + i)).await, Err(SubmitError::QueueFull(_)));
    }
    assert!(refused, "a second waiting request should be refused with max_waiting 1");
}
