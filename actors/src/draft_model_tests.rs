//! A draft model in the rounds: drafted equals plain whatever it drafts, and one that agrees with its target has
//! every greedy draft accepted, which only holds if its KV caught up on each lane's every token.

use tensorfold_engine::boundary::{Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep, Logits};
use tensorfold_kernels::attention::{attend, Query};

use crate::coordinator::{Drafting, Schedule};
use crate::request_types::TokenWork;
use crate::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig, StartError};
use crate::runtime_tests::{collect, on, settle, work, FakeEngine, TEXT};

const VOCAB: usize = 64;

/// Logits from a lane's last token, its position and the mean of every token before, read back from its KV.
struct HistoryEngine {
    /// Shifts the logits, so a draft model of it disagrees with its target.
    shift: u64,
}

impl Engine for HistoryEngine {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4, page_tokens, elem_bytes: 4, state_elems: 0 }
    }
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        let mut out = Vec::new();
        for l in lanes {
            for (i, t) in l.tokens.iter().enumerate() {
                pool.write(0, l.pages, l.start_pos + i, &[0.0; 4], &[*t as f32; 4]);
            }
            let first = match l.logits {
                Logits::None => l.tokens.len(),
                Logits::All | Logits::Picks | Logits::Hidden => 0,
                Logits::Last | Logits::Argmax => l.tokens.len() - 1,
            };
            let mut rows = Vec::new();
            for i in first..l.tokens.len() {
                // A zero query weighs every position alike: the value out is the mean of the tokens so far.
                let mut mean = [0f32; 4];
                attend(pool, 0, &[Query { q: &[0.0; 4], pos: l.start_pos + i, pages: l.pages }], 1, &mut mean);
                let key = (l.tokens[i] as u64 * 131 + (mean[0] * 64.0) as u64 + self.shift) % 997;
                rows.extend(
                    (0..VOCAB as u64).map(|v| ((key * 31 + (l.start_pos + i) as u64 * 17 + v * 7) % 23) as f32),
                );
            }
            out.push(l.logits.take(&rows, VOCAB));
        }
        Ok(out)
    }
}

/// An agreeing draft model that refuses rounds of more than `most` tokens, as a GPU engine sized for them does, and
/// fails its every `nth` pass, as a device fault would.
struct Failing {
    inner: HistoryEngine,
    most: usize,
    nth: usize,
    passes: usize,
}

impl Failing {
    fn new(most: usize, nth: usize) -> Failing {
        Failing { inner: HistoryEngine { shift: 0 }, most, nth, passes: 0 }
    }
}

impl Engine for Failing {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        self.inner.kv_layout(page_tokens)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        self.passes += 1;
        let t: usize = lanes.iter().map(|l| l.tokens.len()).sum();
        if t > self.most {
            return Err(EngineError::Sizing(format!("a round of {t} tokens exceeds {}", self.most)));
        }
        match self.passes.is_multiple_of(self.nth) {
            true => Err(EngineError::Device("a fault in this pass".into())),
            false => self.inner.forward(pool, lanes),
        }
    }
}

/// A fake engine with one more token than the others.
struct Wider;

impl Engine for Wider {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        FakeEngine.kv_layout(page_tokens)
    }
    fn vocab_size(&self) -> usize {
        VOCAB + 1
    }
    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        FakeEngine.forward(pool, lanes)
    }
}

fn spec(name: &str, kind: ModelKind) -> ModelSpec {
    ModelSpec { name: name.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 }
}

async fn start_with(draft: Box<dyn Engine>, target: &str) -> Result<Runtime, StartError> {
    let schedule = Schedule {
        round_tokens: 8,
        parallel: 4,
        max_waiting: 64,
        drafting: Drafting { tokens: 3, max_wait: 16, timed: false },
    };
    let cfg =
        RuntimeConfig { page_tokens: 4, kv_pages: Some(128), memory_limit: None, schedule, prefix_cache_tokens: 0 };
    let text = spec(TEXT, ModelKind::Tokens { engine: Box::new(HistoryEngine { shift: 0 }), codec: None });
    let draft = spec("draft", ModelKind::Draft { engine: draft, target: target.into() });
    Runtime::start(vec![text, draft], cfg).await
}

/// Requests 0..8, greedy and seeded, with long enough outputs to draft often; `draft` on or off.
fn requests(draft: bool) -> Vec<TokenWork> {
    (0..8).map(|i| TokenWork { max_tokens: 24, stop_ids: Vec::new(), draft, ..work(i) }).collect()
}

