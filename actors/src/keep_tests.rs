//! An engine that cuts sampled rows to the tokens their draws can take gives every lane the tokens of one that
//! hands back whole rows, alone and among other lanes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tensorfold_engine::boundary::{Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep};
use tensorfold_kernels::sampling::{kept, penalize, SamplingParams};

use crate::coordinator::{Drafting, Schedule};
use crate::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use crate::runtime_tests::{collect, on, work, FakeEngine, TEXT};

/// The fake engine, cutting each row that asks for it as `keep_rows` does on a GPU: penalty, then `kept`.
struct Keeping {
    inner: FakeEngine,
    rows_cut: Arc<AtomicUsize>,
}

impl Engine for Keeping {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        self.inner.kv_layout(page_tokens)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        let rows = self.inner.forward(pool, lanes)?;
        let cut = lanes.iter().zip(rows).map(|(lane, rows)| match (lane.keep, rows) {
            (Some(keep), LaneRows::Logits(mut row)) => {
                self.rows_cut.fetch_add(1, Ordering::Relaxed);
                penalize(&mut row, keep.history, keep.repetition_penalty);
                let (ids, values) = kept(&row, keep.temperature);
                LaneRows::Kept(ids.into_iter().zip(values).collect())
            }
            (_, rows) => rows,
        });
        Ok(cut.collect())
    }
    fn keeps_rows(&self) -> bool {
        true
    }
}

async fn start(engine: Box<dyn Engine>) -> Runtime {
    let schedule = Schedule { round_tokens: 8, parallel: 4, max_waiting: 64, drafting: Drafting::OFF };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(64), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    let kind = ModelKind::Tokens { engine, codec: None };
    let model = ModelSpec { name: TEXT.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 };
    Runtime::start(vec![model], cfg).await.unwrap()
}

/// Request `i`, sampled cold enough that the cut leaves tokens out, with a penalty on what the lane has seen.
fn sampled(i: u64) -> crate::request_types::ValidRequest {
    let mut w = work(i);
    let temperature = [0.2, 0.7, 1.0][i as usize % 3];
    w.sampling = SamplingParams { temperature, top_p: 0.9, repetition_penalty: 1.3, seed: i, ..Default::default() };
    on(TEXT, w)
}

#[actix::test]
async fn test_rows_cut_by_the_engine_draw_what_whole_rows_draw() {
    let whole = start(Box::new(FakeEngine)).await;
    let rows_cut = Arc::new(AtomicUsize::new(0));
    let keeping = start(Box::new(Keeping { inner: FakeEngine, rows_cut: rows_cut.clone() })).await;
    let mut want = Vec::new();
    for i in 0..9 {
        want.push(collect(whole.submit(sampled(i)).await.unwrap()).await);
    }
    let mut alone = Vec::new();
    for i in 0..9 {
        alone.push(collect(keeping.submit(sampled(i)).await.unwrap()).await);
    }
    let receivers: Vec<_> = futures_util::future::join_all((0..9).map(|i| keeping.submit(sampled(i)))).await;
    let together = futures_util::future::join_all(receivers.into_iter().map(|r| collect(r.unwrap()))).await;
    assert!(rows_cut.load(Ordering::Relaxed) > 0, "no row was cut");
    assert_eq!(alone, want, "rows cut by the engine drew other tokens");
    assert_eq!(together, want, "rows cut by the engine drew other tokens among other lanes");
    assert!(want.iter().all(|(t, f)| !t.is_empty() && f.is_some()));
}

/// Every token's id and log-probability (with its alternatives) of a request, and how it finished.
async fn collect_logprobs(
    mut rx: tokio::sync::mpsc::Receiver<crate::request_types::Event>,
) -> Vec<(u32, Option<crate::request_types::TokenLogprob>)> {
    use crate::request_types::Event;
    let mut tokens = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Token { id, logprob, .. } => tokens.push((id, logprob)),
            Event::Done { .. } => return tokens,
            other => panic!("unexpected event {other:?}"),
        }
    }
    panic!("the stream ended without a finish")
}

#[actix::test]
async fn test_greedy_lanes_and_lanes_asking_for_logprobs_draw_alike_from_an_engine_that_cuts_rows() {
    let whole = start(Box::new(FakeEngine)).await;
    let keeping = start(Box::new(Keeping { inner: FakeEngine, rows_cut: Arc::new(AtomicUsize::new(0)) })).await;
    let cases =
        [(0, 0.0, 1.0, true), (1, 0.0, 1.0, true), (2, 0.8, 1.0, true), (3, 1.0, 1.3, true), (4, 0.0, 1.3, false)];
    for (i, temperature, repetition_penalty, logprobs) in cases {
        let asking = || {
            let mut w = work(i);
            w.sampling = SamplingParams { temperature, repetition_penalty, seed: i, ..Default::default() };
            w.logprobs = logprobs.then_some(2);
            on(TEXT, w)
        };
        let want = collect_logprobs(whole.submit(asking()).await.unwrap()).await;
        let got = collect_logprobs(keeping.submit(asking()).await.unwrap()).await;
        assert!(
            !want.is_empty() && want.iter().all(|(_, lp)| lp.as_ref().is_some_and(|l| l.top.len() == 2) == logprobs)
        );
        assert_eq!(got, want, "temperature {temperature}: the tokens or their log-probabilities differ");
    }
}
