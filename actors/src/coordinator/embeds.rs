//! The embedding book: a prompt prefilled in chunks that share the rounds' token budget, each chunk's hidden rows
//! pooled into one vector, and no token drawn.
//!
//! Pooling is the mean over every prompt position of the final hidden state (after the model's last norm), summed
//! in f64 in position order, then scaled to unit L2 norm. A row's values never depend on the round it ran in or
//! on the chunking, so neither does the vector.

use tensorfold_engine::boundary::EngineError;

use super::book::{LaneBook, Room};
use super::queue::{OfLane, Queue};
use crate::memory::kv::Lease;
use crate::messages::{EnqueueEmbed, LaneEmbedding};
use crate::outbox::Outbox;
use crate::round::{PlannedLane, RoundOutput, RoundPlan};

/// The running mean of a lane's hidden rows, in f64.
#[derive(Clone, Debug, Default)]
pub struct RunningMean {
    sum: Vec<f64>,
    num_rows: usize,
}

impl RunningMean {
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
    request: EnqueueEmbed,
    lease: Lease,
    /// Prompt positions planned so far, the round in flight's included.
    num_planned: usize,
    pooled: RunningMean,
}

impl OfLane for EmbedLane {
    fn lane_id(&self) -> u64 {
        self.request.lane_id
    }
}

/// The embedding lanes and their queue.
#[derive(Default)]
pub struct EmbedBook {
    queue: Queue<EnqueueEmbed, EmbedLane>,
}

impl EmbedBook {
    pub fn enqueue(&mut self, request: EnqueueEmbed) {
        self.queue.waiting.push_back(request);
    }

    /// Pools one lane's rows of a round; a lane whose every row is pooled sends its vector and ends.
    fn pool(&mut self, lane_id: u64, rows: Vec<f32>, outbox: &mut Outbox) {
        let Some(i) = self.queue.position(lane_id) else { return };
        let lane = &mut self.queue.lanes[i];
        let num_rows = lane.num_planned - lane.pooled.num_rows();
        if num_rows == 0 || rows.is_empty() || !rows.len().is_multiple_of(num_rows) {
            let why = format!("{} hidden values for {num_rows} rows", rows.len());
            return self.fail(lane_id, &EngineError::Sizing(why), outbox);
        }
        lane.pooled.add(&rows, rows.len() / num_rows);
        if lane.pooled.num_rows() == lane.request.prompt.len() {
            let lane = self.queue.lanes.swap_remove(i);
            if lane.request.cache {
                lane.lease.cache_prompt(&lane.request.prompt);
            }
            outbox.embeddings.push((lane.request.to, LaneEmbedding(Ok(lane.pooled.finish()))));
        }
    }
}

impl LaneBook for EmbedBook {
    fn num_running(&self) -> usize {
        self.queue.num_running()
    }

    fn num_waiting(&self) -> usize {
        self.queue.num_waiting()
    }

    fn front_lane(&self) -> Option<u64> {
        self.queue.front_lane()
    }

    /// The first waiting request takes a lane when its model's pool has room for its prompt.
    fn admit_one(&mut self, room: &Room) -> bool {
        let Some(next) = self.queue.waiting.front() else { return false };
        // Never from the prefix cache: a resumed prompt would skip rows the mean needs.
        let Some(lease) = room.pages[next.model].admit(next.prompt.len(), None) else { return false };
        let request = self.queue.waiting.pop_front().expect("front exists");
        self.queue.lanes.push(EmbedLane { request, lease, num_planned: 0, pooled: RunningMean::default() });
        true
    }

    /// Each lane's next prompt chunk, in admission order, within what the token lanes left of the round's budget.
    fn plan(&mut self, room: &Room, plan: &mut RoundPlan) {
        let used: usize = plan.lanes.iter().map(|l| l.tokens.len()).sum();
        let mut budget = room.schedule.round_tokens.saturating_sub(used);
        for lane in &mut self.queue.lanes {
            let start = lane.num_planned;
            let end = (start + budget).min(lane.request.prompt.len());
            if end <= start {
                continue;
            }
            budget -= end - start;
            lane.lease.grow_to(end);
            lane.num_planned = end;
            plan.lanes.push(PlannedLane {
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

    fn apply(&mut self, _: &Room, output: &mut RoundOutput, outbox: &mut Outbox) {
        for (lane_id, rows) in std::mem::take(&mut output.hidden) {
            self.pool(lane_id, rows, outbox);
        }
    }

    fn release(&mut self, lane_id: u64) {
        self.queue.release(lane_id);
    }

    fn fail(&mut self, lane_id: u64, why: &EngineError, outbox: &mut Outbox) {
        if let Some(lane) = self.queue.take(lane_id) {
            outbox.embeddings.push((lane.request.to, LaneEmbedding(Err(why.clone()))));
        }
    }

    fn fail_running(&mut self, why: &EngineError, outbox: &mut Outbox) {
        outbox.embeddings.extend(self.queue.lanes.drain(..).map(|l| (l.request.to, LaneEmbedding(Err(why.clone())))));
    }

    fn fail_waiting(&mut self, why: &EngineError, outbox: &mut Outbox) {
        outbox.embeddings.extend(self.queue.waiting.drain(..).map(|r| (r.to, LaneEmbedding(Err(why.clone())))));
    }
}

#[cfg(test)]
mod tests {
    use super::RunningMean;

    #[test]
    fn test_mean_pool_is_the_unit_mean_of_the_rows() {
        let mut pool = RunningMean::default();
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
        let mut whole = RunningMean::default();
        whole.add(&rows, 4);
        for chunk in [1, 2, 3, 7] {
            let mut parts = RunningMean::default();
            rows.chunks(chunk * 4).for_each(|c| parts.add(c, 4));
            assert_eq!(parts.finish(), whole.finish(), "chunks of {chunk} rows");
        }
    }

    #[test]
    fn test_mean_pool_of_zero_rows_is_zero_not_nan() {
        let mut pool = RunningMean::default();
        pool.add(&[0.0, 0.0], 2);
        assert_eq!(pool.finish(), vec![0.0, 0.0]);
    }
}

#[cfg(test)]
#[path = "embeds_tests.rs"]
mod lanes_tests;