async fn outputs(
    rt: &Runtime,
    works: Vec<TokenWork>,
    together: bool,
) -> Vec<(String, Option<crate::request_types::FinishReason>)> {
    if together {
        let receivers = futures_util::future::join_all(works.into_iter().map(|w| rt.submit(on(TEXT, w)))).await;
        return futures_util::future::join_all(receivers.into_iter().map(|r| collect(r.unwrap()))).await;
    }
    let mut out = Vec::new();
    for w in works {
        out.push(collect(rt.submit(on(TEXT, w)).await.unwrap()).await);
    }
    out
}

#[actix::test]
async fn test_a_draft_model_that_agrees_has_every_greedy_draft_accepted_and_drafted_equals_plain() {
    let rt = start_with(Box::new(HistoryEngine { shift: 0 }), TEXT).await.unwrap();
    let plain = outputs(&rt, requests(false), false).await;
    assert_eq!(rt.metrics().drafts(), (0, 0), "\"draft\": false drafts nothing");
    let greedy: Vec<TokenWork> = requests(true).into_iter().filter(|w| w.sampling.is_greedy()).collect();
    let drafted = outputs(&rt, greedy, false).await;
    let (num_drafted, accepted) = rt.metrics().drafts();
    assert!(num_drafted > 0, "the draft model drafted");
    assert_eq!(accepted, num_drafted, "a draft model equal to its target agrees at every greedy step");
    let want: Vec<_> = plain.iter().step_by(2).cloned().collect();
    assert_eq!(drafted, want, "greedy, alone");
    assert_eq!(outputs(&rt, requests(true), true).await, plain, "greedy and seeded, among others");
    settle(&rt).await;
}

#[actix::test]
async fn test_a_draft_model_sized_for_a_rounds_tokens_catches_up_on_every_token_among_others() {
    let rt = start_with(Box::new(Failing::new(8, usize::MAX)), TEXT).await.unwrap();
    let plain = outputs(&rt, requests(false), false).await;
    let greedy: Vec<TokenWork> = requests(true).into_iter().filter(|w| w.sampling.is_greedy()).collect();
    let drafted = outputs(&rt, greedy, true).await;
    let (num_drafted, accepted) = rt.metrics().drafts();
    assert!(num_drafted > 0, "the draft model drafted");
    assert_eq!(accepted, num_drafted, "its passes fit its sizing, so it agrees at every greedy step among others");
    assert_eq!(drafted, plain.iter().step_by(2).cloned().collect::<Vec<_>>(), "greedy, among others");
    settle(&rt).await;
}

#[actix::test]
async fn test_a_draft_model_whose_pass_fails_takes_those_tokens_again() {
    let rt = start_with(Box::new(Failing::new(usize::MAX, 5)), TEXT).await.unwrap();
    let plain = outputs(&rt, requests(false), false).await;
    let greedy = || requests(true).into_iter().filter(|w| w.sampling.is_greedy()).collect::<Vec<_>>();
    let want: Vec<_> = plain.iter().step_by(2).cloned().collect();
    assert_eq!(outputs(&rt, greedy(), false).await, want, "greedy, alone");
    assert_eq!(outputs(&rt, greedy(), true).await, want, "greedy, among others");
    let (num_drafted, accepted) = rt.metrics().drafts();
    assert!(num_drafted > 0, "the draft model drafted");
    assert_eq!(accepted, num_drafted, "a failed pass leaves no position untaken, so every greedy draft holds");
    settle(&rt).await;
}

#[actix::test]
async fn test_a_draft_model_that_disagrees_changes_no_token() {
    let rt = start_with(Box::new(HistoryEngine { shift: 5 }), TEXT).await.unwrap();
    let plain = outputs(&rt, requests(false), false).await;
    assert_eq!(outputs(&rt, requests(true), false).await, plain, "alone");
    assert_eq!(outputs(&rt, requests(true), true).await, plain, "among others");
    let (num_drafted, accepted) = rt.metrics().drafts();
    assert!(num_drafted > accepted, "drafts were rejected: {accepted} of {num_drafted}");
    settle(&rt).await;
}

#[actix::test]
async fn test_a_draft_model_needs_a_loaded_target_with_its_vocabulary() {
    let error = start_with(Box::new(Wider), TEXT).await.err().expect("a wider vocabulary is refused");
    assert!(matches!(error, StartError::DraftVocabulary { draft_vocab: 65, target_vocab: 64, .. }), "{error}");
    let error = start_with(Box::new(FakeEngine), "absent").await.err().expect("a missing target is refused");
    assert_eq!(
        error.to_string(),
        "the draft model \"draft\" drafts for \"absent\", which is not a token model loaded beside it"
    );
}
