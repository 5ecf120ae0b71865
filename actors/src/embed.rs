//! Embedding lanes: a prompt prefilled in chunks that share the rounds' token budget, each chunk's hidden rows
//! pooled into one vector, and no token drawn.
//!
//! Pooling is the mean over every prompt position of the final hidden state (after the model's last norm), summed
//! in f64 in position order, then scaled to unit L2 norm. A row's values never depend on the round it ran in or
//! on the chunking, so neither does the vector.

use std::collections::VecDeque;

use actix::prelude::*;
use tensorfold_engine::boundary::EngineError;

use crate::kv::{Lease, PagePool};
use crate::messages::LaneEmbedding;
use crate::outbox::Outbox;
use crate::round::{ModelId, PlannedLane};

/// An embedding request waiting for a lane.
pub struct EmbedRequest {
    pub lane_id: u64,
    pub model: ModelId,
    pub prompt: Vec<u32>,
    /// Whether the prompt's pages are cached for later prompts once computed.
    pub cache: bool,
    pub to: Recipient<LaneEmbedding>,
}

/// The running mean of a lane's hidden rows, in f64.
#[derive(Clone, Debug, Default)]
pub struct MeanPool {
    sum: Vec<f64>,
    num_rows: usize,
}

impl MeanPool {
    /// Adds `rows` of `width` values each, in position order after the rows added before.
    pub fn add(&mut self, rows: &[f32], width: usize) {
        if self.sum.is_empty() {
            self.sum = vec![0.0; width];
        }
        for row in rows.chunks_exact(width) {
            self.sum.iter_mut().zip(row).for_each(|(s, &v)| *s += v as f64);
            self.num_rows += 1;
        }
    }

    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// The mean row scaled to unit L2 norm; all zeros stay zeros.
    pub fn finish(&self) -> Vec<f32> {
        let mean: Vec<f64> = self.sum.iter().map(|s| s / self.num_rows.max(1) as f64).collect();
        let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
        let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        mean.iter().map(|v| (v * scale) as f32).collect()
    }
}

struct EmbedLane {
    request: EmbedRequest,
    lease: Lease,
    /// Prompt positions planned so far, the round in flight's included.
    num_planned: usize,
    pooled: MeanPool,
}

/// The coordinator's embedding lanes and their queue.
#[derive(Default)]
pub struct EmbedLanes {
    waiting: VecDeque<EmbedRequest>,
    lanes: Vec<EmbedLane>,
}

