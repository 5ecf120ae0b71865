//! The runtime with its KV pool partly in lent memory: the pool grows by the lent whole pages, the ledger counts
//! them beside the cap, and every lane's tokens equal those of a pool without lent memory, alone or together.

use std::time::Duration;

use tensorfold_engine::boundary::{Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep};
use tensorfold_kernels::attention::{attend, Query};
use tensorfold_lend::daemon::{Daemon, Running};
use tensorfold_lend::kv::{host_page, LentLayout};
use tensorfold_lend::pool::{self, MemfdPool};
use tensorfold_lend::{claim, Claim, KeySource, Lent, SLICE_BYTES};

use crate::coordinator::{Drafting, Schedule};
use crate::request_types::FinishReason;
use crate::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};
use crate::runtime_tests::{collect, on, settle, work, TEXT};

const VOCAB: usize = 64;
const HEAD_DIM: usize = 4;
const PAGE_TOKENS: usize = 4;

/// Logits from attention over every position the lane stored, so a page read from the wrong place shows.
struct Attending;

impl Engine for Attending {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: HEAD_DIM, page_tokens, elem_bytes: 4, state_elems: 0 }
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        let row = |t: u32, pos: usize, salt: f32| -> [f32; HEAD_DIM] {
            std::array::from_fn(|i| ((t as usize * 7 + pos * 3 + i * 5) % 11) as f32 * 0.25 - salt)
        };
        let mut out = Vec::new();
        for l in lanes {
            for (i, &t) in l.tokens.iter().enumerate() {
                let pos = l.start_pos + i;
                pool.write(0, l.pages, pos, &row(t, pos, 0.5), &row(t, pos, 1.0));
            }
            let pos = l.start_pos + l.tokens.len() - 1;
            let q = row(*l.tokens.last().unwrap(), pos, 0.0);
            let mut attended = [0f32; HEAD_DIM];
            attend(pool, 0, &[Query { q: &q, pos, pages: l.pages }], 1, &mut attended);
            let mix = attended.iter().fold(0u64, |h, v| h.wrapping_mul(31).wrapping_add(v.to_bits() as u64));
            let logits: Vec<f32> = (0..VOCAB as u64).map(|v| ((mix ^ (v * 2654435761)) % 29) as f32 * 0.2).collect();
            out.push(l.logits.take(&logits, VOCAB));
        }
        Ok(out)
    }
}

fn memfd(bytes: u64) -> Lent {
    Lent::from_descriptor(pool::memfd(bytes).unwrap(), bytes, "test")
}

async fn start(kv_pages: usize, lent: Option<Lent>) -> Runtime {
    let schedule = Schedule { round_tokens: 8, parallel: 4, max_waiting: 64, drafting: Drafting::OFF };
    let cfg = RuntimeConfig {
        page_tokens: PAGE_TOKENS,
        kv_pages: Some(kv_pages),
        memory_limit: None,
        schedule,
        prefix_cache_tokens: 0,
    };
    let kind = ModelKind::Tokens { engine: Box::new(Attending), codec: None };
    let model = ModelSpec { name: TEXT.into(), kind, context: 256, weight_bytes: 0, activation_bytes: 0 };
    Runtime::start_lent(vec![model], cfg, lent).await.unwrap()
}

type Replies = Vec<(String, Option<FinishReason>)>;

/// Twelve requests one at a time, then the same twelve at once.
async fn solo_and_together(rt: &Runtime) -> (Replies, Replies) {
    let mut solo = Vec::new();
    for i in 0..12 {
        solo.push(collect(rt.submit(on(TEXT, work(i))).await.unwrap()).await);
    }
    let receivers: Vec<_> = futures_util::future::join_all((0..12).map(|i| rt.submit(on(TEXT, work(i))))).await;
    let together = futures_util::future::join_all(receivers.into_iter().map(|r| collect(r.unwrap()))).await;
    settle(rt).await;
    (solo, together)
}

