//! One trait for every kind of lane, in the shape of vLLM's scheduler: a book of the requests waiting for a lane
//! and of the lanes running, which admits, plans its part of each round, applies the round's output, releases
//! and fails its lanes. The coordinator's loop knows books only through it.

use tensorfold_engine::boundary::EngineError;

use super::schedule::Schedule;
use crate::memory::kv::KvPages;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::round::{RoundOutput, RoundPlan};
use crate::runner::EngineRunner;

/// What every book reads while it admits, plans and applies: each model's KV pages, the limits, the engine
/// thread's step costs, and the metrics.
pub struct Room<'a> {
    pub pages: &'a [KvPages],
    pub schedule: &'a Schedule,
    pub runner: &'a EngineRunner,
    pub metrics: &'a Metrics,
}

/// One kind of lane's queue and running lanes.
pub trait LaneBook {
    fn num_running(&self) -> usize;

    fn num_waiting(&self) -> usize;

    /// The lane of the request that has waited longest; lane ids rise in the order requests come.
    fn front_lane(&self) -> Option<u64>;

    /// Gives the first waiting request a lane if it can start now; false otherwise.
    fn admit_one(&mut self, room: &Room) -> bool;

    /// Adds this book's work to the next round, after what the books before it planned.
    fn plan(&mut self, room: &Room, plan: &mut RoundPlan);

    /// Takes its lanes' part of a round's output; what the requests must hear goes in `outbox`.
    fn apply(&mut self, room: &Room, output: &mut RoundOutput, outbox: &mut Outbox);

    /// Drops the waiting request or running lane `lane_id`, if it is this book's.
    fn release(&mut self, lane_id: u64);

    /// Ends the running lane `lane_id`, if it is this book's, with `why`.
    fn fail(&mut self, lane_id: u64, why: &EngineError, outbox: &mut Outbox);

    /// Ends every running lane with `why`; waiting requests keep their place.
    fn fail_running(&mut self, why: &EngineError, outbox: &mut Outbox);

    /// Ends every waiting request with `why`.
    fn fail_waiting(&mut self, why: &EngineError, outbox: &mut Outbox);
}
