//! What every lane book keeps: its kind's waiting requests, oldest first, and its running lanes, each found by
//! its lane id.

use std::collections::VecDeque;

use crate::messages::{Enqueue, EnqueueEmbed, EnqueueVoice};

/// A request or lane that belongs to one lane id.
pub trait OfLane {
    fn lane_id(&self) -> u64;
}

impl OfLane for Enqueue {
    fn lane_id(&self) -> u64 {
        self.lane_id
    }
}

impl OfLane for EnqueueVoice {
    fn lane_id(&self) -> u64 {
        self.lane_id
    }
}

impl OfLane for EnqueueEmbed {
    fn lane_id(&self) -> u64 {
        self.lane_id
    }
}

/// One kind's waiting requests and running lanes.
pub struct Queue<R, L> {
    pub waiting: VecDeque<R>,
    pub lanes: Vec<L>,
}

impl<R, L> Default for Queue<R, L> {
    fn default() -> Self {
        Queue { waiting: VecDeque::new(), lanes: Vec::new() }
    }
}

impl<R: OfLane, L: OfLane> Queue<R, L> {
    pub fn num_running(&self) -> usize {
        self.lanes.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The lane of the request that has waited longest.
    pub fn front_lane(&self) -> Option<u64> {
        self.waiting.front().map(R::lane_id)
    }

    /// Where the running lane `lane_id` stands.
    pub fn position(&self, lane_id: u64) -> Option<usize> {
        self.lanes.iter().position(|l| l.lane_id() == lane_id)
    }

    /// Takes the running lane `lane_id` out, if it runs here.
    pub fn take(&mut self, lane_id: u64) -> Option<L> {
        self.position(lane_id).map(|i| self.lanes.swap_remove(i))
    }

    /// Drops the waiting request or running lane `lane_id`.
    pub fn release(&mut self, lane_id: u64) {
        self.waiting.retain(|r| r.lane_id() != lane_id);
        self.lanes.retain(|l| l.lane_id() != lane_id);
    }
}