impl EmbedLanes {
    pub fn num_running(&self) -> usize {
        self.lanes.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The lane of the request that waits longest.
    pub fn front_lane(&self) -> Option<u64> {
        self.waiting.front().map(|r| r.lane_id)
    }

    pub fn enqueue(&mut self, request: EmbedRequest) {
        self.waiting.push_back(request);
    }

    /// Gives the first waiting request a lane when its model's pool has room for its prompt; false otherwise.
    pub fn admit_one(&mut self, pages: &[PagePool]) -> bool {
        let Some(next) = self.waiting.front() else { return false };
        // Never from the prefix cache: a resumed prompt would skip rows the mean needs.
        let Some(lease) = pages[next.model].admit(next.prompt.len(), None) else { return false };
        let request = self.waiting.pop_front().expect("front exists");
        self.lanes.push(EmbedLane { request, lease, num_planned: 0, pooled: MeanPool::default() });
        true
    }

    /// Each lane's next prompt chunk, within `budget` tokens, in admission order.
    pub fn plan(&mut self, mut budget: usize, lanes: &mut Vec<PlannedLane>) {
        for lane in &mut self.lanes {
            let start = lane.num_planned;
            let end = (start + budget).min(lane.request.prompt.len());
            if end <= start {
                continue;
            }
            budget -= end - start;
            lane.lease.grow_to(end);
            lane.num_planned = end;
            lanes.push(PlannedLane {
                lane_id: lane.request.lane_id,
                model: lane.request.model,
                tokens: lane.request.prompt[start..end].to_vec(),
                start_pos: start,
                pages: lane.lease.pages().to_vec(),
                sample: None,
                embed: true,
            });
        }
    }

    /// Pools each lane's rows of a round; a lane whose every row is pooled sends its vector and ends.
    pub fn apply(&mut self, hidden: Vec<(u64, Vec<f32>)>, outbox: &mut Outbox) {
        for (lane_id, rows) in hidden {
            let Some(i) = self.lanes.iter().position(|l| l.request.lane_id == lane_id) else { continue };
            let lane = &mut self.lanes[i];
            let prompt_len = lane.request.prompt.len();
            let num_rows = lane.num_planned - lane.pooled.num_rows();
            if num_rows == 0 || rows.is_empty() || rows.len() % num_rows != 0 {
                let why = format!("{} hidden values for {num_rows} rows", rows.len());
                self.fail(lane_id, &EngineError::Sizing(why), outbox);
                continue;
            }
            lane.pooled.add(&rows, rows.len() / num_rows);
            if lane.pooled.num_rows() == prompt_len {
                let lane = self.lanes.swap_remove(i);
                if lane.request.cache {
                    lane.lease.cache_prompt(&lane.request.prompt);
                }
                outbox.embeddings.push((lane.request.to, LaneEmbedding(Ok(lane.pooled.finish()))));
            }
        }
    }

    pub fn release(&mut self, lane_id: u64) {
        self.waiting.retain(|r| r.lane_id != lane_id);
        self.lanes.retain(|l| l.request.lane_id != lane_id);
    }

    /// Ends the running lane `lane_id`, if it is an embedding lane, with `why` in the outbox.
    pub fn fail(&mut self, lane_id: u64, why: &EngineError, outbox: &mut Outbox) {
        if let Some(i) = self.lanes.iter().position(|l| l.request.lane_id == lane_id) {
            outbox.embeddings.push((self.lanes.swap_remove(i).request.to, LaneEmbedding(Err(why.clone()))));
        }
    }

    /// Ends every running lane with `why` in the outbox; waiting requests keep their place.
    pub fn fail_running(&mut self, why: &EngineError, outbox: &mut Outbox) {
        for lane in self.lanes.drain(..) {
            outbox.embeddings.push((lane.request.to, LaneEmbedding(Err(why.clone()))));
        }
    }

    /// Ends every waiting request with `why`.
    pub fn fail_waiting(&mut self, why: &EngineError) {
        for request in self.waiting.drain(..) {
            request.to.do_send(LaneEmbedding(Err(why.clone())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MeanPool;

    #[test]
    fn test_mean_pool_is_the_unit_mean_of_the_rows() {
        let mut pool = MeanPool::default();
        pool.add(&[1.0, 2.0, 3.0, 6.0], 2);
        pool.add(&[2.0, 4.0], 2);
        assert_eq!(pool.num_rows(), 3);
        // The mean is (2, 4); its unit vector (1, 2) / sqrt(5).
        let v = pool.finish();
        let want = [1.0 / 5f64.sqrt(), 2.0 / 5f64.sqrt()];
        assert!(v.iter().zip(want).all(|(a, b)| (*a as f64 - b).abs() < 1e-7), "{v:?}");
    }

    #[test]
    fn test_mean_pool_does_not_depend_on_the_chunking() {
        let rows: Vec<f32> = (0..40).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.31).collect();
        let mut whole = MeanPool::default();
        whole.add(&rows, 4);
        for chunk in [1, 2, 3, 7] {
            let mut parts = MeanPool::default();
            rows.chunks(chunk * 4).for_each(|c| parts.add(c, 4));
            assert_eq!(parts.finish(), whole.finish(), "chunks of {chunk} rows");
        }
    }

    #[test]
    fn test_mean_pool_of_zero_rows_is_zero_not_nan() {
        let mut pool = MeanPool::default();
        pool.add(&[0.0, 0.0], 2);
        assert_eq!(pool.finish(), vec![0.0, 0.0]);
    }
}

#[cfg(test)]
#[path = "embed_tests.rs"]
mod lanes_tests;
