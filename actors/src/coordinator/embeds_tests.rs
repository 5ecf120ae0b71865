//! Embedding lanes in the rounds: a vector is the same alone, among decoding lanes and at any chunking, and a model
//! whose engine cannot embed refuses the request at submit.

use tensorfold_engine::boundary::{EmbedWork, Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep, Logits};
use tensorfold_kernels::attention::{attend, Query};
use tokio::sync::mpsc::Receiver;

use crate::coordinator::{Drafting, Schedule};
use crate::request_types::{Event, SubmitError, ValidRequest, Work};
use crate::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use crate::runtime_tests::{collect, on, settle, work, TEXT};

const VOCAB: usize = 64;

/// Rows from a row's token, its position and the mean of its lane's tokens so far, read back from the KV; with
/// `refuses_hidden`, it says it cannot embed and fails a step asking for hidden rows, as the CUDA engine does.
struct HistoryEngine {
    refuses_hidden: bool,
}

impl Engine for HistoryEngine {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4, page_tokens, elem_bytes: 4, state_elems: 0 }
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn embeds(&self) -> bool {
        !self.refuses_hidden
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        if self.refuses_hidden && lanes.iter().any(|l| l.logits == Logits::Hidden) {
            return Err(EngineError::Sizing("embeddings are not supported here".into()));
        }
        let mut out = Vec::new();
        for l in lanes {
            for (i, t) in l.tokens.iter().enumerate() {
                pool.write(0, l.pages, l.start_pos + i, &[0.0; 4], &[*t as f32; 4]);
            }
            let (mut hidden, mut logits) = (Vec::new(), Vec::new());
            for i in 0..l.tokens.len() {
                // A zero query weighs every position alike: the value out is the mean of the tokens so far.
                let mut mean = [0f32; 4];
                attend(pool, 0, &[Query { q: &[0.0; 4], pos: l.start_pos + i, pages: l.pages }], 1, &mut mean);
                let pos = (l.start_pos + i) as f32;
                hidden.extend([l.tokens[i] as f32, pos, mean[0], (pos * 0.37).sin()]);
                let key = (l.tokens[i] as u64 * 131 + (mean[0] * 64.0) as u64) % 997;
                logits.extend(
                    (0..VOCAB as u64).map(|v| ((key * 31 + (l.start_pos + i) as u64 * 17 + v * 7) % 23) as f32),
                );
            }
            out.push(match l.logits {
                Logits::Hidden => LaneRows::Hidden(hidden),
                kind => kind.take(&logits[(l.tokens.len() - kind.rows(l.tokens.len())) * VOCAB..], VOCAB),
            });
        }
        Ok(out)
    }
}

async fn start(round_tokens: usize, refuses_hidden: bool) -> Runtime {
    let schedule = Schedule { round_tokens, parallel: 8, max_waiting: 64, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(256), memory_limit: None, schedule, prefix_cache_tokens: 64 };
    let kind = ModelKind::Tokens { engine: Box::new(HistoryEngine { refuses_hidden }), codec: None };
    let model = ModelSpec { name: TEXT.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 };
    Runtime::start(vec![model], cfg).await.unwrap()
}

fn embed(i: u32) -> ValidRequest {
    let prompt = (0..5 + i * 7).map(|t| (t * 11 + i) % VOCAB as u32).collect();
    ValidRequest { model: TEXT.into(), work: Work::Embed(EmbedWork { prompt, cache: i.is_multiple_of(2) }) }
}

async fn vector(mut rx: Receiver<Event>) -> Result<Vec<u32>, EngineError> {
    match rx.recv().await {
        Some(Event::Embedding { vector, usage }) => {
            assert_eq!(usage.completion_tokens, 0);
            Ok(vector.iter().map(|v| v.to_bits()).collect())
        }
        Some(Event::Error(e)) => Err(e),
        other => panic!("not an embedding: {other:?}"),
    }
}

