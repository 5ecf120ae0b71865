//! The voice book: lanes that speak without tokens; a lane prepares each sentence in one round, then makes audio
//! a window per round.

use actix::prelude::*;
use tensorfold_engine::boundary::EngineError;

use super::book::{LaneBook, Room};
use super::queue::{OfLane, Queue};
use crate::messages::{EnqueueVoice, VoiceAudio};
use crate::outbox::Outbox;
use crate::round::{ModelId, PlannedVoice, RoundOutput, RoundPlan, VoiceWork};

struct VoiceLane {
    lane_id: u64,
    model: ModelId,
    to: Recipient<VoiceAudio>,
    /// `None` while the lane's step is in the round in flight.
    work: Option<VoiceWork>,
}

impl OfLane for VoiceLane {
    fn lane_id(&self) -> u64 {
        self.lane_id
    }
}

/// The voice lanes and their queue.
#[derive(Default)]
pub struct VoiceBook {
    queue: Queue<EnqueueVoice, VoiceLane>,
}

impl VoiceBook {
    pub fn enqueue(&mut self, request: EnqueueVoice) {
        self.queue.waiting.push_back(request);
    }
}

fn ended(to: Recipient<VoiceAudio>, pcm: Result<Vec<f32>, EngineError>) -> (Recipient<VoiceAudio>, VoiceAudio) {
    (to, VoiceAudio { pcm, finished: true })
}

impl LaneBook for VoiceBook {
    fn num_running(&self) -> usize {
        self.queue.num_running()
    }

    fn num_waiting(&self) -> usize {
        self.queue.num_waiting()
    }

    fn front_lane(&self) -> Option<u64> {
        self.queue.front_lane()
    }

    fn admit_one(&mut self, _: &Room) -> bool {
        let Some(r) = self.queue.waiting.pop_front() else { return false };
        let work = Some(VoiceWork::Start(r.input));
        self.queue.lanes.push(VoiceLane { lane_id: r.lane_id, model: r.model, to: r.to, work });
        true
    }

    /// One step for every lane not already in flight.
    fn plan(&mut self, _: &Room, plan: &mut RoundPlan) {
        let ready = self.queue.lanes.iter_mut().filter_map(|l| Some((l.lane_id, l.model, l.work.take()?)));
        plan.voices.extend(ready.map(|(lane_id, model, work)| PlannedVoice { lane_id, model, work }));
    }

    /// Puts each step's audio in the outbox; a lane whose audio is complete or failed ends.
    fn apply(&mut self, _: &Room, output: &mut RoundOutput, outbox: &mut Outbox) {
        for out in std::mem::take(&mut output.voices) {
            let Some(i) = self.queue.position(out.lane_id) else { continue };
            let reply = match (out.result, out.state) {
                (Ok(Some(pcm)), Some(state)) => {
                    self.queue.lanes[i].work = Some(VoiceWork::Step(state));
                    (self.queue.lanes[i].to.clone(), VoiceAudio { pcm: Ok(pcm), finished: false })
                }
                (Ok(_), _) => ended(self.queue.lanes.swap_remove(i).to, Ok(Vec::new())),
                (Err(e), _) => ended(self.queue.lanes.swap_remove(i).to, Err(e)),
            };
            outbox.voices.push(reply);
        }
    }

    fn release(&mut self, lane_id: u64) {
        self.queue.release(lane_id);
    }

    fn fail(&mut self, lane_id: u64, why: &EngineError, outbox: &mut Outbox) {
        if let Some(lane) = self.queue.take(lane_id) {
            outbox.voices.push(ended(lane.to, Err(why.clone())));
        }
    }

    fn fail_running(&mut self, why: &EngineError, outbox: &mut Outbox) {
        outbox.voices.extend(self.queue.lanes.drain(..).map(|l| ended(l.to, Err(why.clone()))));
    }

    fn fail_waiting(&mut self, why: &EngineError, outbox: &mut Outbox) {
        outbox.voices.extend(self.queue.waiting.drain(..).map(|r| ended(r.to, Err(why.clone()))));
    }
}