/// The lent pages of a 64-byte plane in one slice: every pair of planes, the values' plane on a host page.
fn lent_pages_of_one_slice() -> usize {
    let plane = HEAD_DIM * PAGE_TOKENS * 4;
    let pages = LentLayout::of(SLICE_BYTES, plane, host_page()).num_pages;
    if host_page() == 4096 {
        assert_eq!(pages, 16384);
    }
    pages
}

#[actix::test]
async fn test_concurrent_equals_solo_with_the_kv_pool_mostly_in_lent_memory() {
    let plain = start(256, None).await;
    let (want, together) = solo_and_together(&plain).await;
    assert_eq!(want, together);
    assert!(want.iter().all(|(t, f)| !t.is_empty() && f.is_some()));
    // Two own pages: every lane but the first takes its pages from the lent memory.
    let lent = start(2, Some(memfd(SLICE_BYTES))).await;
    let (solo, together) = solo_and_together(&lent).await;
    assert_eq!(solo, want, "a lane alone on lent pages differs from one on own pages");
    assert_eq!(together, want, "lanes together on lent pages differ from each alone");
}

#[actix::test]
async fn test_the_page_pool_gains_exactly_the_lent_slices_whole_pages() {
    let rt = start(5, Some(memfd(2 * SLICE_BYTES))).await;
    collect(rt.submit(on(TEXT, work(1))).await.unwrap()).await;
    settle(&rt).await;
    let plane = HEAD_DIM * PAGE_TOKENS * 4;
    let gained = LentLayout::of(2 * SLICE_BYTES, plane, host_page()).num_pages;
    assert_eq!(gained, 2 * lent_pages_of_one_slice());
    assert_eq!(rt.metrics().kv_pages().1, (5 + gained) as u64);
    let text = rt.metrics_text("text").await;
    assert!(text.contains(&format!("tensorfold_ledger_bytes{{kind=\"lent\"}} {}", 2 * SLICE_BYTES)), "{text}");
    assert!(text.contains(&format!("tensorfold_ledger_bytes{{kind=\"kv_cache\"}} {}", 2 * 5 * plane)), "{text}");
    assert!(text.contains(&format!("tensorfold_ledger_total_bytes {}", 2 * 5 * plane)), "{text}");
}

#[actix::test]
async fn test_lent_memory_too_small_for_a_page_leaves_the_ordinary_room() {
    let rt = start(5, Some(memfd(64))).await;
    collect(rt.submit(on(TEXT, work(1))).await.unwrap()).await;
    settle(&rt).await;
    assert_eq!(rt.metrics().kv_pages().1, 5);
    assert!(rt.metrics_text("text").await.contains("tensorfold_ledger_bytes{kind=\"lent\"} 0"));
}

#[actix::test]
async fn test_a_runtime_claims_from_the_reference_daemon_and_serves_from_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lend.sock");
    let daemon = Daemon::bind(&path, b"sesame".to_vec(), Box::new(MemfdPool::new(3))).unwrap();
    let daemon = Running::start(daemon).unwrap();
    let key = KeySource::Inline { key: "sesame".into(), setting: "TF_CARVEOUT_KEY".into() };
    let lent = claim(&Claim::new(path.clone(), key, SLICE_BYTES + 1)).unwrap();
    assert_eq!(lent.bytes(), 2 * SLICE_BYTES);
    let plain = start(256, None).await;
    let (want, _) = solo_and_together(&plain).await;
    let rt = start(1, Some(lent)).await;
    let (solo, together) = solo_and_together(&rt).await;
    assert_eq!((solo, together), (want.clone(), want));
    assert_eq!(rt.metrics().kv_pages().1 as usize, 1 + 2 * lent_pages_of_one_slice());
    for _ in 0..500 {
        if daemon.num_free() == 1 {
            return;
        }
        actix::clock::sleep(Duration::from_millis(10)).await;
    }
    panic!("the daemon has {} slices free while the runtime holds two of three", daemon.num_free());
}