#[actix::test]
async fn test_an_embedding_is_the_same_alone_among_decoding_lanes_and_at_any_chunking() {
    let rt = start(64, false).await;
    let mut alone = Vec::new();
    for i in 0..4 {
        alone.push(vector(rt.submit(embed(i)).await.unwrap()).await.unwrap());
    }
    let norm = |bits: &[u32]| bits.iter().map(|b| f32::from_bits(*b) as f64).map(|v| v * v).sum::<f64>().sqrt();
    assert!(alone.iter().all(|v| v.len() == 4 && (norm(v) - 1.0).abs() < 1e-6));
    assert!(alone.windows(2).all(|w| w[0] != w[1]));
    for round_tokens in [3, 8, 64] {
        let rt = start(round_tokens, false).await;
        let decoding: Vec<_> = futures_util::future::join_all((0..4).map(|i| rt.submit(on(TEXT, work(i))))).await;
        let embeds: Vec<_> = futures_util::future::join_all((0..4).map(|i| rt.submit(embed(i)))).await;
        let texts = futures_util::future::join_all(decoding.into_iter().map(|r| collect(r.unwrap())));
        let vectors = futures_util::future::join_all(embeds.into_iter().map(|r| vector(r.unwrap())));
        let (texts, vectors) = futures_util::future::join(texts, vectors).await;
        assert!(texts.iter().all(|(t, f)| !t.is_empty() && f.is_some()));
        let vectors: Vec<_> = vectors.into_iter().map(Result::unwrap).collect();
        assert_eq!(vectors, alone, "round_tokens {round_tokens}");
        settle(&rt).await;
    }
    settle(&rt).await;
}

#[actix::test]
async fn test_a_model_that_cannot_embed_refuses_at_submit_and_its_lanes_go_on() {
    let (rt, plain) = (start(16, true).await, &start(16, false).await);
    let want = futures_util::future::join_all(
        (0..3).map(|i| async move { collect(plain.submit(on(TEXT, work(i))).await.unwrap()).await }),
    );
    let want = want.await;
    let decoding: Vec<_> = futures_util::future::join_all((0..3).map(|i| rt.submit(on(TEXT, work(i))))).await;
    let refused = rt.submit(embed(2)).await.err();
    assert_eq!(refused, Some(SubmitError::Unsupported { model: TEXT.into(), what: "embeddings" }));
    let got = futures_util::future::join_all(decoding.into_iter().map(|r| collect(r.unwrap()))).await;
    assert_eq!(got, want);
    assert!(rt.limits(TEXT).is_some_and(|l| !l.embeds));
    settle(&rt).await;
}

#[actix::test]
async fn test_an_embedding_takes_a_free_lane_in_its_turn_ahead_of_text_that_came_after_it() {
    let schedule = Schedule { round_tokens: 16, parallel: 1, max_waiting: 64, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(256), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    let kind = ModelKind::Tokens { engine: Box::new(HistoryEngine { refuses_hidden: false }), codec: None };
    let model = ModelSpec { name: TEXT.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 };
    let rt = Runtime::start(vec![model], cfg).await.unwrap();
    let first = rt.submit(on(TEXT, work(0))).await.unwrap();
    let embedding = rt.submit(embed(1)).await.unwrap();
    let later: Vec<_> = futures_util::future::join_all((1..4).map(|i| rt.submit(on(TEXT, work(i))))).await;
    let done_at = |f: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>| async move {
        f.await;
        std::time::Instant::now()
    };
    let texts = later.into_iter().map(|r| done_at(Box::pin(async move { _ = collect(r.unwrap()).await })));
    let (first_done, vector_done, texts_done) = futures_util::future::join3(
        done_at(Box::pin(async move { _ = collect(first).await })),
        done_at(Box::pin(async move {
            vector(embedding).await.unwrap();
        })),
        futures_util::future::join_all(texts),
    )
    .await;
    assert!(first_done <= vector_done, "the embedding ran before the request ahead of it");
    assert!(texts_done.iter().all(|&t| vector_done <= t), "text that came after the embedding went ahead of it");
    settle(&rt).await;
}
